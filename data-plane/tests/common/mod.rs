//! Test fixtures: an in-test control plane (a real tonic
//! `ConfigDiscoveryService`), in-test upstream instances (hyper servers), a data
//! plane started in-process through the library, and small HTTP helpers.
#![allow(dead_code, unreachable_pub)]

use parking_lot::Mutex;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser as _;
use data_plane::args::Args;
use data_plane::{DataPlane, Running};
use futures::{Stream, StreamExt as _};
use gateway_proto::v1::config_discovery_service_server::{
    ConfigDiscoveryService, ConfigDiscoveryServiceServer,
};
use gateway_proto::v1::{
    CircuitBreaker, ConfigRequest, ConfigResponse, ConfigSnapshot, Instance, Route, Upstream,
};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::BroadcastStream;

/// How long any condition in these tests may take before the test fails:
/// generous, since CI runs debug builds of several processes on 2 busy cores
/// (a passing test never waits for it).
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `f` until it returns `Some`, failing the test after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- control plane

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ConfigResponse, tonic::Status>> + Send>>;

struct CpService {
    pushes: broadcast::Sender<ConfigResponse>,
    last: Arc<Mutex<Option<ConfigResponse>>>,
    requests: mpsc::UnboundedSender<ConfigRequest>,
    /// Turns true when the control plane is killed: every open stream ends.
    killed: tokio::sync::watch::Receiver<bool>,
}

#[tonic::async_trait]
impl ConfigDiscoveryService for CpService {
    type StreamConfigStream = ResponseStream;

    async fn stream_config(
        &self,
        request: tonic::Request<tonic::Streaming<ConfigRequest>>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let requests = self.requests.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let _ = requests.send(m);
            }
        });
        let later = BroadcastStream::new(self.pushes.subscribe()).filter_map(|r| async { r.ok() });
        let first = self.last.lock().clone();
        let mut killed = self.killed.clone();
        let stream = futures::stream::iter(first)
            .chain(later)
            .map(Ok)
            .take_until(async move {
                let _ = killed.wait_for(|k| *k).await;
            });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// A control plane the test drives: it pushes snapshots and reads ACKs/NACKs.
pub struct FakeControlPlane {
    pub addr: SocketAddr,
    pushes: broadcast::Sender<ConfigResponse>,
    last: Arc<Mutex<Option<ConfigResponse>>>,
    requests: mpsc::UnboundedReceiver<ConfigRequest>,
    /// Status reports received while waiting for another message.
    reports: std::collections::VecDeque<ConfigRequest>,
    killed: tokio::sync::watch::Sender<bool>,
    server: JoinHandle<()>,
}

impl FakeControlPlane {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (pushes, _) = broadcast::channel(16);
        let last = Arc::new(Mutex::new(None));
        let (tx, requests) = mpsc::unbounded_channel();
        let (killed, killed_rx) = tokio::sync::watch::channel(false);
        let svc = CpService {
            pushes: pushes.clone(),
            last: last.clone(),
            requests: tx,
            killed: killed_rx,
        };
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(ConfigDiscoveryServiceServer::new(svc))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        Self {
            addr,
            pushes,
            last,
            requests,
            reports: std::collections::VecDeque::new(),
            killed,
            server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Pushes a snapshot to every open stream (and to streams opened later).
    pub fn push(&self, snapshot: &ConfigSnapshot, nonce: &str) {
        let resp = ConfigResponse {
            version: snapshot.version,
            hash: snapshot.hash.clone(),
            nonce: nonce.to_string(),
            routes: snapshot.routes.clone(),
            upstreams: snapshot.upstreams.clone(),
            api_keys: snapshot.api_keys.clone(),
            certificates: snapshot.certificates.clone(),
            jwt_issuers: snapshot.jwt_issuers.clone(),
            purge: None,
        };
        *self.last.lock() = Some(resp.clone());
        let _ = self.pushes.send(resp);
    }

    async fn receive(&mut self) -> ConfigRequest {
        tokio::time::timeout(DEADLINE, self.requests.recv())
            .await
            .expect("a request from the data plane in time")
            .expect("control plane request channel open")
    }

    /// The next message a data plane sent that is not a status report (the
    /// first message, an ACK or a NACK); reports are kept for [`Self::next_report`].
    pub async fn next_request(&mut self) -> ConfigRequest {
        loop {
            let m = self.receive().await;
            if m.upstream_health.is_none() {
                return m;
            }
            self.reports.push_back(m);
        }
    }

    /// The next status report (`upstream_health` set) a data plane sent.
    pub async fn next_report(&mut self) -> ConfigRequest {
        if let Some(r) = self.reports.pop_front() {
            return r;
        }
        loop {
            let m = self.receive().await;
            if m.upstream_health.is_some() {
                return m;
            }
        }
    }

    /// Stops serving and ends every open stream, like a killed process (the
    /// listener closes, so reconnecting fails).
    pub async fn kill(self) {
        let _ = self.killed.send(true);
        self.server.abort();
        let _ = self.server.await;
    }
}

// ---------------------------------------------------------------- upstreams

pub type TestBody = BoxBody<Bytes, std::io::Error>;

pub fn full(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// An in-test upstream instance. Paths:
/// * `/slow?ms=N`: answers after N ms;
/// * `/bytes?n=N`: streams N bytes in 64 KiB chunks;
/// * `/gated`: sends `first-chunk`, then waits for [`Upstream::open_gate`] before `rest`;
/// * `/status/NNN`: answers NNN;
/// * `POST /count`: answers the number of body bytes received;
/// * anything else: 200 with the path+query in `x-seen-path` and the received
///   headers as `name: value` lines in the body.
///
/// Every answer has `x-instance-id`.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub gate: Arc<Notify>,
    /// TCP connections accepted so far.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    server: JoinHandle<()>,
}

impl TestUpstream {
    pub async fn start(id: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Arc::new(Notify::new());
        let id: Arc<str> = id.into();
        let g = gate.clone();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = connections.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (id, gate) = (id.clone(), g.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, id.clone(), gate.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            gate,
            connections,
            server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn open_gate(&self) {
        self.gate.notify_one();
    }
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn query_value(req: &Request<Incoming>, key: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.parse().ok()).flatten()
    })
}

async fn answer(
    req: Request<Incoming>,
    id: Arc<str>,
    gate: Arc<Notify>,
) -> Result<Response<TestBody>, Infallible> {
    let path = req.uri().path().to_string();
    let mut resp = match path.as_str() {
        "/slow" => {
            let ms = query_value(&req, "ms").unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Response::new(full("slow"))
        }
        "/bytes" => {
            let n = query_value(&req, "n").unwrap_or(0);
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let chunks = futures::stream::unfold(n, move |left| {
                let chunk = chunk.clone();
                async move {
                    (left > 0).then(|| {
                        let take = left.min(chunk.len() as u64);
                        (Ok(Frame::data(chunk.slice(..take as usize))), left - take)
                    })
                }
            });
            Response::new(BodyExt::boxed(StreamBody::new(chunks)))
        }
        "/gated" => {
            let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(2);
            tokio::spawn(async move {
                let _ = tx
                    .send(Ok(Frame::data(Bytes::from_static(b"first-chunk"))))
                    .await;
                gate.notified().await;
                let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"rest")))).await;
            });
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            Response::new(BodyExt::boxed(StreamBody::new(stream)))
        }
        "/count" => {
            let mut body = req.into_body();
            let mut n = 0u64;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                    Err(_) => break,
                }
            }
            Response::new(full(n.to_string()))
        }
        p if p.starts_with("/status/") => {
            let code: u16 = p["/status/".len()..].parse().unwrap_or(500);
            let mut r = Response::new(full(format!("status {code}")));
            *r.status_mut() = StatusCode::from_u16(code).unwrap();
            r
        }
        _ => {
            let mut lines = String::new();
            for (k, v) in req.headers() {
                lines.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("?")));
            }
            let seen = req
                .uri()
                .path_and_query()
                .map_or("", |p| p.as_str())
                .to_string();
            let mut r = Response::new(full(lines));
            r.headers_mut().insert("x-seen-path", seen.parse().unwrap());
            r
        }
    };
    resp.headers_mut()
        .insert("x-instance-id", id.parse().unwrap());
    Ok(resp)
}

use http_body_util::BodyExt;

/// An address nothing listens on (bound, then closed).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// An instance that accepts a connection, reads the request, and closes
/// without answering (a process dying mid-request).
pub async fn black_hole() -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            drop(s);
        }
    });
    (addr, task)
}

// ---------------------------------------------------------------- config

pub fn route(name: &str, prefix: &str, upstream: &str) -> Route {
    Route {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: upstream.into(),
        ..Default::default()
    }
}

pub fn upstream(name: &str, instances: &[(&str, String)]) -> Upstream {
    Upstream {
        name: name.into(),
        instances: instances
            .iter()
            .map(|(id, url)| Instance {
                id: id.to_string(),
                url: url.clone(),
                ..Default::default()
            })
            .collect(),
        circuit_breaker: Some(CircuitBreaker {
            failure_threshold: 1000,
            reset_timeout_ms: 10_000,
            half_open_max_requests: 1,
            ..Default::default()
        }),
        health_check: None,
        ..Default::default()
    }
}

pub fn snapshot(version: u64, routes: Vec<Route>, upstreams: Vec<Upstream>) -> ConfigSnapshot {
    ConfigSnapshot {
        version,
        hash: format!("hash-{version}"),
        routes,
        upstreams,
        ..Default::default()
    }
}

// ---------------------------------------------------------------- data plane

/// Starts a data plane in-process on free ports.
pub async fn start_data_plane(control_plane: &str, cache_dir: &Path, extra: &[&str]) -> Running {
    let mut argv = vec![
        "data-plane".to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
        "--control-plane".into(),
        control_plane.into(),
        "--node-id".into(),
        "dp-test".into(),
        "--cache-dir".into(),
        cache_dir.display().to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let args = Args::try_parse_from(argv).unwrap();
    DataPlane::new(args).start().await.unwrap()
}

pub fn client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A GET, answered with status, headers and the whole body as text.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, http::HeaderMap, String) {
    send(
        addr,
        Request::get(format!("http://{addr}{path}"))
            .body(full(""))
            .unwrap(),
    )
    .await
}

pub async fn send(
    _addr: SocketAddr,
    req: Request<TestBody>,
) -> (StatusCode, http::HeaderMap, String) {
    let resp = tokio::time::timeout(DEADLINE, client().request(req))
        .await
        .expect("answer in time")
        .expect("request sent");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// Writes raw bytes to `addr` and returns everything read until the server closes
/// or 2 s of silence (for requests no well-behaved client library would send).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => {
                out.extend_from_slice(&buf[..n]);
                // One complete response is enough.
                if response_complete(&out) {
                    break;
                }
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn response_complete(buf: &[u8]) -> bool {
    let text = String::from_utf8_lossy(buf);
    let Some(head_end) = text.find("\r\n\r\n") else {
        return false;
    };
    let len = text[..head_end]
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    buf.len() >= head_end + 4 + len
}

/// The status code of a raw HTTP/1.1 response.
pub fn raw_status(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

/// Fetches an ops endpoint as text.
pub async fn ops(running: &Running, path: &str) -> (StatusCode, String) {
    let (s, _, b) = get(running.admin_addr(), path).await;
    (s, b)
}

/// The value of one metric series in the Prometheus text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}
