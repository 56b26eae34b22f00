//! Cost of one rate-limit decision: in-process plus the Redis round trip
//! (against a `redis-server` spawned here on a free loopback port), and the
//! local limiter alone.
//!
//! Run: `cargo bench -p gateway-ratelimit --bench decision`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::future::join_all;
use gateway_ratelimit::{
    Algorithm, LocalLimiter, Policy, RateLimiter, RateLimiterOptions, write_headers,
};
use http::HeaderMap;

/// Budgets so large that every benchmarked request is admitted (the common case).
fn roomy(algorithm: Algorithm) -> Policy {
    Policy::new("bench", algorithm, 1_000_000_000, 1).unwrap()
}

fn redis(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(devstack::RedisServer::start())
        .expect("redis-server starts");
    let connect = |lease_max_tokens| {
        rt.block_on(async {
            let limiter = RateLimiter::new(
                Some(server.url()),
                RateLimiterOptions {
                    // Measure Redis, not fallbacks: a slow sample must not turn local.
                    decision_timeout: Duration::from_secs(1),
                    lease_max_tokens,
                    ..RateLimiterOptions::default()
                },
            )
            .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !limiter.is_shared() {
                assert!(std::time::Instant::now() < deadline, "Redis unreachable");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            limiter
        })
    };
    // Leases off: every decision below is a Redis round trip.
    let limiter = connect(0);
    // Leases on (the default): a busy key is decided from its lease.
    let leasing = connect(RateLimiterOptions::default().lease_max_tokens);

    let mut group = c.benchmark_group("decision");
    for algorithm in [Algorithm::TokenBucket, Algorithm::FixedWindow] {
        let policy = roomy(algorithm);
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("redis_{}", algorithm.as_str()), |b| {
            b.to_async(&rt).iter(|| limiter.check(&policy, "alice"))
        });
        // One busy key with leases: about one decision in a thousand goes to Redis.
        group.bench_function(format!("leased_{}", algorithm.as_str()), |b| {
            b.to_async(&rt).iter(|| leasing.check(&policy, "alice"))
        });
        // 64 clients at once share the one multiplexed connection: the round
        // trips overlap (pipelining), so the cost per decision drops.
        group.throughput(Throughput::Elements(64));
        group.bench_function(format!("redis_{}_64_concurrent", algorithm.as_str()), |b| {
            b.to_async(&rt).iter(|| {
                join_all((0..64).map(|i| {
                    let policy = &policy;
                    let limiter = &limiter;
                    async move { limiter.check(policy, SUBJECTS[i % SUBJECTS.len()]).await }
                }))
            })
        });
    }

    // A sliding window (stacked.lua with one key), and two stacked limits
    // (a route-wide bucket and a per-caller sliding window) in one run.
    let sliding = roomy(Algorithm::SlidingWindow);
    group.throughput(Throughput::Elements(1));
    group.bench_function("redis_sliding_window", |b| {
        b.to_async(&rt).iter(|| limiter.check(&sliding, "alice"))
    });
    let (route, caller) = stacked_pair();
    let pair: [(&Policy, &[u8]); 2] = [(&route, b"orders"), (&caller, b"alice")];
    group.bench_function("redis_stacked_2", |b| {
        b.to_async(&rt).iter(|| limiter.check_all(&pair))
    });

    // A key over its limit: answered from the "denied until" cache, no Redis.
    let tight = Policy::new("tight", Algorithm::FixedWindow, 1, 3600).unwrap();
    rt.block_on(async {
        limiter.check(&tight, "mallory").await;
        assert!(!limiter.check(&tight, "mallory").await.allowed);
    });
    group.throughput(Throughput::Elements(1));
    group.bench_function("denied_from_cache", |b| {
        b.to_async(&rt).iter(|| limiter.check(&tight, "mallory"))
    });
    group.finish();
    let stats = limiter.stats();
    assert_eq!(
        stats.fallbacks, 0,
        "every measured decision reached Redis: {stats:?}"
    );
    drop(limiter);
    rt.block_on(async move {
        let mut server = server;
        server.kill().await;
    });
}

/// A route-wide bucket and a per-caller sliding window, both roomy.
fn stacked_pair() -> (Policy, Policy) {
    (
        Policy::new("bench-route", Algorithm::TokenBucket, 1_000_000_000, 1).unwrap(),
        Policy::new("bench-caller", Algorithm::SlidingWindow, 1_000_000_000, 1).unwrap(),
    )
}

const SUBJECTS: [&str; 8] = ["u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"];

fn local(c: &mut Criterion) {
    let mut group = c.benchmark_group("local");
    group.throughput(Throughput::Elements(1));

    // The whole check() path without Redis (async wrapper, stats, local limiter).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter =
        rt.block_on(async { RateLimiter::new(None, RateLimiterOptions::default()).unwrap() });
    let policy = roomy(Algorithm::TokenBucket);
    group.bench_function("limiter_check_without_redis", |b| {
        b.to_async(&rt).iter(|| limiter.check(&policy, "alice"))
    });

    // The local limiter alone, clock injected.
    let local = LocalLimiter::new(100_000);
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let policy = roomy(algorithm);
        let mut now = 0;
        group.bench_function(format!("check_at_{}", algorithm.as_str()), |b| {
            b.iter(|| {
                now += 1;
                local.check_at(&policy, "alice", now)
            })
        });
    }

    // Two stacked limits, all or nothing, under the locks of both shards.
    let (route, caller) = stacked_pair();
    let mut now = 0;
    group.bench_function("check_all_at_stacked_2", |b| {
        b.iter(|| {
            now += 1;
            local.check_all_at(&[(&route, b"orders"), (&caller, b"alice")], now)
        })
    });

    // Writing the five header fields of a denial into a response's existing
    // map (cleared each time, so its table is already allocated, as it is
    // for a real response).
    let decision = rt.block_on(async {
        let p = Policy::new("api", Algorithm::TokenBucket, 1, 60).unwrap();
        limiter.check(&p, "bob").await;
        (p.clone(), limiter.check(&p, "bob").await)
    });
    let mut headers = HeaderMap::with_capacity(16);
    group.bench_function("write_headers_denied", |b| {
        b.iter(|| {
            headers.clear();
            write_headers(&mut headers, &decision.0, &decision.1);
            headers.len()
        })
    });
    group.finish();
}

criterion_group!(benches, local, redis);
criterion_main!(benches);
