//! Edge hardening (issue 25) against real processes, mostly with raw bytes
//! over a socket: connection deadlines and caps, headers the gateway relies on
//! that a client must not delete or forge, ambiguous framing, trickled
//! bodies, clients that never read, WebSocket 101s that do not complete the
//! handshake, and the tunnel caps.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use devstack::Stack;
use gateway_proto::v1::{Retry, RetryOn, Route};
use gateway_tests::{
    RawResponse, metric_sample, mock_requests, one_data_plane, open_route, poll, raw_request,
    upsert_route_synced,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

/// The deadlines the hardened stack runs with: short, so the tests see them.
const SHORT: Duration = Duration::from_millis(1000);
/// How much later than a deadline a connection may end and still pass:
/// scheduling on a loaded 2-core machine, never a sleep the test relies on.
const SLACK: Duration = Duration::from_secs(4);
/// The address the tests' "proxy" connects from: the only trusted proxy.
const PROXY: &str = "127.0.0.2";

/// A stack whose data plane has every deadline at [`SHORT`], 127.0.0.2 as a
/// trusted proxy, at most one WebSocket tunnel, and the open route `/open`
/// → `users` plus the retrying route `/retry` → `orders`.
async fn hardened() -> Result<Stack> {
    let ms = SHORT.as_millis().to_string();
    let stack = one_data_plane(&[
        &format!("--header-read-timeout-ms={ms}"),
        &format!("--body-read-timeout-ms={ms}"),
        &format!("--write-timeout-ms={ms}"),
        &format!("--h2-idle-timeout-ms={ms}"),
        &format!("--h2-keep-alive-ms={ms}"),
        &format!("--max-websocket-idle-ms={ms}"),
        "--max-websocket-tunnels=1",
        &format!("--trusted-proxies={PROXY}/32"),
    ])
    .await;
    upsert_route_synced(&stack, open_route("open", "/open/users", "users", "/users")).await?;
    let retrying = Route {
        retry: Some(Retry {
            attempts: 1,
            on: vec![RetryOn::Status5xx as i32],
            per_try_timeout_ms: 0,
        }),
        timeout_ms: 30_000,
        ..open_route("retry", "/retry", "orders", "/orders")
    };
    upsert_route_synced(&stack, retrying).await?;
    let ws = Route {
        websocket: true,
        websocket_idle_timeout_ms: 600_000,
        ..open_route("ws", "/ws", "orders", "")
    };
    upsert_route_synced(&stack, ws).await?;
    Ok(stack)
}

fn addr(base: &str) -> SocketAddr {
    base.trim_start_matches("http://")
        .parse()
        .expect("a gateway URL is http://IP:PORT")
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse()?, 0))?;
    Ok(socket.connect(to).await?)
}

/// Sends `bytes` on `stream` and reads the whole answer (the request asks to close).
async fn exchange(mut stream: TcpStream, bytes: &[u8]) -> Result<RawResponse> {
    stream.write_all(bytes).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .context("no complete answer within 30 s")??;
    RawResponse::parse(&raw)
}

/// Waits until the server ends `stream` (EOF or reset), discarding what it
/// sends; returns how long that took. Fails after `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Result<(Duration, Vec<u8>)> {
    let started = Instant::now();
    let mut got = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .with_context(|| format!("the connection was still open after {limit:?}"))?;
    Ok((started.elapsed(), got))
}

/// The request headers the mock received, from its JSON answer.
fn seen_headers(resp: &RawResponse) -> Result<Value> {
    ensure!(
        resp.status == 200,
        "status {}: {:?}",
        resp.status,
        resp.body
    );
    Ok(resp.json()?["headers"].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_connection_phase_has_a_deadline() -> Result<()> {
    let stack = hardened().await?;
    let gw = addr(&stack.gateways()[0]);
    let ops = &stack.gateway_admins()[0];

    // `PRI` and then nothing: closed within the header timeout (it was never,
    // the auto builder had no version-detection deadline).
    for first in [&b"PRI"[..], b"PRI * HTTP/2.0\r\n", b"GET / HT"] {
        let mut s = TcpStream::connect(gw).await?;
        s.write_all(first).await?;
        let (took, _) = closed_within(&mut s, SHORT + SLACK)
            .await
            .with_context(|| format!("{first:?}"))?;
        ensure!(took >= SHORT / 2, "{first:?} closed after only {took:?}");
    }
    // A preface sent in pieces still opens an HTTP/2 connection: the server's
    // SETTINGS frame (type 4) answers it.
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(b"PRI * HTTP/2.0\r\n").await?;
    s.flush().await?;
    tokio::task::yield_now().await;
    s.write_all(b"\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await?;
    let mut head = [0u8; 9];
    tokio::time::timeout(SLACK, s.read_exact(&mut head))
        .await
        .context("no frame after a split preface")??;
    ensure!(
        head[3] == 4,
        "expected SETTINGS, got frame type {}",
        head[3]
    );

    // An HTTP/2 connection with no stream: GOAWAY (type 7) after the idle
    // timeout; this client never answers the PINGs either, so the keep-alive
    // timeout closes it.
    let mut h2 = TcpStream::connect(gw).await?;
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await?;
    let (took, frames) = closed_within(&mut h2, SHORT * 3 + SLACK)
        .await
        .context("idle h2c")?;
    ensure!(took >= SHORT / 2, "idle h2 closed after only {took:?}");
    ensure!(
        has_frame(&frames, 7),
        "no GOAWAY before the close: {frames:?}"
    );

    // A trickled body: 408 after the body-read timeout, on a retrying route
    // (an idempotent request's body is buffered before it is sent: the
    // upstream is never called) and on a plain one (streamed as it comes).
    let orders = mock_requests(stack.ports().orders_1).await?
        + mock_requests(stack.ports().orders_2).await?;
    for (method, path) in [("PUT", "/retry/1"), ("POST", "/open/users/1")] {
        let mut s = TcpStream::connect(gw).await?;
        s.write_all(
            format!("{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\nabc")
                .as_bytes(),
        )
        .await?;
        let started = Instant::now();
        let (took, answer) = closed_within(&mut s, SHORT + SLACK)
            .await
            .with_context(|| format!("trickled body on {path}"))?;
        let answer = RawResponse::parse(&answer)?;
        ensure!(
            answer.status == 408,
            "{path}: {} {:?}",
            answer.status,
            answer.body
        );
        ensure!(
            answer.json()?["type"] == "urn:gateway:problem:body-timeout",
            "{path}: {:?}",
            answer.body
        );
        ensure!(
            took >= SHORT / 2,
            "{path}: 408 after only {:?}",
            started.elapsed()
        );
    }
    let after = mock_requests(stack.ports().orders_1).await?
        + mock_requests(stack.ports().orders_2).await?;
    ensure!(
        after == orders,
        "the retrying route called its upstream with half a body"
    );

    // A client that never reads a large answer: disconnected after the write
    // timeout, and the upstream connection and in-flight count are let go.
    let socket = TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut s = socket.connect(gw).await?;
    s.write_all(b"GET /open/users/1?bytes=268435456 HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await?;
    poll(
        Duration::from_secs(10),
        "the big answer in flight",
        || async {
            match in_flight(ops, "users").await {
                Ok(1) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    poll(SHORT + SLACK * 2, "in-flight back to 0", || async {
        match in_flight(ops, "users").await {
            Ok(0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    drop(s);
    Ok(())
}

/// Whether `bytes` (HTTP/2 frames from the start of a connection, after
/// the server's) holds a frame of `kind`.
fn has_frame(mut bytes: &[u8], kind: u8) -> bool {
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        if bytes[3] == kind {
            return true;
        }
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    false
}

/// Requests in flight on the instances of `upstream` (`/health/load-balancer`).
async fn in_flight(ops: &str, upstream: &str) -> Result<u64> {
    let lb: Value = gateway_tests::client()
        .get(format!("{ops}/health/load-balancer"))
        .send()
        .await?
        .json()
        .await?;
    let ups = lb["upstreams"].as_array().context("no upstreams")?;
    let up = ups
        .iter()
        .find(|u| u["name"] == upstream)
        .with_context(|| format!("no upstream {upstream} in {lb}"))?;
    Ok(up["instances"]
        .as_array()
        .context("no instances")?
        .iter()
        .filter_map(|i| i["in_flight"].as_u64())
        .sum())
}

#[tokio::test(flavor = "multi_thread")]
async fn headers_the_gateway_relies_on_cannot_be_deleted_or_forged() -> Result<()> {
    let stack = hardened().await?;
    let gw = addr(&stack.gateways()[0]);
    let deny = Route {
        ip_deny: vec!["203.0.113.7".into()],
        ..open_route("deny", "/deny/users", "users", "/users")
    };
    upsert_route_synced(&stack, deny).await?;

    // Through the trusted proxy, the client is 203.0.113.7 and denied; naming
    // X-Forwarded-For in Connection must not make the proxy the client.
    for connection in ["close", "close, X-Forwarded-For", "X-Forwarded-For, close"] {
        let s = connect_from(PROXY, gw).await?;
        let req = format!(
            "GET /deny/users/1 HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 203.0.113.7\r\nConnection: {connection}\r\n\r\n"
        );
        let resp = exchange(s, req.as_bytes()).await?;
        ensure!(
            resp.status == 403,
            "Connection: {connection} -> {} {:?}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
    }

    // From an ordinary client: identity and forwarding headers in any
    // spelling never reach the backend; the gateway's own are set.
    let forged = "GET /open/users/1 HTTP/1.1\r\nHost: app.example\r\n\
        X_User_Id: admin\r\nx-user_role: admin\r\nX_Api_Key_Name: k\r\nX_Gateway_Signature: t=1\r\n\
        X_Forwarded_For: 6.6.6.6\r\nForwarded: for=6.6.6.6;proto=https\r\nX-Real-IP: 6.6.6.6\r\n\
        X-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\n\
        Connection: close, Host, Content-Length, X-Request-Id\r\n\r\n";
    let s = TcpStream::connect(gw).await?;
    let headers = seen_headers(&exchange(s, forged.as_bytes()).await?)?;
    let names: Vec<&str> = headers
        .as_object()
        .context("headers object")?
        .keys()
        .map(String::as_str)
        .collect();
    for gone in [
        "x_user_id",
        "x-user_role",
        "x_api_key_name",
        "x_gateway_signature",
        "x_forwarded_for",
        "forwarded",
        "x-real-ip",
    ] {
        ensure!(
            !names.contains(&gone),
            "{gone} reached the backend: {headers}"
        );
    }
    ensure!(headers["x-forwarded-host"] == "app.example", "{headers}");
    ensure!(headers["x-forwarded-proto"] == "http", "{headers}");
    ensure!(headers["x-forwarded-for"] == "127.0.0.1", "{headers}");
    ensure!(
        headers["host"] == "app.example",
        "Connection removed Host: {headers}"
    );
    ensure!(
        headers["x-request-id"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "Connection removed X-Request-Id: {headers}"
    );

    // From the trusted proxy its own forwarding headers are believed.
    let proxied = "GET /open/users/1 HTTP/1.1\r\nHost: gw.internal\r\n\
        Forwarded: for=198.51.100.1;proto=https\r\nX-Real-IP: 198.51.100.1\r\n\
        X-Forwarded-Host: public.example\r\nX-Forwarded-Proto: https\r\n\
        X-Forwarded-For: 198.51.100.1\r\nConnection: close\r\n\r\n";
    let s = connect_from(PROXY, gw).await?;
    let headers = seen_headers(&exchange(s, proxied.as_bytes()).await?)?;
    ensure!(
        headers["forwarded"] == "for=198.51.100.1;proto=https",
        "{headers}"
    );
    ensure!(headers["x-real-ip"] == "198.51.100.1", "{headers}");
    ensure!(headers["x-forwarded-host"] == "public.example", "{headers}");
    ensure!(headers["x-forwarded-proto"] == "https", "{headers}");
    ensure!(
        headers["x-forwarded-for"] == "198.51.100.1, 127.0.0.2",
        "{headers}"
    );

    // An HTTP/2 request has no Host: X-Forwarded-Host is its `:authority`.
    let headers = h2c_seen_headers(
        gw,
        "app.example:8443",
        "/open/users/1",
        &[("x-forwarded-host", "evil.example")],
    )
    .await?;
    ensure!(
        headers["x-forwarded-host"] == "app.example:8443",
        "{headers}"
    );
    ensure!(headers["x-forwarded-proto"] == "http", "{headers}");
    Ok(())
}

/// An h2c GET of `path` with `:authority` `authority` and `extra` fields; the
/// headers the mock backend saw.
async fn h2c_seen_headers(
    gw: SocketAddr,
    authority: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> Result<Value> {
    let tcp = TcpStream::connect(gw).await?;
    let (h2, connection) = h2::client::handshake(tcp).await?;
    let connection = tokio::spawn(connection);
    let mut request = http::Request::get(format!("http://{authority}{path}"));
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let (response, _) = h2.ready().await?.send_request(request.body(())?, true)?;
    let response = response.await?;
    let status = response.status();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    connection.abort();
    ensure!(
        status == 200,
        "h2 status {status}: {:?}",
        String::from_utf8_lossy(&bytes)
    );
    let seen: Value = serde_json::from_slice(&bytes)?;
    Ok(seen["headers"].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn ambiguous_framing_is_refused_with_400() -> Result<()> {
    let stack = hardened().await?;
    let base = &stack.gateways()[0];
    let gw = addr(base);
    let users = stack.ports().users_1;
    let before = mock_requests(users).await?;
    for (head, why) in [
        (
            "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length and Transfer-Encoding",
        ),
        (
            "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "Transfer-Encoding and Content-Length",
        ),
        (
            "GET /open/users/1 HTTP/1.1\r\nHost: a\r\nHost: b\r\n",
            "two Host",
        ),
        (
            "GET /open/users/1 HTTP/1.1\r\nHost: a\r\nHost: a\r\n",
            "the same Host twice",
        ),
        (
            "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 0, 0\r\n",
            "a Content-Length list",
        ),
        (
            "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nContent-Length: 0\r\n",
            "two Content-Length",
        ),
        (
            "GET http://other.example/open/users/1 HTTP/1.1\r\nHost: gw.example\r\n",
            "an absolute-form target for another host",
        ),
    ] {
        let resp = raw_request(base, head).await?;
        ensure!(resp.status == 400, "{why}: {} {:?}", resp.status, resp.body);
        ensure!(
            resp.header("content-type") == Some("application/problem+json"),
            "{why}: {:?}",
            resp.headers
        );
    }
    // The same heads on a connection that first carried a request with a
    // body (of each framing): refused the same way, never read another way.
    let firsts = [
        "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nhi",
        "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
    ];
    for (second, why) in [
        (
            "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length and Transfer-Encoding",
        ),
        (
            "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "Transfer-Encoding and Content-Length",
        ),
        (
            "POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\nContent-Length: 0\r\n",
            "two Content-Length",
        ),
        (
            "GET /open/users/1 HTTP/1.1\r\nHost: a\r\nHost: b\r\n",
            "two Host",
        ),
        (
            "GET http://other.example/open/users/1 HTTP/1.1\r\nHost: gw.example\r\n",
            "absolute-form",
        ),
    ] {
        for first in firsts {
            let mut s = TcpStream::connect(gw).await?;
            s.write_all(first.as_bytes()).await?;
            s.write_all(format!("{second}Connection: close\r\n\r\n").as_bytes())
                .await?;
            let (_, raw) = closed_within(&mut s, SLACK * 2).await?;
            let text = String::from_utf8_lossy(&raw);
            let statuses: Vec<&str> = text
                .match_indices("HTTP/1.1 ")
                .map(|(i, _)| &text[i + 9..i + 12])
                .filter(|status| *status != "100")
                .collect();
            ensure!(
                statuses == ["200", "400"],
                "{why} after {first:?}: {statuses:?} in {text}"
            );
        }
    }
    // Requests the gateway's own server leaves to hyper (an upgrade it then
    // refuses, HTTP/1.0 asking for keep-alive) end their connection: the
    // ambiguous head after them is never read by another parser.
    for first in [
        "GET /open/users/1 HTTP/1.1\r\nHost: gw\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        "GET /open/users/1 HTTP/1.0\r\nHost: gw\r\nConnection: keep-alive\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(gw).await?;
        s.write_all(first.as_bytes()).await?;
        s.write_all(
            b"POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        )
        .await?;
        let (_, raw) = closed_within(&mut s, SLACK * 2).await?;
        let text = String::from_utf8_lossy(&raw);
        ensure!(
            text.matches("HTTP/1.").count() == 1,
            "one answer, then the connection closes, after {first:?}: {text}"
        );
    }
    // An absolute-form target that agrees with Host is routed.
    let resp = raw_request(
        base,
        "GET http://gw.example/open/users/1 HTTP/1.1\r\nHost: gw.example\r\n",
    )
    .await?;
    ensure!(
        resp.status == 200,
        "matching absolute-form: {}",
        resp.status
    );
    let after = mock_requests(users).await?;
    ensure!(
        after == before + 17,
        "only the fifteen bodies, the HTTP/1.0 request and the matching absolute-form request reach the mock ({before} -> {after})"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_101s_are_checked_and_tunnels_capped() -> Result<()> {
    let stack = hardened().await?;
    let gw = addr(&stack.gateways()[0]);
    let ops = &stack.gateway_admins()[0];
    let handshake = |query: &str| {
        format!(
            "GET /ws{query} HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
    };
    // A 101 with a wrong accept key, or for another protocol: 502, no tunnel.
    for fault in ["accept", "upgrade"] {
        let mut s = TcpStream::connect(gw).await?;
        s.write_all(handshake(&format!("?bad_101={fault}")).as_bytes())
            .await?;
        let head = read_head(&mut s).await?;
        ensure!(head.starts_with("HTTP/1.1 502"), "{fault}: {head}");
        ensure!(head.contains("application/problem+json"), "{fault}: {head}");
    }
    ensure!(metric_sample(ops, "gateway_websocket_bad_upgrades_total").await? == 2.0);

    // A good one opens; a second is refused while it is open (cap 1).
    let mut first = TcpStream::connect(gw).await?;
    first.write_all(handshake("").as_bytes()).await?;
    let head = read_head(&mut first).await?;
    ensure!(head.starts_with("HTTP/1.1 101"), "{head}");
    ensure!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let mut second = TcpStream::connect(gw).await?;
    second.write_all(handshake("").as_bytes()).await?;
    let head = read_head(&mut second).await?;
    ensure!(head.starts_with("HTTP/1.1 503"), "{head}");
    ensure!(metric_sample(ops, "gateway_websocket_tunnels_refused_total").await? == 1.0);

    // The route allows 10 idle minutes; the replica's cap (SHORT) closes it.
    let (took, _) = closed_within(&mut first, SHORT + SLACK * 2).await?;
    ensure!(took >= SHORT / 2, "tunnel closed after only {took:?}");
    poll(SLACK, "the tunnel slot back", || async {
        match metric_sample(ops, "gateway_websocket_replica_tunnels_open").await {
            Ok(0.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

/// Reads a response head (to the empty line) from `s`.
async fn read_head(s: &mut TcpStream) -> Result<String> {
    let mut got = Vec::new();
    let read = async {
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await? == 0 {
                bail!("closed after {:?}", String::from_utf8_lossy(&got));
            }
            got.push(byte[0]);
        }
        Ok(())
    };
    tokio::time::timeout(SLACK * 2, read)
        .await
        .context("no response head in time")??;
    Ok(String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn past_max_connections_new_connections_are_closed_at_once() -> Result<()> {
    let stack = one_data_plane(&["--max-connections=3"]).await;
    upsert_route_synced(&stack, open_route("open", "/open/users", "users", "/users")).await?;
    let gw = addr(&stack.gateways()[0]);
    let ops = &stack.gateway_admins()[0];
    // Three keep-alive connections, each proven served.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(gw).await?;
        s.write_all(b"GET /open/users/1 HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await?;
        let head = read_head(&mut s).await?;
        ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
        held.push(s);
    }
    // The fourth is accepted by the kernel and closed by the gateway at once.
    let mut extra = TcpStream::connect(gw).await?;
    let _ = extra
        .write_all(b"GET /open/users/1 HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await;
    let (_, got) = closed_within(&mut extra, SLACK).await?;
    ensure!(got.is_empty(), "the fourth connection was served: {got:?}");
    ensure!(
        metric_sample(ops, "gateway_connections_refused_total{listener=\"proxy\"}").await? >= 1.0
    );
    ensure!(metric_sample(ops, "gateway_connections_open{listener=\"proxy\"}").await? == 3.0);
    // A slot given back is usable again.
    drop(held.pop());
    poll(SLACK, "a new connection served", || async {
        let resp = raw_request(
            &stack.gateways()[0],
            "GET /open/users/1 HTTP/1.1\r\nHost: gw\r\n",
        )
        .await
        .map_err(|e| e.to_string())?;
        if resp.status == 200 {
            Ok(())
        } else {
            Err(format!("status {}", resp.status))
        }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn expect_100_continue_is_answered_when_the_body_is_wanted() -> Result<()> {
    let stack = hardened().await?;
    let gw = addr(&stack.gateways()[0]);
    let users = stack.ports().users_1;
    let before = mock_requests(users).await?;
    // The route forwards the body: `100 Continue` first, then the answer.
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(
        b"POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut got = vec![0u8; interim.len()];
    tokio::time::timeout(SLACK, s.read_exact(&mut got))
        .await
        .context("no 100 Continue in time")??;
    ensure!(got == interim, "{:?}", String::from_utf8_lossy(&got));
    s.write_all(b"hello").await?;
    let (_, raw) = closed_within(&mut s, SLACK).await?;
    let answer = RawResponse::parse(&raw)?;
    ensure!(answer.status == 200, "{} {:?}", answer.status, answer.body);
    ensure!(
        mock_requests(users).await? == before + 1,
        "the mock got the request"
    );
    // A declared body over --max-body-bytes (10 MiB by default) is refused
    // before it is wanted: no 100, a 413 and the connection closed.
    let mut s = TcpStream::connect(gw).await?;
    s.write_all(
        b"POST /open/users/1 HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 20971520\r\n\r\n",
    )
    .await?;
    let (_, raw) = closed_within(&mut s, SLACK).await?;
    let text = String::from_utf8_lossy(&raw);
    ensure!(!text.contains("100 Continue"), "{text}");
    let answer = RawResponse::parse(&raw)?;
    ensure!(answer.status == 413, "{} {:?}", answer.status, answer.body);
    ensure!(
        mock_requests(users).await? == before + 1,
        "the refused request never reached the mock"
    );
    Ok(())
}
