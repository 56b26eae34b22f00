//! Route retries (issue 10) against real processes: a retry on the other
//! instance hides a 5xx from one instance for GET but not for POST, and the
//! per-upstream retry budget stops a retry storm while every instance fails.
//!
//! The mocks' `FAIL_RATE=1` makes an instance answer every request with 500,
//! or with `FAIL_STATUS` (503 here: an overloaded instance); both are
//! statuses `STATUS_5XX` retries (500, 502, 503, 504).
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use anyhow::{Result, ensure};
use devstack::Stack;
use futures::future::join_all;
use gateway_proto::v1::{CircuitBreaker, Instance, Retry, RetryOn, Route, Upstream};
use gateway_tests::{
    client, header, metric_sample, mock_requests, open_route, upsert_route_synced,
    upsert_upstream_synced,
};

/// The demo `orders` upstream (orders-1, orders-2), without health checks and
/// with a breaker that stays closed through these tests, so that every
/// request is balanced round-robin over both instances.
fn orders(stack: &Stack) -> Upstream {
    let p = stack.ports();
    Upstream {
        name: "orders".into(),
        instances: [("orders-1", p.orders_1), ("orders-2", p.orders_2)]
            .into_iter()
            .map(|(id, port)| Instance {
                id: id.into(),
                url: format!("http://127.0.0.1:{port}"),
                ..Default::default()
            })
            .collect(),
        circuit_breaker: Some(CircuitBreaker {
            failure_threshold: 1000,
            reset_timeout_ms: 100,
            half_open_max_requests: 1,
            ..Default::default()
        }),
        ..Upstream::default()
    }
}

/// `/retry/...` → `/orders/...` on `orders`, retrying 5xx answers.
fn retrying_route(attempts: u32) -> Route {
    Route {
        retry: Some(Retry {
            attempts,
            on: vec![RetryOn::Status5xx as i32],
            per_try_timeout_ms: 0,
        }),
        ..open_route("retry", "/retry", "orders", "/orders")
    }
}

/// A stack whose `failing` instances answer every request with their status.
async fn start(failing: &[(&str, &str)]) -> Result<Stack> {
    let builder = failing.iter().fold(
        Stack::new().data_planes(1).auth(false),
        |b, (instance, status)| {
            b.env(*instance, "FAIL_RATE", "1")
                .env(*instance, "FAIL_STATUS", *status)
        },
    );
    let stack = builder.start().await?;
    upsert_upstream_synced(&stack, orders(&stack)).await?;
    Ok(stack)
}

/// Requests orders-1 and orders-2 have received so far.
async fn seen(stack: &Stack) -> Result<(u64, u64)> {
    let p = stack.ports();
    Ok((
        mock_requests(p.orders_1).await?,
        mock_requests(p.orders_2).await?,
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_hides_one_instances_503_on_get_but_not_on_post() -> Result<()> {
    let stack = start(&[("orders-2", "503")]).await?;
    upsert_route_synced(&stack, retrying_route(1)).await?;
    let gw = &stack.gateways()[0];
    let ops = &stack.gateway_admins()[0];
    let http = client();
    let retries = "gateway_retries_total{upstream=\"orders\",reason=\"status_5xx\"}";

    // GET: every answer is orders-1's 200, whichever instance was tried first.
    let (one, two) = seen(&stack).await?;
    for i in 0..10 {
        let resp = http.get(format!("{gw}/retry/{i}")).send().await?;
        ensure!(resp.status() == 200, "GET {i}: {}", resp.status());
        ensure!(header(&resp, "x-instance-id") == Some("orders-1"));
    }
    let (one_after, two_after) = seen(&stack).await?;
    ensure!(one_after - one == 10, "orders-1 answered every GET");
    let failed_first = two_after - two;
    ensure!(
        failed_first >= 4,
        "round-robin sent orders-2 {failed_first} of 10 first"
    );
    ensure!(
        metric_sample(ops, retries).await? == failed_first as f64,
        "one retry per GET that orders-2 failed"
    );

    // POST is not idempotent: orders-2's 503 reaches the client.
    let (one, two) = seen(&stack).await?;
    let mut failures = 0;
    for i in 0..10 {
        let resp = http
            .post(format!("{gw}/retry"))
            .body(format!("{{\"n\":{i}}}"))
            .send()
            .await?;
        match resp.status().as_u16() {
            200 => ensure!(header(&resp, "x-instance-id") == Some("orders-1")),
            503 => {
                ensure!(header(&resp, "x-instance-id") == Some("orders-2"));
                failures += 1;
            }
            other => anyhow::bail!("POST {i}: {other}"),
        }
    }
    let (one_after, two_after) = seen(&stack).await?;
    ensure!(
        failures >= 4,
        "round-robin sent orders-2 {failures} of 10 POSTs"
    );
    ensure!(
        two_after - two == failures,
        "each failed POST was sent once"
    );
    ensure!(
        one_after - one == 10 - failures,
        "and never retried on orders-1"
    );
    ensure!(
        metric_sample(ops, retries).await? == failed_first as f64,
        "no retry for POST"
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_budget_stops_a_retry_storm_while_every_instance_fails() -> Result<()> {
    let stack = start(&[("orders-1", "500"), ("orders-2", "502")]).await?;
    upsert_route_synced(&stack, retrying_route(5)).await?;
    let gw = stack.gateways()[0].clone();
    let ops = &stack.gateway_admins()[0];
    let http = client();

    // 60 GETs in quick bursts (well within the budget's 10 s window); every
    // one fails on its first instance and would like a retry on the other.
    let (one, two) = seen(&stack).await?;
    const REQUESTS: u64 = 60;
    for burst in 0..6 {
        let answers = join_all((0..10).map(|i| {
            let http = http.clone();
            let url = format!("{gw}/retry/{burst}-{i}");
            async move { http.get(url).send().await }
        }))
        .await;
        for resp in answers {
            // All failed: the last attempt's answer stands (500 from orders-1, 502 from orders-2).
            let resp = resp?;
            let expected = match header(&resp, "x-instance-id") {
                Some("orders-1") => 500,
                Some("orders-2") => 502,
                other => anyhow::bail!("answered by {other:?}"),
            };
            ensure!(resp.status() == expected, "{}", resp.status());
        }
    }
    let (one_after, two_after) = seen(&stack).await?;
    let attempts = (one_after - one) + (two_after - two);
    let retried = metric_sample(
        ops,
        "gateway_retries_total{upstream=\"orders\",reason=\"status_5xx\"}",
    )
    .await? as u64;
    let refused = metric_sample(
        ops,
        "gateway_retry_budget_refusals_total{upstream=\"orders\"}",
    )
    .await? as u64;
    // Two instances: at most one retry per request, each asked the budget once.
    ensure!(retried + refused == REQUESTS, "{retried} + {refused}");
    ensure!(
        attempts == REQUESTS + retried,
        "the mocks saw {attempts} attempts"
    );
    // Budget: 20% of the 60 requests plus a floor of 10.
    ensure!(retried <= REQUESTS / 5 + 10, "{retried} retries");
    ensure!(
        refused >= REQUESTS - (REQUESTS / 5 + 10),
        "{refused} refused"
    );
    stack.shutdown().await;
    Ok(())
}
