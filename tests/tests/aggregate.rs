//! Aggregation routes (issue 11, `Route.aggregate`) against real processes:
//! one GET fans out to several upstreams, and the client gets one JSON object
//! keyed by part name, degraded gracefully when optional parts fail.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::{
    Aggregate, AggregatePart, AuthMode, CircuitBreaker, Instance, Route, Upstream,
};
use gateway_telemetry::TraceContext;
use gateway_telemetry::receiver::{Kind, Receiver};
use gateway_tests::{
    client, header, login, metric_sample, poll, upsert_route_synced, upsert_upstream_synced,
};
use serde_json::Value;

/// Deadline for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);

async fn start(auth: bool) -> Stack {
    Stack::new()
        .data_planes(1)
        .auth(auth)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"))
}

fn part(name: &str, upstream: &str, path: &str, required: bool, timeout_ms: u32) -> AggregatePart {
    AggregatePart {
        name: name.into(),
        upstream: upstream.into(),
        path: path.into(),
        required,
        timeout_ms,
    }
}

/// An `AUTH_NONE` aggregation route at `prefix`.
fn aggregate_route(name: &str, prefix: &str, parts: Vec<AggregatePart>) -> Route {
    Route {
        name: name.into(),
        path_prefix: prefix.into(),
        auth: AuthMode::AuthNone as i32,
        aggregate: Some(Aggregate { parts }),
        ..Route::default()
    }
}

fn one_instance(name: &str, port: u16, breaker: Option<CircuitBreaker>) -> Upstream {
    Upstream {
        name: name.into(),
        instances: vec![Instance {
            id: format!("{name}-1"),
            url: format!("http://127.0.0.1:{port}"),
            ..Default::default()
        }],
        health_check: None,
        circuit_breaker: breaker,
        ..Upstream::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_overview_joins_user_and_order_with_the_callers_identity() -> Result<()> {
    let stack = start(true).await;
    let gw = &stack.gateways()[0];
    let token = login(&stack.auth_url(), "alice", "wonderland").await?;
    let http = client();

    let response = http
        .get(format!("{gw}/api/overview/7?lang=en"))
        .bearer_auth(&token)
        .header("x-request-id", "overview-1")
        .send()
        .await?;
    ensure!(response.status() == 200, "status {}", response.status());
    ensure!(
        header(&response, "content-type") == Some("application/json"),
        "{:?}",
        response.headers()
    );
    ensure!(
        header(&response, "x-partial-failure").is_none(),
        "nothing failed"
    );
    ensure!(header(&response, "x-request-id") == Some("overview-1"));
    let body: Value = response.json().await?;
    let keys: Vec<_> = body.as_object().context("an object")?.keys().collect();
    ensure!(keys.len() == 2, "exactly the two parts: {body}");
    for (part, service) in [("user", "users"), ("orders", "orders")] {
        let doc = &body[part];
        ensure!(doc["service"] == service, "{part}: {doc}");
        ensure!(doc["id"] == "7", "{{rest}} is 7: {doc}");
        ensure!(
            doc["query"] == "lang=en",
            "the caller's query reaches {part}: {doc}"
        );
        let seen = &doc["headers"];
        ensure!(
            seen["x-user-id"] == "alice",
            "{part} knows the caller: {seen}"
        );
        ensure!(seen["x-user-role"] == "user", "{seen}");
        ensure!(seen["x-request-id"] == "overview-1", "{seen}");
        ensure!(seen["accept"] == "application/json", "{seen}");
        ensure!(
            seen.get("authorization").is_none(),
            "the token stays at the edge: {seen}"
        );
        ensure!(seen["traceparent"].is_string(), "trace context: {seen}");
    }
    ensure!(body["user"]["name"] == "User 7", "{body}");

    // Authentication applies before any fan-out; GET only.
    let anonymous = http.get(format!("{gw}/api/overview/7")).send().await?;
    ensure!(anonymous.status() == 401, "{}", anonymous.status());
    let post = http
        .post(format!("{gw}/api/overview/7"))
        .bearer_auth(&token)
        .send()
        .await?;
    ensure!(
        post.status() == 404,
        "POST finds no route: {}",
        post.status()
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_and_a_slow_optional_part_become_null_and_are_listed() -> Result<()> {
    let stack = start(false).await;
    let gw = &stack.gateways()[0];
    let slow_timeout_ms = 400;
    upsert_route_synced(
        &stack,
        aggregate_route(
            "partial",
            "/partial",
            vec![
                part("user", "users", "/users/{rest}", true, 0),
                part("broken", "orders", "/orders/{rest}?status=500", false, 0),
                part(
                    "slow",
                    "orders",
                    "/orders/{rest}?delay_ms=10000",
                    false,
                    slow_timeout_ms,
                ),
            ],
        ),
    )
    .await?;

    let started = Instant::now();
    let response = client().get(format!("{gw}/partial/3")).send().await?;
    let elapsed = started.elapsed();
    ensure!(response.status() == 200, "status {}", response.status());
    ensure!(
        header(&response, "x-partial-failure") == Some("broken,slow"),
        "{:?}",
        response.headers()
    );
    // Bounded by the slowest part's timeout, not by the 10 s the slow part would take.
    ensure!(
        elapsed < Duration::from_millis(u64::from(slow_timeout_ms) + 4000),
        "took {elapsed:?}"
    );
    let body: Value = response.json().await?;
    ensure!(body["user"]["id"] == "3", "{body}");
    ensure!(
        body["broken"] == Value::Null && body["slow"] == Value::Null,
        "{body}"
    );

    let outcome = |p: &str, o: &str| {
        format!("gateway_aggregate_parts_total{{route=\"partial\",part=\"{p}\",outcome=\"{o}\"}}")
    };
    ensure!(metric_sample(&stack.gateway_admins()[0], &outcome("user", "ok")).await? == 1.0);
    ensure!(metric_sample(&stack.gateway_admins()[0], &outcome("broken", "status")).await? == 1.0);
    ensure!(metric_sample(&stack.gateway_admins()[0], &outcome("slow", "timeout")).await? == 1.0);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_required_part_that_is_down_fails_the_request_with_a_502_naming_it() -> Result<()> {
    let stack = start(false).await;
    let gw = &stack.gateways()[0];
    // A port nothing listens on: bound, then released.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    upsert_upstream_synced(&stack, one_instance("billing", dead_port, None)).await?;
    upsert_route_synced(
        &stack,
        aggregate_route(
            "needs-billing",
            "/checkout",
            vec![
                part("user", "users", "/users/{rest}", false, 0),
                part("billing", "billing", "/billing/{rest}", true, 2000),
            ],
        ),
    )
    .await?;

    let response = client().get(format!("{gw}/checkout/1")).send().await?;
    ensure!(response.status() == 502, "status {}", response.status());
    ensure!(
        header(&response, "content-type") == Some("application/problem+json"),
        "{:?}",
        response.headers()
    );
    ensure!(header(&response, "x-request-id").is_some());
    let problem: Value = response.json().await?;
    ensure!(
        problem["type"] == "urn:gateway:problem:aggregate-part-failed",
        "{problem}"
    );
    ensure!(problem["status"] == 502, "{problem}");
    ensure!(problem["part"] == "billing", "{problem}");
    ensure!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("\"billing\"")),
        "{problem}"
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_part_whose_breaker_is_open_fails_at_once() -> Result<()> {
    let stack = start(false).await;
    let gw = &stack.gateways()[0];
    let part_timeout = Duration::from_millis(3000);
    // `flaky` is the users mock behind a breaker that opens on the first failure
    // and stays open for a minute.
    let breaker = CircuitBreaker {
        failure_threshold: 1,
        reset_timeout_ms: 60_000,
        half_open_max_requests: 1,
        ..Default::default()
    };
    upsert_upstream_synced(
        &stack,
        one_instance("flaky", stack.ports().users_1, Some(breaker)),
    )
    .await?;
    upsert_route_synced(
        &stack,
        aggregate_route(
            "guarded",
            "/guarded",
            vec![
                part("user", "users", "/users/{rest}", true, 0),
                part(
                    "extra",
                    "flaky",
                    "/users/{rest}?delay_ms=20000",
                    false,
                    part_timeout.as_millis() as u32,
                ),
            ],
        ),
    )
    .await?;
    let http = client();

    // The first request waits for the part's timeout, which opens the breaker.
    let first = http.get(format!("{gw}/guarded/2")).send().await?;
    ensure!(first.status() == 200, "status {}", first.status());
    ensure!(header(&first, "x-partial-failure") == Some("extra"));
    let open =
        "gateway_circuit_breaker_state{upstream=\"flaky\",instance=\"flaky-1\",state=\"open\"}";
    poll(SOON, "the flaky breaker to open", || async {
        match metric_sample(&stack.gateway_admins()[0], open).await {
            Ok(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;

    // Now the part fails without a network call: the answer comes at once.
    let started = Instant::now();
    let second = http.get(format!("{gw}/guarded/2")).send().await?;
    let elapsed = started.elapsed();
    ensure!(second.status() == 200, "status {}", second.status());
    ensure!(header(&second, "x-partial-failure") == Some("extra"));
    ensure!(
        elapsed < part_timeout / 2,
        "an open breaker must not wait for the {part_timeout:?} part timeout; took {elapsed:?}"
    );
    let body: Value = second.json().await?;
    ensure!(
        body["user"]["id"] == "2" && body["extra"] == Value::Null,
        "{body}"
    );
    let unavailable =
        "gateway_aggregate_parts_total{route=\"guarded\",part=\"extra\",outcome=\"unavailable\"}";
    ensure!(metric_sample(&stack.gateway_admins()[0], unavailable).await? == 1.0);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_trace_has_one_server_span_and_a_client_span_per_part() -> Result<()> {
    let receiver = Receiver::start().await?;
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .otlp_endpoint(receiver.endpoint())
        .env("*", "OTEL_TRACES_SAMPLER", "parentbased_always_on")
        .env("*", "OTEL_BSP_SCHEDULE_DELAY", "200")
        .start()
        .await
        .context("starting the stack")?;
    let gw = &stack.gateways()[0];
    upsert_route_synced(
        &stack,
        aggregate_route(
            "traced",
            "/traced",
            vec![
                part("user", "users", "/users/{rest}", true, 0),
                part("orders", "orders", "/orders/{rest}", false, 0),
                part("again", "users", "/users/{rest}?again=1", false, 0),
            ],
        ),
    )
    .await?;

    let caller = TraceContext::new_root(true);
    let trace = caller.trace_id_hex().to_string();
    let response = client()
        .get(format!("{gw}/traced/5"))
        .header("traceparent", caller.to_string())
        .send()
        .await?;
    ensure!(response.status() == 200, "status {}", response.status());
    let body: Value = response.json().await?;

    // Every backend SERVER span arrives after its CLIENT span ended, so wait for those.
    let spans = receiver
        .wait_for(
            |spans| {
                let backends = spans
                    .iter()
                    .filter(|s| s.trace_id == trace && s.kind == Kind::Server)
                    .filter(|s| s.service_name != "data-plane")
                    .count();
                let gateway = spans.iter().any(|s| {
                    s.trace_id == trace && s.service_name == "data-plane" && s.kind == Kind::Server
                });
                backends == 3 && gateway
            },
            SOON,
        )
        .await
        .context("spans of the aggregation")?;
    let in_trace = |service: &str, kind: Kind| -> Vec<_> {
        spans
            .iter()
            .filter(|s| s.trace_id == trace && s.service_name == service && s.kind == kind)
            .collect()
    };
    let servers = in_trace("data-plane", Kind::Server);
    ensure!(servers.len() == 1, "one gateway SERVER span: {servers:#?}");
    let server = servers[0];
    ensure!(server.attr("http.route") == Some("traced"), "{server}");
    let clients = in_trace("data-plane", Kind::Client);
    ensure!(clients.len() == 3, "one CLIENT span per part: {clients:#?}");
    for c in &clients {
        ensure!(
            c.parent_span_id == server.span_id,
            "CLIENT span not under the SERVER span: {c}"
        );
    }
    // Each backend continued its own part's CLIENT span, and saw it as traceparent.
    let mut backend_parents: Vec<_> = in_trace("users", Kind::Server)
        .into_iter()
        .chain(in_trace("orders", Kind::Server))
        .map(|s| s.parent_span_id.clone())
        .collect();
    let mut client_ids: Vec<_> = clients.iter().map(|c| c.span_id.clone()).collect();
    backend_parents.sort();
    client_ids.sort();
    ensure!(
        backend_parents == client_ids,
        "{backend_parents:?} vs {client_ids:?}"
    );
    for p in ["user", "orders", "again"] {
        let seen: TraceContext = body[p]["headers"]["traceparent"]
            .as_str()
            .context("traceparent")?
            .parse()?;
        ensure!(
            seen.trace_id == caller.trace_id,
            "{p} is in the caller's trace"
        );
        ensure!(
            client_ids.contains(&seen.span_id_hex().to_string()),
            "{p}'s traceparent names its CLIENT span"
        );
    }
    stack.shutdown().await;
    Ok(())
}
