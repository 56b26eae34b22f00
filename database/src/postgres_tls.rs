//! TLS to Postgres: what `sslmode` and `sslrootcert` of a `postgres://` URL
//! (or `PGSSLMODE`/`PGSSLROOTCERT`) do, checked before the first connection so
//! that a mistake is a clear startup error, never a silent cleartext or
//! unverified connection. TLS is rustls with ring (sqlx's
//! `tls-rustls-ring-native-roots`).
//!
//! | `sslmode`            | TLS                  | server certificate checked            |
//! |----------------------|----------------------|---------------------------------------|
//! | `verify-full`        | required             | chains to `sslrootcert` (or a system root) and names the URL's host |
//! | `verify-ca`          | required             | chains, host name not checked         |
//! | `require`            | required             | not checked                           |
//! | `prefer` (no sslmode)| if the server offers | not checked; cleartext otherwise      |
//! | `allow`, `disable`   | never                | -                                     |
//!
//! Refused before connecting: `sslrootcert` with a mode that would ignore it
//! (below `verify-ca`), an `sslrootcert` file that cannot be read or holds no
//! PEM certificate, and a host that is not loopback (nor a Unix socket) with
//! no `sslmode` at all: say `verify-full`, or name the weaker mode you accept.
//! A non-loopback host with a mode below `verify-full` is a warning.

use crate::url::PostgresUrl;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use std::net::IpAddr;
use std::path::PathBuf;

/// Why a Postgres URL's TLS settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum PostgresTlsError {
    /// The `sslrootcert` file cannot be read.
    #[error("sslrootcert {path}: cannot read it: {source}")]
    RootCertUnreadable {
        /// The file.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
    /// The `sslrootcert` file holds no certificate.
    #[error("sslrootcert {path}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it")]
    RootCertEmpty {
        /// The file.
        path: PathBuf,
    },
    /// `sslrootcert` with a mode that does not check the certificate.
    #[error(
        "sslrootcert is only used with sslmode=verify-full (or verify-ca), and sslmode is {mode}: \
         add sslmode=verify-full"
    )]
    RootCertIgnored {
        /// The effective mode.
        mode: &'static str,
    },
    /// A remote host and no `sslmode`: sqlx would fall back to cleartext, unverified.
    #[error(
        "host {host} is not loopback and the URL gives no sslmode (Postgres' default, prefer, \
         neither verifies the server nor refuses cleartext): add \
         sslmode=verify-full&sslrootcert=CA_FILE, or say sslmode=require or sslmode=disable to \
         accept an unverified or a cleartext connection"
    )]
    NoSslMode {
        /// The host.
        host: String,
    },
}

/// The TLS settings of one URL, once checked.
#[derive(Debug)]
pub(crate) struct TlsSettings {
    /// The effective mode's name, e.g. `verify-full`.
    pub(crate) mode: &'static str,
    /// Whether the server's certificate is checked against a CA.
    pub(crate) verified: bool,
    /// The host connected to.
    pub(crate) host: String,
    /// The CA file, when one is given.
    pub(crate) root_cert: Option<String>,
    /// A warning to log once: a remote host without full verification.
    pub(crate) warning: Option<String>,
}

/// Checks `url`'s TLS settings (`options` are its parsed form, environment included).
pub(crate) fn check(
    url: &PostgresUrl,
    options: &PgConnectOptions,
) -> Result<TlsSettings, PostgresTlsError> {
    let mode = options.get_ssl_mode();
    let name = mode_name(mode);
    let verified = matches!(mode, PgSslMode::VerifyCa | PgSslMode::VerifyFull);
    let query = Query::of(url.expose());
    let mode_given = query.mode || std::env::var_os("PGSSLMODE").is_some();
    let root_cert = query
        .root_cert
        .or_else(|| std::env::var("PGSSLROOTCERT").ok());
    if let Some(root) = &root_cert {
        if !verified {
            return Err(PostgresTlsError::RootCertIgnored { mode: name });
        }
        check_root_cert(root)?;
    }
    let host = options.get_host().to_owned();
    let local = options.get_socket().is_some() || is_local(&host);
    if !local && !mode_given {
        return Err(PostgresTlsError::NoSslMode { host });
    }
    let warning = (!local && !matches!(mode, PgSslMode::VerifyFull)).then(|| {
        format!(
            "Postgres host {host} with sslmode={name}: the server is not fully verified{}; \
             use sslmode=verify-full&sslrootcert=CA_FILE",
            if verified {
                ""
            } else {
                " and a man in the middle can read every query"
            }
        )
    });
    Ok(TlsSettings {
        mode: name,
        verified,
        host,
        root_cert,
        warning,
    })
}

/// What the URL's query says, as sqlx reads it (same names, same decoding).
#[derive(Default)]
struct Query {
    mode: bool,
    root_cert: Option<String>,
}

impl Query {
    fn of(url: &str) -> Self {
        let mut query = Query::default();
        let Ok(parsed) = url::Url::parse(url) else {
            return query;
        };
        for (key, value) in parsed.query_pairs() {
            match &*key {
                "sslmode" | "ssl-mode" => query.mode = true,
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                    query.root_cert = Some(value.into_owned())
                }
                _ => {}
            }
        }
        query
    }
}

/// An inline PEM (as `PGSSLROOTCERT` may be) or a readable file with a certificate in it.
fn check_root_cert(root: &str) -> Result<(), PostgresTlsError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    if root.trim_start().starts_with(BEGIN) {
        return Ok(());
    }
    let path = PathBuf::from(root);
    let pem = std::fs::read(&path).map_err(|source| PostgresTlsError::RootCertUnreadable {
        path: path.clone(),
        source,
    })?;
    if !pem.windows(BEGIN.len()).any(|w| w == BEGIN.as_bytes()) {
        return Err(PostgresTlsError::RootCertEmpty { path });
    }
    Ok(())
}

/// `localhost` or a loopback address: nothing crosses a network.
fn is_local(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.starts_with('/')
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::url::Database;

    fn checked(url: &str) -> Result<TlsSettings, PostgresTlsError> {
        let Database::Postgres(url) = url.parse::<Database>().unwrap() else {
            panic!("{url}")
        };
        check(&url, &url.options().unwrap())
    }

    fn ca_file(dir: &tempfile::TempDir, body: &str) -> String {
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, body).unwrap();
        path.display().to_string()
    }

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn verify_full_with_a_readable_ca_is_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca_file(&dir, PEM);
        let s = checked(&format!(
            "postgres://gw:pw@db.example:5432/gw?sslmode=verify-full&sslrootcert={ca}"
        ))
        .unwrap();
        assert_eq!(s.mode, "verify-full");
        assert!(s.verified);
        assert_eq!(s.host, "db.example");
        assert_eq!(s.root_cert.as_deref(), Some(ca.as_str()));
        assert!(s.warning.is_none());
    }

    #[test]
    fn bad_root_certs_are_refused_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem").display().to_string();
        let e = checked(&format!(
            "postgres://gw:pw@db.example/gw?sslmode=verify-full&sslrootcert={missing}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains(&missing) && e.contains("cannot read"), "{e}");
        let empty = ca_file(&dir, "not a certificate\n");
        let e = checked(&format!(
            "postgres://gw:pw@db.example/gw?sslmode=verify-full&sslrootcert={empty}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = checked(&format!(
            "postgres://gw:pw@db.example/gw?sslmode=require&sslrootcert={empty}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("sslmode is require"), "{e}");
        assert!(!e.contains("pw"), "{e}");
    }

    #[test]
    fn a_remote_host_needs_an_sslmode_and_weak_ones_warn() {
        let e = checked("postgres://gw:pw@db.example/gw")
            .unwrap_err()
            .to_string();
        assert!(e.contains("db.example") && e.contains("verify-full"), "{e}");
        for mode in ["require", "prefer", "disable", "verify-ca"] {
            let s = checked(&format!("postgres://gw:pw@db.example/gw?sslmode={mode}")).unwrap();
            assert!(s.warning.unwrap().contains(mode));
        }
        for local in [
            "postgres://gw:pw@127.0.0.1:5432/gw",
            "postgres://gw:pw@localhost/gw",
            "postgres://gw:pw@[::1]:5432/gw",
            "postgres://gw@%2Fvar%2Frun%2Fpostgresql/gw",
        ] {
            let s = checked(local).unwrap();
            assert!(s.warning.is_none(), "{local}");
        }
    }
}
