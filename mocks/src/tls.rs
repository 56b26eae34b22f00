//! `--tls-cert`: the mock as an HTTPS upstream, and with `--client-ca` one
//! that requires a client certificate (mTLS). TLS 1.2 and 1.3 only, ALPN
//! `h2` and `http/1.1`; rustls with `ring`, the workspace's one provider.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

/// The acceptor for `cert` (a PEM chain, leaf first) and its `key`,
/// requiring a client certificate signed by `client_ca` when given.
pub fn acceptor(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<TlsAcceptor> {
    let chain = certificates(cert)?;
    let key_pem = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .with_context(|| format!("{}: no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certificates(ca)? {
                roots
                    .add(c)
                    .with_context(|| format!("{}: not a usable CA certificate", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .with_context(|| format!("{} and its key", cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Every certificate of a PEM file (at least one).
fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not a PEM certificate", path.display()))?;
    if certs.is_empty() {
        bail!("{}: holds no PEM certificate", path.display());
    }
    Ok(certs)
}
