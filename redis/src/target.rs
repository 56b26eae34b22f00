//! [`RedisTarget`]: a checked URL plus, for `rediss://`, the CA the server's
//! certificate must chain to; it builds the `redis::Client` both services use.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Once;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{Client, ConnectionAddr, TlsCertificates, TlsMode};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::connection::{ConnectOptions, RedisConnection};
use crate::url::{Credentials, Node, RedisUrl, Topology};

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
    /// [`RedisTarget::client`] was asked of a Sentinel or Cluster URL, which
    /// names no single server; use [`RedisTarget::connect`].
    #[error("{url} names Sentinels or a Cluster, not one Redis")]
    NotStandalone {
        /// The URL, redacted.
        url: String,
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

    /// A client for this one Redis (connections are opened later, by its user).
    /// `rediss://` verifies the server's certificate and host name against
    /// the CA, or the system's roots. A Sentinel or Cluster URL names no single
    /// server: [`RedisTargetError::NotStandalone`] (use [`RedisTarget::connect`]).
    pub fn client(&self) -> Result<Client, RedisTargetError> {
        if !matches!(self.url.topology(), Topology::Standalone) {
            return Err(RedisTargetError::NotStandalone {
                url: self.url.redacted().to_owned(),
            });
        }
        let url = self.url.expose();
        let client = if self.url.is_tls() {
            install_crypto_provider();
            Client::build_with_tls(url, self.certificates())
        } else {
            Client::open(url)
        };
        client.map_err(|source| self.client_error(source))
    }

    /// The connection handle for whatever the URL names (one Redis, Sentinel,
    /// Cluster; see [`RedisConnection`]). Connects lazily: it never waits on
    /// the network, and must be called inside a Tokio runtime.
    pub fn connect(&self, options: &ConnectOptions) -> Result<RedisConnection, RedisTargetError> {
        match self.url.topology() {
            Topology::Standalone => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_response_timeout(Some(options.response_timeout))
                    .set_number_of_retries(options.retries)
                    .set_min_delay(options.min_retry_delay)
                    .set_max_delay(options.max_retry_delay);
                let conn = ConnectionManager::new_lazy_with_config(self.client()?, config)
                    .map_err(|source| self.client_error(source))?;
                Ok(RedisConnection::single(conn))
            }
            Topology::Sentinel {
                sentinels,
                master,
                credentials,
            } => {
                let tls = self.url.is_tls();
                if tls {
                    install_crypto_provider();
                }
                let mut builder = SentinelClientBuilder::new(
                    sentinels.iter().map(|n| address(n, tls)),
                    master,
                    SentinelServerType::Master,
                )
                .map_err(|source| self.client_error(source))?;
                if let Some(user) = &credentials.username {
                    builder = builder
                        .set_client_to_redis_username(user)
                        .set_client_to_sentinel_username(user);
                }
                if let Some(password) = &credentials.password {
                    builder = builder
                        .set_client_to_redis_password(password)
                        .set_client_to_sentinel_password(password);
                }
                if tls {
                    builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
                    if self.ca.is_some() {
                        builder = builder
                            .set_client_to_redis_certificates(self.certificates())
                            .set_client_to_sentinel_certificates(self.certificates());
                    }
                }
                let client = builder
                    .build()
                    .map_err(|source| self.client_error(source))?;
                Ok(RedisConnection::sentinel(client, options))
            }
            Topology::Cluster { nodes, credentials } => {
                let tls = self.url.is_tls();
                if tls {
                    install_crypto_provider();
                }
                let mut builder = ClusterClient::builder(nodes.iter().map(|n| address(n, tls)))
                    .connection_timeout(options.connect_timeout)
                    .response_timeout(options.response_timeout)
                    .retries(u32::try_from(options.retries).unwrap_or(u32::MAX))
                    .min_retry_wait(millis(options.min_retry_delay))
                    .max_retry_wait(millis(options.max_retry_delay));
                builder = with_credentials(builder, credentials);
                if tls {
                    builder = builder.tls(TlsMode::Secure);
                    if self.ca.is_some() {
                        builder = builder.certs(self.certificates());
                    }
                }
                let client = builder
                    .build()
                    .map_err(|source| self.client_error(source))?;
                Ok(RedisConnection::cluster(client))
            }
        }
    }

    fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: None,
            root_cert: self.ca.as_ref().map(|c| c.pem.clone()),
        }
    }

    fn client_error(&self, source: redis::RedisError) -> RedisTargetError {
        RedisTargetError::Client {
            url: self.url.redacted().to_owned(),
            source,
        }
    }
}

fn with_credentials(
    mut builder: redis::cluster::ClusterClientBuilder,
    credentials: &Credentials,
) -> redis::cluster::ClusterClientBuilder {
    if let Some(user) = &credentials.username {
        builder = builder.username(user);
    }
    if let Some(password) = &credentials.password {
        builder = builder.password(password);
    }
    builder
}

/// A node's address; with TLS its certificate is always verified.
fn address(node: &Node, tls: bool) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(node.host.clone(), node.port)
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
