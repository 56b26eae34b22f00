//! Stacked rate limits, the new keys and the sliding window as clients see
//! them (issue 10): `Route.rate_limits` alongside `rate_limit`, `KEY_ROUTE`,
//! `KEY_HEADER` (+ `key_header`), `KEY_API_KEY` with `AUTH_API_KEY`, `SLIDING_WINDOW`.
//!
//! Every limit must admit a request, and a refused request spends from no
//! budget; the response headers describe the most restrictive limit (a
//! refusal's: the refusing one). Budgets live in Redis; the stacks here give
//! the limiter a generous decision deadline so no decision falls back to the
//! replica-local limiter (whose budgets start full) on a loaded machine.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::{AuthMode, RateLimit, RateLimitAlgorithm, RateLimitKey, Route};
use gateway_tests::{client, create_api_key_synced, header, open_route, upsert_route_synced};
use reqwest::StatusCode;

async fn start() -> Result<Stack> {
    Stack::new()
        .data_planes(1)
        .auth(false)
        .env("*", "DP_RATELIMIT_TIMEOUT_MS", "250")
        .start()
        .await
        .context("stack did not start")
}

fn limit(
    policy: &str,
    algorithm: RateLimitAlgorithm,
    key: RateLimitKey,
    limit: u32,
    window_seconds: u32,
) -> RateLimit {
    RateLimit {
        policy: policy.into(),
        algorithm: algorithm as i32,
        key: key as i32,
        limit,
        window_seconds,
        key_header: if key == RateLimitKey::KeyHeader {
            "X-Client".into()
        } else {
            String::new()
        },
    }
}

/// What one response said.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    policy: Option<String>,
    remaining: Option<u64>,
    retry_after: Option<u64>,
    sent: Instant,
    received: Instant,
}

/// `GET url`, with `X-Client: client_id` when given (the stacks' KEY_HEADER).
async fn get(http: &reqwest::Client, url: &str, client_id: Option<&str>) -> Result<Seen> {
    get_with(http, url, client_id.map(|id| ("x-client", id))).await
}

/// `GET url` with one extra request header, and what the answer said.
async fn get_with(http: &reqwest::Client, url: &str, extra: Option<(&str, &str)>) -> Result<Seen> {
    let mut request = http.get(url);
    if let Some((name, value)) = extra {
        request = request.header(name, value);
    }
    let sent = Instant::now();
    let response = request.send().await.with_context(|| url.to_owned())?;
    let received = Instant::now();
    let number = |name| header(&response, name).and_then(|v| v.parse().ok());
    Ok(Seen {
        status: response.status(),
        policy: header(&response, "ratelimit-policy").map(str::to_owned),
        remaining: number("x-ratelimit-remaining"),
        retry_after: number("retry-after"),
        sent,
        received,
    })
}

#[track_caller]
fn expect(seen: &Seen, status: StatusCode, policy: &str, remaining: u64) {
    assert_eq!(seen.status, status, "{seen:?}");
    assert_eq!(seen.policy.as_deref(), Some(policy), "{seen:?}");
    assert_eq!(seen.remaining, Some(remaining), "{seen:?}");
    assert_eq!(
        seen.retry_after.is_some(),
        status == StatusCode::TOO_MANY_REQUESTS,
        "Retry-After on refusals only: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stacked_limits_all_admit_and_a_refusal_burns_no_budget() -> Result<()> {
    let stack = start().await?;
    let gw = &stack.gateways()[0];
    upsert_route_synced(
        &stack,
        Route {
            // Per client address (generous), stacked with one budget for the
            // whole route and one per X-Client value.
            rate_limit: Some(limit(
                "stk-ip",
                RateLimitAlgorithm::SlidingWindow,
                RateLimitKey::KeyIp,
                100,
                60,
            )),
            rate_limits: vec![
                limit(
                    "stk-route",
                    RateLimitAlgorithm::TokenBucket,
                    RateLimitKey::KeyRoute,
                    3,
                    3600,
                ),
                limit(
                    "stk-client",
                    RateLimitAlgorithm::TokenBucket,
                    RateLimitKey::KeyHeader,
                    2,
                    3600,
                ),
            ],
            ..open_route("stacked", "/stacked/users", "users", "/users")
        },
    )
    .await?;
    let http = client();
    let url = format!("{gw}/stacked/users/1");
    let client_budget = "\"stk-client\";q=2;w=3600";
    let route_budget = "\"stk-route\";q=3;w=3600";

    // Caller a: its own budget of 2 is the tightest limit.
    expect(
        &get(&http, &url, Some("a")).await?,
        StatusCode::OK,
        client_budget,
        1,
    );
    expect(
        &get(&http, &url, Some("a")).await?,
        StatusCode::OK,
        client_budget,
        0,
    );
    // Refused by its own budget, three times: the route budget keeps its 1.
    for _ in 0..3 {
        let s = get(&http, &url, Some("a")).await?;
        expect(&s, StatusCode::TOO_MANY_REQUESTS, client_budget, 0);
        ensure!(
            s.retry_after.is_some_and(|r| (1..=1800).contains(&r)),
            "{s:?}"
        );
    }
    // Caller b is counted apart (KEY_HEADER), and gets the route's last request:
    // now the route budget, with 0 left, is the tightest.
    expect(
        &get(&http, &url, Some("b")).await?,
        StatusCode::OK,
        route_budget,
        0,
    );
    // Then the route refuses everyone, b included (b's own budget still has 1).
    for caller in ["b", "c"] {
        let s = get(&http, &url, Some(caller)).await?;
        expect(&s, StatusCode::TOO_MANY_REQUESTS, route_budget, 0);
    }
    // The per-IP sliding window spent exactly the 3 admitted requests.
    upsert_route_synced(
        &stack,
        Route {
            rate_limit: Some(limit(
                "stk-ip",
                RateLimitAlgorithm::SlidingWindow,
                RateLimitKey::KeyIp,
                100,
                60,
            )),
            ..open_route("ip-only", "/ip-only/users", "users", "/users")
        },
    )
    .await?;
    let s = get(&http, &format!("{gw}/ip-only/users/1"), None).await?;
    // 100 − 3 − this one, or one more if the minute turned meanwhile and the
    // 3 already weigh a little less than 3.
    ensure!(s.status == StatusCode::OK, "{s:?}");
    ensure!(
        matches!(s.remaining, Some(96 | 97)),
        "the refusals spent from the per-IP budget: {s:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn key_header_counts_per_value_and_requests_without_it_share_a_budget() -> Result<()> {
    let stack = start().await?;
    let gw = &stack.gateways()[0];
    upsert_route_synced(
        &stack,
        Route {
            rate_limits: vec![limit(
                "per-tenant",
                RateLimitAlgorithm::TokenBucket,
                RateLimitKey::KeyHeader,
                1,
                3600,
            )],
            ..open_route("tenants", "/tenants/users", "users", "/users")
        },
    )
    .await?;
    let http = client();
    let url = format!("{gw}/tenants/users/1");
    let budget = "\"per-tenant\";q=1;w=3600";
    for tenant in ["acme", "globex"] {
        expect(
            &get(&http, &url, Some(tenant)).await?,
            StatusCode::OK,
            budget,
            0,
        );
        expect(
            &get(&http, &url, Some(tenant)).await?,
            StatusCode::TOO_MANY_REQUESTS,
            budget,
            0,
        );
    }
    // Without the header (or with an empty value): one shared budget.
    expect(&get(&http, &url, None).await?, StatusCode::OK, budget, 0);
    expect(
        &get(&http, &url, None).await?,
        StatusCode::TOO_MANY_REQUESTS,
        budget,
        0,
    );
    expect(
        &get(&http, &url, Some("")).await?,
        StatusCode::TOO_MANY_REQUESTS,
        budget,
        0,
    );
    Ok(())
}

/// `GET url` with `X-API-Key: key`.
async fn get_keyed(http: &reqwest::Client, url: &str, key: &str) -> Result<Seen> {
    get_with(http, url, Some(("x-api-key", key))).await
}

#[tokio::test(flavor = "multi_thread")]
async fn per_ip_and_per_api_key_limits_both_apply_and_a_refusal_burns_neither() -> Result<()> {
    let stack = start().await?;
    let gw = &stack.gateways()[0];
    let per_ip = limit(
        "keyed-ip",
        RateLimitAlgorithm::TokenBucket,
        RateLimitKey::KeyIp,
        5,
        3600,
    );
    let per_key = limit(
        "keyed-key",
        RateLimitAlgorithm::TokenBucket,
        RateLimitKey::KeyApiKey,
        3,
        3600,
    );
    upsert_route_synced(
        &stack,
        Route {
            auth: AuthMode::AuthApiKey as i32,
            rate_limit: Some(per_ip.clone()),
            rate_limits: vec![per_key.clone()],
            ..open_route("keyed-stack", "/keyed-stack/users", "users", "/users")
        },
    )
    .await?;
    let alpha = create_api_key_synced(&stack, "alpha", "svc-alpha", "service")
        .await?
        .key;
    let beta = create_api_key_synced(&stack, "beta", "svc-beta", "service")
        .await?
        .key;
    let http = client();
    let url = format!("{gw}/keyed-stack/users/1");
    let key_budget = "\"keyed-key\";q=3;w=3600";
    let ip_budget = "\"keyed-ip\";q=5;w=3600";

    // No key: 401 before rate limiting, so no budget is touched.
    let anonymous = http.get(&url).send().await?;
    ensure!(
        anonymous.status() == StatusCode::UNAUTHORIZED,
        "{anonymous:?}"
    );

    // alpha spends its own 3 (the tightest limit: per key 2, 1, 0 left; per IP 4, 3, 2).
    for left in [2, 1, 0] {
        expect(
            &get_keyed(&http, &url, &alpha).await?,
            StatusCode::OK,
            key_budget,
            left,
        );
    }
    // Then its key refuses it, three times; the shared per-IP budget keeps its 2.
    for _ in 0..3 {
        expect(
            &get_keyed(&http, &url, &alpha).await?,
            StatusCode::TOO_MANY_REQUESTS,
            key_budget,
            0,
        );
    }
    // beta, from the same address: its key has 3, the address 2 — now the tightest.
    expect(
        &get_keyed(&http, &url, &beta).await?,
        StatusCode::OK,
        ip_budget,
        1,
    );
    expect(
        &get_keyed(&http, &url, &beta).await?,
        StatusCode::OK,
        ip_budget,
        0,
    );
    // The address refuses beta (whose key still has 1) twice.
    for _ in 0..2 {
        expect(
            &get_keyed(&http, &url, &beta).await?,
            StatusCode::TOO_MANY_REQUESTS,
            ip_budget,
            0,
        );
    }
    // Those refusals did not spend beta's key budget: on a route limited per key
    // only (same policy, same budget), beta gets exactly its last request.
    upsert_route_synced(
        &stack,
        Route {
            auth: AuthMode::AuthApiKey as i32,
            rate_limits: vec![per_key],
            ..open_route("keyed-only", "/keyed-only/users", "users", "/users")
        },
    )
    .await?;
    let only = format!("{gw}/keyed-only/users/1");
    expect(
        &get_keyed(&http, &only, &beta).await?,
        StatusCode::OK,
        key_budget,
        0,
    );
    expect(
        &get_keyed(&http, &only, &beta).await?,
        StatusCode::TOO_MANY_REQUESTS,
        key_budget,
        0,
    );
    Ok(())
}

const SW_LIMIT: u64 = 4;
const SW_WINDOW: Duration = Duration::from_secs(2);

/// Milliseconds since the Unix epoch (Redis's clock is this machine's).
fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn sliding_window_stays_within_its_bound_across_a_window_edge() -> Result<()> {
    let stack = start().await?;
    let gw = &stack.gateways()[0];
    upsert_route_synced(
        &stack,
        Route {
            rate_limits: vec![limit(
                "sliding",
                RateLimitAlgorithm::SlidingWindow,
                RateLimitKey::KeyRoute,
                SW_LIMIT as u32,
                SW_WINDOW.as_secs() as u32,
            )],
            ..open_route("sliding", "/sliding/users", "users", "/users")
        },
    )
    .await?;
    let http = client();
    let url = format!("{gw}/sliding/users/1");
    let w = SW_WINDOW.as_millis() as u64;

    // Wait (bounded) for the middle of a counting window, so the burst below
    // lands in one window with room to spare.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(900..1_100).contains(&(epoch_ms() % w)) {
        ensure!(Instant::now() < deadline, "never reached mid-window");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let edge_ms = (epoch_ms() / w + 1) * w;
    let edge = Instant::now() + Duration::from_millis(edge_ms - epoch_ms());

    // The whole budget at once, then one more.
    let burst = futures::future::join_all((0..SW_LIMIT).map(|_| get(&http, &url, None))).await;
    let mut seen = Vec::new();
    for s in burst {
        let s = s?;
        ensure!(s.status == StatusCode::OK, "{s:?}");
        ensure!(
            s.received < edge,
            "the burst ran into the next window: {s:?}"
        );
        seen.push(s);
    }
    let refused = get(&http, &url, None).await?;
    ensure!(
        refused.status == StatusCode::TOO_MANY_REQUESTS,
        "{refused:?}"
    );

    // Keep asking until 1.5 s after the edge.
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    while Instant::now() < edge + Duration::from_millis(1_500) {
        tick.tick().await;
        seen.push(get(&http, &url, None).await?);
    }

    // Right after the edge the previous window's 4 still weigh 4 × (1 − e/2 s):
    // nothing fits before e = 500 ms (a fixed window would admit 4 at once).
    let early = Duration::from_millis(20)..Duration::from_millis(450);
    for s in &seen {
        let decided_early = s.sent >= edge + early.start && s.received <= edge + early.end;
        ensure!(
            !(decided_early && s.status == StatusCode::OK),
            "admitted {:?} after the window edge, while the previous window still weighs: {s:?}",
            s.sent.saturating_duration_since(edge)
        );
    }
    // And it admits again later (one from e = 500 ms, the next from e = 1 s).
    let later = seen
        .iter()
        .filter(|s| s.sent >= edge && s.status == StatusCode::OK)
        .count();
    ensure!(later >= 1, "nothing admitted after the edge: {seen:#?}");

    // The documented bound: no span of one window holds more than 2 × limit − 1
    // admitted requests (counting those surely decided inside the span).
    let admitted: Vec<&Seen> = seen.iter().filter(|s| s.status == StatusCode::OK).collect();
    for first in &admitted {
        let inside = admitted
            .iter()
            .filter(|s| s.sent >= first.sent && s.received < first.sent + SW_WINDOW)
            .count() as u64;
        ensure!(
            inside < 2 * SW_LIMIT,
            "{inside} admitted within one window from {:?}",
            first.sent
        );
    }
    // Each refusal says when to come back.
    for s in seen
        .iter()
        .filter(|s| s.status == StatusCode::TOO_MANY_REQUESTS)
    {
        ensure!(s.retry_after.is_some_and(|r| (1..=4).contains(&r)), "{s:?}");
    }
    Ok(())
}
