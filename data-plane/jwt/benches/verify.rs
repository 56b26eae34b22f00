//! Cost of verifying one access token: with the verified-token cache (the steady state of a
//! client reusing its token) and without it (full EdDSA signature check every time).
//!
//! `cargo bench -p gateway-jwt --bench verify`
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use criterion::{Criterion, criterion_group, criterion_main};
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey as _;
use gateway_jwt::{JwtConfig, JwtVerifier};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Serves one fixed JWKS document over HTTP/1.1 (one response per connection).
async fn jwks_server(jwks: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let response = Arc::new(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{jwks}",
        jwks.len()
    ));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/.well-known/jwks.json")
}

/// Polls a future that is expected to complete without waiting (keys already loaded), so the
/// measurement is the verification itself, not an executor round trip.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("verification waited: keys were not loaded"),
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let signing = SigningKey::from_bytes(&[42; 32]);
    let x = URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes());
    let jwks = format!(
        r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"k1","alg":"EdDSA","use":"sig"}}]}}"#
    );
    let url = rt.block_on(jwks_server(jwks));

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "sub": "alice", "role": "user", "iss": "gateway-auth", "aud": "gateway",
        "exp": now + 3600, "iat": now, "nbf": now, "jti": "bench"
    });
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some("k1".into());
    let der = signing.to_pkcs8_der().unwrap();
    let token =
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ed_der(der.as_bytes())).unwrap();
    // Signed by the same key, expired an hour ago: refused before the signature check.
    let mut old = claims.clone();
    old["exp"] = serde_json::json!(now - 3600);
    let expired =
        jsonwebtoken::encode(&header, &old, &EncodingKey::from_ed_der(der.as_bytes())).unwrap();

    let make = |capacity: usize| {
        let url = url.clone();
        rt.block_on(async move {
            let v = JwtVerifier::new(JwtConfig {
                jwks_url: url,
                cache_capacity: capacity,
                refresh_interval: Duration::ZERO,
                ..JwtConfig::default()
            })
            .unwrap();
            v.refresh_now().await.unwrap();
            v
        })
    };
    let cached = make(10_000);
    let uncached = make(0);
    ready(cached.verify(&token)).unwrap();
    ready(uncached.verify(&token)).unwrap();

    let mut group = c.benchmark_group("verify");
    group.bench_function("cached", |b| {
        b.iter(|| ready(cached.verify(black_box(&token))).unwrap())
    });
    group.bench_function("uncached", |b| {
        b.iter(|| ready(uncached.verify(black_box(&token))).unwrap())
    });
    group.bench_function("expired", |b| {
        b.iter(|| ready(uncached.verify(black_box(&expired))).unwrap_err())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
