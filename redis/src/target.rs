//! [`RedisTarget`]: a checked URL plus, for `rediss://`, the CA the server's
//! certificate must chain to; it builds the `redis::Client` both services use.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Once;

use redis::{Client, TlsCertificates};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::url::RedisUrl;

/// Where and how to reach one Redis.
#[derive(Clone)]
pub struct RedisTarget {
    url: RedisUrl,
    ca: Option<Ca>,
}

/// A CA bundle read at start-up, so a missing or broken file stops the
/// process at once instead of failing every later connection.
#[derive(Clone)]
struct Ca {
    path: PathBuf,
    pem: Vec<u8>,
}

/// Why a [`RedisTarget`] or its client could not be made. No variant ever
/// holds the URL's password: the URL appears only in its redacted form.
#[derive(Debug, thiserror::Error)]
pub enum RedisTargetError {
    /// A CA was given for a plain-text URL, where it could never be used.
    #[error("--redis-ca is given but the Redis URL {url} is not rediss:// (TLS)")]
    CaWithoutTls {
        /// The URL, redacted.
        url: String,
    },
    /// The CA file cannot be read.
    #[error("--redis-ca {}: {source}", path.display())]
    ReadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no usable PEM certificate.
    #[error("--redis-ca {}: {reason}", path.display())]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The redis crate refused the settings.
    #[error("Redis client for {url}: {source}")]
    Client {
        /// The URL, redacted.
        url: String,
        /// Why (the redis crate's messages never contain the URL).
        #[source]
        source: redis::RedisError,
    },
}

impl RedisTarget {
    /// `url`, and for a `rediss://` URL optionally the PEM file of the CA(s)
    /// its certificate must chain to (without one, the system's roots are used).
    pub fn new(url: RedisUrl, ca: Option<&Path>) -> Result<RedisTarget, RedisTargetError> {
        let ca = match ca {
            None => None,
            Some(_) if !url.is_tls() => {
                return Err(RedisTargetError::CaWithoutTls {
                    url: url.redacted().to_owned(),
                });
            }
            Some(path) => Some(read_ca(path)?),
        };
        Ok(RedisTarget { url, ca })
    }

    /// The URL (its `Display` is redacted).
    pub fn url(&self) -> &RedisUrl {
        &self.url
    }

    /// The CA file given with the URL, if any.
    pub fn ca_path(&self) -> Option<&Path> {
        self.ca.as_ref().map(|c| c.path.as_path())
    }

    /// A client for this Redis (connections are opened later, by its user).
    /// `rediss://` verifies the server's certificate and host name against
    /// the CA, or the system's roots.
    pub fn client(&self) -> Result<Client, RedisTargetError> {
        let url = self.url.expose();
        let client = if self.url.is_tls() {
            install_crypto_provider();
            Client::build_with_tls(
                url,
                TlsCertificates {
                    client_tls: None,
                    root_cert: self.ca.as_ref().map(|c| c.pem.clone()),
                },
            )
        } else {
            Client::open(url)
        };
        client.map_err(|source| RedisTargetError::Client {
            url: self.url.redacted().to_owned(),
            source,
        })
    }
}

impl fmt::Display for RedisTarget {
    /// The redacted URL, and the CA file when there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.url.redacted())?;
        if let Some(ca) = &self.ca {
            write!(f, " (CA {})", ca.path.display())?;
        }
        Ok(())
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTarget")
            .field("url", &self.url)
            .field("ca", &self.ca_path())
            .finish()
    }
}

fn read_ca(path: &Path) -> Result<Ca, RedisTargetError> {
    let pem = std::fs::read(path).map_err(|source| RedisTargetError::ReadCa {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |reason: String| RedisTargetError::BadCa {
        path: path.to_path_buf(),
        reason,
    };
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| bad(format!("not a PEM certificate: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(bad(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(Ca {
        path: path.to_path_buf(),
        pem,
    })
}

/// Makes ring rustls's process-wide provider unless one is installed already.
/// The redis crate builds its TLS settings with `ClientConfig::builder()`,
/// which panics when no provider is installed and more (or fewer) than one is
/// compiled in; installing one explicitly makes that independent of features.
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err: another part of the process installed one first, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> RedisUrl {
        s.parse().unwrap()
    }

    #[test]
    fn a_ca_needs_a_tls_url() {
        let err = RedisTarget::new(
            url("redis://:hunter2@cache:6379"),
            Some(Path::new("ca.pem")),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("not rediss://"), "{text}");
        assert!(text.contains("redis://:***@cache:6379"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn missing_or_broken_ca_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = RedisTarget::new(url("rediss://cache:6380"), Some(&missing)).unwrap_err();
        assert!(matches!(err, RedisTargetError::ReadCa { .. }), "{err}");
        assert!(err.to_string().contains("missing.pem"), "{err}");

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "just text\n").unwrap();
        let err = RedisTarget::new(url("rediss://cache:6380"), Some(&empty)).unwrap_err();
        assert!(err.to_string().contains("no PEM certificate"), "{err}");

        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = RedisTarget::new(url("rediss://cache:6380"), Some(&broken)).unwrap_err();
        assert!(err.to_string().contains("not a PEM certificate"), "{err}");
    }

    #[test]
    fn clients_build_for_both_schemes_and_print_redacted() {
        let plain = RedisTarget::new(url("redis://:hunter2@127.0.0.1:6379"), None).unwrap();
        plain.client().unwrap();
        assert_eq!(plain.to_string(), "redis://:***@127.0.0.1:6379");
        let tls = RedisTarget::new(url("rediss://:hunter2@127.0.0.1:6380"), None).unwrap();
        tls.client().unwrap();
        assert!(!format!("{tls} {tls:?}").contains("hunter2"));
        assert!(tls.ca_path().is_none());
    }
}
