//! Per-request cost of the identity stages: checking an `X-API-Key` against
//! 10 and 10,000 keys (one SHA-256 and one hash-map probe, whatever the table
//! size) and signing a forwarded request (`X-Gateway-Signature` v3,
//! HMAC-SHA256 from the key state precomputed per snapshot): a bodiless one
//! (the usual case), and one whose 1 KiB body the gateway holds (hashed too).
//!
//! Run: `cargo bench -p data-plane --bench identity`.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use data_plane::policy::api_key::{ApiKeys, X_API_KEY};
use data_plane::policy::signature::{SignedBody, Signer};
use gateway_proto::v1::ApiKey;
use http::header::{HeaderMap, HeaderValue};
use sha2::{Digest as _, Sha256};

fn key(i: usize) -> String {
    format!("gw_{:064x}", i)
}

fn table(n: usize) -> ApiKeys {
    let keys: Vec<ApiKey> = (0..n)
        .map(|i| ApiKey {
            name: format!("key-{i}"),
            subject: format!("svc-{i}"),
            role: "service".into(),
            key_sha256: gateway_hex::encode(Sha256::digest(key(i).as_bytes())),
            ..Default::default()
        })
        .collect();
    ApiKeys::compile(&keys).expect("valid keys")
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("api_key");
    for n in [10usize, 10_000] {
        let keys = table(n);
        let mut hit = HeaderMap::new();
        hit.insert(&X_API_KEY, HeaderValue::from_str(&key(n - 1)).unwrap());
        let mut miss = HeaderMap::new();
        miss.insert(&X_API_KEY, HeaderValue::from_str(&key(n + 1)).unwrap());
        group.bench_with_input(BenchmarkId::new("valid", n), &hit, |b, h| {
            b.iter(|| black_box(keys.verify(black_box(h)).is_ok()))
        });
        group.bench_with_input(BenchmarkId::new("unknown", n), &miss, |b, h| {
            b.iter(|| black_box(keys.verify(black_box(h)).is_err()))
        });
    }
    group.finish();

    let signer = Signer::new(&"s".repeat(64), "orders").expect("a secret");
    let mut headers = HeaderMap::new();
    headers.insert("x-user-id", HeaderValue::from_static("svc-billing"));
    headers.insert("x-user-role", HeaderValue::from_static("service"));
    c.bench_function("signature/sign", |b| {
        b.iter(|| {
            signer.sign(
                black_box(&mut headers),
                "GET",
                black_box("/orders/12345/items"),
                SignedBody::Whole(b""),
                1_700_000_000,
            )
        })
    });
    let body = vec![b'x'; 1024];
    c.bench_function("signature/sign_1k_body", |b| {
        b.iter(|| {
            signer.sign(
                black_box(&mut headers),
                "PUT",
                black_box("/orders/12345/items"),
                SignedBody::Whole(black_box(&body)),
                1_700_000_000,
            )
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
