//! Route matching cost with 10 and with 10,000 routes: it must not grow with
//! the table (the lookup probes one hash map per segment of the request path).
//! The `router_match` group does the same with routes that have a `match` of
//! four header matchers beside each plain route (issue 29): the conditions are
//! checked only at the slot the path leads to.
//!
//! Run: `cargo bench -p data-plane --bench router`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use data_plane::policy::matching::{MatchInput, RequestMatch};
use data_plane::policy::router::Router;
use gateway_proto::v1::{MatchMode, Matcher, RouteMatch};
use http::{HeaderMap, HeaderValue, Method};

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

/// Four header matchers, as the bench route of scripts/bench has.
fn four_headers() -> Arc<RequestMatch> {
    let m = |name: &str, value: &str| Matcher {
        name: name.into(),
        value: value.into(),
        mode: MatchMode::Exact as i32,
    };
    Arc::new(RequestMatch::new(&RouteMatch {
        headers: vec![
            m("accept-version", "2"),
            m("x-tenant", "acme"),
            m("x-region", "eu"),
            m("x-plan", "gold"),
        ],
        ..Default::default()
    }))
}

/// [`table`] where every service prefix also has a route with four header matchers.
fn matching_table(n: usize) -> Router<usize> {
    let mut r = Router::new();
    for i in 0..n {
        let prefix = format!("/api/svc{i}");
        r.insert(&[], &prefix, &[], 2 * i).unwrap();
        r.insert_matching(&[], &prefix, &[], Some(four_headers()), 2 * i + 1)
            .unwrap();
    }
    r.insert(&[], "/", &[], 2 * n).unwrap();
    r
}

fn bench_match(c: &mut Criterion) {
    let mut group = c.benchmark_group("router_match");
    let mut all = HeaderMap::new();
    for (k, v) in [
        ("accept-version", "2"),
        ("x-tenant", "acme"),
        ("x-region", "eu"),
        ("x-plan", "gold"),
        ("user-agent", "bench"),
        ("accept", "*/*"),
    ] {
        all.insert(k, HeaderValue::from_static(v));
    }
    let mut plain = all.clone();
    plain.remove("x-plan");
    for n in [10usize, 10_000] {
        let r = matching_table(n);
        let path = format!("/api/svc{}/orders/12345", n - 1);
        for (name, headers, want) in [
            ("four_match", &all, 2 * (n - 1) + 1),
            ("fall_to_plain", &plain, 2 * (n - 1)),
        ] {
            let input = MatchInput {
                headers,
                query: Some("page=2"),
            };
            assert_eq!(
                r.find_matching(None, &Method::GET, &path, &input),
                Some(&want)
            );
            group.bench_with_input(BenchmarkId::new(name, n), &path, |b, p| {
                b.iter(|| {
                    r.find_matching(
                        black_box(Some("gw.local")),
                        black_box(&Method::GET),
                        black_box(p),
                        black_box(&input),
                    )
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench, bench_match);
criterion_main!(benches);
