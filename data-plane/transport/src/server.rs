//! Listeners: accept loop, HTTP/1.1 + h2c connection setup, graceful shutdown.
//!
//! Each connection's first bytes are peeked at to pick its protocol: the
//! HTTP/2 preface means h2c, anything else HTTP/1.1, which
//! [`crate::h1_server`] serves, handing one request to hyper for what it
//! leaves to hyper (upgrades, HTTP/1.0, other transfer codings), after which
//! hyper closes the connection ([`one_request`]). A connection whose first
//! segment is a strict prefix of the preface (a client trickling it in) is
//! read until it can be told, within the header read timeout like any head,
//! and what was read is the first of it either protocol sees. The point of serving HTTP/1.1
//! without hyper's auto builder is memory: an HTTP/1.1 connection is then a
//! task of its own type, without what the auto builder keeps for a
//! connection that might be HTTP/2 (measured: 6.5 KB less per idle
//! keep-alive connection; BENCHMARKS.md).
//!
//! Every phase of a connection has a deadline (issue 25): the first bytes and
//! each request head ([`HttpSettings::header_read_timeout`]; the header read
//! timeout only works with a timer set, so one is always set), each write to
//! the client ([`HttpSettings::write_timeout`], [`crate::io_timeout`]), an
//! HTTP/2 connection's idle time and its keep-alive PINGs; request bodies
//! have theirs in [`crate::body`]. Open connections are capped per replica
//! ([`crate::conn_limit`]): past the cap a new one is closed at once.
//!
//! Shutdown: the listener closes (no new connections), every connection is
//! asked to finish its in-flight request and close, open WebSocket tunnels
//! (which have left their HTTP connection) are waited for as well, and after
//! the grace period the rest are dropped; a connection still waiting for its
//! first bytes is closed at once (nothing of it is in flight).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use http::Request;
use hyper::server::conn::{http1, http2};
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::body::{ClientBody, ResponseBody};
use crate::conn_limit::{Connections, Slot};
use crate::conn_timer::ConnTimer;
use crate::h1_server::{self, Ended};
use crate::io_timeout::WriteTimeout;
use crate::proxy_protocol::{self, ProxyProtocol};
use crate::response::Response;
use crate::rewind::Rewind;
use crate::send_progress::{LastTouch, SendProgress};
use crate::tls::TlsAcceptor;

/// The HTTP/2 connection preface a client with prior knowledge opens with (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connection-level settings of a listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpSettings {
    /// Time a client gets to send a complete request head (and, on a new
    /// connection, its first bytes, the whole HTTP/2 preface included).
    pub header_read_timeout: Duration,
    /// Time a write to the client may wait for the client to take any byte;
    /// then the connection is closed ([`crate::io_timeout`]).
    pub write_timeout: Duration,
    /// An HTTP/2 connection with no request in flight for this long is sent
    /// GOAWAY and closed (streams still sending their answers finish first).
    pub h2_idle_timeout: Duration,
    /// HTTP/2 keep-alive: a PING after this much silence; a client that does
    /// not answer within the same time is disconnected.
    pub h2_keep_alive: Duration,
    /// Largest request head; twice it (at least 64 KiB) is the most the
    /// connection layer reads of a head (431 beyond, before the pipeline sees
    /// it; the pipeline enforces the exact limit itself).
    pub max_header_bytes: usize,
    /// Time in-flight requests get to finish after shutdown begins.
    pub shutdown_grace: Duration,
    /// The answer to an HTTP/1.1 head refused before any handler sees it
    /// (malformed, ambiguous, too large, stalled): the application's error
    /// document.
    pub refusal: fn(h1_server::Refusal) -> Response<ResponseBody>,
}

/// The connection builders of one listener, all configured alike.
struct Builders {
    /// Largest request head read (h1_server refuses a larger one, 431; hyper's
    /// HTTP/2 header list has the same bound).
    max_head: usize,
    /// Without a timer: each connection gets its own ([`Builders::http1_connection`]).
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl Builders {
    fn new(settings: &HttpSettings) -> Self {
        // The most of a head read (431 beyond). Above the pipeline's own limit,
        // which answers with the exact figure; also hyper's buffer for the
        // requests it serves, large enough for efficient body reads.
        let buf = (settings.max_header_bytes * 2).max(64 * 1024);
        let max_header_list = u32::try_from(buf).unwrap_or(u32::MAX);
        // Keep-alive stays on for upgrades (hyper's `Connection: close` would
        // replace a 101's `Connection: upgrade`); every other answer hyper
        // sends closes its connection ([`one_request`]).
        let mut http1 = http1::Builder::new();
        http1
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(buf)
            .keep_alive(true);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(max_header_list)
            .max_concurrent_streams(256)
            .keep_alive_interval(settings.h2_keep_alive)
            .keep_alive_timeout(settings.h2_keep_alive);
        Self {
            max_head: buf,
            http1,
            http2,
        }
    }

    /// The HTTP/1.1 builder for one connection: with a timer of its own, so the
    /// header read timeout re-arms one tokio timer ([`ConnTimer`]). hyper's
    /// header read timeout needs a timer to work at all.
    fn http1_connection(&self) -> http1::Builder {
        let mut http1 = self.http1.clone();
        http1.timer(ConnTimer::new());
        http1
    }
}

/// What a connection's first bytes say about its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
    /// A strict prefix of the HTTP/2 preface so far.
    Undecided,
}

/// Classifies the first bytes `seen` of a connection (none: the client closed
/// at once, which the HTTP/1.1 codec handles).
fn classify(seen: &[u8]) -> Protocol {
    if !H2_PREFACE.starts_with(seen) || seen.is_empty() {
        Protocol::Http1
    } else if seen.len() == H2_PREFACE.len() {
        Protocol::Http2
    } else {
        Protocol::Undecided
    }
}

/// Waits for the connection's first bytes (without consuming them) and classifies them.
async fn sniff(stream: &TcpStream) -> std::io::Result<Protocol> {
    let mut first = [0u8; H2_PREFACE.len()];
    let n = stream.peek(&mut first).await?;
    Ok(classify(&first[..n]))
}

/// Reads (consuming them) the bytes of a connection whose first segment was a
/// strict prefix of the HTTP/2 preface until they say which protocol it is.
/// `None`: the client closed first.
async fn read_until_decided(
    stream: &mut TcpStream,
    seen: &mut BytesMut,
) -> std::io::Result<Option<Protocol>> {
    loop {
        if stream.read_buf(seen).await? == 0 {
            return Ok(None);
        }
        let decided = classify(&seen[..seen.len().min(H2_PREFACE.len())]);
        if decided != Protocol::Undecided {
            return Ok(Some(decided));
        }
    }
}

/// When an HTTP/2 connection has had no request in flight for `idle`.
/// Requests are counted while their service call runs; a stream still sending
/// its answer then is let finish by the graceful GOAWAY that follows.
#[derive(Debug, Default)]
struct Activity {
    in_flight: AtomicUsize,
    /// The last request's start or end.
    last: LastTouch,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Counts a request until the guard is dropped.
    fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.last.touch();
        ActivityGuard(self.clone())
    }

    /// Resolves once nothing has been in flight for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.last.reading();
            tokio::time::sleep_until(self.last.after(last, idle)).await;
            let quiet = self.in_flight.load(Ordering::Relaxed) == 0 && self.last.reading() == last;
            if quiet {
                return;
            }
        }
    }
}

struct ActivityGuard(Arc<Activity>);

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.0.last.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Drives `conn` to its end; once `stop` fires (or its sender is gone) it first
/// calls `graceful` on it, which lets in-flight requests finish and then closes.
/// `idle` resolving asks for the same graceful close; `stalled` resolving
/// closes the connection at once, whatever is in flight.
async fn drive<C, E>(
    conn: C,
    mut stop: watch::Receiver<()>,
    graceful: fn(Pin<&mut C>),
    idle: impl Future<Output = ()>,
    stalled: impl Future<Output = ()>,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = pin!(conn);
    let mut stalled = pin!(stalled);
    tokio::select! {
        biased;
        r = conn.as_mut() => return r,
        () = stalled.as_mut() => return stalled_out(),
        _ = stop.changed() => {}
        () = idle => tracing::debug!("HTTP/2 connection idle; closing it"),
    }
    graceful(conn.as_mut());
    tokio::select! {
        biased;
        r = conn => r,
        () = stalled => stalled_out(),
    }
}

/// The end of a connection whose client took nothing of its answers for the
/// write timeout (see [`crate::send_progress`]).
fn stalled_out<E>() -> Result<(), E> {
    tracing::debug!(
        "HTTP/2 client took nothing of its answers within the write timeout; closing the connection"
    );
    Ok(())
}

/// Resolves once `rx` says stop (or its sender is gone).
async fn stop_requested(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await.map(|_| ());
}

/// The scheme a listener serves: which of a worker's handlers answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Cleartext HTTP/1.1 and h2c.
    Http,
    /// TLS, with HTTP/1.1 or HTTP/2 by ALPN.
    Https,
}

/// Serves `listener` (cleartext) with `handler` until `shutdown` turns true,
/// then drains. Each connection holds a slot of `connections`; past its cap
/// a new connection is closed at once. With `proxy_protocol`, connections
/// from the peers it trusts start with a PROXY v2 header
/// ([`crate::proxy_protocol`]).
pub async fn serve<F, Fut>(
    listener: TcpListener,
    settings: HttpSettings,
    connections: Arc<Connections>,
    proxy_protocol: Option<ProxyProtocol>,
    handler: F,
    shutdown: watch::Receiver<bool>,
) where
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let builders = Arc::new(Builders::new(&settings));
    let handler = Arc::new(handler);
    accept_loop(
        listener,
        settings,
        connections,
        proxy_protocol,
        shutdown,
        move |stream, peer, stop, slot| {
            connection(
                stream,
                peer,
                builders.clone(),
                handler.clone(),
                stop,
                settings,
                slot,
            )
        },
    )
    .await;
}

/// [`serve`] for an HTTPS listener: each connection's TLS handshake
/// ([`TlsAcceptor`], within its timeout) comes first, then HTTP/2 or
/// HTTP/1.1 as ALPN said. TLS connections hold slots of `connections`
/// like cleartext ones, from before the handshake. A PROXY v2 header
/// (`proxy_protocol`) comes before the handshake.
pub async fn serve_tls<F, Fut>(
    listener: TcpListener,
    settings: HttpSettings,
    tls: Arc<TlsAcceptor>,
    connections: Arc<Connections>,
    proxy_protocol: Option<ProxyProtocol>,
    handler: F,
    shutdown: watch::Receiver<bool>,
) where
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let builders = Arc::new(Builders::new(&settings));
    let handler = Arc::new(handler);
    accept_loop(
        listener,
        settings,
        connections,
        proxy_protocol,
        shutdown,
        move |stream, peer, stop, slot| {
            tls_connection(
                stream,
                peer,
                tls.clone(),
                builders.clone(),
                handler.clone(),
                stop,
                settings,
                slot,
            )
        },
    )
    .await;
}

/// Accepts connections on `listener` and runs `connection` for each in a
/// task of its own until `shutdown` turns true; then stops accepting, asks
/// every connection to finish and waits for them (and for the WebSocket
/// tunnels started on this thread) up to the grace period. A connection from
/// a peer `proxy_protocol` trusts first has its PROXY v2 header read, and
/// `connection` gets the client the header names as its peer.
async fn accept_loop<C, CFut>(
    listener: TcpListener,
    settings: HttpSettings,
    connections: Arc<Connections>,
    proxy_protocol: Option<ProxyProtocol>,
    mut shutdown: watch::Receiver<bool>,
    connection: C,
) where
    C: Fn(TcpStream, SocketAddr, watch::Receiver<()>, Slot) -> CFut + Send + Sync + 'static,
    CFut: Future<Output = ()> + Send + 'static,
{
    let connection = Arc::new(connection);
    // WebSocket tunnels started on this thread (a worker's runtime) outlive
    // their HTTP connection; shutdown waits for them too.
    let tunnels = crate::tunnels::tunnels();
    // Every connection task holds a receiver: a send asks them to finish, and
    // the sender sees "closed" once the last one has ended.
    let (stop_tx, stop_rx) = watch::channel(());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Usually EMFILE: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                // Past the cap: closed before a byte is read (counted in /metrics).
                let Some(slot) = connections.admit() else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                match &proxy_protocol {
                    // A trusted proxy's connection: its PROXY header first.
                    Some(pp) if pp.trusts(peer.ip()) => {
                        let within = settings.header_read_timeout;
                        let stop = stop_rx.clone();
                        tokio::spawn(proxied(stream, peer, within, stop, slot, connection.clone()));
                    }
                    _ => {
                        tokio::spawn(connection(stream, peer, stop_rx.clone(), slot));
                    }
                }
            }
            () = stop_requested(&mut shutdown) => break,
        }
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(());
    let drained = async {
        stop_tx.closed().await;
        tunnels.drained().await;
    };
    tokio::select! {
        () = drained => {}
        () = tokio::time::sleep(settings.shutdown_grace) => {
            tracing::warn!(grace = ?settings.shutdown_grace, tunnels = tunnels.open(), "connections still open after the grace period; closing them");
        }
    }
}

/// A trusted peer's connection: its PROXY v2 header (within the header read
/// `timeout`), then `connection` with the client it names as the peer. A
/// connection without a valid header is closed.
async fn proxied<C, CFut>(
    mut stream: TcpStream,
    peer: SocketAddr,
    timeout: Duration,
    mut stop: watch::Receiver<()>,
    slot: Slot,
    connection: Arc<C>,
) where
    C: Fn(TcpStream, SocketAddr, watch::Receiver<()>, Slot) -> CFut,
    CFut: Future<Output = ()>,
{
    let header = tokio::select! {
        header = proxy_protocol::read(&mut stream, timeout) => header,
        // Shutdown: no request has started on this connection.
        _ = stop.changed() => return,
    };
    match header {
        Ok(header) => connection(stream, header.client(peer), stop, slot).await,
        Err(e) => tracing::debug!(error = %e, %peer, "refused a trusted peer's connection"),
    }
}

/// hyper's HTTP/1.1 service for a connection h1_server handed over: every
/// answer but a 101 says `Connection: close`, so hyper serves that one
/// request and closes the connection, and every later request of a
/// connection is framed by h1_server, which refuses ambiguous framing
/// (hyper would pick one reading of it). A 101 makes the connection a tunnel.
fn one_request<S>(
    service: S,
) -> impl hyper::service::Service<
    Request<hyper::body::Incoming>,
    Response = http::Response<ResponseBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<ResponseBody>, Infallible>> + Send,
> + Send
where
    S: hyper::service::Service<
            Request<hyper::body::Incoming>,
            Response = http::Response<ResponseBody>,
            Error = Infallible,
        > + Send,
    S::Future: Send + 'static,
{
    service_fn(move |req| {
        let answer = service.call(req);
        async move {
            let Ok(mut resp) = answer.await;
            if resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok(resp)
        }
    })
}

/// Serves one accepted cleartext connection with the protocol its first bytes name.
async fn connection<F, Fut>(
    stream: TcpStream,
    peer: SocketAddr,
    builders: Arc<Builders>,
    handler: Arc<F>,
    mut stop: watch::Receiver<()>,
    settings: HttpSettings,
    _slot: Slot,
) where
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let header_read_timeout = settings.header_read_timeout;
    let mut stream = stream;
    let protocol = tokio::select! {
        sniffed = sniff(&stream) => match sniffed {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, %peer, "connection failed before its first bytes");
                return;
            }
        },
        () = tokio::time::sleep(header_read_timeout) => {
            tracing::debug!(%peer, "no bytes within the header read timeout; closing");
            return;
        }
        // Shutdown: no request has started on this connection, so nothing to finish.
        _ = stop.changed() => return,
    };
    // A client trickling the HTTP/2 preface: its bytes are read (within the
    // header read timeout, like any head) until they say which protocol it is.
    let mut prefix = BytesMut::new();
    let protocol = if protocol == Protocol::Undecided {
        let mut seen = BytesMut::with_capacity(H2_PREFACE.len());
        let decided = tokio::select! {
            r = tokio::time::timeout(header_read_timeout, read_until_decided(&mut stream, &mut seen)) => r,
            _ = stop.changed() => return,
        };
        match decided {
            Ok(Ok(Some(p))) => {
                prefix = seen;
                p
            }
            Ok(Ok(None)) | Ok(Err(_)) => return,
            Err(_) => {
                tracing::debug!(%peer, "HTTP/2 preface incomplete within the header read timeout; closing");
                return;
            }
        }
    } else {
        protocol
    };
    let ended = match protocol {
        // The bytes read to decide the protocol, if any, are h1_server's first.
        Protocol::Http1 => {
            serve_http1(stream, prefix, peer, builders, handler, stop, settings).await
        }
        _ => {
            let io = Rewind::new(prefix.freeze(), stream);
            serve_http2(io, peer, builders, handler, stop, settings).await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
}

/// Serves one accepted HTTPS connection: the handshake, then the protocol
/// ALPN chose (HTTP/1.1 without ALPN).
#[allow(clippy::too_many_arguments)]
async fn tls_connection<F, Fut>(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Arc<TlsAcceptor>,
    builders: Arc<Builders>,
    handler: Arc<F>,
    mut stop: watch::Receiver<()>,
    settings: HttpSettings,
    _slot: Slot,
) where
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let stream = tokio::select! {
        accepted = tls.accept(stream) => match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, %peer, "TLS handshake failed");
                return;
            }
        },
        // Shutdown: no request has started on this connection.
        _ = stop.changed() => return,
    };
    drop(tls);
    // A verified client certificate goes with every request of the connection.
    let certificate = TlsAcceptor::client_certificate(&stream);
    let handler = Arc::new(move |mut req: Box<Request<ClientBody>>, peer| {
        if let Some(c) = &certificate {
            req.extensions_mut().insert(c.clone());
        }
        handler(req, peer)
    });
    let ended = if crate::tls::is_h2(&stream) {
        serve_http2(stream, peer, builders, handler, stop, settings).await
    } else {
        serve_http1(
            stream,
            BytesMut::new(),
            peer,
            builders,
            handler,
            stop,
            settings,
        )
        .await
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, %peer, "TLS connection ended with an error");
    }
}

/// The error a connection ends with.
type ConnError = Box<dyn std::error::Error + Send + Sync>;

/// hyper's view of the handler, for the connections (or the rest of one) it serves.
fn hyper_service<F, Fut>(
    handler: Arc<F>,
    peer: SocketAddr,
) -> impl hyper::service::Service<
    Request<hyper::body::Incoming>,
    Response = http::Response<ResponseBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<ResponseBody>, Infallible>> + Send + 'static,
> + Send
+ Clone
where
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    service_fn(move |req: Request<hyper::body::Incoming>| {
        let busy = crate::workers::Busy::enter();
        let fut = handler(Box::new(req.map(ClientBody::hyper)), peer);
        // hyper writes the answer from one map of its fields.
        async move {
            let answer = fut.await.into_http();
            drop(busy);
            Ok::<_, Infallible>(answer)
        }
    })
}

/// Serves HTTP/1.1 on `io` (`read`: bytes already read from it): h1_server
/// for as long as it can, then hyper for the one request it hands over.
async fn serve_http1<IO, F, Fut>(
    io: IO,
    read: BytesMut,
    peer: SocketAddr,
    builders: Arc<Builders>,
    handler: Arc<F>,
    stop: watch::Receiver<()>,
    settings: HttpSettings,
) -> Result<(), ConnError>
where
    IO: h1_server::ClientStream + Send + 'static,
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    // Each protocol's connection future is boxed on its own, so an HTTP/1.1
    // connection's memory is what HTTP/1.1 needs rather than the largest of
    // the types.
    let served = Box::pin(h1_server::serve(
        io,
        read,
        peer,
        settings.header_read_timeout,
        settings.write_timeout,
        builders.max_head,
        settings.refusal,
        &*handler,
        &stop,
    ))
    .await;
    let io = match served {
        Ended::Closed => return Ok(()),
        Ended::Handover(io) => WriteTimeout::new(io, settings.write_timeout),
    };
    let conn = builders
        .http1_connection()
        .serve_connection(TokioIo::new(io), one_request(hyper_service(handler, peer)))
        .with_upgrades();
    drop(builders);
    Box::pin(drive(
        conn,
        stop,
        |c| c.graceful_shutdown(),
        std::future::pending(),
        std::future::pending(),
    ))
    .await
    .map_err(Into::into)
}

/// Serves HTTP/2 on `io` with hyper, with the idle timeout and the write
/// timeout of a client whose windows stay shut.
async fn serve_http2<IO, F, Fut>(
    io: IO,
    peer: SocketAddr,
    builders: Arc<Builders>,
    handler: Arc<F>,
    stop: watch::Receiver<()>,
    settings: HttpSettings,
) -> Result<(), ConnError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    // Requests in flight, for the idle timeout; answers' send progress, for
    // the write timeout.
    let activity = Activity::new();
    let progress = SendProgress::new();
    let service = {
        let service = hyper_service(handler, peer);
        let (activity, progress) = (activity.clone(), progress.clone());
        service_fn(move |req| {
            let guard = activity.begin();
            let answer = service.call(req);
            let progress = progress.clone();
            async move {
                let Ok(resp) = answer.await;
                drop(guard);
                Ok::<_, Infallible>(resp.map(|body| progress.watch(body)))
            }
        })
    };
    let io = WriteTimeout::new(io, settings.write_timeout);
    let conn = builders.http2.serve_connection(TokioIo::new(io), service);
    drop(builders);
    Box::pin(drive(
        conn,
        stop,
        |c| c.graceful_shutdown(),
        activity.idle_for(settings.h2_idle_timeout),
        progress.stalled_for(settings.write_timeout),
    ))
    .await
    .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    fn settings(timeout: Duration) -> HttpSettings {
        HttpSettings {
            header_read_timeout: timeout,
            write_timeout: timeout,
            h2_idle_timeout: timeout,
            h2_keep_alive: timeout,
            max_header_bytes: 16 * 1024,
            shutdown_grace: timeout,
            refusal: |_| Response::new(ResponseBody::full("refused")),
        }
    }

    /// Serves a listener on a free port with a handler that answers 200.
    async fn listen(timeout: Duration, max: usize) -> (SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve(
            listener,
            settings(timeout),
            Connections::new("proxy", max),
            None,
            |_req, _peer| async { Response::new(ResponseBody::full("ok")) },
            stopped,
        ));
        (addr, stop)
    }

    /// How long until the server ends the connection after `sent`.
    async fn open_for(addr: SocketAddr, sent: &[u8]) -> Duration {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(sent).await.unwrap();
        let started = tokio::time::Instant::now();
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut sink)).await;
        started.elapsed()
    }

    #[tokio::test]
    async fn a_connection_that_starts_with_a_lone_p_is_served_by_h1_server() {
        let (addr, _stop) = listen(Duration::from_secs(10), 10).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        // "P" could start the HTTP/2 preface: the server waits for more and
        // then serves what it read with the rest. The pause gives it the time
        // to look at the lone "P" (the assertions hold either way: bytes that
        // arrive together take the ordinary path to the same server).
        s.write_all(b"P").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(
            b"UT /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nhi\
              GET /b HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all))
            .await
            .expect("closed after the second answer")
            .unwrap();
        let text = String::from_utf8_lossy(&all);
        // Both answered on the one connection: hyper would have closed it
        // after the first (it serves one request of a connection).
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_preface_gets_the_header_read_timeout() {
        let timeout = Duration::from_secs(10);
        let (addr, _stop) = listen(timeout, 10).await;
        for sent in [&b"PRI"[..], b"PRI * HTTP/2.0\r\n", &H2_PREFACE[..23]] {
            let open = open_for(addr, sent).await;
            assert!(open >= timeout, "{sent:?}: closed after {open:?}");
            assert!(open < timeout * 2, "{sent:?}: closed after {open:?}");
        }
    }

    #[test]
    fn first_bytes_pick_the_protocol() {
        assert_eq!(classify(b"GET / HTTP/1.1\r\n"), Protocol::Http1);
        assert_eq!(classify(b"POST /x HTTP/1.1\r\n"), Protocol::Http1);
        assert_eq!(classify(b"PUT"), Protocol::Http1);
        assert_eq!(classify(b""), Protocol::Http1);
        assert_eq!(classify(H2_PREFACE), Protocol::Http2);
        assert_eq!(classify(b"P"), Protocol::Undecided);
        assert_eq!(classify(b"PRI * HTTP/2.0\r\n"), Protocol::Undecided);
        assert_eq!(
            classify(&H2_PREFACE[..H2_PREFACE.len() - 1]),
            Protocol::Undecided
        );
        assert_eq!(classify(b"PRI * HTTP/1.1\r\n\r\n"), Protocol::Http1);
    }
}
