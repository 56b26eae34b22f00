//! Request coalescing (issue 11, `Route.coalesce`) against real processes:
//! identical concurrent GETs share one upstream call, counted at the mock
//! (`GET /stats`).
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use devstack::Stack;
use futures::future::join_all;
use gateway_proto::v1::{AuthMode, Route};
use gateway_tests::{
    client, login, mock_requests, open_route, poll, raw_request, upsert_route_synced,
};
use serde_json::Value;

/// Deadline for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);
/// How long the mock holds each request: long enough for every concurrent
/// request of a test to reach the gateway while the first is in flight.
const DELAY_MS: u32 = 3000;

async fn start(auth: bool) -> Stack {
    Stack::new()
        .data_planes(1)
        .auth(auth)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"))
}

/// `/slow/users` → users (`/users`), without auth, coalescing.
fn coalescing_route() -> Route {
    Route {
        coalesce: true,
        timeout_ms: 10_000,
        ..open_route("slow-users", "/slow/users", "users", "/users")
    }
}

async fn coalesced_total(stack: &Stack, route: &str) -> Result<f64> {
    let text = client()
        .get(format!("{}/metrics", stack.gateway_admins()[0]))
        .send()
        .await?
        .text()
        .await?;
    let series = format!("gateway_coalesced_requests_total{{route=\"{route}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .with_context(|| format!("no {series} in /metrics"))
}

/// Status, `X-Request-Id` and body of `n` concurrent GETs of `url`, each
/// with `headers`.
async fn concurrent_gets(
    url: &str,
    n: usize,
    headers: &[(&str, &str)],
) -> Result<Vec<(u16, String, String)>> {
    let http = client();
    let requests = (0..n).map(|_| {
        let mut r = http.get(url);
        for (name, value) in headers {
            r = r.header(*name, *value);
        }
        async move {
            let response = r.send().await?;
            let status = response.status().as_u16();
            let id = response
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            Ok::<_, anyhow::Error>((status, id, response.text().await?))
        }
    });
    join_all(requests).await.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_identical_concurrent_gets_make_one_upstream_call() -> Result<()> {
    let stack = start(false).await;
    upsert_route_synced(&stack, coalescing_route()).await?;
    let url = format!("{}/slow/users/1?delay_ms={DELAY_MS}", stack.gateways()[0]);
    let before = mock_requests(stack.ports().users_1).await?;

    let answers = concurrent_gets(&url, 50, &[]).await?;

    ensure!(
        mock_requests(stack.ports().users_1).await? - before == 1,
        "the mock must see one request for 50 identical ones"
    );
    let (_, _, first_body) = &answers[0];
    let doc: Value = serde_json::from_str(first_body)?;
    ensure!(doc["name"] == "Alice", "{doc}");
    let mut ids = HashSet::new();
    for (status, id, body) in &answers {
        ensure!(*status == 200, "status {status}");
        ensure!(body == first_body, "every caller gets the same body");
        ensure!(ids.insert(id.clone()), "X-Request-Id {id:?} given twice");
    }
    ensure!(coalesced_total(&stack, "slow-users").await? == 49.0);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_with_cache_control_no_cache_are_not_coalesced() -> Result<()> {
    let stack = start(false).await;
    upsert_route_synced(&stack, coalescing_route()).await?;
    let url = format!("{}/slow/users/1?delay_ms=1000", stack.gateways()[0]);
    let before = mock_requests(stack.ports().users_1).await?;

    let answers = concurrent_gets(&url, 5, &[("cache-control", "no-cache")]).await?;

    ensure!(answers.iter().all(|(s, _, _)| *s == 200));
    ensure!(
        mock_requests(stack.ports().users_1).await? - before == 5,
        "no-cache requests each go upstream"
    );
    ensure!(coalesced_total(&stack, "slow-users").await? == 0.0);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn different_users_are_not_coalesced() -> Result<()> {
    let stack = start(true).await;
    upsert_route_synced(
        &stack,
        Route {
            auth: AuthMode::AuthJwt as i32,
            ..coalescing_route()
        },
    )
    .await?;
    let alice = login(&stack.auth_url(), "alice", "wonderland").await?;
    let bob = login(&stack.auth_url(), "bob", "builder").await?;
    let url = format!("{}/slow/users/1?delay_ms={DELAY_MS}", stack.gateways()[0]);
    let before = mock_requests(stack.ports().users_1).await?;

    let (alice, bob) = (format!("Bearer {alice}"), format!("Bearer {bob}"));
    let (alice, bob) = (
        [("authorization", alice.as_str())],
        [("authorization", bob.as_str())],
    );
    let (alices, bobs) = tokio::join!(
        concurrent_gets(&url, 5, &alice),
        concurrent_gets(&url, 5, &bob),
    );

    ensure!(
        mock_requests(stack.ports().users_1).await? - before == 2,
        "one upstream call per user"
    );
    for (who, answers) in [("alice", alices?), ("bob", bobs?)] {
        for (status, _, body) in answers {
            ensure!(status == 200, "{who}: status {status}");
            let doc: Value = serde_json::from_str(&body)?;
            ensure!(
                doc["headers"]["x-user-id"] == who,
                "{who} got someone else's answer: {doc}"
            );
        }
    }
    ensure!(coalesced_total(&stack, "slow-users").await? == 8.0);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_client_left_still_answers_its_followers() -> Result<()> {
    let stack = start(false).await;
    upsert_route_synced(&stack, coalescing_route()).await?;
    let url = format!("{}/slow/users/1?delay_ms={DELAY_MS}", stack.gateways()[0]);
    let before = mock_requests(stack.ports().users_1).await?;

    // The leader gives up long before the mock answers.
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()?;
    let leader = tokio::spawn(impatient.get(&url).send());
    poll(SOON, "the leader's call to reach the mock", || async {
        match mock_requests(stack.ports().users_1).await {
            Ok(n) if n > before => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let left = leader.await?;
    ensure!(
        left.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the leader's client must have given up: {left:?}"
    );

    // Followers join the call still in flight and get its answer.
    let answers = concurrent_gets(&url, 5, &[]).await?;
    for (status, _, body) in &answers {
        ensure!(*status == 200, "status {status}");
        let doc: Value = serde_json::from_str(body)?;
        ensure!(doc["name"] == "Alice", "{doc}");
    }
    ensure!(
        mock_requests(stack.ports().users_1).await? - before == 1,
        "the followers shared the abandoned leader's call"
    );
    stack.shutdown().await;
    Ok(())
}

/// Sends every `(head, label)` at once as raw bytes (`head` without the final
/// empty line) and returns each answer's label, status and echoed headers.
async fn concurrent_raw(gw: &str, heads: &[(String, String)]) -> Result<Vec<(String, u16, Value)>> {
    let requests = heads.iter().map(|(head, label)| async move {
        let r = raw_request(gw, head).await?;
        let doc = r.json()?;
        Ok::<_, anyhow::Error>((label.clone(), r.status, doc["headers"].clone()))
    });
    join_all(requests).await.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_for_different_hosts_get_answers_built_for_their_own_host() -> Result<()> {
    let stack = start(false).await;
    upsert_route_synced(&stack, coalescing_route()).await?;
    let gw = &stack.gateways()[0];
    let before = mock_requests(stack.ports().users_1).await?;

    // The route has no host, so both names reach it; three callers each.
    let heads: Vec<(String, String)> = ["a.example", "b.example"]
        .iter()
        .flat_map(|host| {
            (0..3).map(move |_| {
                (
                    format!("GET /slow/users/1?delay_ms={DELAY_MS} HTTP/1.1\r\nHost: {host}\r\n"),
                    (*host).to_owned(),
                )
            })
        })
        .collect();
    let answers = concurrent_raw(gw, &heads).await?;

    for (host, status, seen) in &answers {
        ensure!(*status == 200, "{host}: status {status}");
        ensure!(
            seen["host"] == host.as_str(),
            "a caller of {host} got the answer built for {}",
            seen["host"]
        );
    }
    ensure!(
        mock_requests(stack.ports().users_1).await? - before == 2,
        "one upstream call per host"
    );
    ensure!(coalesced_total(&stack, "slow-users").await? == 4.0);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn range_and_conditional_requests_never_get_another_callers_answer() -> Result<()> {
    let stack = start(false).await;
    upsert_route_synced(&stack, coalescing_route()).await?;
    let gw = &stack.gateways()[0];
    let before = mock_requests(stack.ports().users_1).await?;

    // Each variant twice, all at once: (label, extra header line).
    let variants = [
        ("plain", ""),
        ("range", "Range: bytes=0-9\r\n"),
        ("if-range", "Range: bytes=0-9\r\nIf-Range: \"v1\"\r\n"),
        ("if-none-match", "If-None-Match: \"v1\"\r\n"),
        (
            "if-modified-since",
            "If-Modified-Since: Sat, 01 Jan 2000 00:00:00 GMT\r\n",
        ),
        ("if-match", "If-Match: \"v1\"\r\n"),
        (
            "if-unmodified-since",
            "If-Unmodified-Since: Sat, 01 Jan 2000 00:00:00 GMT\r\n",
        ),
    ];
    let heads: Vec<(String, String)> = variants
        .iter()
        .flat_map(|(label, extra)| {
            (0..2).map(move |_| {
                (
                    format!(
                        "GET /slow/users/1?delay_ms={DELAY_MS} HTTP/1.1\r\nHost: gw\r\n{extra}"
                    ),
                    (*label).to_owned(),
                )
            })
        })
        .collect();
    let answers = concurrent_raw(gw, &heads).await?;

    // The mock echoes the headers of the request it answered: each answer
    // must come from a request asking exactly what its caller asked.
    let asked = [
        "range",
        "if-range",
        "if-none-match",
        "if-modified-since",
        "if-match",
        "if-unmodified-since",
    ];
    for (label, status, seen) in &answers {
        ensure!(*status == 200, "{label}: status {status}");
        let (_, extra) = variants
            .iter()
            .find(|(l, _)| l == label)
            .context("a variant")?;
        for name in asked {
            let mine = extra
                .split("\r\n")
                .find_map(|l| {
                    l.split_once(": ")
                        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                })
                .map(|(_, v)| v);
            ensure!(
                seen.get(name).and_then(Value::as_str) == mine,
                "a {label} caller got an answer built for {name}: {:?}: {seen}",
                seen.get(name)
            );
        }
    }
    ensure!(
        mock_requests(stack.ports().users_1).await? - before == variants.len() as u64,
        "one upstream call per variant"
    );
    ensure!(coalesced_total(&stack, "slow-users").await? == variants.len() as f64);
    stack.shutdown().await;
    Ok(())
}
