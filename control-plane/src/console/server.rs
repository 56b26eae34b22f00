//! The console's listener: plain HTTP, or TLS with the control plane's own
//! certificate and key (`--tls-cert`, `--tls-key`) when it has them. The
//! gRPC listener's `--client-ca` is not asked of browsers: a console user
//! signs in with a token. HTTP/1.1 and HTTP/2 (ALPN over TLS).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::console::Console;
use crate::console::router::{self, Answer, Req};
use crate::server::{StartError, TlsFiles};

/// Largest accepted form body.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Request headers must arrive within this time (slowloris guard).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A TLS handshake, and a request body, must complete within this time.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS acceptor for `files` (certificate chain and key; the client CA is not used).
pub fn tls_acceptor(files: &TlsFiles) -> Result<TlsAcceptor, StartError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| StartError::Tls(format!("console: {}: {e}", files.cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| StartError::Tls(format!("console: {}: {e}", files.key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StartError::Tls(format!("console: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| StartError::Tls(format!("console: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves the console on `listener` (over TLS with `tls`) until `shutdown` turns true.
pub async fn serve(
    listener: gateway_listener::Listener,
    console: Arc<Console>,
    tls: Option<TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let builder = Arc::new(builder);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "console listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::shutdown::requested(&mut shutdown) => return,
        };
        let console = console.clone();
        let tls = tls.clone();
        let builder = builder.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            connection(stream, peer, console, tls, builder, stop).await;
        });
    }
}

async fn connection(
    stream: gateway_listener::Guarded,
    peer: SocketAddr,
    console: Arc<Console>,
    tls: Option<TlsAcceptor>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    mut stop: watch::Receiver<bool>,
) {
    let service = service_fn(move |req: Request<Incoming>| {
        let console = console.clone();
        async move { Ok::<_, Infallible>(handle(&console, peer, req).await) }
    });
    let served = match tls {
        None => {
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                r = conn => r,
                _ = crate::shutdown::requested(&mut stop) => Ok(()),
            }
        }
        Some(acceptor) => {
            let stream = match tokio::time::timeout(READ_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "console TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                r = conn => r,
                _ = crate::shutdown::requested(&mut stop) => Ok(()),
            }
        }
    };
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "console connection ended with an error");
    }
}

/// Reads the request (form body up to [`MAX_BODY_BYTES`]) and answers it.
async fn handle(
    console: &Console,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(
        READ_TIMEOUT,
        Limited::new(body, MAX_BODY_BYTES).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            return router::finish(
                Answer::message(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Too large",
                    "The form is too large.",
                ),
                console.tls,
            );
        }
        Err(_) => {
            return router::finish(
                Answer::message(
                    StatusCode::REQUEST_TIMEOUT,
                    "Too slow",
                    "The form did not arrive in time.",
                ),
                console.tls,
            );
        }
    };
    let decode = |bytes: &[u8]| -> Vec<(String, String)> {
        form_urlencoded::parse(bytes)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    };
    let is_form = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let req = Req {
        query: decode(parts.uri.query().unwrap_or_default().as_bytes()),
        form: if is_form { decode(&body) } else { Vec::new() },
        path: parts.uri.path().to_owned(),
        method: parts.method,
        headers: parts.headers,
        peer: peer.ip(),
    };
    router::handle(console, req).await
}
