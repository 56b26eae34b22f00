//! ApplyConfig of 10,000 routes and 100 upstreams against a file database:
//! directly on the store, and end to end through gRPC. Also prints the size of
//! the encoded snapshot, and compares the content hash (secrets as keyed
//! digests) with a plain SHA-256 of the encoding.
//! Run: `cargo bench -p control-plane --bench apply`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use control_plane::config::{Config, Mutation};
use control_plane::store::{MutateOptions, Store};
use control_plane::{ControlPlane, Settings};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use gateway_proto::v1::admin_service_client::AdminServiceClient;
use gateway_proto::v1::{
    ApplyConfigRequest, AuthMode, CircuitBreaker, HealthCheck, Instance, RateLimit,
    RateLimitAlgorithm, RateLimitKey, Route, Upstream,
};
use std::time::Duration;

const ROUTES: usize = 10_000;
const UPSTREAMS: usize = 100;

/// A realistic large configuration; `generation` changes every route's timeout
/// so consecutive applies differ and each one commits a new version.
fn config(generation: u32) -> (Vec<Route>, Vec<Upstream>) {
    let upstreams = (0..UPSTREAMS)
        .map(|u| Upstream {
            name: format!("service-{u:03}"),
            instances: (0..3)
                .map(|i| Instance {
                    id: format!("service-{u:03}-{i}"),
                    url: format!("http://10.0.{u}.{}:8080", i + 1),
                    ..Default::default()
                })
                .collect(),
            health_check: Some(HealthCheck {
                path: "/health".into(),
                interval_ms: 5000,
                timeout_ms: 2000,
                unhealthy_threshold: 3,
                healthy_threshold: 2,
            }),
            circuit_breaker: Some(CircuitBreaker {
                failure_threshold: 5,
                reset_timeout_ms: 10_000,
                half_open_max_requests: 1,
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let routes = (0..ROUTES)
        .map(|r| {
            let u = r % UPSTREAMS;
            Route {
                name: format!("route-{r:05}"),
                hosts: vec![format!("api{}.example.com", r % 10)],
                path_prefix: format!("/api/service-{u:03}/resource-{r:05}"),
                methods: vec!["GET".into(), "POST".into()],
                upstream: format!("service-{u:03}"),
                rewrite_prefix: format!("/resource-{r:05}"),
                auth: if r % 2 == 0 {
                    AuthMode::AuthJwt as i32
                } else {
                    AuthMode::AuthNone as i32
                },
                rate_limit: (r % 3 == 0).then(|| RateLimit {
                    policy: format!("policy-{u:03}"),
                    algorithm: RateLimitAlgorithm::TokenBucket as i32,
                    key: RateLimitKey::KeyIp as i32,
                    limit: 100,
                    window_seconds: 60,
                    key_header: String::new(),
                }),
                timeout_ms: 1000 + generation,
                ..Route::default()
            }
        })
        .collect();
    (routes, upstreams)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();

    let (routes, upstreams) = config(0);
    let encoded = Config::new(routes.clone(), upstreams.clone())
        .encode(None)
        .unwrap();
    eprintln!(
        "snapshot of {ROUTES} routes and {UPSTREAMS} upstreams: {} bytes encoded ({:.2} MiB)",
        encoded.len(),
        encoded.len() as f64 / 1_048_576.0
    );

    // The content hash against what it replaced (encode, then SHA-256 of the
    // bytes), every upstream with a signing secret so each one is masked.
    let secret_upstreams: Vec<Upstream> = upstreams
        .iter()
        .map(|u| Upstream {
            identity_signing_secret: format!("secret-of-{}-0123456789abcdef0123", u.name),
            ..u.clone()
        })
        .collect();
    let with_secrets = Config::new(routes.clone(), secret_upstreams);
    let key = gateway_proto::hash::HashKey::from_bytes([7; 32]);
    let mut hashing = c.benchmark_group("hash_10k_routes");
    hashing.sample_size(20);
    hashing.bench_function("config_hash_keyed", |b| {
        b.iter(|| with_secrets.hash(std::hint::black_box(&key)))
    });
    hashing.bench_function("encode_then_plain_sha256", |b| {
        b.iter(|| {
            gateway_proto::hash::plain_sha256(
                &std::hint::black_box(&with_secrets).encode(None).unwrap(),
            )
        })
    });
    hashing.finish();

    let store = rt
        .block_on(Store::open(&dir.path().join("store.db")))
        .unwrap();
    let configs: Vec<Config> = (0..2)
        .map(|g| {
            let (r, u) = config(g);
            Config::new(r, u)
        })
        .collect();
    let mut generation = 0usize;
    let mut group = c.benchmark_group("apply_10k_routes");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    // Setup (copying the request) is excluded from the measured time.
    let mut next = || {
        generation += 1;
        Mutation::Replace(configs[generation % 2].clone())
    };
    group.bench_function("store_commit", |b| {
        b.iter_batched(
            &mut next,
            |m| {
                let o = rt
                    .block_on(store.mutate(m, &MutateOptions::default()))
                    .unwrap();
                assert!(o.committed);
            },
            BatchSize::PerIteration,
        )
    });
    let dry = MutateOptions {
        dry_run: true,
        ..Default::default()
    };
    group.bench_function("store_dry_run", |b| {
        b.iter_batched(
            &mut next,
            |m| rt.block_on(store.mutate(m, &dry)).unwrap(),
            BatchSize::PerIteration,
        )
    });

    let cp = rt
        .block_on(ControlPlane::start(Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            database: dir.path().join("grpc.db").into(),
            seed: None,
            metrics_listen: None,
            tracer: gateway_telemetry::Tracer::disabled(),
            insecure_open: true,
            ..Settings::default()
        }))
        .unwrap();
    let mut client = rt
        .block_on(AdminServiceClient::connect(format!(
            "http://{}",
            cp.local_addr()
        )))
        .unwrap()
        .max_encoding_message_size(64 << 20);
    let requests: Vec<ApplyConfigRequest> = (0..2)
        .map(|g| {
            let (routes, upstreams) = config(g);
            ApplyConfigRequest {
                routes,
                upstreams,
                dry_run: false,
                expected_version: None,
                certificates: Vec::new(),
                clear_certificates: false,
                jwt_issuers: Vec::new(),
            }
        })
        .collect();
    let mut generation = 0usize;
    group.bench_function("grpc_apply_config", |b| {
        b.iter_batched(
            || {
                generation += 1;
                requests[generation % 2].clone()
            },
            |req| rt.block_on(client.apply_config(req)).unwrap(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
    rt.block_on(cp.stop()).unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);
