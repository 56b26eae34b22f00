//! Black-box check of the Prometheus endpoints (issue 6): after real traffic
//! through a devstack stack, every data plane's `/metrics` and the control
//! plane's `/metrics` pass `promtool check metrics` and carry the families an
//! operator needs (requests, latency, upstreams, breakers, health, rate
//! limits, config version, control-plane connection, span export).
//!
//! Needs every binary built (`cargo build --workspace --bins`), `redis-server`,
//! and `promtool` (Debian package `prometheus`) on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use devstack::Stack;
use gateway_tests::{client, login, metric_sum, open_route, poll, upsert_route_synced};
use tokio::io::AsyncWriteExt;

/// Runs `promtool check metrics` on `text`; returns promtool's complaints on failure.
async fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("cannot run promtool ({e}); install it with: apt-get install -y prometheus")
        })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(text.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    drop(stdin);
    let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

#[track_caller]
fn assert_has(text: &str, family: &str, what: &str) {
    assert!(
        text.lines()
            .any(|l| !l.starts_with('#') && l.starts_with(family)),
        "{what}: no sample of {family} in\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_after_traffic_pass_promtool_and_cover_every_concern() {
    let cp_metrics = format!("127.0.0.1:{}", free_port());
    let stack = Stack::new()
        .data_planes(2)
        .env("control-plane", "CONTROL_PLANE_METRICS_LISTEN", &cp_metrics)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"));

    upsert_route_synced(
        &stack,
        open_route("open-orders", "/open/orders", "orders", "/orders"),
    )
    .await
    .expect("open-orders served by every data plane");

    // Traffic of every kind: proxied 200s and 500s, a 404, a 401, a rate-limited route.
    let http = client();
    let token = login(&stack.auth_url(), "alice", "wonderland")
        .await
        .expect("login");
    for gw in stack.gateways() {
        for path in ["/open/orders/1", "/open/orders/2?status=500", "/nowhere"] {
            let status = http
                .get(format!("{gw}{path}"))
                .send()
                .await
                .expect("request")
                .status();
            assert!(status.as_u16() < 600);
        }
        let unauth = http.get(format!("{gw}/api/users/1")).send().await.unwrap();
        assert_eq!(unauth.status(), 401);
        // Twice: the token is verified once, then found in the cache.
        for _ in 0..2 {
            let ok = http
                .get(format!("{gw}/api/users/1"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(ok.status(), 200);
        }
    }
    // The JWT cache and the rate limiter's Redis round trips, per data plane.
    for admin_url in stack.gateway_admins() {
        let hits = metric_sum(&admin_url, "gateway_jwt_cache_hits_total")
            .await
            .unwrap();
        let misses = metric_sum(&admin_url, "gateway_jwt_cache_misses_total")
            .await
            .unwrap();
        assert!(
            hits >= 1.0 && misses >= 1.0,
            "{admin_url}: hits {hits}, misses {misses}"
        );
        // The limiter's breaker starts open until Redis first answers its probe:
        // a decision may go local at first, so poll until one has gone to Redis.
        let gw = stack.gateways()[stack
            .gateway_admins()
            .iter()
            .position(|a| a == &admin_url)
            .unwrap()]
        .clone();
        let (http, token) = (http.clone(), token.clone());
        poll(
            Duration::from_secs(20),
            "a rate-limit decision timed in Redis",
            || {
                let (http, token, gw, admin_url) =
                    (http.clone(), token.clone(), gw.clone(), admin_url.clone());
                async move {
                    let _ = http
                        .get(format!("{gw}/api/orders/1"))
                        .bearer_auth(&token)
                        .send()
                        .await;
                    let n =
                        metric_sum(&admin_url, "gateway_ratelimit_redis_duration_seconds_count")
                            .await
                            .map_err(|e| e.to_string())?;
                    if n >= 1.0 {
                        Ok(())
                    } else {
                        Err(format!("count {n}"))
                    }
                }
            },
        )
        .await
        .unwrap();
    }

    for admin_url in stack.gateway_admins() {
        let text = http
            .get(format!("{admin_url}/metrics"))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics text");
        if let Err(problems) = promtool_check(&text).await {
            panic!("promtool check metrics failed for {admin_url}:\n{problems}\n---\n{text}");
        }
        let who = format!("data plane {admin_url}");
        for family in [
            "gateway_requests_total",
            "gateway_request_duration_seconds_bucket",
            "gateway_upstream_attempts_total",
            "gateway_upstream_errors_total",
            "gateway_circuit_breaker_state",
            "gateway_upstream_healthy",
            "gateway_ratelimit_decisions_total",
            "gateway_ratelimit_fallbacks_total",
            "gateway_ratelimit_redis_duration_seconds_bucket",
            "gateway_jwt_cache_hits_total",
            "gateway_jwt_cache_misses_total",
            "gateway_config_version",
            "gateway_config_last_applied_timestamp_seconds",
            "gateway_control_plane_connected",
            "gateway_trace_spans_dropped_total",
        ] {
            assert_has(&text, family, &who);
        }
        // The traffic above is visible, by route and status class.
        assert!(
            text.lines().any(|l| l.starts_with("gateway_requests_total")
                && l.contains("open-orders")
                && l.contains("5xx")),
            "{who}: the proxied 500 is not counted under route open-orders:\n{text}"
        );
    }

    let cp_text = tokio::time::timeout(
        Duration::from_secs(10),
        http.get(format!("http://{cp_metrics}/metrics")).send(),
    )
    .await
    .expect("control-plane metrics answer in time")
    .expect("control-plane metrics reachable")
    .text()
    .await
    .unwrap();
    if let Err(problems) = promtool_check(&cp_text).await {
        panic!("promtool check metrics failed for the control plane:\n{problems}\n---\n{cp_text}");
    }
    for family in [
        "control_plane_data_planes_connected",
        "control_plane_config_acks_total",
        "control_plane_config_push_ack_seconds_bucket",
    ] {
        assert_has(&cp_text, family, "control plane");
    }
    stack.shutdown().await;
}
