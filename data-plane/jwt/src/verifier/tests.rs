//! Verifier tests against an in-test hyper JWKS server that counts fetches.

use super::*;
use gateway_clock::ManualClock;

use parking_lot::Mutex;
use std::sync::atomic::AtomicUsize;

use bytes::Bytes;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey as _;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::{Value, json};

/// A test signing key with its JWK.
struct TestKey {
    kid: String,
    encoding: EncodingKey,
    x: String,
    raw_public: [u8; 32],
}

impl TestKey {
    fn new(kid: &str, seed: u8) -> Self {
        let signing = SigningKey::from_bytes(&[seed; 32]);
        let der = signing.to_pkcs8_der().unwrap();
        let raw_public = signing.verifying_key().to_bytes();
        Self {
            kid: kid.to_owned(),
            encoding: EncodingKey::from_ed_der(der.as_bytes()),
            x: URL_SAFE_NO_PAD.encode(raw_public),
            raw_public,
        }
    }

    fn jwk(&self) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "x": self.x, "kid": self.kid, "alg": "EdDSA", "use": "sig"})
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        encode(&header, claims, &self.encoding).unwrap()
    }
}

/// What the test JWKS server serves, and how often it was asked.
#[derive(Default)]
struct ServerState {
    body: Mutex<String>,
    fetches: AtomicUsize,
    delay: Mutex<Duration>,
    cache_control: Mutex<Option<&'static str>>,
}

/// JWKS server whose document can be swapped and whose fetches are counted.
struct JwksServer {
    url: String,
    state: Arc<ServerState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_jwks(
    state: Arc<ServerState>,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    state.fetches.fetch_add(1, Ordering::SeqCst);
    let delay = *state.delay.lock();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let body = state.body.lock().clone();
    let mut resp = hyper::Response::new(Full::new(Bytes::from(body)));
    if let Some(cc) = *state.cache_control.lock() {
        resp.headers_mut().insert(
            http::header::CACHE_CONTROL,
            http::HeaderValue::from_static(cc),
        );
    }
    Ok(resp)
}

impl JwksServer {
    async fn start(keys: &[&TestKey]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ServerState::default());
        let shared = state.clone();
        let task = tokio::spawn(async move {
            // Connection tasks live in this set, so aborting the server closes them too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = shared.clone();
                connections.spawn(async move {
                    let svc = service_fn(move |_req| serve_jwks(state.clone()));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        let server = Self {
            url: format!("http://{addr}/.well-known/jwks.json"),
            state,
            task,
        };
        server.publish(keys);
        server
    }

    fn publish(&self, keys: &[&TestKey]) {
        let doc = json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()});
        *self.state.body.lock() = doc.to_string();
    }

    /// Stops the server and waits until it is gone: `abort` alone only asks,
    /// and on a multi-thread runtime the listener (and open keep-alive
    /// connections) can still answer for a moment after it.
    async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    fn fetches(&self) -> usize {
        self.state.fetches.load(Ordering::SeqCst)
    }
}

const NOW: u64 = 1_800_000_000;

fn config(url: &str) -> JwtConfig {
    JwtConfig {
        jwks_url: url.to_owned(),
        leeway: Duration::from_secs(30),
        refresh_cooldown: Duration::from_secs(5),
        // Only the initial fetch; tests drive everything else.
        refresh_interval: Duration::ZERO,
        ..JwtConfig::default()
    }
}

/// A verifier on a manual clock, after its initial background fetch completed.
async fn verifier(server: &JwksServer, cfg: JwtConfig) -> (JwtVerifier, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(NOW)));
    let v = JwtVerifier::with_clock(cfg, clock.clone()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while v.stats().jwks_fetches < 1 || v.inner.generation.load(Ordering::Acquire) < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "initial JWKS fetch never happened"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(server.fetches(), 1);
    (v, clock)
}

fn claims() -> Value {
    json!({
        "sub": "alice", "role": "user", "iss": "gateway-auth", "aud": "gateway",
        "exp": NOW + 900, "iat": NOW, "nbf": NOW, "jti": "j1"
    })
}

fn with(mut c: Value, key: &str, v: Value) -> Value {
    c[key] = v;
    c
}

fn without(mut c: Value, key: &str) -> Value {
    c.as_object_mut().unwrap().remove(key);
    c
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

fn hs256(header: &Value, claims: &Value, secret: &[u8]) -> String {
    let mut h = Header::new(Algorithm::HS256);
    h.kid = header["kid"].as_str().map(String::from);
    encode(&h, claims, &EncodingKey::from_secret(secret).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn claim_validation_table() {
    let key = TestKey::new("k1", 1);
    let other = TestKey::new("k1", 2); // same kid, different key material
    let server = JwksServer::start(&[&key]).await;
    let (v, _clock) = verifier(&server, config(&server.url)).await;
    let jwks_text = server.state.body.lock().clone();

    let good = key.sign(&claims());
    let [h, p, s]: [&str; 3] = good.split('.').collect::<Vec<_>>().try_into().unwrap();
    let evil_payload = b64(&with(claims(), "role", json!("admin")));
    let kid_header = json!({"alg": "HS256", "kid": "k1", "typ": "JWT"});

    let cases: Vec<(&str, String, Result<(), JwtError>)> = vec![
        ("valid", good.clone(), Ok(())),
        (
            "expired within leeway",
            key.sign(&with(claims(), "exp", json!(NOW - 10))),
            Ok(()),
        ),
        (
            "expired",
            key.sign(&with(claims(), "exp", json!(NOW - 31))),
            Err(JwtError::Expired),
        ),
        (
            "nbf within leeway",
            key.sign(&with(claims(), "nbf", json!(NOW + 30))),
            Ok(()),
        ),
        (
            "nbf in the future",
            key.sign(&with(claims(), "nbf", json!(NOW + 31))),
            Err(JwtError::NotYetValid),
        ),
        (
            "wrong iss",
            key.sign(&with(claims(), "iss", json!("evil"))),
            Err(JwtError::WrongIssuer),
        ),
        (
            "wrong aud",
            key.sign(&with(claims(), "aud", json!("other"))),
            Err(JwtError::WrongAudience),
        ),
        (
            "aud list with ours",
            key.sign(&with(claims(), "aud", json!(["x", "gateway"]))),
            Ok(()),
        ),
        (
            "no exp",
            key.sign(&without(claims(), "exp")),
            Err(JwtError::MissingClaim("exp".into())),
        ),
        (
            "no nbf",
            key.sign(&without(claims(), "nbf")),
            Err(JwtError::MissingClaim("nbf".into())),
        ),
        (
            "no iss",
            key.sign(&without(claims(), "iss")),
            Err(JwtError::MissingClaim("iss".into())),
        ),
        (
            "no aud",
            key.sign(&without(claims(), "aud")),
            Err(JwtError::MissingClaim("aud".into())),
        ),
        (
            "no sub",
            key.sign(&without(claims(), "sub")),
            Err(JwtError::MissingClaim("sub".into())),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(&json!({"alg": "none", "kid": "k1"})),
                b64(&claims())
            ),
            Err(JwtError::Malformed("empty signature")),
        ),
        (
            "alg none with junk signature",
            format!(
                "{}.{}.{s}",
                b64(&json!({"alg": "none", "kid": "k1"})),
                b64(&claims())
            ),
            Err(JwtError::DisallowedAlgorithm("none".into())),
        ),
        (
            "HS256 keyed with the raw public key",
            hs256(&kid_header, &claims(), &key.raw_public),
            Err(JwtError::DisallowedAlgorithm("HS256".into())),
        ),
        (
            "HS256 keyed with x",
            hs256(&kid_header, &claims(), key.x.as_bytes()),
            Err(JwtError::DisallowedAlgorithm("HS256".into())),
        ),
        (
            "HS256 keyed with the JWKS text",
            hs256(&kid_header, &claims(), jwks_text.as_bytes()),
            Err(JwtError::DisallowedAlgorithm("HS256".into())),
        ),
        (
            "RS256 header",
            format!("{}.{p}.{s}", b64(&json!({"alg": "RS256", "kid": "k1"}))),
            Err(JwtError::DisallowedAlgorithm("RS256".into())),
        ),
        (
            "tampered payload",
            format!("{h}.{evil_payload}.{s}"),
            Err(JwtError::BadSignature),
        ),
        (
            "signed by another key with the same kid",
            other.sign(&claims()),
            Err(JwtError::BadSignature),
        ),
        (
            "unknown kid",
            TestKey::new("nope", 3).sign(&claims()),
            Err(JwtError::UnknownKid("nope".into())),
        ),
        (
            // One key published: a token without kid is checked against it.
            "no kid, one key",
            format!("{}.{p}.{s}", b64(&json!({"alg": "EdDSA"}))),
            Err(JwtError::BadSignature),
        ),
        (
            "signature cut off",
            format!("{h}.{p}"),
            Err(JwtError::Malformed("expected three dot-separated segments")),
        ),
        (
            "empty signature",
            format!("{h}.{p}."),
            Err(JwtError::Malformed("empty signature")),
        ),
        (
            "four segments",
            format!("{good}.x"),
            Err(JwtError::Malformed("expected three dot-separated segments")),
        ),
        (
            "non-base64 header",
            format!("!!!.{p}.{s}"),
            Err(JwtError::Malformed("header is not base64url")),
        ),
        (
            "header not JSON",
            format!("{}.{p}.{s}", URL_SAFE_NO_PAD.encode("hello")),
            Err(JwtError::Malformed("header is not a JSON object with alg")),
        ),
        (
            "garbage",
            "abc".to_owned(),
            Err(JwtError::Malformed("expected three dot-separated segments")),
        ),
        ("empty", String::new(), Err(JwtError::Missing)),
        (
            "huge",
            "a".repeat(MAX_TOKEN_BYTES + 1),
            Err(JwtError::Malformed("token too long")),
        ),
    ];
    for (name, token, want) in cases {
        let got = v.verify(&token).await.map(|_| ());
        assert_eq!(got, want, "case {name:?}");
    }
    // Truncations: either the base64 or the signature length gives it away; never accepted.
    for cut in 1..=8 {
        let err = v.verify(&good[..good.len() - cut]).await.unwrap_err();
        assert!(
            matches!(err, JwtError::BadSignature | JwtError::Malformed(_)),
            "cut {cut}: {err:?}"
        );
    }
    let id = v.verify(&good).await.unwrap();
    assert_eq!(
        *id,
        Identity::new("alice".into(), "user".into(), NOW + 900).unwrap()
    );
    assert_eq!(id.sub_header(), "alice");
    assert_eq!(id.role_header(), "user");

    assert_eq!(
        v.verify(&key.sign(&without(claims(), "role"))).await,
        Err(JwtError::MissingClaim("role".into()))
    );
    // Claims of the wrong shape are refused, not panicked on.
    for (name, c) in [
        ("exp as string", with(claims(), "exp", json!("soon"))),
        ("sub as number", with(claims(), "sub", json!(7))),
        (
            "sub with a line break",
            with(claims(), "sub", json!("alice\r\nx-user-role: admin")),
        ),
        ("empty role", with(claims(), "role", json!(""))),
        (
            "sub of a client certificate (issue 41, item 15)",
            with(claims(), "sub", json!("mtls:billing-service")),
        ),
    ] {
        let err = v.verify(&key.sign(&c)).await.unwrap_err();
        assert!(
            matches!(err, JwtError::InvalidClaims(_) | JwtError::MissingClaim(_)),
            "{name}: {err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_kid_triggers_one_refresh_and_finds_a_rotated_key() {
    let k1 = TestKey::new("k1", 1);
    let k2 = TestKey::new("k2", 2);
    let server = JwksServer::start(&[&k1]).await;
    let (v, _clock) = verifier(&server, config(&server.url)).await;

    v.verify(&k1.sign(&claims())).await.unwrap();
    assert_eq!(server.fetches(), 1, "known kid needs no fetch");

    server.publish(&[&k1, &k2]);
    let id = v.verify(&k2.sign(&claims())).await.unwrap();
    assert_eq!(id.sub, "alice");
    assert_eq!(server.fetches(), 2, "exactly one refresh for the new kid");
    v.verify(&k2.sign(&with(claims(), "jti", json!("other"))))
        .await
        .unwrap();
    assert_eq!(server.fetches(), 2, "the new key is cached");
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_kids_cannot_hammer_the_auth_service() {
    let k1 = TestKey::new("k1", 1);
    let server = JwksServer::start(&[&k1]).await;
    let (v, clock) = verifier(&server, config(&server.url)).await;
    // Slow fetches make the concurrent callers overlap with the one in flight.
    *server.state.delay.lock() = Duration::from_millis(200);

    let flood = (0..50).map(|i| {
        let v = v.clone();
        let token = TestKey::new(&format!("garbage-{i}"), 9).sign(&claims());
        tokio::spawn(async move { v.verify(&token).await })
    });
    for r in futures_join(flood).await {
        assert!(matches!(r, Err(JwtError::UnknownKid(_))), "{r:?}");
    }
    assert_eq!(
        server.fetches(),
        2,
        "50 garbage kids at once: one shared fetch"
    );

    // Within the cooldown no further fetch happens at all.
    clock.advance(Duration::from_secs(4));
    for i in 0..20 {
        let token = TestKey::new(&format!("more-{i}"), 9).sign(&claims());
        assert!(matches!(
            v.verify(&token).await,
            Err(JwtError::UnknownKid(_))
        ));
    }
    assert_eq!(server.fetches(), 2, "cooldown honoured");

    // After the cooldown one more fetch is allowed, and a genuinely new key is found.
    let k3 = TestKey::new("k3", 3);
    server.publish(&[&k1, &k3]);
    *server.state.delay.lock() = Duration::ZERO;
    clock.advance(Duration::from_secs(1));
    v.verify(&k3.sign(&claims())).await.unwrap();
    assert_eq!(server.fetches(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_with_a_new_kid_share_one_fetch() {
    let k1 = TestKey::new("k1", 1);
    let k2 = TestKey::new("k2", 2);
    let server = JwksServer::start(&[&k1]).await;
    let (v, _clock) = verifier(&server, config(&server.url)).await;
    server.publish(&[&k1, &k2]);
    *server.state.delay.lock() = Duration::from_millis(100);
    let calls = (0..20).map(|i| {
        let v = v.clone();
        let token = k2.sign(&with(claims(), "jti", json!(i)));
        tokio::spawn(async move { v.verify(&token).await })
    });
    for r in futures_join(calls).await {
        assert_eq!(r.unwrap().sub, "alice");
    }
    assert_eq!(server.fetches(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn token_cache_never_serves_past_exp() {
    let k1 = TestKey::new("k1", 1);
    let server = JwksServer::start(&[&k1]).await;
    let cfg = JwtConfig {
        leeway: Duration::ZERO,
        ..config(&server.url)
    };
    let (v, clock) = verifier(&server, cfg).await;
    let token = k1.sign(&with(claims(), "exp", json!(NOW + 60)));

    assert!(v.cached(&token).is_none(), "not verified yet");
    v.verify(&token).await.unwrap();
    assert_eq!(v.stats().cached_tokens, 1);
    assert_eq!(v.cached(&token).unwrap().sub_header(), "alice");
    // Only the exact token hits: the same signature after another payload does not.
    let (_, signature) = token.rsplit_once('.').unwrap();
    assert!(v.cached(&format!("x.y.{signature}")).is_none());
    clock.advance(Duration::from_secs(59));
    assert!(v.verify(&token).await.is_ok(), "cached and still valid");
    clock.advance(Duration::from_secs(1));
    assert!(v.cached(&token).is_none(), "never past exp");
    assert_eq!(v.verify(&token).await, Err(JwtError::Expired));
    assert_eq!(v.stats().cached_tokens, 0, "the expired entry is gone");
    // Each token counts once: a hit where the cache answered (`cached` or
    // `verify`), a miss where `verify` had to check it; a `cached` miss is
    // counted by the `verify` after it.
    assert_eq!((v.stats().cache_hits, v.stats().cache_misses), (2, 2));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_token_is_refused_before_its_signature_or_kid_is_looked_at() {
    let k1 = TestKey::new("k1", 1);
    let server = JwksServer::start(&[&k1]).await;
    let (v, _clock) = verifier(&server, config(&server.url)).await;
    let forge = |token: String| {
        let (signed, _) = token.rsplit_once('.').unwrap();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode([7u8; 64]))
    };
    let expired = with(claims(), "exp", json!(NOW - 31));

    // The same forged signature: refused for the signature while the token is current,
    // for its age once it says it has expired (it never reaches the signature check).
    assert_eq!(
        v.verify(&forge(k1.sign(&claims()))).await,
        Err(JwtError::BadSignature)
    );
    assert_eq!(
        v.verify(&forge(k1.sign(&expired))).await,
        Err(JwtError::Expired)
    );
    // Within the leeway the full check still runs.
    assert_eq!(
        v.verify(&forge(k1.sign(&with(claims(), "exp", json!(NOW - 10)))))
            .await,
        Err(JwtError::BadSignature)
    );
    // An expired token naming a key nobody published asks for no JWKS.
    let unknown = TestKey::new("k9", 9);
    for _ in 0..3 {
        assert_eq!(
            v.verify(&unknown.sign(&expired)).await,
            Err(JwtError::Expired)
        );
    }
    assert_eq!(server.fetches(), 1, "no refresh for an expired token");
    // A payload that is not JSON, or an `exp` that is not a number, gets the full check's answer.
    let [h, _, s]: [String; 3] = k1
        .sign(&claims())
        .split('.')
        .map(String::from)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    assert_eq!(
        v.verify(&format!("{h}.bm90IGpzb24.{s}")).await,
        Err(JwtError::BadSignature)
    );
    let soon = v
        .verify(&k1.sign(&with(claims(), "exp", json!("soon"))))
        .await;
    // (jsonwebtoken reports an `exp` it cannot read as missing.)
    assert!(
        matches!(
            soon,
            Err(JwtError::InvalidClaims(_) | JwtError::MissingClaim(_))
        ),
        "{soon:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn token_cache_is_dropped_for_keys_no_longer_published() {
    let k1 = TestKey::new("k1", 1);
    let k2 = TestKey::new("k2", 2);
    let server = JwksServer::start(&[&k1, &k2]).await;
    let (v, _clock) = verifier(&server, config(&server.url)).await;
    let t1 = k1.sign(&claims());
    let t2 = k2.sign(&claims());
    v.verify(&t1).await.unwrap();
    v.verify(&t2).await.unwrap();
    assert_eq!(v.stats().cached_tokens, 2);

    server.publish(&[&k2]);
    assert_eq!(v.refresh_now().await.unwrap(), 1);
    assert_eq!(v.stats().cached_tokens, 1);
    assert_eq!(v.verify(&t1).await, Err(JwtError::UnknownKid("k1".into())));
    v.verify(&t2).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_service_down_keeps_known_keys_and_reports_unavailable_when_none() {
    let k1 = TestKey::new("k1", 1);
    let server = JwksServer::start(&[&k1]).await;
    let (v, _clock) = verifier(&server, config(&server.url)).await;
    let url = server.url.clone();
    server.stop().await;
    // Known keys keep working while the JWKS endpoint is gone.
    assert!(v.refresh_now().await.is_err());
    v.verify(&k1.sign(&claims())).await.unwrap();

    // A verifier that never got keys says so.
    let clock = Arc::new(ManualClock::new(Duration::from_secs(NOW)));
    let cold = JwtVerifier::with_clock(config(&url), clock).unwrap();
    let err = cold.verify(&k1.sign(&claims())).await.unwrap_err();
    assert!(matches!(err, JwtError::KeysUnavailable(_)), "{err:?}");
    assert_eq!(err.www_authenticate(), r#"Bearer error="invalid_token""#);
}

#[tokio::test(flavor = "multi_thread")]
async fn background_refresh_follows_a_short_max_age() {
    let k1 = TestKey::new("k1", 1);
    let k2 = TestKey::new("k2", 2);
    let server = JwksServer::start(&[&k1]).await;
    *server.state.cache_control.lock() = Some("public, max-age=1");
    let cfg = JwtConfig {
        refresh_interval: Duration::from_secs(60),
        ..config(&server.url)
    };
    let (v, _clock) = verifier(&server, cfg).await;
    // A key published ahead of use is picked up by the periodic refresh (every max-age = 1 s,
    // not every 60 s), without any request having to miss first.
    server.publish(&[&k1, &k2]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while v.stats().keys < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "periodic refresh ignored max-age"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fetches = server.fetches();
    v.verify(&k2.sign(&claims())).await.unwrap();
    assert_eq!(server.fetches(), fetches, "k2 was already known");
}

#[test]
fn claim_paths_reach_nested_and_namespaced_claims() {
    let claims: Claims = serde_json::from_value(json!({
        "sub": "alice",
        "realm_access": {"roles": ["admin", "user"]},
        "https://example.com/roles": ["ops"],
        "n": 7,
    }))
    .unwrap();
    assert_eq!(claim(&claims, "sub"), Some(&json!("alice")));
    assert_eq!(
        claim(&claims, "realm_access.roles"),
        Some(&json!(["admin", "user"]))
    );
    assert_eq!(
        claim(&claims, "https://example.com/roles"),
        Some(&json!(["ops"]))
    );
    assert_eq!(claim(&claims, "realm_access.missing"), None);
    assert_eq!(claim(&claims, "sub.deeper"), None);
    assert_eq!(
        claim_text(&json!(["admin", "user"]), true),
        Ok(Some("admin,user".into()))
    );
    assert_eq!(claim_text(&json!(["admin", 1]), true), Err(()));
    assert_eq!(claim_text(&json!(["admin"]), false), Err(()));
    assert_eq!(claim_text(&json!([]), true), Ok(None));
    assert_eq!(claim_text(&json!(7), false), Err(()));
    assert_eq!(claim_text(&json!({"a": 1}), true), Err(()));
}

#[tokio::test]
async fn the_algorithm_is_pinned_by_the_key_not_by_the_token() {
    let key = TestKey::new("k1", 1);
    let server = JwksServer::start(&[&key]).await;
    // The issuer allows ES256 too, but k1 is an Ed25519 key: only EdDSA verifies with it.
    let cfg = JwtConfig {
        algorithms: vec![Algorithm::EdDSA, Algorithm::ES256],
        ..config(&server.url)
    };
    let (v, _clock) = verifier(&server, cfg).await;
    let good = key.sign(&claims());
    let [_, p, s]: [&str; 3] = good.split('.').collect::<Vec<_>>().try_into().unwrap();
    let es256 = format!("{}.{p}.{s}", b64(&json!({"alg": "ES256", "kid": "k1"})));
    assert_eq!(
        v.verify(&es256).await,
        Err(JwtError::DisallowedAlgorithm("ES256".into()))
    );
    // An algorithm the issuer does not allow is refused before any key lookup.
    let rs256 = format!("{}.{p}.{s}", b64(&json!({"alg": "RS256", "kid": "k1"})));
    assert_eq!(
        v.verify(&rs256).await,
        Err(JwtError::DisallowedAlgorithm("RS256".into()))
    );
    assert!(v.verify(&good).await.is_ok());
}

#[tokio::test]
async fn kid_is_required_once_the_issuer_publishes_two_keys_and_claims_are_mapped() {
    let key = TestKey::new("k1", 1);
    let second = TestKey::new("k2", 2);
    let server = JwksServer::start(&[&key]).await;
    let cfg = JwtConfig {
        user_id_claim: "uid".into(),
        role_claim: "realm_access.roles".into(),
        required_claims: vec!["tenant".into()],
        ..config(&server.url)
    };
    let (v, _clock) = verifier(&server, cfg).await;
    let claims = with(
        with(
            with(claims(), "uid", json!("u-7")),
            "realm_access",
            json!({"roles": ["admin", "user"]}),
        ),
        "tenant",
        json!("acme"),
    );
    let no_kid = |c: &Value| encode(&Header::new(Algorithm::EdDSA), c, &key.encoding).unwrap();
    let id = v.verify(&no_kid(&claims)).await.unwrap();
    assert_eq!((id.sub.as_str(), id.role.as_str()), ("u-7", "admin,user"));
    assert_eq!(
        v.verify(&no_kid(&without(claims.clone(), "tenant"))).await,
        Err(JwtError::MissingClaim("tenant".into()))
    );
    assert_eq!(
        v.verify(&no_kid(&without(claims.clone(), "realm_access")))
            .await,
        Err(JwtError::MissingClaim("realm_access.roles".into()))
    );

    server.publish(&[&key, &second]);
    v.refresh_now().await.unwrap();
    let fresh = with(claims.clone(), "jti", json!("another"));
    assert_eq!(v.verify(&no_kid(&fresh)).await, Err(JwtError::MissingKid));
    assert!(v.verify(&key.sign(&fresh)).await.is_ok());
}

#[test]
fn config_is_validated() {
    let bad = |url: &str| {
        JwtVerifier::new(JwtConfig {
            jwks_url: url.into(),
            ..JwtConfig::default()
        })
        .unwrap_err()
    };
    assert!(
        bad("ftp://auth/.well-known/jwks.json")
            .to_string()
            .contains("http:// or https://")
    );
    assert!(
        bad("/.well-known/jwks.json")
            .to_string()
            .contains("absolute")
    );
    assert!(bad("not a url at all").to_string().contains("jwks_url"));
    let empty_iss = JwtVerifier::new(JwtConfig {
        issuer: String::new(),
        ..JwtConfig::default()
    })
    .unwrap_err();
    assert_eq!(empty_iss, JwtConfigError::Empty("issuer"));
}

async fn futures_join<T: Send + 'static>(
    handles: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles.collect::<Vec<_>>() {
        out.push(h.await.unwrap());
    }
    out
}

/// Issue 41, item 14: a discovery document's `jwks_uri` must be on the discovery URL's host
/// or on one of the issuer's `jwks_hosts`.
#[tokio::test(flavor = "multi_thread")]
async fn a_discovery_documents_jwks_uri_is_held_to_the_discovery_host_or_jwks_hosts() {
    for (jwks_hosts, refused) in [(vec![], true), (vec!["LOCALHOST".to_owned()], false)] {
        let server = JwksServer::start(&[]).await;
        let port = server
            .url
            .split(':')
            .nth(2)
            .unwrap()
            .split('/')
            .next()
            .unwrap();
        // Every path answers this document: the discovery URL, and the JWKS when it is fetched
        // (where it is no key set, so that fetch fails too, but only after the GET).
        *server.state.body.lock() = json!({
            "issuer": "gateway-auth",
            "jwks_uri": format!("http://localhost:{port}/jwks"),
        })
        .to_string();
        let v = JwtVerifier::new(JwtConfig {
            jwks_url: String::new(),
            discovery_url: server.url.clone(),
            jwks_hosts,
            ..config(&server.url)
        })
        .unwrap();
        let err = v.refresh_now().await.unwrap_err().to_string();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        // The background fetch and refresh_now each failed once.
        while v.stats().jwks_fetch_failures < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fetches never ended"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if refused {
            assert!(
                err.contains("neither the discovery URL's nor one of the issuer's jwks_hosts"),
                "{err}"
            );
            assert_eq!(
                server.fetches(),
                2,
                "only the discovery documents were fetched"
            );
        } else {
            assert!(!err.contains("jwks_hosts"), "{err}");
            assert_eq!(
                server.fetches(),
                4,
                "each fetch read the JWKS at the allowed host"
            );
        }
        server.stop().await;
    }
}
