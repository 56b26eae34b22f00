//! The defences every listener of the control plane (gRPC, web console,
//! metrics) and of the auth service has, like the data plane's own listeners
//! (issue 41, item 7: 320 idle sockets used to hang the admin API):
//!
//! * a **connection cap** per listener ([`Limits::max_connections`]): past it a
//!   new connection is closed at once, before any byte is read, and counted;
//! * a **first-bytes deadline** ([`Limits::first_bytes_timeout`]): a
//!   connection must send its first [`FIRST_BYTES`] bytes (an HTTP/2
//!   preface is 24; any HTTP/1.1 request line with its `Host` is longer)
//!   within it, or its reads fail and the server closes it;
//! * an **idle limit** ([`Limits::idle_timeout`]): a connection from which no
//!   byte arrives for that long is closed the same way (a client that keeps
//!   answering HTTP/2 pings is not idle; the cap bounds those).
//!
//! [`Listener::accept`] hands out [`Guarded`] streams, which tonic serves as
//! it serves a `TcpStream` ([`tonic::transport::server::Connected`]) and hyper
//! through `TokioIo`.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// Bytes a connection must send within the first-bytes deadline.
pub const FIRST_BYTES: u64 = 24;

/// Default of [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of [`Limits::first_bytes_timeout`].
pub const DEFAULT_FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`Limits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once (at least 1).
    pub max_connections: usize,
    /// Time a new connection has to send its first [`FIRST_BYTES`] bytes.
    pub first_bytes_timeout: Duration,
    /// Longest time without a byte from the client before its connection is closed.
    pub idle_timeout: Duration,
}

impl Limits {
    /// The limits from flag values: a cap and two times in milliseconds.
    pub fn from_flags(
        max_connections: u64,
        first_bytes_timeout_ms: u64,
        idle_timeout_ms: u64,
    ) -> Self {
        Self {
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            first_bytes_timeout: Duration::from_millis(first_bytes_timeout_ms),
            idle_timeout: Duration::from_millis(idle_timeout_ms),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            first_bytes_timeout: DEFAULT_FIRST_BYTES_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// Counters of one listener.
#[derive(Debug, Default)]
pub struct Counters {
    open: AtomicUsize,
    refused: AtomicU64,
    timed_out: AtomicU64,
}

impl Counters {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections closed at once because the cap was reached.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed by the first-bytes deadline or the idle limit.
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }
}

/// A listener with its limits.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
    limits: Limits,
    counters: Arc<Counters>,
    /// Name in log lines (`grpc`, `console`, `metrics`, `http`).
    name: &'static str,
}

impl Listener {
    /// `inner` with `limits`, named `name` in log lines.
    pub fn new(inner: TcpListener, limits: Limits, name: &'static str) -> Self {
        Self {
            inner,
            limits: Limits {
                max_connections: limits.max_connections.max(1),
                ..limits
            },
            counters: Arc::default(),
            name,
        }
    }

    /// The listener's counters.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The next connection under the cap; connections past it are closed at
    /// once (and counted) and the wait goes on.
    pub async fn accept(&self) -> io::Result<(Guarded, SocketAddr)> {
        loop {
            let (stream, peer) = self.inner.accept().await?;
            let open = self.counters.open.fetch_add(1, Ordering::AcqRel);
            if open >= self.limits.max_connections {
                self.counters.open.fetch_sub(1, Ordering::AcqRel);
                let refused = self.counters.refused.fetch_add(1, Ordering::Relaxed);
                if refused.is_power_of_two() {
                    tracing::warn!(
                        listener = self.name,
                        max = self.limits.max_connections,
                        refused = refused + 1,
                        "connection cap reached: new connections are closed at once"
                    );
                }
                drop(stream);
                continue;
            }
            let _ = stream.set_nodelay(true);
            return Ok((
                Guarded::new(stream, self.limits, Arc::clone(&self.counters)),
                peer,
            ));
        }
    }

    /// The connections as a stream, for tonic's `serve_with_incoming`.
    pub fn incoming(self) -> impl futures::Stream<Item = io::Result<Guarded>> {
        futures::stream::unfold(self, |listener| async move {
            let next = listener.accept().await.map(|(conn, _)| conn);
            Some((next, listener))
        })
    }
}

/// A connection under a listener's limits; its slot is given back when dropped.
#[derive(Debug)]
pub struct Guarded {
    io: TcpStream,
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    limits: Limits,
    counters: Arc<Counters>,
    /// Bytes read so far, up to [`FIRST_BYTES`].
    read: u64,
    deadline: Pin<Box<Sleep>>,
    timed_out: bool,
}

impl Guarded {
    fn new(io: TcpStream, limits: Limits, counters: Arc<Counters>) -> Self {
        Self {
            peer: io.peer_addr().ok(),
            local: io.local_addr().ok(),
            io,
            limits,
            counters,
            read: 0,
            deadline: Box::pin(tokio::time::sleep(limits.first_bytes_timeout)),
            timed_out: false,
        }
    }

    /// The client's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    fn expired(&mut self) -> io::Error {
        if !self.timed_out {
            self.timed_out = true;
            self.counters.timed_out.fetch_add(1, Ordering::Relaxed);
        }
        let what = if self.read < FIRST_BYTES {
            "no request within the first-bytes deadline"
        } else {
            "idle for longer than the idle limit"
        };
        io::Error::new(io::ErrorKind::TimedOut, what)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.counters.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(Err(this.expired()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = (buf.filled().len() - before) as u64;
                if n > 0 {
                    this.read = (this.read + n).min(FIRST_BYTES);
                    // Progress: the idle limit (or what is left of the first-bytes deadline) runs again.
                    if this.read >= FIRST_BYTES {
                        let next = Instant::now() + this.limits.idle_timeout;
                        this.deadline.as_mut().reset(next);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(this.expired())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Guarded {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.peer,
        }
    }
}

#[cfg(test)]
mod tests;
