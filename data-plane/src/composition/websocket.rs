//! WebSocket upgrades (`Route.websocket`): the handshake is proxied like any
//! request, then the two upgraded connections are joined byte for byte.
//!
//! * An upgrade request is an HTTP/1.1 request with `Connection: upgrade` and
//!   `Upgrade: websocket` ([`is_upgrade`], read before sanitising removes those
//!   hop-by-hop headers). On a route without `websocket` it is refused with 400
//!   `upgrade-refused` (counted as `gateway_policy_refusals_total{reason="upgrade"}`),
//!   and so is a malformed handshake (not GET, no `Sec-WebSocket-Key`, or a
//!   `Sec-WebSocket-Version` other than 13). Any other `Upgrade` value is
//!   stripped and the request proxied as before.
//! * On a `websocket` route the handshake goes through authentication and rate
//!   limiting like any request (a tunnel spends its budget once, at upgrade
//!   time), then to one instance on a connection of its own
//!   ([`Pool::send_upgrade`](gateway_transport::pool::Pool::send_upgrade)), which never
//!   joins the pool. The route timeout bounds the wait for the answer; there
//!   is no retry (the handshake is not replayed).
//! * A 101 answer goes back to the client with `Upgrade` / `Connection`, and a
//!   task on the worker that served the request copies bytes both ways
//!   (`tokio::io::copy_bidirectional`) until either side closes, or until no
//!   byte has moved either way for the route's idle timeout (then both
//!   connections are closed). Any other answer is proxied as a response.
//! * Shutdown: a worker waits for its open tunnels as it waits for its
//!   in-flight requests, within the same grace period ([`gateway_transport::tunnels`]);
//!   what is still open then is closed with the worker.
//!
//! The gateway never looks inside the frames: no WebSocket library is needed.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use gateway_transport::body::{RequestBody, ResponseBody, UpstreamBody};
use gateway_transport::h1::Upgrade;
use gateway_transport::in_flight::InFlight;
use gateway_transport::response::{Fields, Response};
use gateway_transport::tunnels::Tunnel;
use gateway_transport::upstream_error::{Failure, UpstreamError};
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::time::Instant;

use crate::error::ProxyError;
use crate::metrics::{PolicyRefusal, RouteMetrics};
use crate::policy::sanitize::remove_hop_by_hop_fields;
use crate::upstream::UpstreamEntry;
use crate::upstream::attempt::{Attempt, Trace};
use crate::upstream::balancer::Pick;
use crate::upstream::proxy::{RouteView, upstream_request};

/// `Sec-WebSocket-Key`.
static SEC_WEBSOCKET_KEY: header::HeaderName = header::SEC_WEBSOCKET_KEY;
/// `Sec-WebSocket-Version`.
static SEC_WEBSOCKET_VERSION: header::HeaderName = header::SEC_WEBSOCKET_VERSION;

/// Whether `headers` has `name` listing `token` (comma-separated, any case).
fn has_token(headers: &HeaderMap, name: &header::HeaderName, token: &str) -> bool {
    lists_token(
        headers.get_all(name).iter().map(HeaderValue::as_bytes),
        token,
    )
}

/// Whether one of `values` (comma-separated lists) holds `token` (any case).
fn lists_token<'a>(mut values: impl Iterator<Item = &'a [u8]>, token: &str) -> bool {
    values.any(|v| {
        v.split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// Whether the request asks for a WebSocket upgrade: HTTP/1.1 with
/// `Connection: upgrade` and `Upgrade: websocket`. Call it before sanitising.
pub fn is_upgrade(parts: &Parts) -> bool {
    parts.version == Version::HTTP_11
        && has_token(&parts.headers, &header::CONNECTION, "upgrade")
        && has_token(&parts.headers, &header::UPGRADE, "websocket")
}

/// The WebSocket stage for an upgrade request: the route must allow it and
/// the handshake must be well formed (GET, a `Sec-WebSocket-Key`,
/// `Sec-WebSocket-Version: 13`). A refusal is counted on the route.
/// Past `max_tunnels` open tunnels in the replica an upgrade is refused with
/// 503 before any authentication work (counted).
pub fn admit(route: RouteView<'_>, parts: &Parts, max_tunnels: usize) -> Result<(), ProxyError> {
    if route.websocket.is_some() && OPEN_TUNNELS.load(Ordering::Relaxed) >= max_tunnels {
        TUNNELS_REFUSED.fetch_add(1, Ordering::Relaxed);
        return Err(ProxyError::TunnelLimit);
    }
    let well_formed = parts.method == Method::GET
        && parts
            .headers
            .get(&SEC_WEBSOCKET_KEY)
            .is_some_and(|k| !k.is_empty())
        && parts
            .headers
            .get(&SEC_WEBSOCKET_VERSION)
            .is_some_and(|v| v == "13");
    if route.websocket.is_some() && well_formed {
        return Ok(());
    }
    route.metrics.policy.refused(PolicyRefusal::Upgrade);
    Err(ProxyError::UpgradeRefused)
}

/// Sends the handshake in `parts` to the instance in `pick` and, on 101,
/// starts the tunnel and answers the client with the 101.
/// The tunnel's idle timeout is the route's, at most `max_idle`.
pub async fn forward<'a>(
    route: RouteView<'_>,
    upstream: &'a UpstreamEntry,
    pick: Pick<'a>,
    mut parts: Parts,
    path: &str,
    mut trace: Trace<'_, 'a>,
    max_idle: Duration,
) -> Result<Response<ResponseBody>, ProxyError> {
    let idle = route
        .websocket
        .ok_or(ProxyError::UpgradeRefused)?
        .min(max_idle);
    // What the upstream's 101 must answer (RFC 6455 §4.2.2).
    let expected_accept = parts
        .headers
        .get(&SEC_WEBSOCKET_KEY)
        .map(|key| accept_for(key.as_bytes()))
        .ok_or(ProxyError::UpgradeRefused)?;
    // The client's side of the upgrade: hyper hands its socket over after our 101.
    let client_side = parts
        .extensions
        .remove::<OnUpgrade>()
        .ok_or(ProxyError::UpgradeRefused)?;
    let mut req = upstream_request(parts, &route, path, RequestBody::empty())?;
    // Sanitising removed the hop-by-hop pair; this hop asks for the upgrade again.
    let headers = req.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));

    let attempt = Attempt::start(upstream, pick, &mut req, &mut trace, 0);
    let instance = attempt.instance();
    let sent = tokio::time::timeout(route.timeout, instance.pool.send_upgrade(req)).await;
    let error = match sent {
        Err(_) => UpstreamError::timeout(route.timeout),
        Ok(Err(failed)) => failed.error,
        Ok(Ok(Upgrade::Switched(resp, _)))
            if let Err(why) = completes_handshake(resp.fields(), &expected_accept) =>
        {
            BAD_UPGRADES.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(upstream = %upstream.name, instance = %instance.id, why, "upstream 101 does not complete the WebSocket handshake");
            attempt.failed(&UpstreamError::sent(Failure::Invalid(why)));
            return Err(ProxyError::BadUpgrade(why));
        }
        Ok(Ok(resp)) => {
            let in_flight = attempt.answered(resp.status());
            return Ok(answer(resp, client_side, idle, route.metrics, in_flight));
        }
    };
    attempt.failed(&error);
    Err(ProxyError::Upstream(error))
}

/// The GUID RFC 6455 appends to the key before hashing it.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The `Sec-WebSocket-Accept` value that answers `key`: base64(SHA-1(key + GUID)).
pub fn accept_for(key: &[u8]) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut sha = sha1::Sha1::new();
    sha.update(key);
    sha.update(WEBSOCKET_GUID);
    base64::engine::general_purpose::STANDARD.encode(sha.finalize())
}

/// Whether an upstream's 101 completes the handshake: `Upgrade: websocket`,
/// `Connection: upgrade` and the `Sec-WebSocket-Accept` that answers the key
/// sent. Otherwise the upstream is not speaking WebSocket to us (or is
/// something else answering 101), and no tunnel is opened.
fn completes_handshake(fields: &Fields, expected_accept: &str) -> Result<(), &'static str> {
    if !lists_token(fields.get_all("upgrade"), "websocket") {
        return Err("no Upgrade: websocket");
    }
    if !lists_token(fields.get_all("connection"), "upgrade") {
        return Err("no Connection: upgrade");
    }
    match fields.get("sec-websocket-accept") {
        Some(v) if v == expected_accept.as_bytes() => Ok(()),
        Some(_) => Err("a wrong Sec-WebSocket-Accept"),
        None => Err("no Sec-WebSocket-Accept"),
    }
}

/// Tunnels open in the replica (every worker).
static OPEN_TUNNELS: AtomicUsize = AtomicUsize::new(0);
/// Upgrades refused because [`OPEN_TUNNELS`] was at the cap.
static TUNNELS_REFUSED: AtomicU64 = AtomicU64::new(0);
/// Upstream 101 answers that did not complete the handshake (502).
static BAD_UPGRADES: AtomicU64 = AtomicU64::new(0);

/// Prometheus text for the whole replica:
/// `gateway_websocket_replica_tunnels_open`,
/// `gateway_websocket_tunnels_refused_total` and
/// `gateway_websocket_bad_upgrades_total` (per-route tunnel counts are in
/// the route metrics).
pub fn write_metrics(out: &mut String) {
    use std::fmt::Write as _;
    let families = [
        (
            "gateway_websocket_replica_tunnels_open",
            "gauge",
            "WebSocket tunnels open in this replica, every route.",
            OPEN_TUNNELS.load(Ordering::Relaxed) as u64,
        ),
        (
            "gateway_websocket_tunnels_refused_total",
            "counter",
            "Upgrades refused (503) because --max-websocket-tunnels were open.",
            TUNNELS_REFUSED.load(Ordering::Relaxed),
        ),
        (
            "gateway_websocket_bad_upgrades_total",
            "counter",
            "Upstream 101 answers that did not complete the WebSocket handshake (502).",
            BAD_UPGRADES.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, value) in families {
        crate::metrics::header(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
}

/// The client's answer to the upstream's answer `resp`: on 101 the tunnel
/// starts; anything else is proxied (its connection closes with the body).
fn answer(
    upstream: Upgrade,
    client_side: OnUpgrade,
    idle: Duration,
    metrics: &Arc<RouteMetrics>,
    in_flight: InFlight,
) -> Response<ResponseBody> {
    let (status, mut fields, upstream_side) = match upstream {
        Upgrade::Answered(resp) => {
            let (status, mut fields, body) = resp.into_parts();
            remove_hop_by_hop_fields(&mut fields);
            let body = UpstreamBody::unpooled(body, in_flight);
            return Response::from_parts(status, fields, ResponseBody::Upstream(body));
        }
        Upgrade::Switched(resp, upgraded) => {
            let (status, fields, ()) = resp.into_parts();
            (status, fields, upgraded)
        }
    };
    remove_hop_by_hop_fields(&mut fields);
    fields.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    fields.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let guard = TunnelGuard::open(metrics.clone());
    tokio::spawn(async move {
        let _guard = guard;
        let _in_flight = in_flight;
        match client_side.await {
            Ok(client) => {
                let outcome = tunnel(TokioIo::new(client), upstream_side, idle).await;
                tracing::debug!(?outcome, "websocket tunnel closed");
            }
            Err(e) => tracing::debug!(error = %e, "websocket upgrade did not complete"),
        }
    });
    Response::from_parts(status, fields, ResponseBody::empty())
}

/// How a tunnel ended.
#[derive(Debug)]
pub enum TunnelEnd {
    /// The client closed (or half-closed) its connection.
    ClientClosed,
    /// The upstream closed (or half-closed) its connection.
    UpstreamClosed,
    /// No byte moved either way for the idle timeout.
    Idle,
    /// A read or write failed.
    Failed(io::Error),
}

/// Copies bytes both ways between `client` and `upstream` until one side
/// closes or nothing moves for `idle`; then both connections are shut down.
/// (A WebSocket has no use for a half-closed connection: once one side has
/// closed, the other only waits for the TCP close.)
pub async fn tunnel<C, U>(client: C, upstream: U, idle: Duration) -> TunnelEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    // Every byte either way passes the client side: watching it is enough.
    let client = Activity {
        inner: client,
        start,
        last: &last,
    };
    let (mut client_rx, mut client_tx) = tokio::io::split(client);
    let (mut upstream_rx, mut upstream_tx) = tokio::io::split(upstream);
    let end = {
        let up = tokio::io::copy(&mut client_rx, &mut upstream_tx);
        let down = tokio::io::copy(&mut upstream_rx, &mut client_tx);
        tokio::pin!(up, down);
        loop {
            let quiet_since = start + Duration::from_nanos(last.load(Ordering::Relaxed));
            tokio::select! {
                done = &mut up => break done.map_or_else(TunnelEnd::Failed, |_| TunnelEnd::ClientClosed),
                done = &mut down => break done.map_or_else(TunnelEnd::Failed, |_| TunnelEnd::UpstreamClosed),
                () = tokio::time::sleep_until(quiet_since + idle) => {
                    let moved = start + Duration::from_nanos(last.load(Ordering::Relaxed));
                    if moved + idle <= Instant::now() {
                        break TunnelEnd::Idle;
                    }
                }
            }
        }
    };
    // Best effort: a FIN to both sides (dropping them closes the sockets anyway).
    let _ = tokio::join!(client_tx.shutdown(), upstream_tx.shutdown());
    end
}

/// An I/O object that notes when bytes last moved through it.
struct Activity<'a, S> {
    inner: S,
    start: Instant,
    last: &'a AtomicU64,
}

impl<S> Activity<'_, S> {
    fn touch(&self) {
        let since = Instant::now().saturating_duration_since(self.start);
        self.last.store(
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Activity<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Activity<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// One open tunnel: counted on the route, in the replica and on the thread's
/// registry ([`gateway_transport::tunnels`]) until dropped.
struct TunnelGuard {
    metrics: Arc<RouteMetrics>,
    _tunnel: Tunnel,
}

impl TunnelGuard {
    fn open(metrics: Arc<RouteMetrics>) -> Self {
        metrics.websocket.opened();
        OPEN_TUNNELS.fetch_add(1, Ordering::Relaxed);
        Self {
            metrics,
            _tunnel: Tunnel::open(),
        }
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.metrics.websocket.closed();
        OPEN_TUNNELS.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, duplex};

    fn parts(version: Version, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::get("/ws").version(version);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    const HANDSHAKE: [(&str, &str); 4] = [
        ("connection", "keep-alive, Upgrade"),
        ("upgrade", "WebSocket"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
    ];

    #[test]
    fn an_upstream_101_must_answer_the_key() {
        // RFC 6455 §1.3's example.
        let accept = accept_for(b"dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        let answer = |fields: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in fields {
                h.append(
                    header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            completes_handshake(&Fields::from(h), &accept)
        };
        let good = [
            ("upgrade", "WebSocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        ];
        assert_eq!(answer(&good), Ok(()));
        assert!(answer(&good[1..]).is_err(), "no Upgrade");
        assert!(answer(&[good[0], good[2]]).is_err(), "no Connection");
        assert!(answer(&good[..2]).is_err(), "no Accept");
        let wrong = [good[0], good[1], ("sec-websocket-accept", "AAAA")];
        assert_eq!(answer(&wrong), Err("a wrong Sec-WebSocket-Accept"));
        let h2c = [("upgrade", "h2c"), good[1], good[2]];
        assert!(answer(&h2c).is_err());
    }

    #[test]
    fn upgrade_requests_are_recognised_by_connection_and_upgrade_tokens() {
        assert!(is_upgrade(&parts(Version::HTTP_11, &HANDSHAKE)));
        assert!(!is_upgrade(&parts(Version::HTTP_2, &HANDSHAKE)));
        assert!(!is_upgrade(&parts(
            Version::HTTP_11,
            &[("connection", "upgrade"), ("upgrade", "h2c")]
        )));
        assert!(!is_upgrade(&parts(
            Version::HTTP_11,
            &[("upgrade", "websocket")]
        )));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_copies_both_ways_and_ends_when_a_side_closes() {
        let (client, mut client_peer) = duplex(64);
        let (upstream, mut upstream_peer) = duplex(64);
        let task = tokio::spawn(tunnel(client, upstream, Duration::from_secs(60)));
        client_peer.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        upstream_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        upstream_peer.write_all(b"pong!").await.unwrap();
        let mut buf = [0u8; 5];
        client_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong!");
        // The upstream goes away: the tunnel ends and the client sees the close
        // although it keeps its own side open.
        drop(upstream_peer);
        assert!(matches!(task.await.unwrap(), TunnelEnd::UpstreamClosed));
        assert_eq!(client_peer.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_closes_after_the_idle_timeout_and_traffic_postpones_it() {
        let idle = Duration::from_secs(10);
        let (client, mut client_peer) = duplex(64);
        let (upstream, mut upstream_peer) = duplex(64);
        let started = Instant::now();
        let task = tokio::spawn(tunnel(client, upstream, idle));
        // Traffic at 6 s pushes the deadline to 16 s.
        tokio::time::sleep(Duration::from_secs(6)).await;
        upstream_peer.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        client_peer.read_exact(&mut one).await.unwrap();
        match task.await.unwrap() {
            TunnelEnd::Idle => {}
            other => panic!("{other:?}"),
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(16), "{took:?}");
        assert!(took < Duration::from_secs(17), "{took:?}");
        // Both sides see the close.
        assert_eq!(client_peer.read(&mut one).await.unwrap(), 0);
        assert_eq!(upstream_peer.read(&mut one).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_tunnel_is_counted_on_its_route_and_its_thread_until_it_closes() {
        let metrics = Arc::new(RouteMetrics::default());
        let registry = gateway_transport::tunnels::tunnels();
        registry.drained().await;
        let guard = TunnelGuard::open(metrics.clone());
        assert_eq!(registry.open(), 1);
        assert_eq!(metrics.websocket.open(), 1);
        drop(guard);
        assert_eq!(registry.open(), 0);
        assert_eq!(metrics.websocket.open(), 0);
        assert_eq!(metrics.websocket.total(), 1);
    }
}
