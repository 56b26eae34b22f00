//! Route matching cost with 10 and with 10,000 routes: it must not grow with
//! the table (the lookup probes one hash map per segment of the request path).
//!
//! Run: `cargo bench -p data-plane --bench router`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use data_plane::policy::router::Router;
use http::Method;

/// A table shaped like a real one: per-service prefixes two segments deep,
/// a tenth of them host-bound, a few with explicit methods, and a catch-all.
fn table(n: usize) -> Router<usize> {
    let mut r = Router::new();
    for i in 0..n {
        let hosts: Vec<String> = if i % 10 == 0 {
            vec![format!("svc{i}.example.com")]
        } else {
            Vec::new()
        };
        let methods: Vec<Method> = if i % 7 == 0 {
            vec![Method::GET, Method::POST]
        } else {
            Vec::new()
        };
        r.insert(&hosts, &format!("/api/svc{i}"), &methods, i)
            .unwrap();
    }
    r.insert(&["*.example.com".to_string()], "/", &[], n)
        .unwrap();
    r.insert(&[], "/", &[], n + 1).unwrap();
    r
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("router");
    for n in [10usize, 10_000] {
        let r = table(n);
        let last = n - 1;
        let hit = format!("/api/svc{last}/orders/12345/items");
        let miss = "/static/assets/app/main.js".to_string();
        let host_hit = format!("/api/svc{}/x", (n - 1) / 10 * 10);
        let host = format!("svc{}.example.com", (n - 1) / 10 * 10);
        group.bench_with_input(BenchmarkId::new("deep_hit", n), &hit, |b, p| {
            b.iter(|| {
                r.find(
                    black_box(Some("gw.local")),
                    black_box(&Method::GET),
                    black_box(p),
                )
            })
        });
        group.bench_with_input(BenchmarkId::new("fallback_to_root", n), &miss, |b, p| {
            b.iter(|| {
                r.find(
                    black_box(Some("gw.local")),
                    black_box(&Method::GET),
                    black_box(p),
                )
            })
        });
        group.bench_with_input(BenchmarkId::new("exact_host_hit", n), &host_hit, |b, p| {
            b.iter(|| {
                r.find(
                    black_box(Some(host.as_str())),
                    black_box(&Method::GET),
                    black_box(p),
                )
            })
        });
        group.bench_with_input(BenchmarkId::new("wildcard_host", n), &miss, |b, p| {
            b.iter(|| {
                r.find(
                    black_box(Some("a.b.example.com")),
                    black_box(&Method::GET),
                    black_box(p),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
