//! Route policies (issue 10) against real processes: IP allow/deny rules,
//! header transforms and CORS.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Result, ensure};
use gateway_proto::v1::{
    AuthMode, Cors, HeaderTransform, RateLimit, RateLimitAlgorithm, RateLimitKey, Route,
    UpsertRouteRequest,
};
use gateway_tests::{
    client, create_api_key_synced, header, metric_sample, mock_requests, one_data_plane,
    open_route, upsert_route_synced,
};
use serde_json::Value;

/// The address the tests' "proxy" connects from: the only trusted proxy.
/// Linux routes all of 127.0.0.0/8 to loopback, so a client bound to
/// 127.0.0.2 reaches the data plane on 127.0.0.1 while an ordinary client
/// (127.0.0.1) is an untrusted peer whose `X-Forwarded-For` is ignored.
const PROXY: &str = "127.0.0.2";

/// A client connecting from `local` (an address of the loopback network).
fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(local.parse::<IpAddr>().expect("an IP address"))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("a plain HTTP client always builds")
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// Status of `GET url` sent by `http` with `X-Forwarded-For: xff` (if any);
/// a 403 must be the ip-denied problem.
async fn status(http: &reqwest::Client, url: &str, xff: Option<&str>) -> Result<u16> {
    let mut req = http.get(url);
    if let Some(xff) = xff {
        req = req.header("x-forwarded-for", xff);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    if status == 403 {
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        ensure!(ct == "application/problem+json", "403 with {ct:?}");
        let doc: Value = resp.json().await?;
        ensure!(
            doc["type"] == "urn:gateway:problem:ip-denied" && doc["status"] == 403,
            "unexpected problem {doc}"
        );
    }
    Ok(status)
}

#[tokio::test(flavor = "multi_thread")]
async fn ip_rules_allow_and_deny_ipv4_and_ipv6_behind_a_trusted_proxy() -> Result<()> {
    let stack = one_data_plane(&["--trusted-proxies=127.0.0.2/32"]).await;
    let gw = &stack.gateways()[0];
    upsert_route_synced(
        &stack,
        Route {
            ip_allow: strings(&["203.0.113.0/24", "2001:db8::/32"]),
            ip_deny: strings(&["203.0.113.7", "2001:db8::bad"]),
            ..open_route("ip-allow", "/allow/users", "users", "/users")
        },
    )
    .await?;
    upsert_route_synced(
        &stack,
        Route {
            ip_deny: strings(&["127.0.0.1", "2001:db8::/32"]),
            ..open_route("ip-deny", "/deny/users", "users", "/users")
        },
    )
    .await?;
    let proxy = client_from(PROXY);
    let direct = client();
    let allow = format!("{gw}/allow/users/1");
    let deny = format!("{gw}/deny/users/1");

    // Through the trusted proxy, X-Forwarded-For names the client.
    for (xff, want) in [
        ("203.0.113.5", 200),
        ("203.0.113.7", 403),  // in both lists: deny wins
        ("198.51.100.1", 403), // not in the allow list
        ("2001:db8::1", 200),
        ("2001:db8::bad", 403),
        ("2001:db9::1", 403),
        // A chain: the right-most untrusted hop is the client.
        ("198.51.100.1, 203.0.113.5", 200),
    ] {
        assert_eq!(
            status(&proxy, &allow, Some(xff)).await?,
            want,
            "allow, XFF {xff}"
        );
    }
    for (xff, want) in [
        ("203.0.113.5", 200),
        ("2001:db8::1", 403),
        ("2001:db9::1", 200),
    ] {
        assert_eq!(
            status(&proxy, &deny, Some(xff)).await?,
            want,
            "deny, XFF {xff}"
        );
    }
    // The proxy itself (no XFF) is the client: 127.0.0.2 is not denied.
    assert_eq!(status(&proxy, &deny, None).await?, 200);

    // From an untrusted peer a forged X-Forwarded-For is ignored: the peer
    // 127.0.0.1 is the client, outside the allow list and in the deny list.
    assert_eq!(status(&direct, &allow, Some("203.0.113.5")).await?, 403);
    assert_eq!(status(&direct, &deny, Some("2001:db9::1")).await?, 403);

    // Refusals are counted per route under reason="ip".
    let allow_refused = r#"gateway_policy_refusals_total{route="ip-allow",reason="ip"}"#;
    let deny_refused = r#"gateway_policy_refusals_total{route="ip-deny",reason="ip"}"#;
    assert_eq!(
        metric_sample(&stack.gateway_admins()[0], allow_refused).await?,
        5.0
    );
    assert_eq!(
        metric_sample(&stack.gateway_admins()[0], deny_refused).await?,
        2.0
    );
    Ok(())
}

fn transform(set: &[(&str, &str)], add: &[(&str, &str)], remove: &[&str]) -> HeaderTransform {
    let map = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    HeaderTransform {
        set: map(set),
        add: map(add),
        remove: strings(remove),
        allow_identity_and_host: false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn header_transforms_set_add_and_remove_both_ways() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    let gw = &stack.gateways()[0];
    upsert_route_synced(
        &stack,
        Route {
            request_headers: Some(transform(
                &[("X-Env", "test")],
                &[("x-tag", "gateway")],
                &["x-debug"],
            )),
            response_headers: Some(transform(
                &[("content-type", "application/json; charset=utf-8")],
                &[("x-frame-options", "DENY")],
                &["X-Instance-Id"],
            )),
            ..open_route("shaped", "/shaped/users", "users", "/users")
        },
    )
    .await?;

    let resp = client()
        .get(format!("{gw}/shaped/users/1"))
        .header("x-env", "prod")
        .header("x-tag", "client")
        .header("x-debug", "1")
        .header("x-request-id", "shaped-1")
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    // Response: set replaced, add added, remove deleted; the gateway's own headers stay.
    assert_eq!(h["content-type"], "application/json; charset=utf-8");
    assert_eq!(h["x-frame-options"], "DENY");
    assert!(h.get("x-instance-id").is_none(), "{h:?}");
    assert_eq!(h["x-request-id"], "shaped-1");
    // Request, as the mock received it: set replaced, add appended, remove deleted.
    let doc: Value = resp.json().await?;
    let seen = &doc["headers"];
    assert_eq!(seen["x-env"], "test", "{seen}");
    assert_eq!(seen["x-tag"], "client, gateway", "{seen}");
    assert!(seen.get("x-debug").is_none(), "{seen}");

    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn header_transforms_touching_protected_headers_are_refused() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    let mut admin = stack.admin_client().await;
    let before = stack.seeded_version();
    for (request, response) in [
        (Some(transform(&[("X-User-Id", "admin")], &[], &[])), None),
        (Some(transform(&[], &[("x-user-role", "admin")], &[])), None),
        (None, Some(transform(&[], &[], &["Connection"]))),
        (Some(transform(&[("host", "evil.example")], &[], &[])), None),
    ] {
        let route = Route {
            request_headers: request,
            response_headers: response,
            ..open_route("forge", "/forge", "users", "/users")
        };
        let err = admin
            .upsert_route(UpsertRouteRequest {
                route: Some(route),
                expected_version: None,
            })
            .await
            .expect_err("a protected header must be refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains("is a protected header"),
            "{}",
            err.message()
        );
    }
    // Nothing was committed.
    let config = admin
        .get_config(gateway_proto::v1::GetConfigRequest::default())
        .await?
        .into_inner();
    assert_eq!(config.version, before);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn header_transforms_may_change_identity_and_host_when_explicitly_allowed() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    let gw = &stack.gateways()[0];
    let created = create_api_key_synced(&stack, "partner", "svc-partner", "admin").await?;
    upsert_route_synced(
        &stack,
        Route {
            auth: AuthMode::AuthApiKey as i32,
            // This backend only ever gets read access, whatever the key says,
            // and routes by virtual host.
            request_headers: Some(HeaderTransform {
                allow_identity_and_host: true,
                ..transform(
                    &[("X-User-Role", "reader"), ("Host", "backend.internal")],
                    &[],
                    &[],
                )
            }),
            ..open_route("narrowed", "/narrowed/users", "users", "/users")
        },
    )
    .await?;
    let resp = client()
        .get(format!("{gw}/narrowed/users/1"))
        .header("x-api-key", &created.key)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let doc: Value = resp.json().await?;
    let seen = &doc["headers"];
    assert_eq!(seen["x-user-id"], "svc-partner", "{seen}");
    assert_eq!(seen["x-user-role"], "reader", "{seen}");
    assert_eq!(seen["host"], "backend.internal", "{seen}");
    Ok(())
}

const APP: &str = "https://app.example";

#[tokio::test(flavor = "multi_thread")]
async fn cors_preflights_are_answered_at_the_gateway_and_actual_requests_decorated() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    let gw = &stack.gateways()[0];
    upsert_route_synced(
        &stack,
        Route {
            // OPTIONS is not among the route's methods: preflights must still
            // work. DELETE is served but not allowed cross-origin.
            methods: strings(&["GET", "PUT", "DELETE"]),
            rate_limit: Some(RateLimit {
                policy: "cors-budget".into(),
                algorithm: RateLimitAlgorithm::FixedWindow as i32,
                key: RateLimitKey::KeyIp as i32,
                limit: 3,
                window_seconds: 3600,
                key_header: String::new(),
            }),
            cors: Some(Cors {
                allow_origins: strings(&[APP, "http://localhost:3000"]),
                allow_methods: strings(&["GET", "PUT"]),
                allow_headers: strings(&["content-type", "x-requested-with"]),
                expose_headers: strings(&["x-request-id"]),
                allow_credentials: true,
                max_age_seconds: 600,
            }),
            ..open_route("browser", "/browser/users", "users", "/users")
        },
    )
    .await?;
    let http = client();
    let url = format!("{gw}/browser/users/1");
    let before = mock_requests(stack.ports().users_1).await?;

    // Preflights: answered by the gateway, no upstream call, no budget.
    for _ in 0..5 {
        let resp = http
            .request(reqwest::Method::OPTIONS, &url)
            .header("origin", APP)
            .header("access-control-request-method", "PUT")
            .header(
                "access-control-request-headers",
                "Content-Type, X-Requested-With",
            )
            .send()
            .await?;
        assert_eq!(resp.status(), 204);
        assert_eq!(header(&resp, "access-control-allow-origin"), Some(APP));
        assert_eq!(
            header(&resp, "access-control-allow-methods"),
            Some("GET, PUT")
        );
        assert_eq!(
            header(&resp, "access-control-allow-headers"),
            Some("content-type, x-requested-with")
        );
        assert_eq!(
            header(&resp, "access-control-allow-credentials"),
            Some("true")
        );
        assert_eq!(header(&resp, "access-control-max-age"), Some("600"));
        assert_eq!(header(&resp, "vary"), Some("origin"));
        assert!(header(&resp, "x-ratelimit-remaining").is_none());
        assert!(header(&resp, "x-request-id").is_some());
    }
    assert_eq!(
        mock_requests(stack.ports().users_1).await?,
        before,
        "a preflight reached the backend"
    );

    // The actual request: proxied, decorated, and the first to spend budget.
    let resp = http.get(&url).header("origin", APP).send().await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "access-control-allow-origin"), Some(APP));
    assert_eq!(
        header(&resp, "access-control-allow-credentials"),
        Some("true")
    );
    assert_eq!(
        header(&resp, "access-control-expose-headers"),
        Some("x-request-id")
    );
    assert_eq!(header(&resp, "vary"), Some("origin"));
    assert_eq!(
        header(&resp, "x-ratelimit-remaining"),
        Some("2"),
        "preflights spent rate-limit budget"
    );
    assert_eq!(mock_requests(stack.ports().users_1).await?, before + 1);

    // A disallowed origin: its preflight is refused (and counted) ...
    let refused = r#"gateway_policy_refusals_total{route="browser",reason="cors"}"#;
    assert_eq!(
        metric_sample(&stack.gateway_admins()[0], refused).await?,
        0.0
    );
    for (origin, method, asked) in [
        ("https://evil.example", "PUT", None),
        (APP, "DELETE", None),
        (APP, "PUT", Some("x-secret")),
    ] {
        let mut req = http
            .request(reqwest::Method::OPTIONS, &url)
            .header("origin", origin)
            .header("access-control-request-method", method);
        if let Some(asked) = asked {
            req = req.header("access-control-request-headers", asked);
        }
        let resp = req.send().await?;
        assert_eq!(resp.status(), 403, "{origin} {method} {asked:?}");
        assert!(header(&resp, "access-control-allow-origin").is_none());
        let doc: Value = resp.json().await?;
        assert_eq!(doc["type"], "urn:gateway:problem:cors-refused");
    }
    assert_eq!(
        metric_sample(&stack.gateway_admins()[0], refused).await?,
        3.0
    );
    assert_eq!(mock_requests(stack.ports().users_1).await?, before + 1);

    // ... and its actual request is proxied without CORS headers (the browser blocks it).
    let resp = http
        .get(&url)
        .header("origin", "https://evil.example")
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "access-control-allow-origin").is_none());
    assert!(header(&resp, "access-control-allow-credentials").is_none());
    assert_eq!(header(&resp, "vary"), Some("origin"));
    assert_eq!(mock_requests(stack.ports().users_1).await?, before + 2);
    Ok(())
}
