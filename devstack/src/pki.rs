//! `--tls`: a throwaway certificate authority made when the stack starts, a
//! server certificate for the control plane (`localhost` and `127.0.0.1`) and
//! one client certificate that data planes (and operators' grpcurl) present
//! for mutual TLS. Keys are written with mode 0600 and die with the stack dir.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{CertifiedIssuer, ExtendedKeyUsagePurpose, KeyPair};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::StackError;

/// The PEM files of the stack's PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate (what `grpcurl -cacert` and `--control-plane-ca` take).
    pub ca: PathBuf,
    /// The control plane's certificate.
    pub server_cert: PathBuf,
    /// Its private key.
    pub server_key: PathBuf,
    /// The client certificate (data planes, grpcurl `-cert`).
    pub client_cert: PathBuf,
    /// Its private key (grpcurl `-key`).
    pub client_key: PathBuf,
}

fn rcgen_error(e: rcgen::Error) -> StackError {
    StackError::io("making the TLS certificates")(std::io::Error::other(e.to_string()))
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), StackError> {
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(StackError::io(format!("writing {}", path.display())))
}

/// A CA certificate and key, self-signed, named `common_name`.
fn new_ca(common_name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, StackError> {
    control_plane::tls_generate::new_ca(common_name).map_err(rcgen_error)
}

/// A certificate for `names` (the first is its common name) signed by `ca`,
/// and its private key, both PEM.
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String), StackError> {
    control_plane::tls_generate::leaf(ca, &names, usage).map_err(rcgen_error)
}

/// The edge's TLS (issue 27): a throwaway CA and the certificate it signed
/// for `localhost` and `127.0.0.1`, which devstack commits as the
/// certificate named `default`, so every data plane's HTTPS listener offers
/// it. Clients trust it with `curl --cacert <ca>`.
#[derive(Debug, Clone)]
pub struct EdgeTls {
    /// The CA certificate (`curl --cacert`).
    pub ca: PathBuf,
    /// The edge certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}

impl EdgeTls {
    /// The edge certificate kept in `dir`, or a new one made there. Kept so
    /// a persistent control-plane database, which keeps its certificate,
    /// keeps the CA that signed it too.
    pub fn load_or_generate(dir: &Path) -> Result<EdgeTls, StackError> {
        let ca = dir.join("edge-ca.pem");
        let (cert, key) = (dir.join("edge.pem"), dir.join("edge-key.pem"));
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        if let (Some(_), Some(cert_pem), Some(key_pem)) = (read(&ca), read(&cert), read(&key)) {
            return Ok(EdgeTls {
                ca,
                cert_pem,
                key_pem,
            });
        }
        std::fs::create_dir_all(dir)
            .map_err(StackError::io(format!("creating {}", dir.display())))?;
        let issuer = new_ca("devstack edge CA")?;
        let (cert_pem, key_pem) = leaf(
            &issuer,
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        write(&cert, &cert_pem, 0o644)?;
        write(&key, &key_pem, 0o600)?;
        write(&ca, &issuer.pem(), 0o644)?;
        Ok(EdgeTls {
            ca,
            cert_pem,
            key_pem,
        })
    }

    /// The certificate as the control plane takes it: named `default`, for
    /// `localhost` (and any name, as the default).
    pub fn certificate(&self) -> gateway_proto::v1::Certificate {
        gateway_proto::v1::Certificate {
            name: "default".into(),
            sni_hosts: vec!["localhost".into()],
            cert_chain_pem: self.cert_pem.clone(),
            private_key_pem: self.key_pem.clone(),
            ..Default::default()
        }
    }
}

impl Pki {
    /// Makes a CA and its certificates in `dir` (created if missing).
    pub fn generate(dir: &Path) -> Result<Pki, StackError> {
        std::fs::create_dir_all(dir)
            .map_err(StackError::io(format!("creating {}", dir.display())))?;
        let ca = new_ca("devstack throwaway CA")?;
        let (server_cert, server_key) = leaf(
            &ca,
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_cert, client_key) = leaf(
            &ca,
            vec!["devstack-data-plane".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let pki = Pki {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
        };
        write(&pki.ca, &ca.pem(), 0o644)?;
        write(&pki.server_cert, &server_cert, 0o644)?;
        write(&pki.server_key, &server_key, 0o600)?;
        write(&pki.client_cert, &client_cert, 0o644)?;
        write(&pki.client_key, &client_key, 0o600)?;
        Ok(pki)
    }

    /// Client TLS settings trusting the CA and presenting the client certificate.
    pub fn client_tls(&self) -> ClientTlsConfig {
        let read = |p: &Path| std::fs::read(p).unwrap_or_default();
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca)))
            .identity(Identity::from_pem(
                read(&self.client_cert),
                read(&self.client_key),
            ))
    }
}
