//! `--database`: which engine holds the configuration history.
//!
//! * `sqlite://PATH`, or a bare `PATH` (the flag's form before Postgres): one
//!   SQLite file, one control plane. The default, `control-plane.db`.
//! * `postgres://user:password@host:port/db` (or `postgresql://`): a Postgres
//!   database that several control planes share.
//!
//! The password of a Postgres URL never reaches a log line: [`Database`]'s
//! `Display` and `Debug` print it as `***`. So a `postgres://` URL is only
//! read when connecting ([`crate::postgres::pool`]): refused while parsing
//! the flag, clap would print it whole, password included.

use sqlx::postgres::PgConnectOptions;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where the control plane keeps its versions.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// One SQLite file, created with its schema if missing.
    Sqlite(PathBuf),
    /// A Postgres database shared by every control plane given the same URL.
    Postgres(PostgresUrl),
}

/// A checked `postgres://` URL; shown with its password masked.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl(String);

/// Why a `--database` value was refused.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseUrlError {
    /// Empty value.
    #[error(
        "--database: empty; give sqlite://PATH, a file path, or postgres://USER:PASSWORD@HOST:PORT/DB"
    )]
    Empty,
    /// `sqlite://` without a path.
    #[error("--database: sqlite:// needs a file path, e.g. sqlite://control-plane.db")]
    NoPath,
    /// A scheme other than sqlite and postgres.
    #[error(
        "--database: unsupported scheme {0:?}; give sqlite://PATH, a file path, or \
         postgres://USER:PASSWORD@HOST:PORT/DB"
    )]
    Scheme(String),
}

impl Database {
    /// The SQLite file `path`.
    pub fn sqlite(path: impl Into<PathBuf>) -> Self {
        Database::Sqlite(path.into())
    }

    /// Whether several control planes can share this database.
    pub fn is_shared(&self) -> bool {
        matches!(self, Database::Postgres(_))
    }
}

impl PostgresUrl {
    /// The URL as given, password included: for the driver only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The driver's connection options.
    pub fn options(&self) -> Result<PgConnectOptions, sqlx::Error> {
        PgConnectOptions::from_str(&self.0)
    }
}

impl From<PathBuf> for Database {
    fn from(path: PathBuf) -> Self {
        Database::Sqlite(path)
    }
}

impl FromStr for Database {
    type Err = DatabaseUrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(DatabaseUrlError::Empty);
        }
        let Some((scheme, rest)) = s.split_once("://") else {
            // Today's form: a file path (it may contain ':' but never "://").
            return Ok(Database::Sqlite(PathBuf::from(s)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" if rest.is_empty() => Err(DatabaseUrlError::NoPath),
            // sqlite:///abs/path keeps its leading '/'; sqlite://rel/path is relative.
            "sqlite" => Ok(Database::Sqlite(PathBuf::from(rest))),
            // Not checked here: clap prints a refused value whole, password
            // included. `postgres::pool` refuses it, the password masked.
            "postgres" | "postgresql" => Ok(Database::Postgres(PostgresUrl(s.to_owned()))),
            other => Err(DatabaseUrlError::Scheme(other.to_owned())),
        }
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&mask_password(&self.0))
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgresUrl({self})")
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Database::Postgres(url) => url.fmt(f),
        }
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Database({self})")
    }
}

/// `scheme://user:***@rest`: the password between the user's ':' and the last
/// '@' of the authority is replaced (a password may itself contain '@').
fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let (userinfo, host) = authority.split_at(at);
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{host}{tail}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_sqlite_urls_are_files() {
        assert_eq!(
            "control-plane.db".parse::<Database>().unwrap(),
            Database::sqlite("control-plane.db")
        );
        assert_eq!(
            "/var/lib/gw/cp.db".parse::<Database>().unwrap(),
            Database::sqlite("/var/lib/gw/cp.db")
        );
        assert_eq!(
            "sqlite:///var/lib/gw/cp.db".parse::<Database>().unwrap(),
            Database::sqlite("/var/lib/gw/cp.db")
        );
        assert_eq!(
            "sqlite://cp.db".parse::<Database>().unwrap(),
            Database::sqlite("cp.db")
        );
        assert!(!Database::sqlite("x").is_shared());
    }

    #[test]
    fn postgres_urls_are_checked_and_masked() {
        let db: Database = "postgres://gw:s3cr@t@db.example:5432/gateway"
            .parse()
            .unwrap();
        assert!(db.is_shared());
        assert_eq!(db.to_string(), "postgres://gw:***@db.example:5432/gateway");
        assert!(!format!("{db:?}").contains("s3cr"));
        let Database::Postgres(url) = &db else {
            panic!("{db:?}")
        };
        assert_eq!(url.expose(), "postgres://gw:s3cr@t@db.example:5432/gateway");
        assert!(
            "postgresql://gw@localhost/gateway"
                .parse::<Database>()
                .unwrap()
                .is_shared()
        );
    }

    #[test]
    fn bad_values_say_what_is_accepted() {
        for (value, needle) in [
            ("", "empty"),
            ("sqlite://", "needs a file path"),
            ("mysql://x@y/z", "unsupported scheme \"mysql\""),
        ] {
            let e = value.parse::<Database>().unwrap_err().to_string();
            assert!(e.contains(needle), "{value}: {e}");
        }
    }

    #[test]
    fn a_bad_postgres_url_is_refused_when_connecting_never_echoed_by_clap() {
        let db: Database = "postgres://gw:s3cret@host:notaport/db".parse().unwrap();
        let Database::Postgres(url) = &db else {
            panic!("{db:?}")
        };
        let e = url.options().unwrap_err().to_string();
        assert!(e.contains("invalid port number"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        assert_eq!(db.to_string(), "postgres://gw:***@host:notaport/db");
    }
}
