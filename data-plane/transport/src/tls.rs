//! The HTTPS listener's handshake (issue 27): rustls, TLS 1.2 and 1.3 only,
//! with the ring provider's suites (ECDHE with AES-GCM or ChaCha20-Poly1305:
//! nothing with CBC, RC4, 3DES or RSA key exchange), ALPN `h2` and
//! `http/1.1`, and the certificate chosen by SNI through the application's
//! [`ResolvesServerCert`].
//!
//! * A client whose ClientHello names no certificate the resolver has (nor a
//!   default) gets a fatal `unrecognized_name` alert (RFC 6066 §3) and the
//!   connection is closed. rustls itself would answer `access_denied`, so the
//!   ClientHello is read first ([`LazyConfigAcceptor`]) and the resolver
//!   asked before the handshake goes on.
//! * The whole handshake, ClientHello included, has a deadline.
//! * One [`TlsAcceptor`] serves every worker of a replica: its session
//!   ticket keys (rustls' ring `Ticketer`: a new key every 6 hours, the
//!   previous one still accepted) and its TLS 1.2 session cache are shared,
//!   so a client resumes on whichever worker the kernel hands it to.
//! * The resolver is asked on every handshake, so a certificate pushed in a
//!   new configuration applies to the next handshake, and open connections
//!   keep the one they were made with.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::server::{
    Acceptor, ResolvesServerCert, ServerSessionMemoryCache, WebPkiClientVerifier,
};
use rustls::{RootCertStore, ServerConfig};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;

/// A fatal `unrecognized_name` alert record: content type 21 (alert),
/// TLS 1.2 record version, length 2, level fatal (2), description 112.
const UNRECOGNIZED_NAME: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70];

/// TLS 1.2 sessions kept for resumption by session id (clients without tickets).
const SESSION_CACHE: usize = 4096;

/// Why a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// No certificate for the name the client asked for, and no default.
    #[error("no certificate for server name {0:?}")]
    UnrecognizedName(Option<String>),
    /// The deadline passed first.
    #[error("the TLS handshake took longer than {0:?}")]
    Timeout(Duration),
    /// The client's bytes were not a handshake rustls accepts (an old
    /// version, no shared cipher suite, garbage), or the socket failed.
    #[error("TLS handshake failed: {0}")]
    Failed(#[from] io::Error),
}

/// Why the client CA file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("client CA file {path}: {reason}")]
pub struct ClientCaError {
    /// The file.
    pub path: std::path::PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The CA certificates of a PEM file clients' certificates must chain to
/// (`--tls-client-ca`), read once at start-up.
pub fn client_ca_roots(path: &std::path::Path) -> Result<Arc<RootCertStore>, ClientCaError> {
    let bad = |reason: String| ClientCaError {
        path: path.to_path_buf(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        let cert: CertificateDer<'static> = cert.map_err(|e| bad(format!("not PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(Arc::new(roots))
}

/// The certificate revocation lists of a PEM file (`--tls-client-crl`, one or
/// more `X509 CRL` blocks), read once at start-up: a client certificate they
/// revoke fails the handshake.
pub fn client_crls(
    path: &std::path::Path,
) -> Result<Vec<rustls::pki_types::CertificateRevocationListDer<'static>>, ClientCaError> {
    use rustls::pki_types::CertificateRevocationListDer;
    let bad = |reason: String| ClientCaError {
        path: path.to_path_buf(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let crls = <CertificateRevocationListDer<'static> as rustls::pki_types::pem::PemObject>::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM: {e}")))?;
    if crls.is_empty() {
        return Err(bad(
            "holds no PEM certificate revocation list (X509 CRL)".into()
        ));
    }
    Ok(crls)
}

/// The verified end-entity certificate a client presented on the HTTPS
/// listener, carried as an extension of every request of its connection.
#[derive(Debug, Clone)]
pub struct ClientCertificate(pub Arc<CertificateDer<'static>>);

/// Handshake counters, for `/metrics`.
#[derive(Debug, Default)]
pub struct TlsStats {
    /// Handshakes completed with a full key exchange.
    pub full: AtomicU64,
    /// Handshakes that resumed a session (ticket or session id).
    pub resumed: AtomicU64,
    /// Refused with `unrecognized_name`.
    pub unrecognized_name: AtomicU64,
    /// Past the handshake timeout.
    pub timed_out: AtomicU64,
    /// Any other failure.
    pub failed: AtomicU64,
}

impl TlsStats {
    /// Appends the counters in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str("# HELP gateway_tls_handshakes_total TLS handshakes on the HTTPS listener, by outcome.\n# TYPE gateway_tls_handshakes_total counter\n");
        for (outcome, n) in [
            ("full", get(&self.full)),
            ("resumed", get(&self.resumed)),
            ("unrecognized_name", get(&self.unrecognized_name)),
            ("timeout", get(&self.timed_out)),
            ("failed", get(&self.failed)),
        ] {
            let _ = writeln!(
                out,
                "gateway_tls_handshakes_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
    }
}

/// The handshake side of an HTTPS listener, shared by a replica's workers.
pub struct TlsAcceptor {
    config: Arc<ServerConfig>,
    resolver: Arc<dyn ResolvesServerCert>,
    handshake_timeout: Duration,
    stats: Arc<TlsStats>,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl TlsAcceptor {
    /// An acceptor offering what `resolver` returns for each ClientHello,
    /// asking clients for a certificate that chains to `client_ca` when set,
    /// and refusing one that `client_crls` revoke (only the end-entity
    /// certificate is checked; one whose issuer has no list here is not).
    pub fn new(
        resolver: Arc<dyn ResolvesServerCert>,
        handshake_timeout: Duration,
        client_ca: Option<Arc<RootCertStore>>,
        client_crls: Vec<rustls::pki_types::CertificateRevocationListDer<'static>>,
    ) -> Result<Self, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
        let builder = match client_ca {
            Some(roots) => {
                let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .allow_unauthenticated();
                if !client_crls.is_empty() {
                    verifier = verifier
                        .with_crls(client_crls)
                        .only_check_end_entity_revocation()
                        .allow_unknown_revocation_status();
                }
                let verifier = verifier
                    .build()
                    .map_err(|e| rustls::Error::General(format!("client CA certificates: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
        config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE);
        // One ticket per TLS 1.3 handshake (rustls sends two by default): a
        // client reuses one per connection, and each costs a seal.
        config.send_tls13_tickets = 1;
        Ok(Self {
            config: Arc::new(config),
            resolver,
            handshake_timeout,
            stats: Arc::default(),
        })
    }

    /// The handshake counters.
    pub fn stats(&self) -> &Arc<TlsStats> {
        &self.stats
    }

    /// The verified certificate the client of `stream` presented, if any.
    pub fn client_certificate(stream: &TlsStream<TcpStream>) -> Option<ClientCertificate> {
        let first = stream.get_ref().1.peer_certificates()?.first()?;
        Some(ClientCertificate(Arc::new(first.clone().into_owned())))
    }

    /// Runs the server side of a handshake on `stream`, within the handshake timeout.
    pub async fn accept(&self, stream: TcpStream) -> Result<TlsStream<TcpStream>, HandshakeError> {
        // Pinned here, not moved into the timeout: on a timeout the handshake
        // (and the connection it holds) is dropped only after it is counted, so
        // a client that sees the close sees the count too.
        let handshake = self.handshake(stream);
        tokio::pin!(handshake);
        let outcome = tokio::time::timeout(self.handshake_timeout, &mut handshake).await;
        let counter = match &outcome {
            Ok(Ok(tls)) => match tls.get_ref().1.handshake_kind() {
                Some(rustls::HandshakeKind::Resumed) => &self.stats.resumed,
                _ => &self.stats.full,
            },
            Ok(Err(HandshakeError::UnrecognizedName(_))) => &self.stats.unrecognized_name,
            Ok(Err(_)) => &self.stats.failed,
            Err(_) => &self.stats.timed_out,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        outcome.unwrap_or(Err(HandshakeError::Timeout(self.handshake_timeout)))
    }

    async fn handshake(&self, stream: TcpStream) -> Result<TlsStream<TcpStream>, HandshakeError> {
        let start = LazyConfigAcceptor::new(Acceptor::default(), stream).await?;
        let hello = start.client_hello();
        if self.resolver.resolve(hello).is_none() {
            let name = start.client_hello().server_name().map(str::to_owned);
            let mut io = start.io;
            let _ = io.write_all(&UNRECOGNIZED_NAME).await;
            let _ = io.shutdown().await;
            return Err(HandshakeError::UnrecognizedName(name));
        }
        Ok(start.into_stream(self.config.clone()).await?)
    }
}

/// Whether the connection negotiated HTTP/2 by ALPN.
pub fn is_h2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}
