//! The accept loop: HTTP/1.1 and h2c on one listener (or, with TLS, HTTP/1.1
//! and h2 over it), graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Either;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use gateway_telemetry::Tracer;

use crate::config::MockConfig;
use crate::handler;
use crate::stats::RequestStats;

/// How long in-flight requests may take to finish after shutdown starts.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long a client gets to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `listener` (cleartext HTTP/1.1 and h2c) until `shutdown` resolves,
/// then stops accepting and lets open connections finish (at most
/// [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    config: MockConfig,
    tracer: Tracer,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, config, tracer, None, shutdown).await
}

/// [`serve`] over TLS: each connection's handshake with `tls` first.
pub async fn serve_tls(
    listener: TcpListener,
    config: MockConfig,
    tracer: Tracer,
    tls: TlsAcceptor,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, config, tracer, Some(tls), shutdown).await
}

async fn serve_with(
    listener: TcpListener,
    config: MockConfig,
    tracer: Tracer,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let grpc = crate::grpc::routes(config.clone())
        .map_err(|e| std::io::Error::other(format!("gRPC reflection descriptors: {e:?}")))?;
    let state = Arc::new((config, tracer, RequestStats::default(), grpc));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A timer makes hyper enforce its header read timeout (slowloris).
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let state = Arc::clone(&state);
            async move {
                let (config, tracer, stats, grpc) = &*state;
                // gRPC calls (by content type) go to the Echo service, the rest to the HTTP mock.
                let grpc_call = req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                if grpc_call {
                    let Ok(resp) = tower_service::Service::call(&mut grpc.clone(), req).await;
                    return Ok::<_, Infallible>(resp.map(Either::Right));
                }
                Ok(handler::handle(config, tracer, stats, req)
                    .await
                    .map(Either::Left))
            }
        });
        let Some(tls) = &tls else {
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
            continue;
        };
        let (tls, builder, watcher) = (tls.clone(), builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!("TLS handshake timed out"),
            };
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }

    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period");
    }
    Ok(())
}
