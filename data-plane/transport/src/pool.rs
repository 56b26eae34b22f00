//! Per-instance pool of keep-alive HTTP/1.1 connections (the bulkhead).
//!
//! Each upstream instance owns one pool, so a slow or broken instance can only
//! exhaust its own connections. The pool is our own rather than hyper-util's
//! legacy `Client` because the proxy needs to know, per attempt, whether the
//! request left the gateway: a request that was never written comes back to
//! us intact and may be retried on another instance whatever its method.
//!
//! Exchanges use our own HTTP/1.1 client ([`crate::h1`]): the request's task
//! writes and reads the socket itself. Upgrade requests (WebSockets) go on a
//! connection of their own ([`Pool::send_upgrade`]), with the same client.
//!
//! Idle connections are kept LIFO (the warmest is reused first), at most
//! `max_idle` of them, each for at most `idle_timeout`; one the upstream has
//! closed (or written to unasked) is dropped when it is next taken. The lock
//! is held only to push or pop, never across an `.await`.
//!
//! Each proxy worker ([`crate::workers`]) has its own idle list, so a worker
//! reuses the connections whose tasks run on its own thread and an exchange
//! never hops threads; `max_idle` applies per list.
//!
//! An instance of an `HTTP2` upstream ([`Protocol::Http2`]) is spoken to with
//! hyper's HTTP/2 client instead, its connections multiplexed
//! ([`crate::h2_client`], [`Pool::send_h2`]); they are made the same way
//! (TCP, then TLS with ALPN `h2` for an https:// instance).

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::body::RequestBody;
use crate::h1::{Conn, H1Body, Upgrade};
use crate::h2_client::{self, H2Slot, H2Stream};
use crate::response::Response;
use crate::upstream_error::{Failure, SendError, UpstreamError};
use crate::upstream_io::{UpstreamIo, UpstreamTls};
use crate::workers::Worker;

/// Pool limits, the same for every instance.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Idle connections kept per instance; beyond this a finished connection is closed.
    pub max_idle: usize,
    /// An idle connection older than this is closed instead of reused. Kept below the
    /// usual upstream keep-alive timeouts (60–75 s) so we rarely reuse one the upstream is closing.
    pub idle_timeout: Duration,
    /// Time allowed to establish a TCP connection. A connect timeout counts as
    /// "never reached the instance", so the request is retried elsewhere.
    pub connect_timeout: Duration,
    /// Idle lists: one per proxy worker plus one for every other thread
    /// (the [`Worker`] index of the exchange picks the list).
    pub slots: usize,
    /// Streams in flight on one HTTP/2 connection before another is opened
    /// (fewer when the instance allows fewer).
    pub h2_max_streams: usize,
}

/// The HTTP version an upstream's instances are spoken to with (`protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// HTTP/1.1, with keep-alive connections (the default).
    #[default]
    Http1,
    /// HTTP/2: prior knowledge over cleartext, ALPN `h2` over TLS; streams
    /// multiplexed over few connections.
    Http2,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_idle: 128,
            idle_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            slots: 1,
            h2_max_streams: 100,
        }
    }
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

struct Inner {
    authority: Arc<str>,
    /// For an https:// instance: its upstream's TLS client, and the host its certificate is checked against by default.
    tls: Option<InstanceTls>,
    settings: PoolSettings,
    /// One list per slot (see [`PoolSettings::slots`]).
    idle: Box<[Slot]>,
    /// An `HTTP2` instance's connections, one list per slot (`None`: HTTP/1.1).
    h2: Option<Box<[H2Slot]>>,
}

/// One slot's idle list, alone on its cache lines: two workers' lists side by
/// side in one line made every take and check-in (a lock and an unlock each)
/// pull the line away from the other worker's core.
#[repr(align(128))]
#[derive(Default)]
struct Slot(Mutex<Vec<Idle>>);

impl Inner {
    /// `worker`'s idle list.
    fn idle(&self, worker: Worker) -> &Mutex<Vec<Idle>> {
        &self.idle[worker % self.idle.len()].0
    }

    /// `worker`'s HTTP/2 connections (`None`: an HTTP/1.1 instance).
    fn h2(&self, worker: Worker) -> Option<&H2Slot> {
        self.h2.as_ref().map(|slots| &slots[worker % slots.len()])
    }
}

/// The connection pool of one upstream instance. Cheap to clone (shared).
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("authority", &self.inner.authority)
            .field("idle", &self.idle_count())
            .finish()
    }
}

/// Returns a connection to its pool once its response body has been read to the end.
pub struct Checkin {
    pool: Arc<Inner>,
    /// The worker whose idle list takes the connection back.
    worker: Worker,
}

impl std::fmt::Debug for Checkin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkin")
            .field("authority", &self.pool.authority)
            .finish()
    }
}

impl Checkin {
    /// Puts `conn` (done with its exchange) back as idle, or closes it when
    /// the pool is full.
    pub fn checkin(self, conn: Box<Conn>) {
        let pool = self.pool;
        if pool.settings.max_idle == 0 {
            return;
        }
        let now = Instant::now();
        let mut idle = pool.idle(self.worker).lock();
        // The oldest entries sit at the bottom: drop expired ones there.
        while idle
            .first()
            .is_some_and(|i| now - i.since > pool.settings.idle_timeout)
        {
            idle.remove(0);
        }
        if idle.len() < pool.settings.max_idle {
            idle.push(Idle { conn, since: now });
        }
    }
}

/// How a pool's connections are made TLS (an https:// instance).
#[derive(Debug, Clone)]
pub struct InstanceTls {
    /// The upstream's TLS client.
    pub client: Arc<UpstreamTls>,
    /// The instance URL's host: the server name unless the upstream sets one.
    pub host: Arc<str>,
}

impl Pool {
    /// A pool for the cleartext HTTP/1.1 instance at `authority` (`host:port`).
    pub fn new(authority: impl Into<Arc<str>>, settings: PoolSettings) -> Self {
        Self::with_tls(authority, settings, None, Protocol::Http1)
    }

    /// A pool for the instance at `authority`, over TLS when `tls` is set,
    /// speaking `protocol`.
    pub fn with_tls(
        authority: impl Into<Arc<str>>,
        settings: PoolSettings,
        tls: Option<InstanceTls>,
        protocol: Protocol,
    ) -> Self {
        let slots = settings.slots.max(1);
        Self {
            inner: Arc::new(Inner {
                tls,
                authority: authority.into(),
                settings,
                idle: (0..slots).map(|_| Slot::default()).collect(),
                h2: (protocol == Protocol::Http2)
                    .then(|| (0..slots).map(|_| H2Slot::default()).collect()),
            }),
        }
    }

    /// The HTTP version this instance is spoken to with.
    pub fn protocol(&self) -> Protocol {
        if self.inner.h2.is_some() {
            Protocol::Http2
        } else {
            Protocol::Http1
        }
    }

    /// host:port this pool connects to.
    pub fn authority(&self) -> &str {
        &self.inner.authority
    }

    /// Idle connections now held (ones the upstream closed are counted until
    /// they are next taken).
    pub fn idle_count(&self) -> usize {
        self.inner.idle.iter().map(|slot| slot.0.lock().len()).sum()
    }

    /// HTTP/2 connections now held, busy or idle (0 for an HTTP/1.1 instance).
    pub fn h2_connection_count(&self) -> usize {
        self.inner
            .h2
            .as_ref()
            .map_or(0, |slots| slots.iter().map(H2Slot::len).sum())
    }

    fn take_idle(&self, now: Instant, worker: Worker) -> Option<Box<Conn>> {
        let mut idle = self.inner.idle(worker).lock();
        while let Some(i) = idle.pop() {
            if now - i.since <= self.inner.settings.idle_timeout && i.conn.is_reusable() {
                return Some(i.conn);
            }
        }
        None
    }

    /// A new TCP connection to the instance.
    async fn connect_tcp(&self) -> Result<TcpStream, Failure> {
        let authority = &self.inner.authority;
        let stream = tokio::time::timeout(
            self.inner.settings.connect_timeout,
            TcpStream::connect(&**authority),
        )
        .await
        .map_err(|_| Failure::ConnectTimeout {
            authority: authority.clone(),
        })?
        .map_err(|source| Failure::Connect {
            authority: authority.clone(),
            source,
        })?;
        // Small request/response exchanges must not wait for Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// A new connection to the instance: TCP, then the TLS handshake for an
    /// https:// instance (within the connect timeout too).
    async fn connect(&self) -> Result<UpstreamIo, Failure> {
        let tcp = self.connect_tcp().await?;
        let Some(tls) = &self.inner.tls else {
            return Ok(tcp.into());
        };
        let authority = &self.inner.authority;
        match tokio::time::timeout(
            self.inner.settings.connect_timeout,
            tls.client.connect(&tls.host, tcp),
        )
        .await
        {
            Ok(Ok(io)) => Ok(io),
            Ok(Err(source)) => Err(Failure::Tls {
                authority: authority.clone(),
                source,
            }),
            Err(_) => Err(Failure::Tls {
                authority: authority.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no TLS handshake within the connect timeout",
                ),
            }),
        }
    }

    /// A new connection to the instance, outside the idle lists (active
    /// health checks: each on a connection of its own, closed after it).
    pub async fn fresh_connection(&self) -> Result<Box<Conn>, Failure> {
        Ok(Conn::new(self.connect().await?))
    }

    /// Sends `req` on a new HTTP/2 connection of its own, outside the pool
    /// (active health checks of an `HTTP2` instance), closed after it.
    /// Returns the answer's status (its body is not read).
    pub async fn send_on_fresh_h2(
        &self,
        mut req: Request<RequestBody>,
    ) -> Result<http::StatusCode, UpstreamError> {
        let io = self.connect().await.map_err(UpstreamError::not_sent)?;
        let mut sender = h2_client::handshake(io)
            .await
            .map_err(|e| UpstreamError::not_sent(Failure::Http2(e)))?;
        h2_client::to_h2(&mut req, self.scheme(), &self.inner.authority);
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| UpstreamError::sent(Failure::Http2(e)))?;
        Ok(resp.status())
    }

    /// The URI scheme of the instance: `https` over TLS.
    fn scheme(&self) -> http::uri::Scheme {
        if self.inner.tls.is_some() {
            http::uri::Scheme::HTTPS
        } else {
            http::uri::Scheme::HTTP
        }
    }

    /// A new hyper connection whose task hands the socket over to
    /// `hyper::upgrade::on` after a 101 answer instead of closing it.
    /// Sends an upgrade request (a WebSocket handshake) on a new connection of
    /// its own, which never joins the idle list: after a 101 its socket belongs
    /// to the tunnel, and after any other answer it is closed with the
    /// response body. Errors as in [`Pool::send`] (never on a reused connection).
    pub async fn send_upgrade(&self, req: Box<Request<RequestBody>>) -> Result<Upgrade, SendError> {
        let stream = match self.connect().await {
            Ok(s) => s,
            Err(failure) => return Err(SendError::not_sent(req, failure)),
        };
        Conn::new(stream).upgrade(req, &self.inner.authority).await
    }

    /// Sends `req` on an idle connection, or on a new one. A reused connection
    /// that turns out to be closed before the request was written is skipped
    /// silently (the request comes back and goes on the next connection).
    /// Returns the response (its body reads the connection) and the
    /// [`Checkin`] that takes the connection back at the body's end. `now`
    /// (the caller's clock reading) is when the exchange starts: idle
    /// connections older than the idle timeout by then are dropped.
    /// `worker`'s idle list is used, and takes the connection back.
    pub async fn send(
        &self,
        mut req: Box<Request<RequestBody>>,
        now: Instant,
        worker: Worker,
    ) -> Result<(Response<H1Body>, Checkin), SendError> {
        loop {
            let (conn, reused) = match self.take_idle(now, worker) {
                Some(c) => (c, true),
                None => match self.connect().await {
                    Ok(s) => (Conn::new(s), false),
                    Err(failure) => return Err(SendError::not_sent(req, failure)),
                },
            };
            match conn.send(req, &self.inner.authority).await {
                Ok(resp) => {
                    let checkin = Checkin {
                        pool: self.inner.clone(),
                        worker,
                    };
                    return Ok((resp, checkin));
                }
                // A reused connection closed before the request was written:
                // the request comes back and goes on the next one.
                Err(SendError {
                    error,
                    request: Some(back),
                }) if reused && error.never_reached() => req = back,
                Err(SendError { error, request }) => {
                    return Err(SendError {
                        error: error.on_reused(reused),
                        request,
                    });
                }
            }
        }
    }
}

impl Pool {
    /// Sends `req` to an `HTTP2` instance on a stream of one of `worker`'s
    /// connections, opening a connection when none has room
    /// ([`crate::h2_client`]). The request is made HTTP/2-shaped first
    /// (absolute target, `:authority` from `Host`). A request a reused
    /// connection gave back unsent (it was closing) goes on the next one.
    /// Returns the response, whose body streams data and trailers, and the
    /// stream to hold until that body ends. Errors as in [`Pool::send`].
    pub async fn send_h2(
        &self,
        mut req: Box<Request<RequestBody>>,
        now: Instant,
        worker: Worker,
    ) -> Result<(http::Response<hyper::body::Incoming>, H2Stream), SendError> {
        let Some(slot) = self.inner.h2(worker) else {
            return self.h1_instance(req);
        };
        h2_client::to_h2(&mut req, self.scheme(), &self.inner.authority);
        let settings = &self.inner.settings;
        let limit = settings.h2_max_streams;
        loop {
            let (stream, mut sender, reused) =
                match slot.checkout(limit, now, settings.idle_timeout) {
                    Some((stream, sender)) => (stream, sender, true),
                    None => {
                        let _one_connect = slot.connecting().await;
                        match slot.checkout(limit, now, settings.idle_timeout) {
                            Some((stream, sender)) => (stream, sender, true),
                            None => {
                                let io = match self.connect().await {
                                    Ok(io) => io,
                                    Err(failure) => return Err(SendError::not_sent(req, failure)),
                                };
                                match slot.open(io).await {
                                    Ok((stream, sender)) => (stream, sender, false),
                                    Err(e) => {
                                        return Err(SendError::not_sent(req, Failure::Http2(e)));
                                    }
                                }
                            }
                        }
                    }
                };
            match sender.try_send_request(*req).await {
                Ok(resp) => return Ok((resp, stream)),
                Err(mut failed) => {
                    slot.forget(&stream);
                    let back = failed.take_message().map(Box::new);
                    let error = failed.into_error();
                    match back {
                        // A reused connection that was closing: the next one.
                        Some(back) if reused => req = back,
                        Some(back) => return Err(SendError::not_sent(back, Failure::Http2(error))),
                        None => {
                            return Err(SendError {
                                error: UpstreamError::sent(h2_failure(error)).on_reused(reused),
                                request: None,
                            });
                        }
                    }
                }
            }
        }
    }

    /// [`Pool::send_h2`] on an HTTP/1.1 instance: a caller's mistake, refused
    /// as a failure that never reached it.
    fn h1_instance<T>(&self, req: Box<Request<RequestBody>>) -> Result<T, SendError> {
        Err(SendError::not_sent(
            req,
            Failure::Invalid("an HTTP/2 exchange with an HTTP/1.1 instance"),
        ))
    }
}

/// What a failed HTTP/2 exchange is blamed on: the client's body when that
/// is what failed, else the exchange.
pub(crate) fn h2_failure(error: hyper::Error) -> Failure {
    match std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<crate::body::RequestBodyError>())
    {
        Some(e) => Failure::ClientBody(e.copied()),
        None => Failure::Http2(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// An upstream that answers every request on a connection with a small 200,
    /// and counts the connections it accepted.
    async fn upstream() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    loop {
                        let n = match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    /// One GET through `pool` for `worker`, its body read to the end (which
    /// checks the connection back in).
    async fn get(pool: &Pool, authority: &str, worker: Worker) {
        let req = Request::get(format!("http://{authority}/"))
            .body(RequestBody::empty())
            .unwrap();
        let (resp, checkin) = pool
            .send(Box::new(req), Instant::now(), worker)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let mut read = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                read.extend_from_slice(&data);
            }
        }
        assert_eq!(read, b"ok");
        checkin.checkin(body.take_conn().expect("a reusable connection"));
    }

    #[tokio::test]
    async fn a_connection_goes_back_to_the_idle_list_of_the_worker_that_used_it() {
        let (authority, accepted) = upstream().await;
        let pool = Pool::new(
            authority.clone(),
            PoolSettings {
                slots: 3,
                ..PoolSettings::default()
            },
        );
        get(&pool, &authority, 1).await;
        assert_eq!(pool.idle_count(), 1);
        assert_eq!(pool.inner.idle(1).lock().len(), 1);
        // Another worker does not take it: its own list is empty.
        get(&pool, &authority, 2).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(pool.idle_count(), 2);
        // The first worker reuses its own.
        get(&pool, &authority, 1).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(pool.inner.idle(1).lock().len(), 1);
        assert_eq!(pool.inner.idle(2).lock().len(), 1);
    }

    /// An h2c server that holds every answer until `hold` requests have
    /// arrived, counting the connections it accepted.
    async fn h2_upstream(hold: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use hyper::service::service_fn;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let barrier = Arc::new(tokio::sync::Barrier::new(hold));
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_req| {
                        let barrier = barrier.clone();
                        async move {
                            barrier.wait().await;
                            Ok::<_, std::convert::Infallible>(http::Response::new(
                                http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                            ))
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(s), service)
                    .await;
                });
            }
        });
        (addr, accepted)
    }

    /// `n` concurrent GETs through an HTTP2 `pool`, each body read to its end.
    async fn h2_gets(pool: &Pool, n: usize) {
        let calls = (0..n).map(|_| async {
            let req = Request::get("/").body(RequestBody::empty()).unwrap();
            let (resp, stream) = pool
                .send_h2(Box::new(req), Instant::now(), 0)
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
            drop(stream);
        });
        futures::future::join_all(calls).await;
    }

    #[tokio::test]
    async fn h2_streams_multiplex_up_to_the_limit_then_open_another_connection() {
        // 10 answers held until all 10 requests arrived: 4 streams a connection → 3 connections.
        let (authority, accepted) = h2_upstream(10).await;
        let settings = PoolSettings {
            h2_max_streams: 4,
            ..PoolSettings::default()
        };
        let pool = Pool::with_tls(authority, settings, None, Protocol::Http2);
        h2_gets(&pool, 10).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(pool.h2_connection_count(), 3);

        // Streams were released at their bodies' ends: the next ones reuse the connections.
        h2_gets(&pool, 10).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);

        // With room for all of them, one connection carries every stream.
        let (authority, accepted) = h2_upstream(10).await;
        let pool = Pool::with_tls(authority, PoolSettings::default(), None, Protocol::Http2);
        h2_gets(&pool, 10).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_h2_request_to_a_dead_instance_comes_back_unsent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        drop(listener);
        let pool = Pool::with_tls(authority, PoolSettings::default(), None, Protocol::Http2);
        let req = Request::get("/").body(RequestBody::empty()).unwrap();
        let failed = pool
            .send_h2(Box::new(req), Instant::now(), 0)
            .await
            .unwrap_err();
        assert!(failed.error.never_reached() && failed.error.is_connect());
        assert!(failed.request.is_some());
    }
}
