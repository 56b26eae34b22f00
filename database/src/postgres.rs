//! Postgres pools that fail fast: a request that cannot get a connection
//! within [`ACQUIRE_TIMEOUT`] (Postgres down or restarting) fails with an
//! error [`is_unreachable`] recognises, which the services answer as
//! "unavailable, retry" (gRPC `UNAVAILABLE`, HTTP 503) instead of hanging.
//! A pooled connection that died with a restart is found by sqlx's ping
//! before use and replaced, so the services recover by themselves.

use crate::postgres_tls;
use crate::url::PostgresUrl;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::time::Duration;

/// How long a request waits for a Postgres connection before it fails.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Server-side limits of every session: no statement hangs a request for
/// long, nor does waiting for another replica's lock.
const SESSION_OPTIONS: [(&str, &str); 2] = [("statement_timeout", "30s"), ("lock_timeout", "15s")];

/// A pool of at most `max` connections to `url`, named `application` in
/// `pg_stat_activity`; fails if Postgres does not answer now, if the URL's TLS
/// settings are refused (a [`sqlx::Error::Configuration`] holding a
/// [`PostgresTlsError`](crate::postgres_tls::PostgresTlsError)), or if the
/// server's certificate fails verification (a [`sqlx::Error::Tls`] that says
/// which CA and host it was checked against).
pub async fn pool(url: &PostgresUrl, max: u32, application: &str) -> Result<PgPool, sqlx::Error> {
    let options = url.options()?;
    let tls =
        postgres_tls::check(url, &options).map_err(|e| sqlx::Error::Configuration(Box::new(e)))?;
    if let Some(warning) = &tls.warning {
        tracing::warn!(database = %url, "{warning}");
    }
    let options = options
        .application_name(application)
        .options(SESSION_OPTIONS);
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| match tls_refusal(e) {
            // rustls says "invalid peer certificate: UnknownIssuer": add against what.
            sqlx::Error::Tls(reason) if tls.verified => sqlx::Error::Tls(
                format!(
                    "{reason} (sslmode={}: the server's certificate must be signed by {}{})",
                    tls.mode,
                    match tls.root_cert.as_deref() {
                        None => "a system root".to_owned(),
                        Some(pem) if pem.trim_start().starts_with("-----BEGIN") => {
                            "PGSSLROOTCERT's certificates or a system root".to_owned()
                        }
                        Some(ca) => format!("sslrootcert {ca} or a system root"),
                    },
                    if tls.mode == "verify-full" {
                        format!(" and name the host {}", tls.host)
                    } else {
                        String::new()
                    }
                )
                .into(),
            ),
            e => e,
        })
}

/// sqlx reports a handshake that rustls refused as an I/O error ("error
/// communicating with database"): call it the TLS error it is.
fn tls_refusal(e: sqlx::Error) -> sqlx::Error {
    match e {
        sqlx::Error::Io(io)
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>()) =>
        {
            let inner = io.into_inner().expect("checked: it has an inner error");
            sqlx::Error::Tls(inner)
        }
        e => e,
    }
}

/// Whether `e` says the database could not be reached, rather than that it
/// refused what was asked: no connection in time, a connection that broke,
/// or Postgres shutting down, starting up or out of connections.
pub fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE classes 08 (connection exception) and 57P (operator
        // intervention: admin_shutdown, crash_shutdown, cannot_connect_now),
        // and 53300 too_many_connections.
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || code.starts_with("57P") || code == "53300"
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_is_told_from_refused() {
        assert!(is_unreachable(&sqlx::Error::PoolTimedOut));
        assert!(is_unreachable(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!is_unreachable(&sqlx::Error::RowNotFound));
    }
}
