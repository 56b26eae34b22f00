//! Rate limits as clients see them (issue 5, docs/grpc-api.md RateLimit and
//! docs/data-plane.md "Rate-limit"), through 3 data planes started by devstack with the demo
//! configuration: `api` = per-user token bucket, 20 per 60 s, shared by
//! `/api/users` and `/api/orders`; `login` = per-IP fixed window, 5 per 60 s.
//!
//! Every limited response must carry `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `RateLimit-Policy: "<policy>";q=<limit>;w=<window>`
//! and `RateLimit: "<policy>";r=<remaining>;t=<seconds>`; a 429 adds
//! `Retry-After` and a problem+json body.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use devstack::Stack;
// At the auth service itself, not through the gateway, so the per-IP login budget stays untouched.
use futures::future::join_all;
use gateway_tests::{login, metric_sum};
use reqwest::{Client, Method, StatusCode};

const API_LIMIT: u64 = 20;
const API_WINDOW: u64 = 60;
/// The `api` bucket refills one token every window / limit = 3 s.
const API_TOKEN_EVERY: Duration = Duration::from_secs(API_WINDOW / API_LIMIT);
const LOGIN_LIMIT: u64 = 5;
const LOGIN_WINDOW: u64 = 60;

fn client() -> Result<Client> {
    Ok(Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// What one response said about its rate limit.
#[derive(Debug, Clone)]
struct Seen {
    gateway: usize,
    status: StatusCode,
    elapsed: Duration,
    limit: Option<u64>,
    remaining: Option<u64>,
    policy: Option<String>,
    ratelimit: Option<String>,
    retry_after: Option<u64>,
    content_type: Option<String>,
    body: String,
}

async fn send(
    http: &Client,
    method: Method,
    url: String,
    gateway: usize,
    token: Option<&str>,
    json: Option<serde_json::Value>,
) -> Result<Seen> {
    let mut request = http.request(method, &url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(json) = json {
        request = request.json(&json);
    }
    let started = Instant::now();
    let response = request.send().await.with_context(|| url.clone())?;
    let elapsed = started.elapsed();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let number = |name: &str| -> Result<Option<u64>> {
        header(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .with_context(|| format!("{name}: {v:?}"))
            })
            .transpose()
    };
    let seen = Seen {
        gateway,
        status: response.status(),
        elapsed,
        limit: number("x-ratelimit-limit")?,
        remaining: number("x-ratelimit-remaining")?,
        policy: header("ratelimit-policy"),
        ratelimit: header("ratelimit"),
        retry_after: number("retry-after")?,
        content_type: header("content-type"),
        body: String::new(),
    };
    let body = response.text().await?;
    Ok(Seen { body, ..seen })
}

/// `"api";r=19;t=3` → ("api", {r: 19, t: 3}).
fn parse_ratelimit(field: &str) -> Result<(String, BTreeMap<String, u64>)> {
    let mut parts = field.split(';');
    let name = parts.next().unwrap_or_default().trim();
    ensure!(
        name.len() >= 2 && name.starts_with('"') && name.ends_with('"'),
        "policy name must be a quoted string: {field:?}"
    );
    let mut params = BTreeMap::new();
    for part in parts {
        let (key, value) = part
            .trim()
            .split_once('=')
            .with_context(|| format!("parameter without '=' in {field:?}"))?;
        params.insert(
            key.to_owned(),
            value
                .parse()
                .with_context(|| format!("non-integer {key} in {field:?}"))?,
        );
    }
    Ok((name[1..name.len() - 1].to_owned(), params))
}

/// Checks every rate-limit field of a limited response against the policy,
/// and against each other.
fn check_fields(seen: &Seen, policy: &str, limit: u64, window: u64) -> Result<()> {
    let ctx = || format!("{seen:?}");
    ensure!(seen.limit == Some(limit), "X-RateLimit-Limit: {}", ctx());
    let remaining = seen
        .remaining
        .with_context(|| format!("no X-RateLimit-Remaining: {}", ctx()))?;
    ensure!(
        remaining < limit,
        "remaining {remaining} must be below the limit: {}",
        ctx()
    );
    ensure!(
        seen.policy.as_deref() == Some(&format!("\"{policy}\";q={limit};w={window}")),
        "RateLimit-Policy: {}",
        ctx()
    );
    let (name, params) = parse_ratelimit(seen.ratelimit.as_deref().context("no RateLimit field")?)?;
    ensure!(name == policy, "RateLimit names {name:?}: {}", ctx());
    ensure!(
        params.get("r") == Some(&remaining),
        "RateLimit r vs X-RateLimit-Remaining: {}",
        ctx()
    );
    let t = *params
        .get("t")
        .with_context(|| format!("RateLimit without t: {}", ctx()))?;
    ensure!(t <= window, "t beyond the window: {}", ctx());
    match seen.status {
        StatusCode::TOO_MANY_REQUESTS => {
            ensure!(remaining == 0, "a 429 has nothing remaining: {}", ctx());
            let retry = seen
                .retry_after
                .with_context(|| format!("429 without Retry-After: {}", ctx()))?;
            ensure!(
                retry >= 1 && retry <= t,
                "Retry-After {retry} must be in 1..=t ({t}): {}",
                ctx()
            );
            ensure!(
                seen.content_type
                    .as_deref()
                    .is_some_and(|c| c.starts_with("application/problem+json")),
                "429 must be problem+json: {}",
                ctx()
            );
            let body: serde_json::Value =
                serde_json::from_str(&seen.body).with_context(|| format!("429 body: {}", ctx()))?;
            ensure!(body["status"] == 429, "problem status: {}", ctx());
            ensure!(
                body["type"].is_string() && body["title"].is_string(),
                "problem type/title: {}",
                ctx()
            );
        }
        status if status.is_success() => {
            ensure!(
                seen.retry_after.is_none(),
                "Retry-After on a success: {}",
                ctx()
            );
            ensure!(
                t >= 1,
                "an admitted request spent budget, so t >= 1: {}",
                ctx()
            );
        }
        status => bail!("unexpected status {status}: {}", ctx()),
    }
    Ok(())
}

/// `n` concurrent GETs as `token`, request i to gateway i % 3 and alternately
/// to /api/users/1 and /api/orders/1.
async fn api_burst(
    http: &Client,
    stack: &Stack,
    token: &str,
    n: usize,
) -> Result<(Vec<Seen>, Duration)> {
    let gateways = stack.gateways();
    let started = Instant::now();
    let seen = join_all((0..n).map(|i| {
        let gateway = i % gateways.len();
        let path = if i % 2 == 0 {
            "/api/users/1"
        } else {
            "/api/orders/1"
        };
        send(
            http,
            Method::GET,
            format!("{}{path}", gateways[gateway]),
            gateway,
            Some(token),
            None,
        )
    }))
    .await
    .into_iter()
    .collect::<Result<Vec<_>>>()?;
    Ok((seen, started.elapsed()))
}

const FALLBACK_METRIC: &str = "gateway_ratelimit_fallbacks_total";

/// Fallbacks, Redis timeouts, Redis errors and merged decisions, summed over `admins`.
async fn limiter_counters(admins: &[String]) -> Result<[f64; 4]> {
    let mut sums = [0.0; 4];
    for admin in admins {
        for (sum, name) in sums.iter_mut().zip([
            FALLBACK_METRIC,
            "gateway_ratelimit_redis_timeouts_total",
            "gateway_ratelimit_redis_errors_total",
            "gateway_ratelimit_merged_decisions_total",
        ]) {
            *sum += metric_sum(admin, name).await?;
        }
    }
    Ok(sums)
}
/// The data plane's `--ratelimit-timeout-ms` (decision deadline) from the environment.
const RATELIMIT_TIMEOUT_ENV: &str = "DP_RATELIMIT_TIMEOUT_MS";

/// Waits (at most `within`) until the current wall-clock minute has at least
/// `room` left, so a fixed 60 s window (aligned to the minute, on Redis's
/// clock, which is this machine's) cannot end in the middle of the test.
async fn wait_for_room_in_minute(room: Duration, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let into_minute = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() % 60_000;
        if Duration::from_millis(60_000 - into_minute as u64) >= room {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "clock never left the end of a minute"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_are_shared_exact_and_fully_described() -> Result<()> {
    // Exactness needs every decision to reach Redis. With the production
    // deadline (5 ms), a debug build on a loaded 2-core CI box misses it for
    // ~1-2% of decisions (the Redis process or the reader task is simply not
    // scheduled in time), and a missed deadline is decided locally, which can
    // admit one request too many. This test is about the shared budget, not
    // latency (the outage test below keeps the default deadline), so it gives
    // the limiter room. Unknown variables are ignored by processes.
    let stack = Stack::new()
        .data_planes(3)
        .env("*", RATELIMIT_TIMEOUT_ENV, "250")
        .start()
        .await?;
    let http = client()?;
    let token = login(&stack.auth_url(), "alice", "wonderland").await?;

    // One user, 3 replicas, both routes, all at once: the shared `api` budget admits exactly 20.
    let (seen, elapsed) = api_burst(&http, &stack, &token, 60).await?;
    let admitted: Vec<&Seen> = seen.iter().filter(|s| s.status == StatusCode::OK).collect();
    let refused = seen
        .iter()
        .filter(|s| s.status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    let others: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.status != StatusCode::OK && s.status != StatusCode::TOO_MANY_REQUESTS)
        .collect();
    ensure!(others.is_empty(), "only 200 and 429 expected: {others:#?}");
    // The bucket refills a token every 3 s; if the burst took longer, a refill is legitimate.
    let refills = (elapsed.as_millis() / API_TOKEN_EVERY.as_millis()) as u64;
    let fallbacks: Vec<f64> = join_all(
        stack
            .gateway_admins()
            .iter()
            .map(|a| metric_sum(a, FALLBACK_METRIC)),
    )
    .await
    .into_iter()
    .collect::<Result<_>>()?;
    ensure!(
        (API_LIMIT..=API_LIMIT + refills).contains(&(admitted.len() as u64)),
        "admitted {} of 60 in {elapsed:?} (expected exactly {API_LIMIT} + {refills} refills); \
         per replica: {:?}; fallbacks per replica: {fallbacks:?}",
        admitted.len(),
        (0..3)
            .map(|g| admitted.iter().filter(|s| s.gateway == g).count())
            .collect::<Vec<_>>()
    );
    ensure!(refused + admitted.len() == 60);
    // Shared: the budget is spent across replicas, so every replica saw both outcomes' fields.
    for s in &seen {
        check_fields(s, "api", API_LIMIT, API_WINDOW)?;
    }
    if refills == 0 {
        // One atomic budget: the admitted requests saw every remaining count once.
        let mut remaining: Vec<u64> = admitted.iter().filter_map(|s| s.remaining).collect();
        remaining.sort_unstable();
        ensure!(
            remaining == (0..API_LIMIT).collect::<Vec<_>>(),
            "remaining counts {remaining:?}"
        );
        // The token bucket refills one token every 3 s: that is the longest wait.
        for s in seen
            .iter()
            .filter(|s| s.status == StatusCode::TOO_MANY_REQUESTS)
        {
            ensure!(
                s.retry_after
                    .is_some_and(|r| r <= API_TOKEN_EVERY.as_secs()),
                "{s:?}"
            );
        }
    }

    // Logins through the gateway: 5 per minute per client IP, shared by all replicas.
    wait_for_room_in_minute(Duration::from_secs(20), Duration::from_secs(60)).await?;
    let gateways = stack.gateways();
    for i in 0..6u64 {
        let gateway = i as usize % gateways.len();
        let s = send(
            &http,
            Method::POST,
            format!("{}/auth/login", gateways[gateway]),
            gateway,
            None,
            Some(serde_json::json!({"username": "alice", "password": "wonderland"})),
        )
        .await?;
        check_fields(&s, "login", LOGIN_LIMIT, LOGIN_WINDOW)?;
        if i < LOGIN_LIMIT {
            ensure!(
                s.status == StatusCode::OK,
                "login {} must pass: {s:?}",
                i + 1
            );
            ensure!(
                s.remaining == Some(LOGIN_LIMIT - 1 - i),
                "login {}: {s:?}",
                i + 1
            );
        } else {
            ensure!(
                s.status == StatusCode::TOO_MANY_REQUESTS,
                "the 6th login must be refused: {s:?}"
            );
            let (_, params) = parse_ratelimit(s.ratelimit.as_deref().unwrap_or_default())?;
            // A fixed window: retry exactly when it resets, within the 60 s window.
            ensure!(
                s.retry_after == params.get("t").copied(),
                "Retry-After == t: {s:?}"
            );
            ensure!(
                s.retry_after
                    .is_some_and(|r| (1..=LOGIN_WINDOW).contains(&r)),
                "{s:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_outage_falls_back_locally_and_shared_limits_come_back() -> Result<()> {
    let stack = Stack::new().data_planes(3).start().await?;
    let http = client()?;
    let alice = login(&stack.auth_url(), "alice", "wonderland").await?;
    let bob = login(&stack.auth_url(), "bob", "builder").await?;
    let admins = stack.gateway_admins();
    // Generous for debug builds on a busy machine; the decision itself is
    // bounded at a few ms (gateway-ratelimit's own tests check that), so a
    // gateway that waited on the dead Redis would blow far past this.
    let fast = Duration::from_millis(500);

    // Shared limiting works before the outage (a few requests, well under the limit).
    let (seen, _) = api_burst(&http, &stack, &alice, 3).await?;
    ensure!(seen.iter().all(|s| s.status == StatusCode::OK), "{seen:#?}");

    stack.kill("redis").await?;

    // Mid-outage traffic: 30 requests per replica. No 5xx, fast answers, local
    // budgets (fresh, so each replica admits up to the limit on its own).
    let (seen, elapsed) = api_burst(&http, &stack, &alice, 90).await?;
    let refills = (elapsed.as_millis() / API_TOKEN_EVERY.as_millis()) as u64;
    for s in &seen {
        ensure!(
            !s.status.is_server_error(),
            "5xx during the Redis outage: {s:?}"
        );
        ensure!(
            s.elapsed < fast,
            "slow answer during the Redis outage: {s:?}"
        );
        check_fields(s, "api", API_LIMIT, API_WINDOW)?;
    }
    let per_replica: Vec<usize> = (0..3)
        .map(|g| {
            seen.iter()
                .filter(|s| s.gateway == g && s.status == StatusCode::OK)
                .count()
        })
        .collect();
    for (g, admitted) in per_replica.iter().enumerate() {
        ensure!(
            *admitted as u64 <= API_LIMIT + refills,
            "replica {g} admitted {admitted}: the local limiter must still enforce the policy ({per_replica:?})"
        );
    }
    ensure!(
        per_replica.iter().sum::<usize>() as u64 > API_LIMIT,
        "during an outage each replica limits on its own, so together they admit more than one budget: {per_replica:?}"
    );
    for admin in &admins {
        let fallbacks = metric_sum(admin, FALLBACK_METRIC).await?;
        ensure!(
            fallbacks > 0.0,
            "{admin}/metrics counts no rate-limit fallback"
        );
    }

    // Redis back (empty, on the same port): every replica returns to the
    // shared budget by itself. A replica is back when a request through it
    // leaves its fallback counter unchanged.
    stack.start_process("redis").await?;
    let gateways = stack.gateways();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut back = [false; 3];
    while !back.iter().all(|b| *b) {
        ensure!(
            Instant::now() < deadline,
            "shared limiting did not resume on every replica: {back:?}"
        );
        for g in 0..3 {
            if back[g] {
                continue;
            }
            let before = metric_sum(&admins[g], FALLBACK_METRIC).await?;
            let s = send(
                &http,
                Method::GET,
                format!("{}/api/users/1", gateways[g]),
                g,
                Some(&alice),
                None,
            )
            .await?;
            ensure!(!s.status.is_server_error(), "{s:?}");
            let after = metric_sum(&admins[g], FALLBACK_METRIC).await?;
            back[g] = after == before;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // And the budget is shared again: bob (untouched so far) gets exactly 20 across the replicas.
    // This stack runs the production deadline (5 ms), so on a loaded machine a
    // decision may still miss Redis now and then; each such miss is decided
    // locally, may admit one extra request, and is counted. So: exactly the
    // limit, plus refills, plus at most one per counted fallback.
    let before = limiter_counters(&admins).await?;
    let (seen, elapsed) = api_burst(&http, &stack, &bob, 60).await?;
    let after = limiter_counters(&admins).await?;
    let delta: Vec<u64> = after
        .iter()
        .zip(&before)
        .map(|(a, b)| (a - b).max(0.0) as u64)
        .collect();
    let missed = delta[0];
    ensure!(
        seen.iter().all(|s| !s.status.is_server_error()),
        "{seen:#?}"
    );
    let admitted = seen.iter().filter(|s| s.status == StatusCode::OK).count() as u64;
    let refills = (elapsed.as_millis() / API_TOKEN_EVERY.as_millis()) as u64;
    // Shared limiting that had not resumed would decide (nearly) all 60 locally;
    // a loaded debug build misses the deadline for a minority at most.
    ensure!(
        missed < 30,
        "{missed} of 60 decisions fell back although Redis is up: shared limiting did not really resume \
         (of the burst: {} Redis timeouts, {} Redis errors, {} merged decisions)",
        delta[1],
        delta[2],
        delta[3]
    );
    ensure!(
        (API_LIMIT..=API_LIMIT + refills + missed).contains(&admitted),
        "after Redis came back, bob got {admitted} of 60 in {elapsed:?}; expected exactly {API_LIMIT} (+{refills} refills, +{missed} counted fallbacks)"
    );
    Ok(())
}
