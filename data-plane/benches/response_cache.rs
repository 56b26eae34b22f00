//! Per-request cost of a response cache hit: building the key (route, Host,
//! path, query, one listed header) and finding a fresh stored answer in the
//! sharded store holding 10 and 10,000 keys, then copying the answer for the
//! caller (fields and body shared, not copied); and the same with two
//! threads on one key (one shard's lock contended).
//!
//! Run: `cargo bench -p data-plane --bench response_cache`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use data_plane::composition::response_cache::RouteCacheEntry;
use data_plane::composition::response_cache::store::{ResponseCache, Slot, Stored};
use gateway_proto::spec::Auth;
use gateway_proto::v1::RouteCache;
use gateway_transport::response::Fields;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::time::Instant;

fn parts(i: usize) -> http::request::Parts {
    http::Request::get(format!("/orders/{i}?page=1"))
        .header("host", "api.example.com")
        .header("accept-language", "en")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

fn bench(c: &mut Criterion) {
    let entry = RouteCacheEntry::compile(
        "orders",
        Auth::None,
        &RouteCache {
            ttl_seconds: 60,
            vary: vec!["accept-language".into()],
            ..Default::default()
        },
    );
    let mut fields = HeaderMap::new();
    fields.insert("content-type", HeaderValue::from_static("application/json"));
    fields.insert("etag", HeaderValue::from_static("\"v1\""));
    let body = Bytes::from(vec![b'x'; 1024]);
    let mut group = c.benchmark_group("response_cache");
    for n in [10usize, 10_000] {
        let store = ResponseCache::new(64 << 20, Arc::default());
        let route: Arc<str> = "orders".into();
        for i in 0..n {
            let p = parts(i);
            let key = entry.key(&p, p.uri.path());
            let slot = Slot {
                key: &key,
                route: &route,
                path: p.uri.path(),
                vary: Box::new([]),
            };
            let stored = Stored {
                status: StatusCode::OK,
                fields: Fields::from(fields.clone()),
                body: body.clone(),
                stored_at: Instant::now(),
                initial_age: Duration::ZERO,
                lifetime: Duration::from_secs(3600),
                etag: None,
                vary_values: Box::new([]),
            };
            store.put(slot, stored);
        }
        let p = parts(n / 2);
        let hit = |p: &http::request::Parts| {
            let key = entry.key(black_box(p), p.uri.path());
            let stored = store.get(&key, &p.headers).unwrap();
            let now = Instant::now();
            assert!(stored.is_fresh(now));
            black_box(stored.response())
        };
        group.bench_with_input(BenchmarkId::new("hit", n), &p, |b, p| b.iter(|| hit(p)));
        // Two threads (two proxy workers) hitting the same key, so the same shard's lock:
        // the time per hit of the pair, to compare with one thread's.
        group.bench_with_input(BenchmarkId::new("hit_2_threads_one_key", n), &p, |b, p| {
            b.iter_custom(|iters| {
                let start = std::time::Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..2 {
                        s.spawn(|| {
                            for _ in 0..iters / 2 {
                                hit(p);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
