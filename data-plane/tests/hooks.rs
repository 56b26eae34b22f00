//! The authenticate and rate-limit stages with test implementations plugged in
//! through `DataPlane::authenticator` / `DataPlane::rate_limiter`: identity
//! forwarding, 401 with `WWW-Authenticate`, 429 with back-off fields, and fail
//! closed when no verifier is configured.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use clap::Parser as _;
use common::*;
use data_plane::DataPlane;
use data_plane::args::Args;
use data_plane::policy::hooks::{
    AuthError, Authenticator, Identity, LimitKey, RateLimited, RateLimiter, RouteLimit,
};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use gateway_proto::v1::{AuthMode, RateLimit, RateLimitKey};
use http::header::{HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Request, StatusCode};

/// Accepts `Authorization: Bearer good-<user>`.
struct TestAuth;

impl Authenticator for TestAuth {
    fn authenticate<'a>(&'a self, req: &'a Parts) -> BoxFuture<'a, Result<Identity, AuthError>> {
        async move {
            let token = req
                .headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or(AuthError::Missing)?;
            let user = token.strip_prefix("good-").ok_or(AuthError::Invalid)?;
            Ok(Identity {
                subject: HeaderValue::from_str(user).unwrap(),
                role: HeaderValue::from_static("user"),
                api_key: None,
            })
        }
        .boxed()
    }
}

/// Allows `limit` requests in total per key kind, records the last key.
struct TestLimiter {
    used: AtomicU32,
    last_key: parking_lot::Mutex<String>,
}

impl RateLimiter for TestLimiter {
    fn check<'a>(
        &'a self,
        limits: &'a [RouteLimit],
        keys: &'a [LimitKey<'a>],
    ) -> BoxFuture<'a, Result<Option<HeaderMap>, RateLimited>> {
        async move {
            let limit = &limits[0].policy;
            *self.last_key.lock() = keys
                .iter()
                .map(|key| match *key {
                    LimitKey::User(u) => format!("user:{}", String::from_utf8_lossy(u)),
                    LimitKey::Ip(ip) => format!("ip:{ip}"),
                    LimitKey::ApiKey(k) => format!("api-key:{}", String::from_utf8_lossy(k)),
                    LimitKey::Route(r) => format!("route:{r}"),
                    LimitKey::Header(h) => format!("header:{}", String::from_utf8_lossy(h)),
                })
                .collect::<Vec<_>>()
                .join(",");
            let used = self.used.fetch_add(1, Ordering::SeqCst) + 1;
            if used > limit.limit() {
                return Err(RateLimited::new(
                    limit.name(),
                    limit.limit(),
                    limit.window_seconds(),
                    0,
                    42,
                ));
            }
            let mut h = HeaderMap::new();
            h.insert(
                "x-ratelimit-remaining",
                HeaderValue::from(limit.limit() - used),
            );
            Ok(Some(h))
        }
        .boxed()
    }
}

async fn start(
    cfg: gateway_proto::v1::ConfigSnapshot,
    plug: bool,
) -> (data_plane::Running, tempfile::TempDir, Arc<TestLimiter>) {
    let cache = tempfile::tempdir().unwrap();
    let args = Args::try_parse_from([
        "data-plane",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--control-plane",
        &format!("http://{}", closed_port()),
        "--cache-dir",
        &cache.path().display().to_string(),
    ])
    .unwrap();
    let limiter = Arc::new(TestLimiter {
        used: AtomicU32::new(0),
        last_key: Default::default(),
    });
    let mut dp = DataPlane::new(args);
    if plug {
        dp = dp
            .authenticator(Arc::new(TestAuth))
            .rate_limiter(limiter.clone());
    }
    let running = dp.start().await.unwrap();
    running.runtime().apply(cfg, false).await.unwrap();
    (running, cache, limiter)
}

fn config(up: &TestUpstream) -> gateway_proto::v1::ConfigSnapshot {
    let mut api = route("api", "/api", "svc");
    api.auth = AuthMode::AuthJwt as i32;
    api.rate_limit = Some(RateLimit {
        policy: "api".into(),
        algorithm: 0,
        key: RateLimitKey::KeyUser as i32,
        limit: 2,
        window_seconds: 60,
        key_header: String::new(),
    });
    let mut open = route("open", "/open", "svc");
    open.rate_limit = Some(RateLimit {
        policy: "open".into(),
        algorithm: 0,
        key: RateLimitKey::KeyIp as i32,
        limit: 100,
        window_seconds: 60,
        key_header: String::new(),
    });
    // Stacked: the client address, the whole route and an X-Client value.
    let mut stacked = route("stacked", "/stacked", "svc");
    stacked.rate_limit = open.rate_limit.clone();
    stacked.rate_limits = vec![
        RateLimit {
            policy: "whole".into(),
            key: RateLimitKey::KeyRoute as i32,
            limit: 100,
            window_seconds: 60,
            ..Default::default()
        },
        RateLimit {
            policy: "per-client".into(),
            key: RateLimitKey::KeyHeader as i32,
            key_header: "X-Client".into(),
            limit: 100,
            window_seconds: 60,
            ..Default::default()
        },
    ];
    let mut keyed = route("keyed", "/keyed", "svc");
    keyed.auth = AuthMode::AuthApiKey as i32;
    snapshot(
        1,
        vec![api, open, stacked, keyed],
        vec![upstream("svc", &[("a", up.url())])],
    )
}

fn get_with(addr: std::net::SocketAddr, path: &str, auth: Option<&str>) -> Request<TestBody> {
    let mut b = Request::get(format!("http://{addr}{path}"))
        .header("x-user-id", "spoofed")
        .header("x-user-role", "admin");
    if let Some(a) = auth {
        b = b.header("authorization", a);
    }
    b.body(full("")).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn jwt_routes_fail_closed_without_a_verifier() {
    let up = TestUpstream::start("a").await;
    let (dp, _cache, _) = start(config(&up), false).await;
    let addr = dp.proxy_addr();
    let (status, headers, body) =
        send(addr, get_with(addr, "/api/x", Some("Bearer good-alice"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(headers["www-authenticate"], "Bearer");
    assert!(body.contains("urn:gateway:problem:unauthorized"), "{body}");
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        0,
        "nothing reached the upstream"
    );
    // AUTH_NONE routes still work (rate limits are simply not enforced).
    let (status, _, _) = send(addr, get_with(addr, "/open/x", None)).await;
    assert_eq!(status, StatusCode::OK);
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plugged_stages_authenticate_forward_identity_and_limit() {
    let up = TestUpstream::start("a").await;
    let (dp, _cache, limiter) = start(config(&up), true).await;
    let addr = dp.proxy_addr();

    let (status, headers, _) = send(addr, get_with(addr, "/api/x", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers["www-authenticate"], "Bearer");
    let (status, headers, _) = send(addr, get_with(addr, "/api/x", Some("Bearer forged"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        headers["www-authenticate"],
        "Bearer error=\"invalid_token\""
    );

    // Verified: identity forwarded, token and spoofed identity dropped, budget reported.
    let (status, headers, body) =
        send(addr, get_with(addr, "/api/x", Some("Bearer good-alice"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("x-user-id: alice\n"), "{body}");
    assert!(body.contains("x-user-role: user\n"), "{body}");
    assert!(!body.contains("authorization"), "{body}");
    assert!(
        !body.contains("spoofed") && !body.contains("admin"),
        "{body}"
    );
    assert_eq!(headers["x-ratelimit-remaining"], "1");
    assert_eq!(*limiter.last_key.lock(), "user:alice");

    // Over the limit: 429 with back-off fields, the upstream is not called.
    let (status, _, _) = send(addr, get_with(addr, "/api/x", Some("Bearer good-alice"))).await;
    assert_eq!(status, StatusCode::OK);
    let before = up.connections.load(Ordering::SeqCst);
    let (status, headers, body) =
        send(addr, get_with(addr, "/api/x", Some("Bearer good-alice"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(headers["retry-after"], "42");
    assert_eq!(headers["x-ratelimit-limit"], "2");
    assert_eq!(headers["ratelimit-policy"], "\"api\";q=2;w=60");
    assert_eq!(headers["ratelimit"], "\"api\";r=0;t=42");
    assert!(body.contains("urn:gateway:problem:rate-limited"), "{body}");
    assert_eq!(up.connections.load(Ordering::SeqCst), before);

    // KEY_IP routes are counted per client address.
    limiter.used.store(0, Ordering::SeqCst);
    let (status, _, _) = send(addr, get_with(addr, "/open/x", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(*limiter.last_key.lock(), "ip:127.0.0.1");

    // Stacked limits get one key each, in order; a missing header counts as empty.
    let mut req = get_with(addr, "/stacked/x", None);
    req.headers_mut()
        .insert("x-client", http::HeaderValue::from_static("zed"));
    let (status, _, _) = send(addr, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        *limiter.last_key.lock(),
        "ip:127.0.0.1,route:stacked,header:zed"
    );
    let (status, _, _) = send(addr, get_with(addr, "/stacked/x", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        *limiter.last_key.lock(),
        "ip:127.0.0.1,route:stacked,header:"
    );

    // AUTH_API_KEY routes fail closed here: no API-key verifier is plugged in.
    let before = up.connections.load(Ordering::SeqCst);
    let (status, _, body) = send(addr, get_with(addr, "/keyed/x", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(up.connections.load(Ordering::SeqCst), before);
    dp.shutdown().await;
}
