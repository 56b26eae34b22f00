//! The proxy listener against in-test upstreams: forwarding and header hygiene,
//! streaming both ways, timeouts, connect failures and retries, size limits,
//! path normalisation, problem+json errors, h2c, graceful shutdown.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use data_plane::Running;
use gateway_proto::v1::{CircuitBreaker, ConfigSnapshot, HealthCheck};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

/// A data plane with no reachable control plane, configured directly.
async fn data_plane_with(cfg: ConfigSnapshot, extra: &[&str]) -> (Running, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let dead_cp = format!("http://{}", closed_port());
    let dp = start_data_plane(&dead_cp, cache.path(), extra).await;
    dp.runtime()
        .apply(cfg, false)
        .await
        .expect("config applies");
    (dp, cache)
}

/// One upstream instance `o1` behind a catch-all route, and a data plane
/// serving it with the `extra` flags.
async fn one_route(extra: &[&str]) -> (TestUpstream, Running, tempfile::TempDir) {
    let up = TestUpstream::start("o1").await;
    let cfg = snapshot(
        1,
        vec![route("all", "/", "svc")],
        vec![upstream("svc", &[("o1", up.url())])],
    );
    let (dp, cache) = data_plane_with(cfg, extra).await;
    (up, dp, cache)
}

fn problem_type(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["type"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn forwards_with_rewrite_query_and_clean_headers() {
    let up = TestUpstream::start("o1").await;
    let mut orders = route("orders", "/api/orders", "orders");
    orders.rewrite_prefix = "/orders".into();
    let cfg = snapshot(
        1,
        vec![orders],
        vec![upstream("orders", &[("o1", up.url())])],
    );
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let addr = dp.proxy_addr();

    let req = Request::get(format!("http://{addr}/api//orders/./7?x=1&y=%20z"))
        .header("connection", "x-secret")
        .header("x-secret", "must not pass")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("X-User-Id", "spoofed")
        .header("x-user-role", "admin")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-request-id", "client-id-42")
        .header("accept", "text/plain")
        .body(full(""))
        .unwrap();
    let (status, headers, body) = send(addr, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-seen-path"], "/orders/7?x=1&y=%20z");
    assert_eq!(headers["x-request-id"], "client-id-42");
    let seen: Vec<&str> = body.lines().collect();
    assert!(
        seen.contains(&"x-forwarded-for: 203.0.113.9, 127.0.0.1"),
        "{body}"
    );
    assert!(seen.contains(&"x-forwarded-proto: http"), "{body}");
    assert!(seen.contains(&"x-request-id: client-id-42"), "{body}");
    assert!(seen.contains(&"accept: text/plain"), "{body}");
    for gone in [
        "x-secret",
        "keep-alive",
        "proxy-authorization",
        "x-user-id",
        "x-user-role",
    ] {
        assert!(
            !body.contains(&format!("{gone}:")),
            "{gone} reached the upstream: {body}"
        );
    }

    // An invalid incoming request id is replaced by a generated one.
    let req = Request::get(format!("http://{addr}/api/orders"))
        .header("x-request-id", "bad id with spaces")
        .body(full(""))
        .unwrap();
    let (_, headers, body) = send(addr, req).await;
    let id = headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32, "{id}");
    assert!(body.contains(&format!("x-request-id: {id}")), "{body}");
    dp.shutdown().await;
}

/// Sends a mix of sequential requests (bodies, no bodies, errors, HEAD) through
/// a data plane with `workers` proxy workers; returns the upstream connections
/// opened and the `/health/load-balancer` document.
async fn sequential_mix(workers: &str) -> (usize, String) {
    let (up, dp, _cache) = one_route(&["--workers", workers]).await;
    for path in [
        "/a",
        "/bytes?n=100000",
        "/status/204",
        "/b",
        "/status/404",
        "/c",
    ] {
        for _ in 0..5 {
            let (status, _, _) = get(dp.proxy_addr(), path).await;
            assert!(status.as_u16() < 500, "{path}: {status}");
        }
    }
    // HEAD has no body to read to the end, yet its connection returns to the pool.
    for _ in 0..3 {
        let req = Request::head(format!("http://{}/a", dp.proxy_addr()))
            .body(full(""))
            .unwrap();
        assert_eq!(send(dp.proxy_addr(), req).await.0, StatusCode::OK);
    }
    let n = up.connections.load(std::sync::atomic::Ordering::SeqCst);
    let (_, lb) = ops(&dp, "/health/load-balancer").await;
    dp.shutdown().await;
    (n, lb)
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_connections_are_kept_alive_and_reused() {
    let (n, lb) = sequential_mix("1").await;
    assert_eq!(n, 1, "sequential requests share one upstream connection");
    assert!(lb.contains("\"idle_connections\":1"), "{lb}");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_worker_reuses_its_own_upstream_connections() {
    // The kernel spreads client connections over the workers; each worker keeps
    // (at most) one idle connection for sequential traffic, never one per request.
    let (n, lb) = sequential_mix("2").await;
    assert!(
        (1..=2).contains(&n),
        "{n} upstream connections for 33 sequential requests"
    );
    assert!(lb.contains(&format!("\"idle_connections\":{n}")), "{lb}");
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_errors_are_problem_json() {
    let up = TestUpstream::start("o1").await;
    let cfg = snapshot(
        1,
        vec![route("orders", "/api/orders", "orders")],
        vec![upstream("orders", &[("o1", up.url())])],
    );
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let addr = dp.proxy_addr();

    for path in ["/nothing", "/api/ordersx", "/api"] {
        let (status, headers, body) = get(addr, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(problem_type(&body), "urn:gateway:problem:no-route");
        assert!(body.contains("\"status\":404"), "{body}");
        assert!(headers.contains_key("x-request-id"));
    }
    // Unsafe paths: raw requests, since client libraries would rewrite them.
    for path in [
        "/api/orders/%2e%2e/%2e%2e/etc/passwd",
        "/api/orders/%2E%2E/admin",
        "/api/orders/a%2Fb",
        "/api/orders/a%2fb",
        "/api/orders/a%5Cb",
        "/api/orders/a%00b",
        "/api/orders/../../../x",
    ] {
        let resp = raw(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert_eq!(raw_status(&resp), 400, "{path}: {resp}");
        assert!(resp.contains("application/problem+json"), "{path}: {resp}");
        assert!(
            resp.contains("urn:gateway:problem:bad-path"),
            "{path}: {resp}"
        );
    }
    // Safe dot segments are resolved and routed like the canonical path.
    let resp = raw(
        addr,
        b"GET /api/x/../orders/1 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&resp), 200, "{resp}");
    assert!(resp.contains("x-seen-path: /api/orders/1"), "{resp}");
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn size_limits_431_and_413() {
    let (_up, dp, _cache) = one_route(&["--max-body-bytes", "1048576"]).await;
    let addr = dp.proxy_addr();

    // Headers over the 16 KiB default: 431 with a problem document ...
    let big = "a".repeat(20 * 1024);
    let resp = raw(
        addr,
        format!("GET / HTTP/1.1\r\nHost: gw\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(raw_status(&resp), 431, "{}", &resp[..resp.len().min(300)]);
    assert!(
        resp.contains("urn:gateway:problem:headers-too-large"),
        "{resp}"
    );
    // ... and far over it the connection layer refuses before the head is
    // complete, with the same document.
    let huge = "a".repeat(200 * 1024);
    let resp = raw(
        addr,
        format!("GET / HTTP/1.1\r\nHost: gw\r\nX-Big: {huge}\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(raw_status(&resp), 431, "{}", &resp[..resp.len().min(300)]);
    assert!(
        resp.contains("urn:gateway:problem:headers-too-large"),
        "{resp}"
    );

    // Declared body over the limit: refused before reading it.
    let resp = raw(
        addr,
        b"POST /count HTTP/1.1\r\nHost: gw\r\nContent-Length: 2097152\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&resp), 413, "{resp}");
    assert!(
        resp.contains("urn:gateway:problem:body-too-large"),
        "{resp}"
    );

    // A chunked body that grows over the limit while streaming.
    let chunks = futures::stream::iter(
        (0..40).map(|_| Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b'z'; 64 * 1024])))),
    );
    let req = Request::post(format!("http://{addr}/count"))
        .body(BodyExt::boxed(StreamBody::new(chunks)))
        .unwrap();
    let (status, _, body) = send(addr, req).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");

    // Under the limit it passes.
    let req = Request::post(format!("http://{addr}/count"))
        .body(full(vec![b'z'; 1000]))
        .unwrap();
    let (status, _, body) = send(addr, req).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "1000"));
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_stream_both_ways() {
    let (up, dp, _cache) = one_route(&["--max-body-bytes", "104857600"]).await;
    let addr = dp.proxy_addr();

    // The first chunk reaches the client while the upstream is still holding the rest.
    let resp = client()
        .request(
            Request::get(format!("http://{addr}/gated"))
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(DEADLINE, body.frame())
        .await
        .expect("first chunk before the upstream finished")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first-chunk");
    up.open_gate();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "rest");

    // 32 MiB down, counted as it arrives.
    let n: u64 = 32 * 1024 * 1024;
    let resp = client()
        .request(
            Request::get(format!("http://{addr}/bytes?n={n}"))
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut got = 0u64;
    while let Some(frame) = body.frame().await {
        got += frame.unwrap().into_data().map_or(0, |d| d.len() as u64);
    }
    assert_eq!(got, n);

    // 24 MiB up, chunked, counted by the upstream.
    let chunks = futures::stream::iter(
        (0..384).map(|_| Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b'u'; 64 * 1024])))),
    );
    let req = Request::post(format!("http://{addr}/count"))
        .body(BodyExt::boxed(StreamBody::new(chunks)))
        .unwrap();
    let (status, _, body) = send(addr, req).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "25165824"));
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_upstream_gets_504() {
    let up = TestUpstream::start("o1").await;
    let mut r = route("slow", "/", "svc");
    r.timeout_ms = 300;
    let cfg = snapshot(1, vec![r], vec![upstream("svc", &[("o1", up.url())])]);
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let started = std::time::Instant::now();
    let (status, headers, body) = get(dp.proxy_addr(), "/slow?ms=5000").await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(problem_type(&body), "urn:gateway:problem:upstream-timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Fast requests on the same route still pass.
    let (status, _, _) = get(dp.proxy_addr(), "/slow?ms=10").await;
    assert_eq!(status, StatusCode::OK);
    let (_, metrics) = ops(&dp, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "gateway_upstream_errors_total{upstream=\"svc\",instance=\"o1\",kind=\"timeout\"}"
        ),
        Some(1.0)
    );
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_failure_502_then_open_breaker_503() {
    let dead = closed_port();
    let mut up = upstream("svc", &[("dead", format!("http://{dead}"))]);
    up.circuit_breaker = Some(CircuitBreaker {
        failure_threshold: 2,
        reset_timeout_ms: 60_000,
        half_open_max_requests: 1,
        ..Default::default()
    });
    let cfg = snapshot(1, vec![route("all", "/", "svc")], vec![up]);
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    for _ in 0..2 {
        let (status, _, body) = get(dp.proxy_addr(), "/x").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(
            problem_type(&body),
            "urn:gateway:problem:upstream-unreachable"
        );
    }
    let (status, _, body) = get(dp.proxy_addr(), "/x").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        problem_type(&body),
        "urn:gateway:problem:no-healthy-upstream"
    );
    let (_, breakers) = ops(&dp, "/health/circuit-breakers").await;
    let v: serde_json::Value = serde_json::from_str(&breakers).unwrap();
    let inst = &v["upstreams"][0]["instances"][0];
    assert_eq!(inst["state"], "open", "{breakers}");
    assert!(
        inst["next_probe_in_ms"].as_u64().unwrap() > 50_000,
        "{breakers}"
    );
    let (_, lb) = ops(&dp, "/health/load-balancer").await;
    assert!(lb.contains("\"available\":false"), "{lb}");
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_refused_is_retried_on_the_other_instance() {
    let live = TestUpstream::start("live").await;
    let dead = closed_port();
    let cfg = snapshot(
        1,
        vec![route("all", "/", "svc")],
        vec![upstream(
            "svc",
            &[("dead", format!("http://{dead}")), ("live", live.url())],
        )],
    );
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let addr = dp.proxy_addr();
    for i in 0..6 {
        let (status, headers, body) = get(addr, "/x").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
        assert_eq!(headers["x-instance-id"], "live");
    }
    // A request with a body is retried too: it never left the gateway.
    for _ in 0..4 {
        let req = Request::post(format!("http://{addr}/count"))
            .body(full(vec![1u8; 5000]))
            .unwrap();
        let (status, _, body) = send(addr, req).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "5000"));
    }
    let (_, metrics) = ops(&dp, "/metrics").await;
    let retries = metric(
        &metrics,
        "gateway_upstream_retries_total{upstream=\"svc\",instance=\"live\"}",
    )
    .unwrap();
    assert!(retries >= 4.0, "retries {retries}\n{metrics}");
    let refused = metric(
        &metrics,
        "gateway_upstream_errors_total{upstream=\"svc\",instance=\"dead\",kind=\"connect\"}",
    )
    .unwrap();
    assert_eq!(refused, retries);
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotent_requests_cut_off_mid_exchange_are_replayed() {
    let live = TestUpstream::start("live").await;
    let (hole, _task) = black_hole().await;
    let cfg = snapshot(
        1,
        vec![route("all", "/", "svc")],
        vec![upstream(
            "svc",
            &[("hole", format!("http://{hole}")), ("live", live.url())],
        )],
    );
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let addr = dp.proxy_addr();
    let mut posts_failed = 0;
    for _ in 0..4 {
        let (status, headers, _) = get(addr, "/x").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["x-instance-id"], "live");
        // A POST may have been processed: never replayed, so one that hits the hole fails.
        let req = Request::post(format!("http://{addr}/count"))
            .body(full("abc"))
            .unwrap();
        let (status, _, body) = send(addr, req).await;
        match status {
            StatusCode::OK => assert_eq!(body, "3"),
            StatusCode::BAD_GATEWAY => {
                assert_eq!(problem_type(&body), "urn:gateway:problem:upstream-failed");
                posts_failed += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(
        posts_failed > 0,
        "round-robin must have sent some POSTs to the hole"
    );
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_and_graceful_shutdown() {
    let (_up, dp, _cache) = one_route(&[]).await;
    let addr = dp.proxy_addr();

    // HTTP/2 with prior knowledge (h2c).
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<TestBody>();
    let resp = h2
        .request(
            Request::get(format!("http://{addr}/hello?q=1"))
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-seen-path"], "/hello?q=1");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains(&format!("host: {addr}")));

    // A request in flight when shutdown begins still completes.
    let in_flight = tokio::spawn(get(addr, "/slow?ms=700"));
    eventually("the slow request to reach the upstream", || async {
        let (_, lb) = ops(&dp, "/health/load-balancer").await;
        lb.contains("\"in_flight\":1").then_some(())
    })
    .await;
    let admin = dp.admin_addr();
    dp.shutdown().await;
    let (status, _, body) = in_flight.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow"));
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "proxy listener closed"
    );
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "ops listener closed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn active_health_checks_take_instances_out_and_back() {
    let a = TestUpstream::start("a").await;
    let b = TestUpstream::start("b").await;
    let with_check = |version: u64, path: &str| {
        let mut up = upstream("svc", &[("a", a.url()), ("b", b.url())]);
        up.health_check = Some(HealthCheck {
            path: path.into(),
            interval_ms: 100,
            timeout_ms: 100,
            unhealthy_threshold: 2,
            healthy_threshold: 1,
        });
        snapshot(version, vec![route("all", "/", "svc")], vec![up])
    };
    // Both instances answer the check path with 503: both become unhealthy.
    let (dp, _cache) = data_plane_with(with_check(1, "/status/503"), &[]).await;
    let addr = dp.proxy_addr();
    eventually("both instances unhealthy", || async {
        let (status, _, body) = get(addr, "/x").await;
        (status == StatusCode::SERVICE_UNAVAILABLE && body.contains("no-healthy-upstream"))
            .then_some(())
    })
    .await;
    let (_, lb) = ops(&dp, "/health/load-balancer").await;
    assert_eq!(lb.matches("\"healthy\":false").count(), 2, "{lb}");
    let (_, metrics) = ops(&dp, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "gateway_upstream_healthy{upstream=\"svc\",instance=\"a\"}"
        ),
        Some(0.0)
    );

    // A new version with a passing check path: the same instances (state kept)
    // come back after one success.
    dp.runtime()
        .apply(with_check(2, "/ok"), false)
        .await
        .unwrap();
    eventually("instances healthy again", || async {
        let (status, _, _) = get(addr, "/x").await;
        (status == StatusCode::OK).then_some(())
    })
    .await;
    eventually("both serving", || async {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let (_, headers, _) = get(addr, "/x").await;
            seen.insert(headers.get("x-instance-id")?.to_str().ok()?.to_string());
        }
        (seen.len() == 2).then_some(())
    })
    .await;
    assert_eq!(dp.runtime().health.task_count(), 2);

    // Without health_check the instances are always healthy and no checks run.
    dp.runtime()
        .apply(
            snapshot(
                3,
                vec![route("all", "/", "svc")],
                vec![upstream("svc", &[("a", a.url())])],
            ),
            false,
        )
        .await
        .unwrap();
    assert_eq!(dp.runtime().health.task_count(), 0);
    let (status, headers, _) = get(addr, "/x").await;
    assert_eq!(
        (status, headers["x-instance-id"].to_str().unwrap()),
        (StatusCode::OK, "a")
    );
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_silent_header_senders_are_cut_off() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (up, dp, _cache) = one_route(&["--header-read-timeout-ms", "300"]).await;
    // Half a head and then nothing; and nothing at all (the protocol sniff,
    // which waits for the first bytes, must not wait forever either).
    for sent in [&b"GET / HTTP/1.1\r\nHost: gw\r\nX-Slow: "[..], &b""[..]] {
        let mut s = tokio::net::TcpStream::connect(dp.proxy_addr())
            .await
            .unwrap();
        s.write_all(sent).await.unwrap();
        let started = std::time::Instant::now();
        // The gateway closes the connection (possibly after a 408) without a complete head.
        let mut buf = Vec::new();
        let read = tokio::time::timeout(DEADLINE, s.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "connection still open after {DEADLINE:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let text = String::from_utf8_lossy(&buf);
        assert!(
            text.is_empty()
                || (!sent.is_empty()
                    && text.starts_with("HTTP/1.1 408")
                    && text.contains("urn:gateway:problem:head-timeout")),
            "{text}"
        );
    }
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_does_not_wait_for_a_connection_that_never_spoke() {
    let up = TestUpstream::start("o1").await;
    let cfg = snapshot(
        1,
        vec![route("all", "/", "svc")],
        vec![upstream("svc", &[("o1", up.url())])],
    );
    // The silent connection would be cut off only after 60 s, and the grace
    // period is 20 s: shutdown must close it at once instead.
    let (dp, _cache) = data_plane_with(
        cfg,
        &[
            "--header-read-timeout-ms",
            "60000",
            "--shutdown-timeout-ms",
            "20000",
        ],
    )
    .await;
    let _silent = tokio::net::TcpStream::connect(dp.proxy_addr())
        .await
        .unwrap();
    // An HTTP/1.1 exchange on another connection proves the listener is serving.
    let (status, _, _) = get(dp.proxy_addr(), "/x").await;
    assert_eq!(status, StatusCode::OK);
    let started = std::time::Instant::now();
    tokio::time::timeout(DEADLINE, dp.shutdown())
        .await
        .expect("shutdown finished");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown waited {:?} for a silent connection",
        started.elapsed()
    );
}

/// Clients that send their first bytes in pieces: an HTTP/1.1 request whose
/// first segment ("P") could still be the HTTP/2 preface, and an h2c client
/// whose preface arrives in two segments, are each served in their protocol.
#[tokio::test(flavor = "multi_thread")]
async fn first_bytes_split_across_segments_pick_the_right_protocol() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (_up, dp, _cache) = one_route(&[]).await;
    let addr = dp.proxy_addr();

    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"P").await.unwrap();
    // Gives the gateway a chance to see "P" alone; the test holds either way.
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(
        b"OST /count HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut buf))
        .await
        .expect("answered within the deadline")
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("\r\n\r\n3"), "{text}");

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&PREFACE[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(&PREFACE[10..]).await.unwrap();
    // An empty SETTINGS frame: length 0, type 4, flags 0, stream 0.
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    // The server's first frame is its own SETTINGS frame.
    let mut frame_head = [0u8; 9];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut frame_head))
        .await
        .expect("answered within the deadline")
        .unwrap();
    assert_eq!(
        frame_head[3], 4,
        "not an HTTP/2 SETTINGS frame: {frame_head:?}"
    );
    dp.shutdown().await;
}

/// Issue 41, item 6: a client that makes the backend answer 500 cannot open
/// its breakers (5xx count only with `count_5xx`), and even counted failures
/// hold at most `max_open_percent` of the instances out.
#[tokio::test(flavor = "multi_thread")]
async fn clients_asking_for_500s_open_no_breaker_and_counted_ones_stay_under_the_cap() {
    let a = TestUpstream::start("a").await;
    let b = TestUpstream::start("b").await;
    let mut up = upstream("svc", &[("a", a.url()), ("b", b.url())]);
    up.circuit_breaker = Some(CircuitBreaker {
        failure_threshold: 2,
        reset_timeout_ms: 60_000,
        half_open_max_requests: 1,
        ..Default::default()
    });
    let cfg = snapshot(1, vec![route("all", "/", "svc")], vec![up.clone()]);
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let open_breakers = |text: &str| text.matches("\"state\":\"open\"").count();
    // By default: 20 answers of 500 are answers, and the instances stay in.
    for i in 0..20 {
        let (status, _, body) = get(dp.proxy_addr(), "/status/500").await;
        assert_eq!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "request {i}: {body}"
        );
    }
    let (_, breakers) = ops(&dp, "/health/circuit-breakers").await;
    assert_eq!(open_breakers(&breakers), 0, "{breakers}");
    let (status, _, _) = get(dp.proxy_addr(), "/ok").await;
    assert_eq!(status, StatusCode::OK);
    dp.shutdown().await;

    // With count_5xx the 500s count, but max_open_percent (default 50) of two
    // instances is one: the other keeps its share, so clients still get the
    // upstream's answers, never a 503 from the gateway.
    up.circuit_breaker.as_mut().unwrap().count_5xx = true;
    let cfg = snapshot(1, vec![route("all", "/", "svc")], vec![up]);
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    for i in 0..20 {
        let (status, _, body) = get(dp.proxy_addr(), "/status/500").await;
        assert_eq!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "request {i}: {body}"
        );
    }
    let (_, breakers) = ops(&dp, "/health/circuit-breakers").await;
    assert_eq!(open_breakers(&breakers), 1, "{breakers}");
    let (status, headers, _) = get(dp.proxy_addr(), "/ok").await;
    assert_eq!(status, StatusCode::OK);
    assert!(["a", "b"].contains(&headers["x-instance-id"].to_str().unwrap()));
    dp.shutdown().await;
}

/// Issue 41, item 6: with four dead instances and max_open_percent 50, two
/// breakers open and two instances keep their share (502, never 503).
#[tokio::test(flavor = "multi_thread")]
async fn breakers_hold_at_most_max_open_percent_of_the_instances_out() {
    let dead: Vec<(String, String)> = (0..4)
        .map(|i| (format!("d{i}"), format!("http://{}", closed_port())))
        .collect();
    let refs: Vec<(&str, String)> = dead
        .iter()
        .map(|(id, u)| (id.as_str(), u.clone()))
        .collect();
    let mut up = upstream("svc", &refs);
    up.circuit_breaker = Some(CircuitBreaker {
        failure_threshold: 1,
        reset_timeout_ms: 60_000,
        half_open_max_requests: 1,
        max_open_percent: 50,
        ..Default::default()
    });
    let cfg = snapshot(1, vec![route("all", "/", "svc")], vec![up]);
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    for i in 0..20 {
        let (status, _, body) = get(dp.proxy_addr(), "/x").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "request {i}: {body}");
    }
    let (_, breakers) = ops(&dp, "/health/circuit-breakers").await;
    assert_eq!(
        breakers.matches("\"state\":\"open\"").count(),
        2,
        "{breakers}"
    );
    dp.shutdown().await;
}
