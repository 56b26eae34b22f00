//! What the traffic-management features of issue 29 kept in this crate cost
//! on the request path, and what routes and upstreams without them pay:
//!
//! * `pick/plain` vs `pick/outlier`: a round-robin pick over 3 instances of an
//!   upstream without and with `outlier_detection` (nothing ejected): the
//!   balancer's one extra atomic load per candidate, the same for both;
//! * `record/plain` vs `record/outlier_success` / `record/outlier_failure`:
//!   an attempt's outlier accounting (`outlier::record`): an `Option` check
//!   without it; a clock read and one compare-and-swap with it (a failure also
//!   sums the ten buckets);
//! * `mirror/sample_50`: the per-request draw of a `mirror` route at 50 %
//!   (a route without `mirror` pays one `Option` check, nothing to measure).
//!
//! Run: `cargo bench -p data-plane --bench traffic`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use data_plane::composition::mirror::Mirror;
use data_plane::upstream::balancer::{self, Affinity};
use data_plane::upstream::breaker::BreakerSettings;
use data_plane::upstream::outlier::{self, Outlier, OutlierSettings};
use data_plane::upstream::{InstanceKey, InstanceState, UpstreamEntry};
use gateway_proto::v1::OutlierDetection;
use gateway_transport::pool::{PoolSettings, Protocol};

fn instance(id: &str) -> Arc<InstanceState> {
    let key = InstanceKey {
        upstream: "u".into(),
        id: id.into(),
        url: "http://127.0.0.1:1".into(),
        tls: None,
        protocol: Protocol::Http1,
    };
    Arc::new(InstanceState::new(
        key,
        "127.0.0.1:1",
        PoolSettings::default(),
        None,
    ))
}

fn upstream(outlier: bool) -> UpstreamEntry {
    let breaker = BreakerSettings {
        failure_threshold: 5,
        reset_timeout: Duration::from_secs(10),
        half_open_max_requests: 1,
        count_5xx: false,
        max_open_percent: 50,
    };
    let settings = OutlierSettings::from_proto(&OutlierDetection {
        // Never reached here: the failure path sums the window without ejecting.
        failure_rate_percent: 100,
        min_requests: 100_000,
        window_ms: 10_000,
        ejection_ms: 30_000,
        max_ejection_percent: 50,
    });
    let instances = (0..3).map(|i| instance(&format!("i{i}"))).collect();
    UpstreamEntry::new("u", instances, breaker, None)
        .with_outlier(outlier.then(|| Outlier::new(settings)))
}

fn bench(c: &mut Criterion) {
    let plain = upstream(false);
    let detected = upstream(true);
    let mut g = c.benchmark_group("pick");
    g.bench_function("plain", |b| {
        b.iter(|| {
            let p = balancer::pick(black_box(&plain), Affinity::NONE, None).unwrap();
            black_box(p.index)
        });
    });
    g.bench_function("outlier", |b| {
        b.iter(|| {
            let p = balancer::pick(black_box(&detected), Affinity::NONE, None).unwrap();
            black_box(p.index)
        });
    });
    g.finish();

    let mut g = c.benchmark_group("record");
    g.bench_function("plain", |b| {
        b.iter(|| outlier::record(black_box(&plain), &plain.instances[0], black_box(false)));
    });
    g.bench_function("outlier_success", |b| {
        b.iter(|| {
            outlier::record(
                black_box(&detected),
                &detected.instances[0],
                black_box(false),
            );
        });
    });
    g.bench_function("outlier_failure", |b| {
        b.iter(|| {
            outlier::record(
                black_box(&detected),
                &detected.instances[1],
                black_box(true),
            )
        });
    });
    g.finish();

    let mirror = Mirror {
        upstream: Arc::new(upstream(false)),
        percent: 50,
        include_body: false,
        deny: Box::default(),
    };
    c.bench_function("mirror/sample_50", |b| {
        b.iter(|| black_box(&mirror).sampled());
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
