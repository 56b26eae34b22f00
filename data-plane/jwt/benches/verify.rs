//! Cost of verifying one access token: with the verified-token cache (the steady state of a
//! client reusing its token) and without it (a full signature check every time), for EdDSA
//! (the auth service's tokens), RS256 (RSA 2048) and ES256 (P-256), what OpenID Connect
//! issuers sign with.
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

/// One algorithm's case: its JWK, the header algorithm, the signing key.
struct Case {
    name: &'static str,
    alg: Algorithm,
    jwk: String,
    key: EncodingKey,
}

fn cases() -> Vec<Case> {
    let signing = SigningKey::from_bytes(&[42; 32]);
    let x = URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes());
    let der = signing.to_pkcs8_der().unwrap();
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    // The uncompressed point: 0x04, x, y.
    let point = ec.public_key_raw();
    let (ex, ey) = (
        URL_SAFE_NO_PAD.encode(&point[1..33]),
        URL_SAFE_NO_PAD.encode(&point[33..65]),
    );
    vec![
        Case {
            name: "eddsa",
            alg: Algorithm::EdDSA,
            jwk: format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"k1","use":"sig"}}"#),
            key: EncodingKey::from_ed_der(der.as_bytes()),
        },
        Case {
            name: "rs256",
            alg: Algorithm::RS256,
            jwk: format!(r#"{{"kty":"RSA","n":"{RSA_1_N}","e":"AQAB","kid":"k1","use":"sig"}}"#),
            key: EncodingKey::from_rsa_pem(RSA_1_PEM.as_bytes()).unwrap(),
        },
        Case {
            name: "es256",
            alg: Algorithm::ES256,
            jwk: format!(
                r#"{{"kty":"EC","crv":"P-256","x":"{ex}","y":"{ey}","kid":"k1","use":"sig"}}"#
            ),
            key: EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap(),
        },
    ]
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "sub": "alice", "role": "user", "iss": "gateway-auth", "aud": "gateway",
        "exp": now + 3600, "iat": now, "nbf": now, "jti": "bench"
    });
    let mut group = c.benchmark_group("verify");
    for case in cases() {
        let url = rt.block_on(jwks_server(format!(r#"{{"keys":[{}]}}"#, case.jwk)));
        let mut header = Header::new(case.alg);
        header.kid = Some("k1".into());
        let token = jsonwebtoken::encode(&header, &claims, &case.key).unwrap();
        // Signed by the same key, expired an hour ago: refused before the signature check.
        let mut old = claims.clone();
        old["exp"] = serde_json::json!(now - 3600);
        let expired = jsonwebtoken::encode(&header, &old, &case.key).unwrap();

        let make = |capacity: usize| {
            let url = url.clone();
            rt.block_on(async move {
                let v = JwtVerifier::new(JwtConfig {
                    jwks_url: url,
                    algorithms: vec![case.alg],
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

        // EdDSA keeps the names of earlier sessions (`verify/cached` ...).
        let label = |what: &str| {
            if case.name == "eddsa" {
                what.to_owned()
            } else {
                format!("{}-{what}", case.name)
            }
        };
        group.bench_function(label("cached"), |b| {
            b.iter(|| ready(cached.verify(black_box(&token))).unwrap())
        });
        group.bench_function(label("uncached"), |b| {
            b.iter(|| ready(uncached.verify(black_box(&token))).unwrap())
        });
        group.bench_function(label("expired"), |b| {
            b.iter(|| ready(uncached.verify(black_box(&expired))).unwrap_err())
        });
    }
    group.finish();
}

/// A fixed 2048-bit RSA test key: PKCS#8 PEM and the JWK's `n`.
const RSA_1_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIEvwIBADANBgkqhkiG9w0BAQEFAASCBKkwggSlAgEAAoIBAQDeExl6XZ9+serZ
Gy2+3LJPl2MH+3RTyAPRgmvYrdltY5XvxdY/ASNCReHEFRay4+/RnCckS7a3ipaZ
eDwErGEkz91LnpteHLRnwRMmA+ZmCJi+IaNonhzOY5xCZHf8YzbN2F4xq4EDNfLm
pPGJulWVYDgKdvBQgIbp3sjwUxghKzIIkNHVHxcJf5+rKVdt6GUmNgVpzfridcLp
c3OuzbAzOs5n55kzhSAvjYS4QSgPuoP7XGykwo76CZgDxzFDiwE4IrrWDZFmlQqF
m6U1DUB9o9ixsS/lcetFr2kxNDhTIy8thpGdJUFQuiR0MSsuMuuprvUT9yOyF1Ij
u8s1GRwJAgMBAAECggEAYBLSPGqBhF2zVK6Z6U7wQ1eii8MAzfgjksGCJ7D6dgUV
yjAEIqi62MKDzAE1mznaOAv+sQiiaSAnTAjEql7q/fKBceQRojL350UTpCgexnik
n+jMmYeBvdZBNUXi1MkVXhNjmMhyHXH6/kZQin2W5fNE+13+VE1uUIJF2xaPw1Tu
bcCavQ8mY2TrdkI0Bb0VZhRN5K4tM0lXzLL7MW2PZvATZp4e5+OA3qtfLt8wKwwf
IkIPmeuBwrT98omfZaKQAa0gJ+FHo0Ex6rKjY8tRhgGqmtwmJ31wVCI8P5eHdmxM
jaVr1XpNTS/8vBmpG6XIN0Y4f8j7WShnJRjvuwdRgwKBgQD+BSKSFEhLeE+b3qbU
g0DV/h7Q4AJCM1uiZyt2d+bnOeBh2x1AGQ1XfkIqg+mZw/3vL8y4qgNQdB36U4Ba
W7Tts0fq5EPdw5MuSvDLrGiN9cteitNJfcp5BnIwO9lj+YuAtBDXcXD4+xyE8Edw
WUcyYBu5XNtu3vE+xdCnhNoREwKBgQDfzjirgGhkK0SRCnLTPaQM1RaIZZ/N9iue
yUVJLYW8g4btAs5jbsUMg4Oh8ruLcMRpk/r9NftncQP5rqMlO0HbOpanCH8zpKk/
DNERymxxU/UqmG3ZAkO3TlzKIsBEc8eAFT7DIhLItP0H3DuhtbHAzJbVXECRGX0D
0+AEWl1d8wKBgQC1G+goCrn4xRDNaxO7VNF3QTWrautxU7izs6czUg2ZMpSecGEM
gFAY33ZBZce50BlO3d+ykdTHGeL9xWcwBU6cY0SVXqZciMJ5MQk5zfTFskeLYqN+
NGeVnljvttwqAZPK8ZdIZCNOAYu15LKqkZzHd+qMYH47ME0EmnlH1tq7bQKBgQCn
9RyEYI53Nh1z9/JqY2UdGEGbxSBjsi3UMVok69vkuJRmhGedKYEJvhzoScDDibJt
RVfj9UIhxCfmlk/rXggzXUm4OuEzQYyeO6EfB9nQRuDDwbcWV+O3ykBKlj/SX01F
6yu5x3VvWJxX7Mh3uGKYvTEpF92Axy8R00zYF3TgTwKBgQCJNzUooEEYP4tUmw0h
Scq88+aELYhc53Q32ZYrP3SCuAMAMy7Mq8HiffszkvTnBq5yZBhWtSp105t4aorS
cBOjk177Z7sKrAl76k8WFj0cXGvbtlKTYHCKaWfkbxNZ976PzcOGklGuioYrTJzs
iiOnIIQ/kSqhlhNvK7P2Td7YLA==
-----END PRIVATE KEY-----\n";
const RSA_1_N: &str = "3hMZel2ffrHq2RstvtyyT5djB_t0U8gD0YJr2K3ZbWOV78XWPwEjQkXhxBUWsuPv0ZwnJEu2t4qWmXg8BKxhJM_dS56bXhy0Z8ETJgPmZgiYviGjaJ4czmOcQmR3_GM2zdheMauBAzXy5qTxibpVlWA4CnbwUICG6d7I8FMYISsyCJDR1R8XCX-fqylXbehlJjYFac364nXC6XNzrs2wMzrOZ-eZM4UgL42EuEEoD7qD-1xspMKO-gmYA8cxQ4sBOCK61g2RZpUKhZulNQ1AfaPYsbEv5XHrRa9pMTQ4UyMvLYaRnSVBULokdDErLjLrqa71E_cjshdSI7vLNRkcCQ";

criterion_group!(benches, bench);
criterion_main!(benches);
