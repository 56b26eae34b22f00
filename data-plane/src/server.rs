//! Listeners: accept loop, HTTP/1.1 + h2c connection setup, graceful shutdown.
//!
//! Each connection's first bytes are peeked at to pick its protocol: the
//! HTTP/2 preface means h2c, anything else HTTP/1.1, which
//! [`crate::h1_server`] serves, handing the rest of the connection to hyper
//! for what it leaves to hyper (request bodies, upgrades, heads it cannot
//! take). Only a connection whose first segment is a strict prefix of the
//! preface (a client trickling it in) is left to hyper-util's auto builder,
//! which reads until it can tell. The
//! point is memory: an HTTP/1.1 connection is then a task of its own type,
//! without what the auto builder keeps for a connection that might be HTTP/2
//! (measured: 6.5 KB less per idle keep-alive connection; BENCHMARKS.md).
//!
//! The header read timeout only works with a timer set, so one is always set:
//! without it a slowloris client could hold a connection open forever. The
//! same timeout bounds the wait for the first bytes, and shutdown closes a
//! connection still waiting for them at once (nothing of it is in flight).
//!
//! Shutdown: the listener closes (no new connections), every connection is
//! asked to finish its in-flight request and close, open WebSocket tunnels
//! (which have left their HTTP connection) are waited for as well, and after
//! the grace period the rest are dropped.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::body::{ClientBody, ResponseBody};
use crate::conn_timer::ConnTimer;
use crate::h1_server::{self, Ended};
use crate::response_head;

/// The HTTP/2 connection preface a client with prior knowledge opens with (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connection-level settings of a listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpSettings {
    /// Time a client gets to send a complete request head (and, on a new
    /// connection, its first bytes).
    pub header_read_timeout: Duration,
    /// Largest request head; hyper refuses larger ones with 431 before the
    /// pipeline sees them (the pipeline enforces the exact limit itself).
    pub max_header_bytes: usize,
    /// Time in-flight requests get to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

/// The connection builders of one listener, all configured alike.
struct Builders {
    /// Largest request head read before hyper is left to refuse it (431).
    max_head: usize,
    /// Without a timer: each connection gets its own ([`Builders::http1_connection`]).
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new(settings: &HttpSettings) -> Self {
        // hyper's buffer bounds the head it will parse (431 beyond). Keep it above
        // our own limit so the pipeline answers with a problem document, and large
        // enough for efficient body reads.
        let buf = (settings.max_header_bytes * 2).max(64 * 1024);
        let max_header_list = u32::try_from(buf).unwrap_or(u32::MAX);
        let mut http1 = http1::Builder::new();
        http1
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(buf)
            .keep_alive(true);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(max_header_list)
            .max_concurrent_streams(256);
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(buf)
            .keep_alive(true);
        auto.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(max_header_list)
            .max_concurrent_streams(256);
        Self {
            max_head: buf,
            http1,
            http2,
            auto,
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

/// Drives `conn` to its end; once `stop` fires (or its sender is gone) it first
/// calls `graceful` on it, which lets in-flight requests finish and then closes.
async fn drive<C, E>(
    conn: C,
    mut stop: watch::Receiver<()>,
    graceful: fn(Pin<&mut C>),
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = pin!(conn);
    tokio::select! {
        biased;
        r = conn.as_mut() => return r,
        _ = stop.changed() => {}
    }
    graceful(conn.as_mut());
    conn.await
}

/// Resolves once `rx` says stop (or its sender is gone).
async fn stop_requested(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await.map(|_| ());
}

/// Serves `listener` with `handler` until `shutdown` turns true, then drains.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    settings: HttpSettings,
    handler: F,
    mut shutdown: watch::Receiver<bool>,
) where
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let builders = Arc::new(Builders::new(&settings));
    let handler = Arc::new(handler);
    // WebSocket tunnels started on this thread (a worker's runtime) outlive
    // their HTTP connection; shutdown waits for them too.
    let tunnels = crate::websocket::tunnels();
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
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(
                    stream,
                    peer,
                    builders.clone(),
                    handler.clone(),
                    stop_rx.clone(),
                    settings.header_read_timeout,
                ));
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

/// Serves one accepted connection with the protocol its first bytes name.
/// Each protocol's connection future is boxed on its own, so an HTTP/1.1
/// connection's memory is what HTTP/1.1 needs rather than the largest of the
/// three types.
async fn connection<F, Fut>(
    stream: TcpStream,
    peer: SocketAddr,
    builders: Arc<Builders>,
    handler: Arc<F>,
    mut stop: watch::Receiver<()>,
    header_read_timeout: Duration,
) where
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
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
    // hyper's view of the handler, for the connections (or the rest of one) it serves.
    let service = {
        let handler = handler.clone();
        service_fn(move |req: Request<hyper::body::Incoming>| {
            let fut = handler(Box::new(req.map(ClientBody::hyper)), peer);
            async move {
                let mut resp = fut.await;
                // hyper writes the answer from its map alone.
                response_head::materialize(&mut resp);
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let ended: Result<(), Box<dyn std::error::Error + Send + Sync>> = match protocol {
        Protocol::Http1 => {
            let served = Box::pin(h1_server::serve(
                stream,
                peer,
                header_read_timeout,
                builders.max_head,
                &*handler,
                &stop,
            ))
            .await;
            match served {
                Ended::Closed => Ok(()),
                Ended::Handover(io) => {
                    let conn = builders
                        .http1_connection()
                        .serve_connection(TokioIo::new(io), service)
                        .with_upgrades();
                    drop(builders);
                    Box::pin(drive(conn, stop, |c| c.graceful_shutdown()))
                        .await
                        .map_err(Into::into)
                }
            }
        }
        Protocol::Http2 => {
            let conn = builders
                .http2
                .serve_connection(TokioIo::new(stream), service);
            drop(builders);
            Box::pin(drive(conn, stop, |c| c.graceful_shutdown()))
                .await
                .map_err(Into::into)
        }
        Protocol::Undecided => {
            let conn = builders
                .auto
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            drop(builders);
            Box::pin(drive(conn, stop, |c| c.graceful_shutdown())).await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
