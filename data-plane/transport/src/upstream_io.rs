//! The socket of an upstream connection: TCP, or TLS over TCP for an
//! instance whose URL is `https://` (issue 27), one type for the HTTP/1.1
//! client ([`crate::h1`]), the pool and WebSocket tunnels.
//!
//! [`UpstreamTls`] is an upstream's TLS client: rustls with the ring
//! provider, TLS 1.2 and 1.3, the instances' certificates always verified
//! (against the upstream's CA bundle, or the system's CA certificates), the
//! name checked and sent as SNI (the upstream's `server_name`, else the
//! instance's host), and a client certificate for instances that require
//! mTLS. ALPN offers `http/1.1`, or `h2` for an `HTTP2` upstream.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::pool::Protocol;

/// Why an upstream's TLS client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    /// A CA certificate rustls does not accept as a trust anchor.
    #[error("tls.ca_pem: {0}")]
    Ca(String),
    /// The system's CA certificates could not be read (no `ca_pem` given).
    #[error("no tls.ca_pem and the system's CA certificates cannot be loaded: {0}")]
    SystemRoots(String),
    /// `server_name` is not a name rustls can check.
    #[error("tls.server_name {0:?} is not a valid server name")]
    ServerName(String),
    /// rustls refused the settings.
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The TLS client of one upstream, shared by its instances' pools.
pub struct UpstreamTls {
    connector: TlsConnector,
    /// `server_name`; `None`: each instance's host.
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// A client trusting `ca` (`None`: the system's CA certificates),
    /// checking `server_name` (`None`: each instance's host), presenting
    /// `client` (its chain and key) when set, offering `protocol` by ALPN.
    pub fn new(
        ca: Option<&[CertificateDer<'static>]>,
        server_name: Option<&str>,
        client: Option<&CertifiedKey>,
        protocol: Protocol,
    ) -> Result<Self, UpstreamTlsError> {
        let mut roots = rustls::RootCertStore::empty();
        match ca {
            Some(cas) => {
                for c in cas {
                    roots
                        .add(c.clone())
                        .map_err(|e| UpstreamTlsError::Ca(e.to_string()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                if found.certs.is_empty() {
                    let why = found
                        .errors
                        .first()
                        .map_or_else(|| "none found".to_owned(), ToString::to_string);
                    return Err(UpstreamTlsError::SystemRoots(why));
                }
                // Unparseable system certificates are skipped, as every client does.
                roots.add_parsable_certificates(found.certs);
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_root_certificates(roots);
        let mut config = match client {
            Some(key) => builder
                .with_client_cert_resolver(Arc::new(ClientCertificate(Arc::new(key.clone())))),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![match protocol {
            Protocol::Http1 => b"http/1.1".to_vec(),
            Protocol::Http2 => b"h2".to_vec(),
        }];
        let server_name = server_name
            .map(|n| {
                ServerName::try_from(n.to_owned())
                    .map_err(|_| UpstreamTlsError::ServerName(n.to_owned()))
            })
            .transpose()?;
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    /// Runs the client handshake on `tcp` with the instance whose URL host is `host`.
    pub(crate) async fn connect(&self, host: &str, tcp: TcpStream) -> io::Result<UpstreamIo> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => ServerName::try_from(host.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        };
        let tls = self.connector.connect(name, tcp).await?;
        Ok(UpstreamIo::Tls(Box::new(tls)))
    }
}

/// The client certificate an upstream's instances get when they ask for one.
#[derive(Debug)]
struct ClientCertificate(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for ClientCertificate {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// An upstream connection's socket.
#[derive(Debug)]
pub enum UpstreamIo {
    /// Cleartext.
    Tcp(TcpStream),
    /// TLS (boxed: the session state is large, and most connections are cleartext).
    Tls(Box<TlsStream<TcpStream>>),
}

impl From<TcpStream> for UpstreamIo {
    fn from(tcp: TcpStream) -> Self {
        Self::Tcp(tcp)
    }
}

impl UpstreamIo {
    /// Whether written bytes may wait in the stream until it is flushed (TLS).
    pub(crate) fn buffers(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// Whether an idle connection can carry another request: the upstream
    /// has neither closed it nor sent anything unasked (for TLS: neither a
    /// close_notify nor any other record). A probe that finds bytes
    /// consumes one, which is fine: such a connection is dropped.
    pub(crate) fn is_idle_open(&self) -> bool {
        let tcp = match self {
            Self::Tcp(tcp) => tcp,
            Self::Tls(tls) => tls.get_ref().0,
        };
        let mut probe = [0u8; 1];
        matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, data),
            Self::Tls(s) => Pin::new(&mut **s).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Tcp(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

impl UpstreamIo {
    /// The read and write sides, for sending a request body while the
    /// response head is read (a TCP stream splits for free; a TLS stream
    /// through tokio's split, whose halves share the session).
    pub(crate) fn split(&mut self) -> (ReadSide<'_>, WriteSide<'_>) {
        match self {
            Self::Tcp(tcp) => {
                let (r, w) = tcp.split();
                (ReadSide::Tcp(r), WriteSide::Tcp(w))
            }
            Self::Tls(tls) => {
                let (r, w) = tokio::io::split(&mut **tls);
                (ReadSide::Tls(r), WriteSide::Tls(w))
            }
        }
    }
}

/// The read side of a split [`UpstreamIo`].
pub(crate) enum ReadSide<'a> {
    Tcp(tokio::net::tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>),
}

/// The write side of a split [`UpstreamIo`].
pub(crate) enum WriteSide<'a> {
    Tcp(tokio::net::tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>),
}

impl AsyncRead for ReadSide<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteSide<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, data),
            Self::Tls(s) => Pin::new(s).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
