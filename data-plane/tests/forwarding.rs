//! Route forwarding settings against in-test upstreams: `retry` (per-try
//! timeout, replayed bodies, non-idempotent methods) and `websocket` tunnels
//! (bytes both ways, graceful shutdown waits for an open tunnel).
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use data_plane::Running;
use gateway_proto::v1::{ConfigSnapshot, Retry, RetryOn, Route};
use http::{Method, Request, StatusCode};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A data plane with no reachable control plane, configured directly.
async fn data_plane_with(cfg: ConfigSnapshot, extra: &[&str]) -> (Running, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let dead_cp = format!("http://{}", closed_port());
    let dp = start_data_plane(&dead_cp, cache.path(), extra).await;
    dp.runtime()
        .apply(cfg, false)
        .await
        .expect("config applies");
    (dp, cache)
}

fn retrying(name: &str, on: &[RetryOn], per_try_timeout_ms: u32) -> Route {
    Route {
        retry: Some(Retry {
            attempts: 2,
            on: on.iter().map(|o| *o as i32).collect(),
            per_try_timeout_ms,
        }),
        ..route(name, "/", "svc")
    }
}

/// An instance that accepts connections and never answers.
async fn silent() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_per_try_timeout_moves_a_get_to_the_other_instance() {
    let live = TestUpstream::start("live").await;
    let (quiet, _task) = silent().await;
    let cfg = snapshot(
        1,
        vec![Route {
            timeout_ms: 5_000,
            ..retrying("all", &[RetryOn::Timeout], 200)
        }],
        vec![upstream(
            "svc",
            &[("quiet", format!("http://{quiet}")), ("live", live.url())],
        )],
    );
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let addr = dp.proxy_addr();
    for i in 0..4 {
        let started = Instant::now();
        let (status, headers, body) = get(addr, "/x").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
        assert_eq!(headers["x-instance-id"], "live");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    let (_, metrics) = ops(&dp, "/metrics").await;
    let timeouts = metric(
        &metrics,
        "gateway_retries_total{upstream=\"svc\",reason=\"timeout\"}",
    )
    .unwrap();
    assert!(
        timeouts >= 1.0,
        "round-robin tried the quiet one first at least once\n{metrics}"
    );
    // A POST is not retried after a timeout: it may have been processed.
    let mut post_timeouts = 0;
    for _ in 0..4 {
        let req = Request::post(format!("http://{addr}/count"))
            .body(full("abc"))
            .unwrap();
        let (status, _, body) = send(addr, req).await;
        match status {
            StatusCode::OK => assert_eq!(body, "3"),
            StatusCode::GATEWAY_TIMEOUT => post_timeouts += 1,
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(post_timeouts > 0, "some POSTs went to the quiet instance");
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn small_idempotent_bodies_are_replayed_and_large_ones_are_not() {
    let live = TestUpstream::start("live").await;
    let (hole, _task) = black_hole().await;
    let cfg = snapshot(
        1,
        vec![retrying("all", &[RetryOn::ConnectFailure], 0)],
        vec![upstream(
            "svc",
            &[("hole", format!("http://{hole}")), ("live", live.url())],
        )],
    );
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let addr = dp.proxy_addr();
    let put = |n: usize| {
        Request::builder()
            .method(Method::PUT)
            .uri(format!("http://{addr}/count"))
            .body(full(vec![7u8; n]))
            .unwrap()
    };
    // 5000 bytes: buffered, replayed whole on the live instance after the hole cuts it off.
    for i in 0..4 {
        let (status, headers, body) = send(addr, put(5000)).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "5000"), "PUT {i}");
        assert_eq!(headers["x-instance-id"], "live");
    }
    // Over 64 KiB: streamed once, so a PUT that meets the hole fails.
    let mut large_failed = 0;
    for _ in 0..4 {
        let (status, _, body) = send(addr, put(100 * 1024)).await;
        match status {
            StatusCode::OK => assert_eq!(body, (100 * 1024).to_string()),
            StatusCode::BAD_GATEWAY => large_failed += 1,
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(large_failed > 0, "some large PUTs met the hole");
    let (_, metrics) = ops(&dp, "/metrics").await;
    let retried = metric(
        &metrics,
        "gateway_retries_total{upstream=\"svc\",reason=\"connect_failure\"}",
    )
    .unwrap();
    assert!(retried >= 1.0, "{metrics}");
    dp.shutdown().await;
}

/// An upstream that answers any request head with 101 and then echoes bytes.
async fn raw_upgrade_echo() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
                if s.write_all(answer).await.is_err() {
                    return;
                }
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, task)
}

/// Reads from `s` until `want` bytes have arrived (within 5 s).
async fn read_n(s: &mut TcpStream, want: usize) -> Vec<u8> {
    let mut out = vec![0u8; want];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut out))
        .await
        .expect("bytes in time")
        .expect("read");
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tunnel_carries_bytes_and_shutdown_waits_for_it() {
    let (echo, _task) = raw_upgrade_echo().await;
    let cfg = snapshot(
        1,
        vec![Route {
            websocket: true,
            ..route("ws", "/ws", "svc")
        }],
        vec![upstream("svc", &[("echo", format!("http://{echo}"))])],
    );
    let (dp, _cache) = data_plane_with(cfg, &["--shutdown-timeout-ms", "30000"]).await;
    let addr = dp.proxy_addr();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nhost: gw\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
          sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        head.extend(read_n(&mut s, 1).await);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert!(head.contains("connection: upgrade"), "{head}");
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    // The gateway only tunnels bytes: anything goes through, both ways.
    s.write_all(b"\x81\x05hello").await.unwrap();
    assert_eq!(read_n(&mut s, 7).await, b"\x81\x05hello");

    // Shutdown begins: the listener closes, the tunnel keeps working.
    let admin = dp.admin_addr();
    let shutdown = tokio::spawn(dp.shutdown());
    eventually("the proxy listener to close", || async {
        TcpStream::connect(addr).await.is_err().then_some(())
    })
    .await;
    s.write_all(b"still there").await.unwrap();
    assert_eq!(read_n(&mut s, 11).await, b"still there");
    assert!(
        !shutdown.is_finished(),
        "shutdown waits for the open tunnel"
    );
    // The client leaves: the tunnel ends and shutdown completes well before its grace.
    drop(s);
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown completes once the tunnel is closed")
        .unwrap();
    assert!(
        TcpStream::connect(admin).await.is_err(),
        "ops listener closed"
    );
}

/// Answers for [`raw_fields_upstream`], by request path.
const PLAIN_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nServer: Raw/1\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\n\
Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\nX-Request-Id: from-upstream\r\n\
Set-Cookie: a=1\r\nset-cookie: b=2\r\nProxy-Authenticate: Basic\r\nTrailer: X-T\r\nX-Empty: \r\n\r\nok";
const NAMED_ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\nServer: Raw/1\r\nConnection: keep-alive, X-Hop\r\n\
X-Hop: secret\r\nContent-Length: 2\r\n\r\nok";
const CHUNKED_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nServer: Raw/1\r\nTransfer-Encoding: chunked\r\n\
Content-Length: 99\r\n\r\n2\r\nok\r\n0\r\n\r\n";

/// An upstream that answers each request with the fixed head above its path
/// names (keeping the connection unless the answer overrides its length).
async fn raw_fields_upstream() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while got.len() < end + 4 + length {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    got.drain(..end + 4 + length);
                    let path = head.split(' ').nth(1).unwrap_or_default();
                    let answer = match path {
                        "/named" => NAMED_ANSWER,
                        "/chunked" => CHUNKED_ANSWER,
                        _ => PLAIN_ANSWER,
                    };
                    if s.write_all(answer).await.is_err() || answer == CHUNKED_ANSWER {
                        return;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// The header fields of a raw response: (lower-case name, value), sorted,
/// with `traceresponse` (new on every request) checked and left out.
fn fields_of(response: &str) -> Vec<(String, String)> {
    let head = &response[..response.find("\r\n\r\n").expect("a whole head")];
    let mut fields: Vec<_> = head
        .lines()
        .skip(1)
        .map(|l| {
            let (name, value) = l.split_once(':').expect("a field line");
            (name.to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    fields.sort();
    let traced = fields.iter().position(|(n, _)| n == "traceresponse");
    fields.remove(traced.expect("the gateway's traceresponse"));
    fields
}

/// The fields an upstream answers with reach the client as they came, less the
/// hop-by-hop ones (and those its `Connection` names), with the gateway's own
/// replacing any of the same name: the same fields whether the answer is
/// written by the gateway's HTTP/1.1 server or by hyper's (a request with a body).
#[tokio::test(flavor = "multi_thread")]
async fn upstream_response_fields_reach_the_client_less_the_hop_by_hop_ones() {
    let (up, _task) = raw_fields_upstream().await;
    let cfg = snapshot(
        1,
        vec![route("svc", "/", "svc")],
        vec![upstream("svc", &[("raw", format!("http://{up}"))])],
    );
    let (dp, _cache) = data_plane_with(cfg, &[]).await;
    let addr = dp.proxy_addr();
    let request = |method: &str, path: &str| {
        let body = if method == "POST" {
            "Content-Length: 3\r\n\r\nabc"
        } else {
            "\r\n"
        };
        format!(
            "{method} {path} HTTP/1.1\r\nHost: gw\r\nX-Request-Id: client-id-1\r\nConnection: close\r\n{body}"
        )
    };

    let plain = raw(addr, request("GET", "/plain").as_bytes()).await;
    assert_eq!(raw_status(&plain), 200, "{plain}");
    assert!(plain.ends_with("\r\n\r\nok"), "{plain}");
    // Names keep the case they came in.
    assert!(plain.contains("\r\nServer: Raw/1\r\n"), "{plain}");
    let want: Vec<(String, String)> = [
        ("connection", "close"),
        ("content-length", "2"),
        ("date", "Tue, 01 Dec 2026 00:00:00 GMT"),
        ("server", "Raw/1"),
        ("set-cookie", "a=1"),
        ("set-cookie", "b=2"),
        ("x-empty", ""),
        ("x-request-id", "client-id-1"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    assert_eq!(fields_of(&plain), want, "{plain}");
    // hyper's server writes the same fields (HTTP/1.1 requests with a body go to it).
    let posted = raw(addr, request("POST", "/plain").as_bytes()).await;
    assert_eq!(fields_of(&posted), want, "{posted}");

    // What `Connection` names goes too.
    for method in ["GET", "POST"] {
        let named = raw(addr, request(method, "/named").as_bytes()).await;
        let fields = fields_of(&named);
        assert!(fields.iter().all(|(n, _)| n != "x-hop"), "{named}");
        assert!(
            fields.contains(&("server".into(), "Raw/1".into())),
            "{named}"
        );
        assert!(
            fields.contains(&("content-length".into(), "2".into())),
            "{named}"
        );
    }

    // `Transfer-Encoding` overrides `Content-Length`: the body is re-framed, the length dropped.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request("GET", "/chunked").as_bytes())
        .await
        .unwrap();
    let mut chunked = Vec::new();
    // The gateway closes the connection after the answer (the client asked it to).
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut chunked))
        .await
        .expect("the answer in time")
        .unwrap();
    let chunked = String::from_utf8(chunked).unwrap();
    let fields = fields_of(&chunked);
    assert!(
        fields.contains(&("transfer-encoding".into(), "chunked".into())),
        "{chunked}"
    );
    assert!(
        fields.iter().all(|(n, _)| n != "content-length"),
        "{chunked}"
    );
    assert!(
        chunked.ends_with("\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
        "{chunked}"
    );
    dp.shutdown().await;
}
