//! API tests: the router driven in-process against a real SQLite file and a real redis-server.

use super::*;
use crate::client_addr::TrustedProxies;
use crate::keys::{KeyRing, RotationPolicy};
use crate::refresh::RefreshStore;
use crate::testutil::{RedisServer, connection_manager, start_redis};
use crate::throttle::{LoginThrottle, ThrottleConfig};
use crate::tokens::TokenIssuer;
use crate::users::UserStore;
use gateway_clock::SystemClock;
use parking_lot::RwLock;
use tokio::net::TcpListener;

struct Fixture {
    _dir: tempfile::TempDir,
    redis: RedisServer,
    service: Arc<AuthService>,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let redis = start_redis().await;
    let users = UserStore::open(&dir.path().join("auth.db")).await.unwrap();
    users
        .add_user("alice", "user", "wonderland".into(), false)
        .await
        .unwrap();
    let now = SystemClock.unix_secs();
    let ring = KeyRing::load_or_init(
        &dir.path().join("keys"),
        RotationPolicy::new(Duration::from_secs(3600), Duration::from_secs(120)),
        now,
    )
    .unwrap();
    let service = Arc::new(AuthService::new(
        users,
        Arc::new(RwLock::new(ring)),
        TokenIssuer {
            issuer: "gateway-auth".into(),
            audience: "gateway".into(),
        },
        RefreshStore::new(connection_manager(&redis)),
        LoginThrottle::new(
            connection_manager(&redis),
            ThrottleConfig {
                user_failures: 3,
                ip_failures: 5,
                name_failures: 0,
                slowdown: Duration::from_secs(1),
                window: Duration::from_secs(60),
            },
        ),
        Arc::new(SystemClock),
    ));
    Fixture {
        _dir: dir,
        redis,
        service,
    }
}

use gateway_clock::Clock as _;

fn post(path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

async fn call(
    f: &Fixture,
    req: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, serde_json::Value) {
    call_from(f, CLIENT, req).await
}

/// The client address of requests sent with [`call`].
const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

async fn call_from(
    f: &Fixture,
    client: IpAddr,
    req: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, serde_json::Value) {
    let resp = handle(&f.service, client, req).await;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let json = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
        })
    };
    (parts.status, parts.headers, json)
}

async fn login(f: &Fixture) -> serde_json::Value {
    let (status, headers, body) = call(
        f,
        post(
            "/auth/login",
            r#"{"username":"alice","password":"wonderland"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers[header::CACHE_CONTROL], "no-store");
    body
}

fn assert_problem(
    status: StatusCode,
    headers: &http::HeaderMap,
    body: &serde_json::Value,
    want: StatusCode,
) {
    assert_eq!(status, want, "{body}");
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(body["status"], want.as_u16());
    assert!(
        body["type"]
            .as_str()
            .unwrap()
            .starts_with(crate::problem::PROBLEM_TYPE_BASE)
    );
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn login_returns_a_bearer_pair() {
    let f = fixture().await;
    let body = login(&f).await;
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 900);
    assert_eq!(body["refresh_expires_in"], 7 * 24 * 3600);
    assert_eq!(body["access_token"].as_str().unwrap().split('.').count(), 3);
    assert_eq!(body["refresh_token"].as_str().unwrap().len(), 43);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_user_and_wrong_password_are_indistinguishable() {
    let f = fixture().await;
    let (s1, h1, b1) = call(
        &f,
        post("/auth/login", r#"{"username":"alice","password":"nope"}"#),
    )
    .await;
    let (s2, h2, b2) = call(
        &f,
        post("/auth/login", r#"{"username":"mallory","password":"nope"}"#),
    )
    .await;
    assert_problem(s1, &h1, &b1, StatusCode::UNAUTHORIZED);
    assert_problem(s2, &h2, &b2, StatusCode::UNAUTHORIZED);
    assert_eq!(b1, b2);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_400_problem_json_never_500() {
    let f = fixture().await;
    let oversized = format!(
        r#"{{"username":"alice","password":"{}"}}"#,
        "x".repeat(MAX_BODY_BYTES)
    );
    let cases: Vec<(&str, Request<Full<Bytes>>, &str)> = vec![
        ("not json", post("/auth/login", "{nope"), "invalid JSON"),
        (
            "missing field",
            post("/auth/login", r#"{"username":"alice"}"#),
            "missing field `password`",
        ),
        (
            "wrong type",
            post("/auth/login", r#"{"username":1,"password":"x"}"#),
            "invalid type",
        ),
        ("empty", post("/auth/login", ""), "empty request body"),
        ("array", post("/auth/refresh", "[]"), "invalid JSON"),
        (
            "unknown field",
            post("/auth/refresh", r#"{"refresh_token":"x","extra":1}"#),
            "unknown field",
        ),
        (
            "missing token",
            post("/auth/logout", "{}"),
            "missing field `refresh_token`",
        ),
        (
            "null token",
            post("/auth/refresh", r#"{"refresh_token":null}"#),
            "invalid type",
        ),
        (
            "oversized, no length",
            post("/auth/login", oversized.clone()),
            "exceeds 16384",
        ),
        (
            "oversized, announced",
            Request::post("/auth/login")
                .header(header::CONTENT_LENGTH, oversized.len())
                .body(Full::new(Bytes::from(oversized)))
                .unwrap(),
            "exceeds 16384",
        ),
        (
            "bad length",
            Request::post("/auth/login")
                .header(header::CONTENT_LENGTH, "lots")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap(),
            "Content-Length",
        ),
        (
            "not utf-8",
            post("/auth/login", &b"\xff\xfe"[..]),
            "invalid JSON",
        ),
    ];
    for (name, req, detail) in cases {
        let (status, headers, body) = call(&f, req).await;
        assert_problem(status, &headers, &body, StatusCode::BAD_REQUEST);
        let got = body["detail"].as_str().unwrap();
        assert!(
            got.contains(detail),
            "{name}: detail {got:?} lacks {detail:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn refresh_rotates_and_replay_burns_the_family() {
    let f = fixture().await;
    let first = login(&f).await;
    let body = |t: &serde_json::Value| format!(r#"{{"refresh_token":{t}}}"#);
    let (status, _, second) = call(&f, post("/auth/refresh", body(&first["refresh_token"]))).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_ne!(second["refresh_token"], first["refresh_token"]);
    assert_eq!(second["token_type"], "Bearer");

    let (status, h, b) = call(&f, post("/auth/refresh", body(&first["refresh_token"]))).await;
    assert_problem(status, &h, &b, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(&f, post("/auth/refresh", body(&second["refresh_token"]))).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "newest token of a burnt family must die too"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn logout_is_204_and_revokes_the_family() {
    let f = fixture().await;
    let pair = login(&f).await;
    let body = format!(r#"{{"refresh_token":{}}}"#, pair["refresh_token"]);
    let (status, _, b) = call(&f, post("/auth/logout", body.clone())).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(b.is_null());
    let (status, _, _) = call(&f, post("/auth/refresh", body.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Logging out twice, or with a token never issued, is still fine.
    let (status, _, _) = call(&f, post("/auth/logout", body)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = call(&f, post("/auth/logout", r#"{"refresh_token":"nonsense"}"#)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn jwks_is_cacheable_and_public_only() {
    let f = fixture().await;
    let req = Request::get("/.well-known/jwks.json")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, body) = call(&f, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CACHE_CONTROL], "public, max-age=60");
    let keys = body["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    assert!(keys[0].get("d").is_none());
    assert_eq!(keys[0]["kty"], "OKP");
    assert_eq!(keys[0]["crv"], "Ed25519");
    assert_eq!(keys[0]["use"], "sig");

    // The access token names that key.
    let token = login(&f).await["access_token"].as_str().unwrap().to_owned();
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!(header.kid.as_deref(), keys[0]["kid"].as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_paths_and_methods() {
    let f = fixture().await;
    let (s, h, b) = call(
        &f,
        Request::get("/nope").body(Full::new(Bytes::new())).unwrap(),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);
    let (s, h, b) = call(
        &f,
        Request::get("/auth/login")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(h[header::ALLOW], "POST");
    let (s, _, b) = call(
        &f,
        Request::get("/healthz")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, b),
        (StatusCode::OK, serde_json::Value::String("ok\n".into()))
    );
}

/// The fixture allows 3 failures per name from one address and 5 per address within 60 s.
#[tokio::test(flavor = "multi_thread")]
async fn failed_logins_are_throttled_with_429_problem_json_and_retry_after() {
    let f = fixture().await;
    let wrong = r#"{"username":"alice","password":"queen"}"#;
    let right = r#"{"username":"alice","password":"wonderland"}"#;
    for i in 0..3 {
        let (s, h, b) = call(&f, post("/auth/login", wrong)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "failure {i}: {b}");
        assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    }
    // The name is blocked from that address, even with the right password (issue 41: other
    // addresses still log in, below).
    let other = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7));
    for (client, body) in [(CLIENT, wrong), (CLIENT, right)] {
        let (s, h, b) = call_from(&f, client, post("/auth/login", body)).await;
        assert_problem(s, &h, &b, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(b["type"], "urn:gateway:problem:too-many-failed-logins");
        assert_eq!(b["title"], "Too many failed logins");
        let retry: u64 = h[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        assert!(
            b["detail"]
                .as_str()
                .unwrap()
                .contains(&format!("retry in {retry} s")),
            "{b}"
        );
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
    }
    // The right password from another address: in.
    let (s, _, b) = call_from(&f, other, post("/auth/login", right)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // The address has 3 failures: two more on other names, then it is blocked too.
    for name in ["bob", "carol"] {
        let body = format!(r#"{{"username":"{name}","password":"x"}}"#);
        let (s, _, b) = call(&f, post("/auth/login", body)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
    }
    let (s, h, b) = call(
        &f,
        post("/auth/login", r#"{"username":"dave","password":"x"}"#),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::TOO_MANY_REQUESTS);
    // Refresh and JWKS are not throttled.
    let (s, _, _) = call(
        &f,
        Request::get("/.well-known/jwks.json")
            .body(Full::default())
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
}

/// Logins that succeed are not failures: any number of them, no 429.
#[tokio::test(flavor = "multi_thread")]
async fn successful_logins_are_never_throttled() {
    let f = fixture().await;
    for _ in 0..8 {
        login(&f).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_down_gives_503_not_500() {
    let mut f = fixture().await;
    f.redis.kill().await;
    let (s, h, b) = call(
        &f,
        post(
            "/auth/login",
            r#"{"username":"alice","password":"wonderland"}"#,
        ),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::SERVICE_UNAVAILABLE);
    let (s, h, b) = call(
        &f,
        post(
            "/auth/refresh",
            format!(r#"{{"refresh_token":"{}"}}"#, "A".repeat(43)),
        ),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::SERVICE_UNAVAILABLE);
}

/// Over a real socket: a chunked body that grows past the limit is cut off with a 400.
#[tokio::test(flavor = "multi_thread")]
async fn served_over_tcp_with_chunked_oversized_body() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let f = fixture().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        gateway_listener::Listener::new(listener, gateway_listener::Limits::default(), "http"),
        f.service.clone(),
        TrustedProxies::default(),
        gateway_telemetry::Tracer::disabled(),
        async {
            let _ = stop_rx.await;
        },
    ));

    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let chunk = "a".repeat(4096);
    let mut req =
        String::from("POST /auth/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for _ in 0..5 {
        req.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    req.push_str("0\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0; 4096];
    let n = s.read(&mut buf).await.unwrap();
    let resp = String::from_utf8_lossy(&buf[..n]);
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(resp.contains("application/problem+json"), "{resp}");

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Issue 41, item 7: idle sockets cannot hold the service: past the cap a
/// connection is closed at once, and silent ones go at the first-bytes deadline.
#[tokio::test(flavor = "multi_thread")]
async fn idle_sockets_are_capped_and_closed_and_the_service_answers() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let f = fixture().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = gateway_listener::Limits {
        max_connections: 8,
        first_bytes_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(2),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        gateway_listener::Listener::new(listener, limits, "http"),
        f.service.clone(),
        TrustedProxies::default(),
        gateway_telemetry::Tracer::disabled(),
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut idle = Vec::new();
    for _ in 0..12 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Every one of them is closed by the server: 4 at once (the cap), 8 at the deadline.
    for (i, s) in idle.iter_mut().enumerate() {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "idle socket {i} was not closed: {read:?}"
        );
    }
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut resp = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut resp))
        .await
        .unwrap()
        .unwrap();
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
