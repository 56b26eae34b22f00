//! Trace propagation as an operator sees it in a collector (issue 6, docs/data-plane.md
//! "Tracing"): a devstack run exports to an in-test OTLP/gRPC receiver, and the
//! assertions read the spans it collected.
//!
//! The stack runs with `OTEL_TRACES_SAMPLER=parentbased_always_on` (every
//! edge-started trace recorded, callers' decisions followed) and
//! `OTEL_BSP_SCHEDULE_DELAY=200` (spans arrive within a fraction of a second).
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use devstack::Stack;
// At the auth service itself, not through the gateway, so the per-IP login budget stays untouched.
use gateway_telemetry::TraceContext;
use gateway_telemetry::receiver::{Kind, ReceivedSpan, Receiver, StatusCode};
use gateway_tests::login;
use reqwest::{Client, RequestBuilder, Response};

/// How long spans may take to show up in the receiver.
const SPAN_WAIT: Duration = Duration::from_secs(30);

fn client() -> Result<Client> {
    Ok(Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?)
}

async fn start(receiver: &Receiver) -> Result<Stack> {
    Stack::new()
        .data_planes(1)
        .otlp_endpoint(receiver.endpoint())
        .env("*", "OTEL_TRACES_SAMPLER", "parentbased_always_on")
        .env("*", "OTEL_BSP_SCHEDULE_DELAY", "200")
        .start()
        .await
        .context("starting the stack")
}

/// A fresh sampled caller context, as an upstream service would send it.
fn caller() -> TraceContext {
    TraceContext::new_root(true)
}

fn with_parent(request: RequestBuilder, parent: &TraceContext) -> RequestBuilder {
    request.header("traceparent", parent.to_string())
}

/// The `traceresponse` of a response, parsed strictly.
fn traceresponse(response: &Response) -> Result<TraceContext> {
    let value = response
        .headers()
        .get("traceresponse")
        .context("response without traceresponse")?;
    TraceContext::parse(value.as_bytes())
        .with_context(|| format!("invalid traceresponse {value:?}"))
}

fn hex(ctx: &TraceContext) -> (String, String) {
    (
        ctx.trace_id_hex().to_string(),
        ctx.span_id_hex().to_string(),
    )
}

fn in_trace<'a>(spans: &'a [ReceivedSpan], trace: &str) -> impl Iterator<Item = &'a ReceivedSpan> {
    spans.iter().filter(move |s| s.trace_id == trace)
}

fn find<'a>(
    spans: &'a [ReceivedSpan],
    trace: &str,
    service: &str,
    kind: Kind,
) -> Option<&'a ReceivedSpan> {
    in_trace(spans, trace).find(|s| s.service_name == service && s.kind == kind)
}

/// Waits for the gateway's SERVER span of `trace` and returns it with every span received.
async fn gateway_span(
    receiver: &Receiver,
    trace: &str,
) -> Result<(ReceivedSpan, Vec<ReceivedSpan>)> {
    let spans = receiver
        .wait_for(
            |spans| find(spans, trace, "data-plane", Kind::Server).is_some(),
            SPAN_WAIT,
        )
        .await
        .with_context(|| format!("no data-plane SERVER span for trace {trace}"))?;
    let span = find(&spans, trace, "data-plane", Kind::Server)
        .cloned()
        .context("vanished")?;
    Ok((span, spans))
}

/// A rejected request's gateway span: closed, failed, with the status code recorded.
fn assert_rejected(span: &ReceivedSpan, status: u16) -> Result<()> {
    ensure!(span.is_closed(), "span not closed: {span}");
    ensure!(
        span.status == StatusCode::Error,
        "{status} span without error status: {span}"
    );
    ensure!(
        span.attr("http.response.status_code") == Some(&status.to_string()),
        "{status} span records another status code: {span}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_follow_requests_across_every_hop() -> Result<()> {
    let receiver = Receiver::start().await?;
    let stack = start(&receiver).await?;
    let gw = stack.gateways()[0].clone();
    let http = client()?;
    let token = login(&stack.auth_url(), "alice", "wonderland").await?;

    // 1. A known traceparent: one trace, caller -> gateway SERVER -> gateway CLIENT -> users SERVER.
    let parent = caller();
    let (trace, caller_span) = hex(&parent);
    let response = with_parent(
        http.get(format!("{gw}/api/users/1")).bearer_auth(&token),
        &parent,
    )
    .header("tracestate", "congo=t61rcWkgMzE")
    .send()
    .await?;
    ensure!(
        response.status() == 200,
        "GET /api/users/1: {}",
        response.status()
    );
    let returned = traceresponse(&response)?;
    ensure!(
        returned.trace_id == parent.trace_id,
        "traceresponse {returned} is not in trace {trace}"
    );
    ensure!(
        returned.span_id != parent.span_id,
        "traceresponse names the caller's span"
    );
    let body: serde_json::Value = response.json().await?;
    let seen_by_backend: TraceContext = body["headers"]["traceparent"]
        .as_str()
        .context("the mock saw no traceparent")?
        .parse()
        .context("the mock saw an invalid traceparent")?;
    ensure!(
        seen_by_backend.trace_id == parent.trace_id,
        "backend got another trace: {seen_by_backend}"
    );
    ensure!(
        body["headers"]["tracestate"] == "congo=t61rcWkgMzE",
        "tracestate not forwarded: {body}"
    );

    let spans = receiver
        .wait_for(
            |spans| {
                find(spans, &trace, "data-plane", Kind::Server).is_some()
                    && find(spans, &trace, "data-plane", Kind::Client).is_some()
                    && find(spans, &trace, "users", Kind::Server).is_some()
            },
            SPAN_WAIT,
        )
        .await?;
    let server_spans: Vec<_> = in_trace(&spans, &trace)
        .filter(|s| s.service_name == "data-plane" && s.kind == Kind::Server)
        .collect();
    ensure!(
        server_spans.len() == 1,
        "expected one gateway SERVER span: {server_spans:#?}"
    );
    let server = server_spans[0];
    ensure!(
        server.parent_span_id == caller_span,
        "gateway span's parent is not the caller: {server}"
    );
    ensure!(
        server.span_id == returned.span_id_hex().to_string(),
        "traceresponse does not name the gateway span"
    );
    ensure!(
        server.attr("http.request.method") == Some("GET"),
        "{server}"
    );
    ensure!(server.attr("http.route") == Some("users"), "{server}");
    ensure!(
        server.attr("http.response.status_code") == Some("200"),
        "{server}"
    );
    ensure!(
        server.service_instance_id.is_some(),
        "gateway span without service.instance.id: {server}"
    );
    let client_span = find(&spans, &trace, "data-plane", Kind::Client).context("no CLIENT span")?;
    ensure!(
        client_span.parent_span_id == server.span_id,
        "CLIENT span not under the SERVER span: {client_span}"
    );
    ensure!(
        seen_by_backend.span_id_hex().to_string() == client_span.span_id,
        "the outgoing traceparent does not name the CLIENT span"
    );
    let backend = find(&spans, &trace, "users", Kind::Server).context("no users span")?;
    let backend_parent = in_trace(&spans, &trace)
        .find(|s| s.span_id == backend.parent_span_id)
        .with_context(|| format!("backend span's parent is not in the trace: {backend}"))?;
    ensure!(
        backend_parent.service_name == "data-plane" && backend_parent.kind == Kind::Client,
        "backend span's parent is not the gateway CLIENT span: {backend_parent}"
    );
    ensure!(
        backend.service_instance_id.as_deref() == Some("users-1"),
        "{backend}"
    );
    ensure!(
        in_trace(&spans, &trace).all(ReceivedSpan::is_closed),
        "an unclosed span in {trace}"
    );

    // 2. No traceparent: a new trace, whose id comes back in traceresponse.
    let response = http
        .get(format!("{gw}/api/users/2"))
        .bearer_auth(&token)
        .send()
        .await?;
    ensure!(
        response.status() == 200,
        "GET /api/users/2: {}",
        response.status()
    );
    let started = traceresponse(&response)?;
    ensure!(
        started.is_sampled(),
        "parentbased_always_on must sample edge traces: {started}"
    );
    let (new_trace, new_span) = hex(&started);
    let (span, _) = gateway_span(&receiver, &new_trace).await?;
    ensure!(
        span.parent_span_id.is_empty(),
        "edge-started span has a parent: {span}"
    );
    ensure!(
        span.span_id == new_span,
        "traceresponse does not name the gateway span: {span}"
    );

    // 3. An invalid traceparent: a fresh trace, tracestate dropped, the request still succeeds.
    let invalid = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01";
    let response = http
        .get(format!("{gw}/api/users/3"))
        .bearer_auth(&token)
        .header("traceparent", invalid)
        .header("tracestate", "congo=t61rcWkgMzE")
        .send()
        .await?;
    ensure!(
        response.status() == 200,
        "invalid traceparent broke the request: {}",
        response.status()
    );
    let fresh = traceresponse(&response)?;
    let (fresh_trace, _) = hex(&fresh);
    ensure!(
        fresh_trace != "4bf92f3577b34da6a3ce929d0e0e4736",
        "the invalid trace id was kept"
    );
    let body: serde_json::Value = response.json().await?;
    let forwarded: TraceContext = body["headers"]["traceparent"]
        .as_str()
        .context("no traceparent forwarded after an invalid one")?
        .parse()?;
    ensure!(
        forwarded.trace_id == fresh.trace_id,
        "forwarded {forwarded} is not the fresh trace"
    );
    ensure!(
        body["headers"].get("tracestate").is_none(),
        "tracestate kept with an invalid traceparent: {body}"
    );
    let (span, _) = gateway_span(&receiver, &fresh_trace).await?;
    ensure!(
        span.parent_span_id.is_empty(),
        "fresh trace has a parent: {span}"
    );

    // 4. 401: no token on a JWT route.
    let parent = caller();
    let response = with_parent(http.get(format!("{gw}/api/users/1")), &parent)
        .send()
        .await?;
    ensure!(
        response.status() == 401,
        "expected 401, got {}",
        response.status()
    );
    ensure!(
        traceresponse(&response)?.trace_id == parent.trace_id,
        "401 without our traceresponse"
    );
    let (span, _) = gateway_span(&receiver, &hex(&parent).0).await?;
    assert_rejected(&span, 401)?;
    ensure!(span.parent_span_id == hex(&parent).1, "{span}");

    // 5. The auth service continues the trace of a login proxied through the gateway,
    //    and the 6th login from this IP within 60 s is a 429.
    let mut limited = None;
    let mut first_login = None;
    for attempt in 0..10 {
        let parent = caller();
        let response = with_parent(http.post(format!("{gw}/auth/login")), &parent)
            .json(&serde_json::json!({"username": "alice", "password": "not-her-password"}))
            .send()
            .await?;
        if response.status() == 429 {
            limited = Some(parent);
            break;
        }
        ensure!(
            response.status() == 401,
            "login attempt {attempt}: {}",
            response.status()
        );
        first_login.get_or_insert(parent);
    }
    let limited = limited.context("no 429 after 10 logins from one IP")?;
    let (span, _) = gateway_span(&receiver, &hex(&limited).0).await?;
    assert_rejected(&span, 429)?;
    let login_trace = hex(&first_login.context("every login was limited")?).0;
    let spans = receiver
        .wait_for(
            |spans| find(spans, &login_trace, "auth-service", Kind::Server).is_some(),
            SPAN_WAIT,
        )
        .await
        .context("the auth service exported no span for a proxied login")?;
    let auth_span = find(&spans, &login_trace, "auth-service", Kind::Server).context("vanished")?;
    let auth_parent =
        find(&spans, &login_trace, "data-plane", Kind::Client).context("no gateway CLIENT span")?;
    ensure!(
        auth_span.parent_span_id == auth_parent.span_id,
        "auth span not under the gateway: {auth_span}"
    );

    // 6. The control plane continues a trace carried in gRPC metadata.
    let parent = caller();
    let mut admin = stack.admin_client().await;
    let mut request = tonic::Request::new(gateway_proto::v1::ListRoutesRequest::default());
    request.metadata_mut().insert(
        "traceparent",
        parent.to_string().parse().context("metadata value")?,
    );
    admin.list_routes(request).await.context("ListRoutes")?;
    let (trace, span_id) = hex(&parent);
    let spans = receiver
        .wait_for(
            |spans| find(spans, &trace, "control-plane", Kind::Server).is_some(),
            SPAN_WAIT,
        )
        .await
        .context("the control plane exported no span for ListRoutes")?;
    let cp = find(&spans, &trace, "control-plane", Kind::Server).context("vanished")?;
    ensure!(
        cp.parent_span_id == span_id,
        "control-plane span's parent is not the caller: {cp}"
    );

    // 7. Breaker open: users-1 answers 500 until its breaker (3 failures) opens;
    //    then the gateway answers 503 itself, without a network call. A 5xx
    //    counts as a breaker failure only with count_5xx (issue 41), so the
    //    demo's users upstream gets it first.
    let mut users = admin
        .get_upstream(gateway_proto::v1::GetUpstreamRequest {
            name: "users".into(),
        })
        .await
        .context("GetUpstream users")?
        .into_inner();
    users
        .circuit_breaker
        .get_or_insert_with(Default::default)
        .count_5xx = true;
    gateway_tests::upsert_upstream_synced(&stack, users).await?;
    let mut opened = None;
    for attempt in 0..10 {
        let parent = caller();
        let response = with_parent(
            http.get(format!("{gw}/api/users/1?status=500"))
                .bearer_auth(&token),
            &parent,
        )
        .send()
        .await?;
        match response.status().as_u16() {
            500 => continue,
            503 if response.headers().get("x-instance-id").is_none() => {
                opened = Some(parent);
                break;
            }
            other => bail!("attempt {attempt} with ?status=500 gave {other}"),
        }
    }
    let opened = opened.context("the breaker never opened after 10 failing requests")?;
    let trace = hex(&opened).0;
    let (span, spans) = gateway_span(&receiver, &trace).await?;
    assert_rejected(&span, 503)?;
    // Export is in order: a CLIENT span ended before the SERVER span would be here already.
    ensure!(
        find(&spans, &trace, "data-plane", Kind::Client).is_none(),
        "an open breaker still made an upstream attempt"
    );

    receiver.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_collector_costs_no_failed_requests() -> Result<()> {
    let receiver = Receiver::start().await?;
    let stack = start(&receiver).await?;
    let gw = stack.gateways()[0].clone();
    let http = client()?;
    let tokens = [
        login(&stack.auth_url(), "alice", "wonderland").await?,
        login(&stack.auth_url(), "bob", "builder").await?,
    ];

    // Spans flow while the collector is up.
    let mut traces = Vec::new();
    for i in 0..4 {
        let parent = caller();
        let response = with_parent(
            http.get(format!("{gw}/api/users/{i}"))
                .bearer_auth(&tokens[i % 2]),
            &parent,
        )
        .send()
        .await?;
        ensure!(
            response.status() == 200,
            "before the kill: {}",
            response.status()
        );
        traces.push(hex(&parent).0);
    }
    receiver
        .wait_for(
            |spans| {
                traces
                    .iter()
                    .all(|t| find(spans, t, "users", Kind::Server).is_some())
            },
            SPAN_WAIT,
        )
        .await?;

    receiver.shutdown().await;

    // 30 requests spread over 3 s (several export cycles at 200 ms), within
    // the two users' 20-per-minute budgets: every one must succeed, promptly.
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    let mut slowest = Duration::ZERO;
    for i in 0..30 {
        pace.tick().await;
        let parent = caller();
        let started = Instant::now();
        let response = with_parent(
            http.get(format!("{gw}/api/orders/{i}"))
                .bearer_auth(&tokens[i % 2]),
            &parent,
        )
        .send()
        .await
        .with_context(|| format!("request {i} after the collector died"))?;
        slowest = slowest.max(started.elapsed());
        ensure!(
            response.status() == 200,
            "request {i} after the kill: {}",
            response.status()
        );
        let back = traceresponse(&response)?;
        ensure!(
            back.trace_id == parent.trace_id,
            "request {i}: traceresponse {back} lost the trace"
        );
    }
    ensure!(
        slowest < Duration::from_secs(2),
        "a request took {slowest:?} with the collector down"
    );
    Ok(())
}

/// `tracestate` through a real data plane (issue 25, item 15), as the current
/// W3C Trace Context text has it: keys with `@` after the first character and
/// keys of up to 256 characters pass to the backend; a key that starts with
/// `@` or has 257 characters drops the whole header; a repeated key keeps its
/// first entry and the rest of the list.
#[tokio::test(flavor = "multi_thread")]
async fn tracestate_follows_the_w3c_key_rules() -> Result<()> {
    let stack = Stack::new().data_planes(1).start().await?;
    gateway_tests::upsert_route_synced(
        &stack,
        gateway_tests::open_route("open-users", "/open/users", "users", "/users"),
    )
    .await?;
    let gw = stack.gateways()[0].clone();
    let http = client()?;
    let key_256 = format!("{}@{}", "t".repeat(241), "v".repeat(14));
    let key_257 = format!("{key_256}v");
    let simple_256 = "z".repeat(256);
    // (what the client sends as separate tracestate lines, what the backend must see)
    let cases: Vec<(&str, Vec<String>, Option<String>)> = vec![
        (
            "empty vendor",
            vec!["foo@=1,bar=2".into()],
            Some("foo@=1,bar=2".into()),
        ),
        (
            "two at signs",
            vec!["foo@@bar=1,bar=2".into()],
            Some("foo@@bar=1,bar=2".into()),
        ),
        (
            "two vendors, digit first",
            vec!["foo@bar@baz=1,1st=2".into()],
            Some("foo@bar@baz=1,1st=2".into()),
        ),
        // One long key per case: two would pass the 512 bytes forwarded.
        (
            "256-character simple key",
            vec!["foo=1".into(), format!("{simple_256}=2")],
            Some(format!("foo=1,{simple_256}=2")),
        ),
        (
            "256-character key with @",
            vec!["foo=1".into(), format!("{key_256}=3")],
            Some(format!("foo=1,{key_256}=3")),
        ),
        (
            "a repeated key keeps the header",
            vec!["foo=1,bar=2".into(), "foo=2".into()],
            Some("foo=1,bar=2".into()),
        ),
        ("key starting with @", vec!["@foo=1,bar=2".into()], None),
        (
            "257-character simple key",
            vec!["foo=1".into(), format!("{simple_256}z=2")],
            None,
        ),
        (
            "257-character key with @",
            vec!["foo=1".into(), format!("{key_257}=2")],
            None,
        ),
    ];
    for (name, sent, want) in cases {
        let parent = caller();
        let mut request = with_parent(http.get(format!("{gw}/open/users/1")), &parent);
        for line in &sent {
            request = request.header("tracestate", line);
        }
        let response = request.send().await?;
        ensure!(
            response.status() == 200,
            "{name}: GET /open/users/1 answered {}",
            response.status()
        );
        let body: serde_json::Value = response.json().await?;
        let seen_parent: TraceContext = body["headers"]["traceparent"]
            .as_str()
            .with_context(|| format!("{name}: the backend saw no traceparent"))?
            .parse()?;
        ensure!(
            seen_parent.trace_id == parent.trace_id,
            "{name}: the backend got another trace: {seen_parent}"
        );
        let seen = body["headers"].get("tracestate").and_then(|v| v.as_str());
        ensure!(
            seen == want.as_deref(),
            "{name}: sent {sent:?}, the backend saw {seen:?}, expected {want:?}"
        );
    }
    Ok(())
}
