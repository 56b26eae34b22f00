//! Listeners: accept loop, HTTP/1.1 + h2c connection setup, graceful shutdown.
//!
//! Every connection is served by hyper-util's auto builder (HTTP/1.1, or h2c
//! when the client opens with the HTTP/2 preface). The header read timeout only
//! works with a timer set, so one is always set: without it a slowloris client
//! could hold a connection open forever.
//!
//! Shutdown: the listener closes (no new connections), every connection is
//! asked to finish its in-flight request and close, open WebSocket tunnels
//! (which have left their HTTP connection) are waited for as well, and after
//! the grace period the rest are dropped.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::body::ResponseBody;

/// Connection-level settings of a listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpSettings {
    /// Time a client gets to send a complete request head.
    pub header_read_timeout: Duration,
    /// Largest request head; hyper refuses larger ones with 431 before the
    /// pipeline sees them (the pipeline enforces the exact limit itself).
    pub max_header_bytes: usize,
    /// Time in-flight requests get to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

/// The connection builder for `settings`.
pub fn builder(settings: &HttpSettings) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    // hyper's buffer bounds the head it will parse (431 beyond). Keep it above
    // our own limit so the pipeline answers with a problem document, and large
    // enough for efficient body reads.
    let buf = (settings.max_header_bytes * 2).max(64 * 1024);
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(buf)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(buf).unwrap_or(u32::MAX))
        .max_concurrent_streams(256);
    b
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
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let builder = builder(&settings);
    let handler = Arc::new(handler);
    // WebSocket tunnels started on this thread (a worker's runtime) outlive
    // their HTTP connection; shutdown waits for them too.
    let tunnels = crate::websocket::tunnels();
    let graceful = GracefulShutdown::new();
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
                let handler = handler.clone();
                let service = service_fn(move |req| {
                    let fut = handler(req, peer);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let conn = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            () = stop_requested(&mut shutdown) => break,
        }
    }
    drop(listener);
    let drained = async {
        graceful.shutdown().await;
        tunnels.drained().await;
    };
    tokio::select! {
        () = drained => {}
        () = tokio::time::sleep(settings.shutdown_grace) => {
            tracing::warn!(grace = ?settings.shutdown_grace, tunnels = tunnels.open(), "connections still open after the grace period; closing them");
        }
    }
}
