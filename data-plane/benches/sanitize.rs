//! Per-request cost of header sanitising at the trust boundary
//! (`data_plane::policy::sanitize`): hop-by-hop and client-forged identity headers
//! removed, `X-Request-Id` kept or made, `X-Forwarded-For` / `-Proto` set.
//!
//! * `typical`: what a browser or API client sends (host, user agent, accept,
//!   accept-encoding, authorization, cookie, a valid `X-Request-Id`): nothing
//!   to remove, the id is kept;
//! * `hostile`: the same plus `Connection` naming a header, `Keep-Alive`,
//!   `TE`, `Upgrade`, a forged `X-User-Id` / `X-User-Role`, an existing
//!   `X-Forwarded-For` chain and an invalid `X-Request-Id` (replaced);
//! * `response`: an upstream answer's hop-by-hop removal, for the responses
//!   whose fields become a map (`response_head.rs`).
//!
//! Each iteration gets a fresh copy of the map (not timed).
//!
//! Run: `cargo bench -p data-plane --bench sanitize`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use data_plane::policy::sanitize::{Strip, ensure_request_id, remove_hop_by_hop, set_forwarded};
use gateway_transport::server::Scheme;
use http::header::{HeaderMap, HeaderName, HeaderValue};

fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in fields {
        h.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    h
}

const TYPICAL: &[(&str, &str)] = &[
    ("host", "api.example.com"),
    (
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    ),
    ("accept", "application/json"),
    ("accept-encoding", "gzip, deflate, br"),
    (
        "authorization",
        "Bearer eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl",
    ),
    ("cookie", "session=abc123; theme=dark"),
    ("x-request-id", "3f2a9c1e-7b4d-4e8a-9f0c-1d2e3f4a5b6c"),
];

const HOSTILE: &[(&str, &str)] = &[
    ("host", "api.example.com"),
    ("user-agent", "curl/8.5.0"),
    ("accept", "*/*"),
    ("connection", "keep-alive, X-Secret, Upgrade"),
    ("x-secret", "1"),
    ("keep-alive", "timeout=5"),
    ("te", "trailers"),
    ("upgrade", "h2c"),
    ("x-user-id", "admin"),
    ("x-user-role", "admin"),
    ("x-forwarded-for", "198.51.100.7, 203.0.113.9"),
    ("x-request-id", "not a valid id!"),
];

const RESPONSE: &[(&str, &str)] = &[
    ("server", "nginx/1.22.1"),
    ("date", "Wed, 02 Dec 2026 07:00:00 GMT"),
    ("content-type", "application/json"),
    ("content-length", "512"),
    ("connection", "keep-alive"),
    ("keep-alive", "timeout=5"),
    ("cache-control", "no-store"),
];

fn bench(c: &mut Criterion) {
    let peer = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10));
    let mut group = c.benchmark_group("sanitize");
    for (name, fields) in [("typical", TYPICAL), ("hostile", HOSTILE)] {
        let headers = map(fields);
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || headers.clone(),
                |h| {
                    let size = remove_hop_by_hop(
                        h,
                        Strip::Request {
                            trusted_peer: false,
                        },
                    );
                    let id = ensure_request_id(h);
                    set_forwarded(h, None, peer, false, Scheme::Http);
                    black_box((size, id));
                },
                BatchSize::SmallInput,
            )
        });
    }
    let response = map(RESPONSE);
    group.bench_function("response", |b| {
        b.iter_batched_ref(
            || response.clone(),
            |h| black_box(remove_hop_by_hop(h, Strip::Response)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
