//! `https://` JWKS: the rustls client settings (a CA file, or the system's
//! roots) and the connector that puts TLS over hyper-util's TCP connector.
//!
//! rustls with the `ring` provider, the one crypto backend of the workspace
//! (tonic and the Redis client use it too), passed explicitly so nothing
//! depends on a process-wide default provider being installed.

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::error::JwtConfigError;

/// The TLS settings for an `https://` JWKS URL: the server's certificate must
/// chain to a certificate of `ca` (a PEM file) or, without one, to one of the
/// system's roots, and name the URL's host. `None` for `http://`, where a
/// CA is refused because it would never be used.
pub(crate) fn client_config(
    uri: &Uri,
    url: &str,
    ca: Option<&Path>,
) -> Result<Option<TlsConnector>, JwtConfigError> {
    if uri.scheme_str() != Some("https") {
        return match ca {
            Some(_) => Err(JwtConfigError::CaWithoutTls {
                url: url.to_owned(),
            }),
            None => Ok(None),
        };
    }
    let roots = match ca {
        Some(path) => ca_roots(path)?,
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| JwtConfigError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(TlsConnector::from(Arc::new(config))))
}

/// Every certificate of a PEM file, read once at start-up so a missing or
/// broken file stops the data plane instead of failing every fetch.
fn ca_roots(path: &Path) -> Result<RootCertStore, JwtConfigError> {
    let bad = |reason: String| JwtConfigError::Ca {
        path: path.to_path_buf(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("not a PEM certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(roots)
}

/// The system's roots (rustls-native-certs: the OS store, or `SSL_CERT_FILE`
/// / `SSL_CERT_DIR`); an error when there is not a single usable one.
fn system_roots() -> Result<RootCertStore, JwtConfigError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (_, _unusable) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(JwtConfigError::SystemRoots(why));
    }
    Ok(roots)
}

/// hyper-util's TCP connector, then TLS for `https://` URIs.
#[derive(Clone)]
pub(crate) struct JwksConnector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

impl JwksConnector {
    /// `http` must not enforce the `http` scheme (`enforce_http(false)`).
    pub(crate) fn new(http: HttpConnector, tls: Option<TlsConnector>) -> Self {
        Self { http, tls }
    }
}

type BoxError = Box<dyn StdError + Send + Sync>;

impl tower_service::Service<Uri> for JwksConnector {
    type Response = JwksStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<JwksStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri.clone());
        let tls = self.tls.clone();
        Box::pin(async move {
            let tcp = connecting.await?;
            if uri.scheme_str() != Some("https") {
                return Ok(JwksStream::Plain(tcp));
            }
            let tls = tls.ok_or("an https:// URI without TLS settings")?;
            // The URI's host names the server: a DNS name or an IP address
            // (without the brackets of an IPv6 literal).
            let host = uri.host().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| format!("{host:?} is not a server name: {e}"))?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(JwksStream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection to the JWKS server, with or without TLS.
pub(crate) enum JwksStream {
    /// `http://`.
    Plain(TokioIo<TcpStream>),
    /// `https://` (boxed: a TLS session is large next to a socket).
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for JwksStream {
    fn connected(&self) -> Connected {
        match self {
            JwksStream::Plain(s) => s.connected(),
            JwksStream::Tls(s) => s.inner().get_ref().0.connected(),
        }
    }
}

impl Read for JwksStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            JwksStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            JwksStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for JwksStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            JwksStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            JwksStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            JwksStream::Plain(s) => Pin::new(s).poll_flush(cx),
            JwksStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            JwksStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            JwksStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An error and its causes, `: `-joined: hyper's "client error (Connect)"
/// alone would not say that the server's certificate was refused.
pub(crate) fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
