//! `--tls-generate-dir`: a TLS identity for the gRPC listener made on the
//! first start and kept, for deployments with no PKI of their own (the
//! compose stack): a private CA signs one server certificate for the
//! `--tls-generate-name`s, the CA certificate is written where data planes
//! read it (`--tls-generate-ca`, their `--control-plane-ca`), and the CA's
//! private key is dropped at once, so nothing can ever issue a second
//! certificate under it. Later starts reuse the kept files while they still
//! name every requested host; otherwise (or when one is missing) a new CA
//! and certificate replace them.
//!
//! The same two steps ([`new_ca`], [`leaf`]) make devstack's throwaway
//! certificates.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// Why the TLS identity could not be made or kept.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// A file could not be written or read.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// rcgen refused a name or failed to sign.
    #[error("making the TLS certificate: {0}")]
    Certificate(String),
    /// A requested name is neither a host name nor an IP address (or none was given).
    #[error(
        "--tls-generate-name {0:?} is not a host name or an IP address (e.g. control-plane, \
         localhost, 127.0.0.1)"
    )]
    BadName(String),
}

fn rcgen_error(e: rcgen::Error) -> GenerateError {
    GenerateError::Certificate(e.to_string())
}

/// A CA certificate and key, self-signed, named `common_name`.
pub fn new_ca(common_name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    CertifiedIssuer::self_signed(params, KeyPair::generate()?)
}

/// A certificate for `names` (the first is its common name; at least one)
/// signed by `ca`, for `usage`, and its private key, both PEM.
pub fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    names: &[String],
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String), rcgen::Error> {
    let mut params = CertificateParams::new(names.to_vec())?;
    if let Some(first) = names.first() {
        params
            .distinguished_name
            .push(DnType::CommonName, first.clone());
    }
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Where the generated identity lives.
#[derive(Clone, Debug)]
pub struct TlsGenerate {
    /// Directory of the server certificate (`server.pem`), its key
    /// (`server-key.pem`, mode 0600) and the names it was made for (`server.names`).
    pub dir: PathBuf,
    /// Where the CA certificate is written (default `DIR/ca.pem`).
    pub ca: Option<PathBuf>,
    /// The names the certificate is for (DNS names or IP addresses).
    pub names: Vec<String>,
}

/// The files [`ensure`] made or kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generated {
    /// The server certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA certificate that signed it.
    pub ca: PathBuf,
    /// Whether they were made now (false: kept from an earlier start).
    pub made: bool,
}

impl TlsGenerate {
    fn ca_path(&self) -> PathBuf {
        self.ca.clone().unwrap_or_else(|| self.dir.join("ca.pem"))
    }
}

/// The kept identity when it is complete and names every requested host,
/// else a new one written over it.
pub fn ensure(g: &TlsGenerate) -> Result<Generated, GenerateError> {
    if g.names.is_empty() {
        return Err(GenerateError::BadName(String::new()));
    }
    if let Some(bad) = g.names.iter().find(|n| {
        n.parse::<std::net::IpAddr>().is_err() && !gateway_proto::validate::is_valid_hostname(n)
    }) {
        return Err(GenerateError::BadName(bad.clone()));
    }
    let cert = g.dir.join("server.pem");
    let key = g.dir.join("server-key.pem");
    let names = g.dir.join("server.names");
    let ca = g.ca_path();
    let kept_names = std::fs::read_to_string(&names).unwrap_or_default();
    let kept: Vec<&str> = kept_names.lines().collect();
    if cert.is_file()
        && key.is_file()
        && ca.is_file()
        && g.names.iter().all(|n| kept.contains(&n.as_str()))
    {
        return Ok(Generated {
            cert,
            key,
            ca,
            made: false,
        });
    }
    let issuer = new_ca("gateway control plane CA").map_err(rcgen_error)?;
    let (cert_pem, key_pem) =
        leaf(&issuer, &g.names, ExtendedKeyUsagePurpose::ServerAuth).map_err(rcgen_error)?;
    create_dir(&g.dir)?;
    if let Some(parent) = ca.parent() {
        create_dir(parent)?;
    }
    // Key first, CA last: a start interrupted half-way finds no CA and makes all three again.
    write_atomically(&key, &key_pem, 0o600)?;
    write_atomically(&cert, &cert_pem, 0o644)?;
    write_atomically(&names, &names_text(&g.names), 0o644)?;
    write_atomically(&ca, &issuer.pem(), 0o644)?;
    Ok(Generated {
        cert,
        key,
        ca,
        made: true,
    })
}

/// The `names` file's content: one requested name per line.
fn names_text(names: &[String]) -> String {
    names.iter().map(|n| format!("{n}\n")).collect()
}

fn create_dir(dir: &Path) -> Result<(), GenerateError> {
    std::fs::create_dir_all(dir).map_err(|source| GenerateError::Io {
        what: "cannot create the directory",
        path: dir.to_owned(),
        source,
    })
}

/// Writes `text` to a temporary file beside `path` with `mode`, then renames it over `path`.
fn write_atomically(path: &Path, text: &str, mode: u32) -> Result<(), GenerateError> {
    let tmp = path.with_extension("tmp");
    let io = |what| {
        move |source| GenerateError::Io {
            what,
            path: path.to_owned(),
            source,
        }
    };
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .map_err(io("cannot write"))?;
    std::fs::rename(&tmp, path).map_err(io("cannot replace"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn names() -> Vec<String> {
        vec![
            "control-plane".into(),
            "localhost".into(),
            "127.0.0.1".into(),
        ]
    }

    #[test]
    fn makes_then_keeps_a_server_certificate_for_every_name() {
        let dir = tempfile::tempdir().unwrap();
        let g = TlsGenerate {
            dir: dir.path().join("tls"),
            ca: Some(dir.path().join("shared").join("ca.pem")),
            names: names(),
        };
        let first = ensure(&g).unwrap();
        assert!(first.made);
        assert_eq!(first.ca, dir.path().join("shared").join("ca.pem"));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&first.key), 0o600);
        let cert_pem = std::fs::read_to_string(&first.cert).unwrap();
        // The CA's key is nowhere: only the server's key was written.
        let keys: Vec<_> = walk(dir.path())
            .into_iter()
            .filter(|p| std::fs::read_to_string(p).unwrap().contains("PRIVATE KEY"))
            .collect();
        assert_eq!(keys, vec![first.key.clone()]);

        let again = ensure(&g).unwrap();
        assert!(!again.made, "kept");
        assert_eq!(std::fs::read_to_string(&again.cert).unwrap(), cert_pem);

        // A name the kept certificate lacks: a new CA and certificate.
        let more = TlsGenerate {
            names: vec!["control-plane".into(), "cp.example".into()],
            ..g
        };
        let renewed = ensure(&more).unwrap();
        assert!(renewed.made);
        assert_ne!(std::fs::read_to_string(&renewed.cert).unwrap(), cert_pem);
    }

    #[test]
    fn a_missing_file_makes_all_three_again() {
        let dir = tempfile::tempdir().unwrap();
        let g = TlsGenerate {
            dir: dir.path().to_owned(),
            ca: None,
            names: names(),
        };
        let first = ensure(&g).unwrap();
        let ca_before = std::fs::read_to_string(&first.ca).unwrap();
        std::fs::remove_file(&first.key).unwrap();
        let second = ensure(&g).unwrap();
        assert!(second.made);
        assert_ne!(std::fs::read_to_string(&second.ca).unwrap(), ca_before);
    }

    #[test]
    fn a_bad_name_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let g = TlsGenerate {
            dir: dir.path().to_owned(),
            ca: None,
            names: vec!["bad name with spaces".into()],
        };
        let e = ensure(&g).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"bad name with spaces\" is not a host name"),
            "{e}"
        );
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "nothing written"
        );
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }
}
