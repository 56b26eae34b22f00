//! gRPC through the gateway (issue 27) against real processes: devstack's
//! control plane and data plane, and the mocks' tonic service
//! `mock.v1.Echo` (with reflection) behind an upstream with `protocol: HTTP2`.
//!
//! * the real grpcurl, through both listeners (h2c and TLS with ALPN h2):
//!   `list` (reflection, a bidirectional stream), a unary call, a server
//!   stream, and a deadline (`-max-time`);
//! * with a tonic client: the upstream's own statuses and trailers pass
//!   through; the gateway's failures are gRPC statuses in a Trailers-Only
//!   answer — no instance / open breaker `UNAVAILABLE`, a `grpc-timeout`
//!   that passes `DEADLINE_EXCEEDED`, a missing API key `UNAUTHENTICATED`,
//!   a rate limit `RESOURCE_EXHAUSTED`, no route `UNIMPLEMENTED`;
//! * an HTTP2 upstream is health-checked over HTTP/2, and a WebSocket route
//!   to one is refused.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`), `redis-server` and `grpcurl` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::{
    AuthMode, CircuitBreaker, HealthCheck, Instance, RateLimit, RateLimitAlgorithm, RateLimitKey,
    Route, UpsertRouteRequest, Upstream, UpstreamProtocol,
};
use gateway_tests::{metric_sample, one_data_plane, open_route, poll, upsert_route_synced};
use mock_service::grpc::v1::echo_client::EchoClient;
use mock_service::grpc::v1::{EchoRequest, StreamRequest};
use tonic::Code;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(20);

/// An HTTP2 upstream `name` over the stack's two orders mocks.
fn echo_upstream(stack: &Stack, name: &str) -> Upstream {
    let p = stack.ports();
    Upstream {
        name: name.into(),
        instances: [("orders-1", p.orders_1), ("orders-2", p.orders_2)]
            .iter()
            .map(|(id, port)| Instance {
                id: (*id).into(),
                url: format!("http://127.0.0.1:{port}"),
                ..Default::default()
            })
            .collect(),
        protocol: UpstreamProtocol::Http2 as i32,
        ..Default::default()
    }
}

/// Routes the Echo service and reflection to `upstream`.
async fn route_grpc(stack: &Stack, upstream: &str) -> Result<()> {
    upsert_route_synced(stack, open_route("echo", "/mock.v1.Echo", upstream, "")).await?;
    for version in ["v1", "v1alpha"] {
        let prefix = format!("/grpc.reflection.{version}.ServerReflection");
        let name = format!("reflection-{version}");
        upsert_route_synced(stack, open_route(&name, &prefix, upstream, "")).await?;
    }
    Ok(())
}

async fn upsert_upstream(stack: &Stack, upstream: Upstream) -> Result<()> {
    gateway_tests::upsert_upstream_synced(stack, upstream).await?;
    Ok(())
}

/// Runs grpcurl with `args`; its output and whether it succeeded.
async fn grpcurl(args: &[&str]) -> Result<(bool, String)> {
    let out = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::new("grpcurl").args(args).output(),
    )
    .await
    .context("grpcurl hung")?
    .context("grpcurl runs (scripts/test installs it)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

/// A tonic client of the gateway's cleartext listener (h2c).
async fn echo_client(stack: &Stack) -> Result<EchoClient<Channel>> {
    Ok(EchoClient::connect(stack.gateways()[0].clone()).await?)
}

/// A unary Echo call as raw HTTP/2 (prior knowledge) to the gateway, with
/// `grpc-timeout` when given: the HTTP status, `grpc-status` and
/// `grpc-message` (from the trailers, or from the head of a Trailers-Only answer).
async fn raw_unary(
    stack: &Stack,
    req: &EchoRequest,
    grpc_timeout: Option<&str>,
) -> Result<(u16, String, String)> {
    use http_body_util::BodyExt as _;
    use prost::Message as _;
    let message = req.encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message.len())?.to_be_bytes());
    body.extend_from_slice(&message);
    let authority = stack.gateways()[0].trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&authority).await?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await?;
    tokio::spawn(conn);
    let mut call = http::Request::post(format!("http://{authority}/mock.v1.Echo/Unary"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = grpc_timeout {
        call = call.header("grpc-timeout", t);
    }
    let call = call.body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
    let resp = tokio::time::timeout(DEADLINE, sender.send_request(call)).await??;
    let (head, body) = resp.into_parts();
    let collected = tokio::time::timeout(DEADLINE, body.collect()).await??;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let field = |name: &str| {
        head.headers
            .get(name)
            .or_else(|| trailers.get(name))
            .map(|v| v.to_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    Ok((
        head.status.as_u16(),
        field("grpc-status"),
        field("grpc-message"),
    ))
}

/// The status of a unary call that must fail.
async fn failing(client: &mut EchoClient<Channel>, req: EchoRequest) -> Result<tonic::Status> {
    client.unary(req).await.err().context("the call succeeded")
}

fn unary(message: &str, delay_ms: u32) -> EchoRequest {
    EchoRequest {
        message: message.into(),
        fail_code: 0,
        delay_ms,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpcurl_lists_calls_streams_and_times_out_through_both_listeners() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    upsert_upstream(&stack, echo_upstream(&stack, "echo")).await?;
    route_grpc(&stack, "echo").await?;
    let plain = stack.gateways()[0].trim_start_matches("http://").to_owned();
    let tls = stack.gateways_tls()[0]
        .trim_start_matches("https://")
        .to_owned();
    let ca = stack.edge_ca().to_str().unwrap().to_owned();
    let listeners: [Vec<&str>; 2] = [
        vec!["-plaintext", &plain],
        vec!["-cacert", &ca, "-servername", "localhost", &tls],
    ];
    for listener in &listeners {
        let (target, connection) = listener.split_last().unwrap();
        let run = |call: &[&str]| {
            let mut args: Vec<&str> = connection.to_vec();
            args.extend_from_slice(&call[..call.len() - 1]);
            args.push(target);
            args.push(call[call.len() - 1]);
            args.into_iter().map(str::to_owned).collect::<Vec<_>>()
        };
        // Reflection (a bidirectional stream) through the gateway.
        let args = run(&["list"]);
        let (ok, out) = grpcurl(&args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        ensure!(
            ok && out.contains("mock.v1.Echo"),
            "{listener:?} list: {out}"
        );

        // A unary call: the instance answers, the gateway's headers reached it.
        let args = run(&[
            "-d",
            r#"{"message": "through the gateway"}"#,
            "mock.v1.Echo/Unary",
        ]);
        let (ok, out) = grpcurl(&args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        ensure!(ok, "{listener:?} unary: {out}");
        let reply: serde_json::Value = serde_json::from_str(&out)?;
        ensure!(reply["message"] == "through the gateway", "{reply}");
        ensure!(
            reply["instance"].as_str().unwrap().starts_with("orders-"),
            "{reply}"
        );
        ensure!(
            reply["metadata"]["x-request-id"].is_string(),
            "the gateway's request id reached the instance: {reply}"
        );

        // A server stream: every answer, in order (grpcurl leaves out the first sequence, 0).
        let args = run(&[
            "-d",
            r#"{"message": "s", "count": 5}"#,
            "mock.v1.Echo/ServerStream",
        ]);
        let (ok, out) = grpcurl(&args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        ensure!(ok, "{listener:?} stream: {out}");
        let sequences: Vec<u64> = serde_json::Deserializer::from_str(&out)
            .into_iter::<serde_json::Value>()
            .map(|v| v.map(|v| v["sequence"].as_u64().unwrap_or(0)))
            .collect::<Result<_, _>>()?;
        ensure!(sequences == [0, 1, 2, 3, 4], "{sequences:?}: {out}");

        // A deadline: a call slower than -max-time ends DeadlineExceeded, in about that time.
        let started = Instant::now();
        let args = run(&[
            "-max-time",
            "0.5",
            "-d",
            r#"{"message": "slow", "delay_ms": 5000}"#,
            "mock.v1.Echo/Unary",
        ]);
        let (ok, out) = grpcurl(&args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        ensure!(
            !ok && out.contains("DeadlineExceeded"),
            "{listener:?} deadline: {out}"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(4),
            "the deadline was not kept: {:?}",
            started.elapsed()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_statuses_pass_through_and_gateway_failures_are_grpc_statuses() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    upsert_upstream(&stack, echo_upstream(&stack, "echo")).await?;
    route_grpc(&stack, "echo").await?;
    let mut client = echo_client(&stack).await?;

    // The instance's own status and message reach the caller in the trailers.
    let failed = client
        .unary(EchoRequest {
            message: "x".into(),
            fail_code: Code::NotFound as i32,
            delay_ms: 0,
        })
        .await
        .err()
        .context("the call succeeded")?;
    ensure!(failed.code() == Code::NotFound, "{failed:?}");
    // A stream that fails midway: the answers before it, then its status.
    let mut stream = client
        .server_stream(StreamRequest {
            message: "m".into(),
            count: 5,
            interval_ms: 0,
            fail_code: Code::Aborted as i32,
            fail_after: 2,
        })
        .await?
        .into_inner();
    let mut got = 0;
    let end = loop {
        match stream.message().await {
            Ok(Some(_)) => got += 1,
            Ok(None) => break None,
            Err(status) => break Some(status),
        }
    };
    ensure!(
        got == 2 && end.as_ref().map(tonic::Status::code) == Some(Code::Aborted),
        "{got} answers, then {end:?}"
    );

    // grpc-timeout shorter than the call: the gateway answers DEADLINE_EXCEEDED
    // itself (a raw HTTP/2 call: tonic's client would time out on its own first).
    let started = Instant::now();
    let (http, grpc_status, message) =
        raw_unary(&stack, &unary("slow", 5_000), Some("300m")).await?;
    ensure!(
        http == 200 && grpc_status == "4" && message.contains("did not answer"),
        "{http} grpc-status {grpc_status} {message:?}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Without it, the same call waits for the instance.
    let (http, grpc_status, _) = raw_unary(&stack, &unary("quick", 0), None).await?;
    ensure!(http == 200 && grpc_status == "0", "{http} {grpc_status}");

    // No route: UNIMPLEMENTED.
    let mut other = EchoClient::connect(stack.gateways()[0].clone()).await?;
    let unrouted = tonic::Request::new(unary("x", 0));
    upsert_route_synced(&stack, open_route("echo", "/mock.v1.Nothing", "echo", "")).await?;
    let failed = other
        .unary(unrouted)
        .await
        .err()
        .context("the call succeeded")?;
    ensure!(failed.code() == Code::Unimplemented, "{failed:?}");

    // An API-key route without a key: UNAUTHENTICATED.
    let keyed = Route {
        auth: AuthMode::AuthApiKey as i32,
        ..open_route("echo", "/mock.v1.Echo", "echo", "")
    };
    upsert_route_synced(&stack, keyed).await?;
    let failed = failing(&mut client, unary("x", 0)).await?;
    ensure!(failed.code() == Code::Unauthenticated, "{failed:?}");

    // A rate limit of one call: the second is RESOURCE_EXHAUSTED.
    let limited = Route {
        rate_limit: Some(RateLimit {
            policy: "grpc-one".into(),
            algorithm: RateLimitAlgorithm::FixedWindow as i32,
            key: RateLimitKey::KeyIp as i32,
            limit: 1,
            window_seconds: 60,
            key_header: String::new(),
        }),
        ..open_route("echo", "/mock.v1.Echo", "echo", "")
    };
    upsert_route_synced(&stack, limited).await?;
    // (Calls until one is refused: a replica that could not reach Redis yet
    // decides from a local budget of its own, which the next call exhausts.)
    let mut refused = None;
    for _ in 0..5 {
        if let Err(status) = client.unary(unary("counted", 0)).await {
            refused = Some(status);
            break;
        }
    }
    let failed = refused.context("five calls under a limit of one all succeeded")?;
    ensure!(failed.code() == Code::ResourceExhausted, "{failed:?}");

    // No instance reachable: UNAVAILABLE; then the breaker opens and it stays UNAVAILABLE.
    let dead = Upstream {
        instances: vec![Instance {
            id: "dead".into(),
            url: "http://127.0.0.1:9".into(),
            ..Default::default()
        }],
        circuit_breaker: Some(CircuitBreaker {
            failure_threshold: 1,
            reset_timeout_ms: 60_000,
            half_open_max_requests: 1,
            ..Default::default()
        }),
        ..echo_upstream(&stack, "echo-dead")
    };
    upsert_upstream(&stack, dead).await?;
    upsert_route_synced(&stack, open_route("echo", "/mock.v1.Echo", "echo-dead", "")).await?;
    let failed = failing(&mut client, unary("x", 0)).await?;
    ensure!(
        failed.code() == Code::Unavailable,
        "unreachable: {failed:?}"
    );
    let failed = failing(&mut client, unary("x", 0)).await?;
    ensure!(
        failed.code() == Code::Unavailable && failed.message().contains("no instance"),
        "breaker open: {failed:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_upstream_is_health_checked_over_http2_and_refuses_websocket_routes() -> Result<()>
{
    let stack = one_data_plane(&[]).await;
    let checked = |path: &str| Upstream {
        health_check: Some(HealthCheck {
            path: path.into(),
            interval_ms: 300,
            timeout_ms: 300,
            unhealthy_threshold: 1,
            healthy_threshold: 1,
        }),
        ..echo_upstream(&stack, "echo")
    };
    let admin = &stack.gateway_admins()[0];
    let healthy = || async {
        metric_sample(
            admin,
            "gateway_upstream_healthy{upstream=\"echo\",instance=\"orders-1\"}",
        )
        .await
    };
    // A path the instance does not serve: its checks fail (404) and it is
    // marked unhealthy; then its health endpoint: healthy again.
    for (path, want) in [("/missing", 0.0), ("/health", 1.0)] {
        upsert_upstream(&stack, checked(path)).await?;
        poll(
            DEADLINE,
            &format!("orders-1 healthy = {want} with {path}"),
            || async {
                match healthy().await {
                    Ok(h) if h == want => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await?;
    }

    // WebSocket needs HTTP/1.1: refused with the reason.
    let ws = Route {
        websocket: true,
        ..open_route("ws", "/ws", "echo", "")
    };
    let refused = stack
        .admin_client()
        .await
        .upsert_route(UpsertRouteRequest {
            route: Some(ws),
            ..Default::default()
        })
        .await
        .err()
        .context("the WebSocket route was accepted")?;
    ensure!(
        refused.code() == Code::InvalidArgument && refused.message().contains("HTTP1 upstream"),
        "{refused:?}"
    );
    Ok(())
}
