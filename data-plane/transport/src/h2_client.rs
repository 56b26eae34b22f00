//! HTTP/2 to the instances of an upstream whose `protocol` is `HTTP2`
//! (issue 27): prior-knowledge h2c for `http://` instances, ALPN `h2` for
//! `https://` ones, hyper's HTTP/2 client over the connections the pool
//! makes ([`crate::pool::Pool::send_h2`]).
//!
//! Multiplexing: as with HTTP/1.1 idle lists, each proxy worker keeps its own
//! list of connections to an instance, so a stream's task and its
//! connection's task share a thread. A request takes a stream on the first
//! open connection with fewer streams in flight than
//! [`PoolSettings::h2_max_streams`](crate::pool::PoolSettings), and past that
//! a new connection is opened (an instance that allows fewer streams, by its
//! `SETTINGS_MAX_CONCURRENT_STREAMS`, makes the extra ones wait on the
//! connection: set the limit to match it). One connect at a time per list: a
//! burst waits for that handshake instead of opening a connection per request.
//!
//! A stream is held until its response body ends or is dropped
//! ([`H2Stream`]). A connection the instance closed (GOAWAY, I/O error) is
//! dropped at the next pick, and so is one that carried no stream for the
//! idle timeout. Keep-alive PINGs find connections that died silently.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{Request, Version};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::body::RequestBody;
use crate::upstream_io::UpstreamIo;

/// Interval of the keep-alive PINGs on an upstream HTTP/2 connection.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// A PING unanswered for this long closes the connection.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP/2 connection to an instance.
struct H2Conn {
    sender: SendRequest<RequestBody>,
    /// Streams in flight (taken and not yet released).
    streams: AtomicUsize,
    /// When the last stream was released (the idle timeout counts from it).
    idle_since: Mutex<Instant>,
}

impl std::fmt::Debug for H2Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Conn")
            .field("streams", &self.streams.load(Ordering::Relaxed))
            .field("closed", &self.sender.is_closed())
            .finish()
    }
}

/// A stream taken on an upstream HTTP/2 connection: released when dropped
/// (the response body ended, or was abandoned).
#[derive(Debug)]
pub struct H2Stream {
    conn: Arc<H2Conn>,
}

impl H2Stream {
    fn take(conn: &Arc<H2Conn>) -> Self {
        conn.streams.fetch_add(1, Ordering::Relaxed);
        Self { conn: conn.clone() }
    }
}

impl Drop for H2Stream {
    fn drop(&mut self) {
        if self.conn.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            *self.conn.idle_since.lock() = Instant::now();
        }
    }
}

/// One worker's HTTP/2 connections to an instance.
#[derive(Debug, Default)]
pub(crate) struct H2Slot {
    conns: Mutex<Vec<Arc<H2Conn>>>,
    /// Held while a connection is being opened for this list.
    connecting: tokio::sync::Mutex<()>,
}

impl H2Slot {
    /// A stream on an open connection with room under `limit`, dropping
    /// closed connections and ones idle longer than `idle_timeout` on the way.
    pub(crate) fn checkout(
        &self,
        limit: usize,
        now: Instant,
        idle_timeout: Duration,
    ) -> Option<(H2Stream, SendRequest<RequestBody>)> {
        let mut conns = self.conns.lock();
        conns.retain(|c| {
            !c.sender.is_closed()
                && (c.streams.load(Ordering::Relaxed) > 0
                    || now.saturating_duration_since(*c.idle_since.lock()) <= idle_timeout)
        });
        let conn = conns
            .iter()
            .find(|c| c.streams.load(Ordering::Relaxed) < limit.max(1))?;
        Some((H2Stream::take(conn), conn.sender.clone()))
    }

    /// Serialises opening connections for this list.
    pub(crate) async fn connecting(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.connecting.lock().await
    }

    /// Adds a new connection and takes its first stream.
    fn add(&self, conn: H2Conn) -> (H2Stream, SendRequest<RequestBody>) {
        let conn = Arc::new(conn);
        let taken = (H2Stream::take(&conn), conn.sender.clone());
        self.conns.lock().push(conn);
        taken
    }

    /// Drops the connection of `stream` from the list (it failed a request).
    pub(crate) fn forget(&self, stream: &H2Stream) {
        self.conns.lock().retain(|c| !Arc::ptr_eq(c, &stream.conn));
    }

    /// Connections now held.
    pub(crate) fn len(&self) -> usize {
        self.conns.lock().len()
    }

    /// Runs the HTTP/2 handshake on `io`, spawns the connection's task on
    /// this thread's runtime, adds the connection and takes its first stream.
    pub(crate) async fn open(
        &self,
        io: UpstreamIo,
    ) -> Result<(H2Stream, SendRequest<RequestBody>), hyper::Error> {
        let sender = handshake(io).await?;
        Ok(self.add(H2Conn {
            sender,
            streams: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }))
    }
}

/// The HTTP/2 client handshake on `io` (keep-alive PINGs on); the
/// connection's task runs on the current runtime until the connection closes.
pub(crate) async fn handshake(io: UpstreamIo) -> Result<SendRequest<RequestBody>, hyper::Error> {
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(io))
        .await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
        }
    });
    Ok(sender)
}

/// Makes an HTTP/1.1-shaped request (origin-form target, `Host`) what an
/// HTTP/2 instance is sent: the target in absolute form with `scheme` and the
/// `Host` (else `fallback`, the instance's host:port) as `:authority`, no
/// `Host` field, and `TE: trailers` on gRPC calls, which require it.
pub(crate) fn to_h2(req: &mut Request<RequestBody>, scheme: Scheme, fallback: &str) {
    let host = req.headers_mut().remove(header::HOST);
    let authority = host
        .as_ref()
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        .or_else(|| Authority::try_from(fallback).ok());
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(scheme);
    parts.authority = authority;
    parts.path_and_query = Some(path);
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_2;
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        req.headers_mut()
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_h1_shaped_request_gets_an_absolute_target_and_loses_host() {
        let mut req = Request::post("/mock.v1.Echo/Say?x=1")
            .header(header::HOST, "api.example:8080")
            .header(header::CONTENT_TYPE, "application/grpc+proto")
            .body(RequestBody::empty())
            .unwrap();
        to_h2(&mut req, Scheme::HTTP, "10.0.0.1:50051");
        assert_eq!(req.uri(), "http://api.example:8080/mock.v1.Echo/Say?x=1");
        assert!(!req.headers().contains_key(header::HOST));
        assert_eq!(req.headers()[header::TE], "trailers");
        assert_eq!(req.version(), Version::HTTP_2);

        // No Host: the instance's authority; not gRPC: no TE.
        let mut req = Request::get("/a").body(RequestBody::empty()).unwrap();
        to_h2(&mut req, Scheme::HTTPS, "10.0.0.1:8443");
        assert_eq!(req.uri(), "https://10.0.0.1:8443/a");
        assert!(!req.headers().contains_key(header::TE));
    }
}
