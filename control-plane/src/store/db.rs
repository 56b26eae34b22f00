//! The two engines behind [`super::Store`]: one SQLite file, or a Postgres
//! database shared by several control planes.
//!
//! Every statement is written once, with `$N` parameters that both engines
//! read, and the types both map alike (`BIGINT`/`INTEGER` as `i64`,
//! `BYTEA`/`BLOB` as bytes, `TEXT`). `on!` expands a statement for each
//! engine's connection type. What differs is said here and nowhere else:
//! * opening: SQLite's WAL and `synchronous = FULL`; Postgres' short acquire
//!   timeout, so a write while Postgres is down fails fast (gRPC `UNAVAILABLE`);
//! * the schema: `migrations/` or `migrations/postgres/`;
//! * the write lock: SQLite's `BEGIN IMMEDIATE`, or a transaction-level
//!   advisory lock that every replica takes before reading the head version,
//!   so concurrent commits on two replicas serialise and versions stay gap-free;
//! * the commit's `NOTIFY`, through which other replicas learn of it (Postgres).

use crate::database::{Database, PostgresUrl};
use crate::error::StoreError;
use gateway_proto::v1::ConfigVersion;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection as _, Postgres, Row as _, SqlSafeStr as _, Sqlite};
use std::path::Path;
use std::time::Duration;

/// How long a SQLite writer waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request waits for a Postgres connection before it fails with
/// `UNAVAILABLE`: while Postgres is down, writes answer within this.
pub use gateway_database::postgres::ACQUIRE_TIMEOUT as PG_ACQUIRE_TIMEOUT;

/// The `NOTIFY` channel of committed versions; the payload is the version.
pub const PG_CHANNEL: &str = "gateway_config_versions";

/// The `NOTIFY` channel of cache purges (`PurgeCache`, not versions); the
/// payload is the purge as JSON (`follow.rs`).
pub(super) const PG_PURGE_CHANNEL: &str = "gateway_cache_purges";

/// Key of the advisory lock every Postgres writer holds for its transaction.
/// Any constant works, as long as every replica uses the same one.
const PG_WRITE_LOCK: i64 = 0x6761_7465_7761_7901; // "gateway" + 1

/// A connection pool of either engine.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// One pooled connection.
pub(crate) enum Conn {
    Sqlite(PoolConnection<Sqlite>),
    Postgres(PoolConnection<Postgres>),
}

/// An open transaction holding the write lock.
pub(crate) enum Tx<'c> {
    Sqlite(sqlx::Transaction<'c, Sqlite>),
    Postgres(sqlx::Transaction<'c, Postgres>),
}

/// A connection to run statements on.
pub(crate) enum Exec<'a> {
    Sqlite(&'a mut SqliteConnection),
    Postgres(&'a mut PgConnection),
}

/// Runs `$body` with `$c` bound to the engine's own `&mut` connection.
macro_rules! on {
    ($exec:expr, $c:ident => $body:expr) => {
        match $exec {
            Exec::Sqlite($c) => $body,
            Exec::Postgres($c) => $body,
        }
    };
}

/// One stored version, as its row holds it.
pub(crate) struct StoredVersion {
    pub version: i64,
    pub snapshot: Vec<u8>,
    pub hash: String,
    pub created_at: String,
    pub summary: String,
    pub author: String,
}

impl Pool {
    /// Opens `database` and brings its schema up to date.
    pub(crate) async fn open(database: &Database) -> Result<Self, StoreError> {
        let pool = match database {
            Database::Sqlite(path) => Pool::Sqlite(open_sqlite(path).await?),
            Database::Postgres(url) => Pool::Postgres(open_postgres(url, 8).await?),
        };
        match &pool {
            Pool::Sqlite(p) => sqlite_migrator().run(p).await?,
            // sqlx's Postgres migrator holds an advisory lock while it runs,
            // so replicas starting together migrate once.
            Pool::Postgres(p) => postgres_migrator().run(p).await?,
        }
        Ok(pool)
    }

    /// Takes a connection from the pool.
    pub(crate) async fn acquire(&self) -> Result<Conn, StoreError> {
        Ok(match self {
            Pool::Sqlite(p) => Conn::Sqlite(p.acquire().await?),
            Pool::Postgres(p) => Conn::Postgres(p.acquire().await?),
        })
    }

    /// The Postgres pool, when that is the engine.
    pub(crate) fn postgres(&self) -> Option<&PgPool> {
        match self {
            Pool::Sqlite(_) => None,
            Pool::Postgres(p) => Some(p),
        }
    }

    /// The SQLite pool (unit tests reach under the store with it).
    #[cfg(test)]
    pub(crate) fn sqlite(&self) -> &SqlitePool {
        match self {
            Pool::Sqlite(p) => p,
            Pool::Postgres(_) => panic!("the unit tests' stores are SQLite"),
        }
    }

    /// Closes every connection.
    pub(crate) async fn close(&self) {
        match self {
            Pool::Sqlite(p) => p.close().await,
            Pool::Postgres(p) => p.close().await,
        }
    }
}

/// A Postgres pool of `max` connections with the short acquire timeout and the session limits.
pub(crate) async fn open_postgres(url: &PostgresUrl, max: u32) -> Result<PgPool, StoreError> {
    Ok(gateway_database::postgres::pool(url, max, "gateway-control-plane").await?)
}

async fn open_sqlite(path: &Path) -> Result<SqlitePool, StoreError> {
    // WAL keeps the file consistent if the process dies at any moment; FULL
    // also fsyncs each commit, so a version reported and pushed survives a
    // power loss (store.rs explains why that matters).
    // Mode 0600 before SQLite opens it: it holds every version's secrets (sealed or digested).
    gateway_database::sqlite_file::prepare(path).map_err(sqlx::Error::Io)?;
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT);
    Ok(SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?)
}

impl Conn {
    /// Statements outside a transaction.
    pub(crate) fn exec(&mut self) -> Exec<'_> {
        match self {
            Conn::Sqlite(c) => Exec::Sqlite(c),
            Conn::Postgres(c) => Exec::Postgres(c),
        }
    }

    /// Begins a transaction that holds the write lock until it ends:
    /// concurrent writers, in this process or another, wait for it.
    pub(crate) async fn begin_write(&mut self) -> Result<Tx<'_>, StoreError> {
        Ok(match self {
            Conn::Sqlite(c) => Tx::Sqlite(c.begin_with("BEGIN IMMEDIATE").await?),
            Conn::Postgres(c) => {
                let mut tx = c.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(PG_WRITE_LOCK)
                    .execute(&mut *tx)
                    .await?;
                Tx::Postgres(tx)
            }
        })
    }

    /// Drops the connection instead of giving it back to the pool: a failed
    /// write may have left it in a state sqlx does not know (store.rs).
    pub(crate) fn close_on_drop(&mut self) {
        match self {
            Conn::Sqlite(c) => c.close_on_drop(),
            Conn::Postgres(c) => c.close_on_drop(),
        }
    }
}

impl Tx<'_> {
    /// Statements inside the transaction.
    pub(crate) fn exec(&mut self) -> Exec<'_> {
        match self {
            Tx::Sqlite(t) => Exec::Sqlite(t),
            Tx::Postgres(t) => Exec::Postgres(t),
        }
    }

    /// Commits, which releases the write lock (and sends the transaction's `NOTIFY`).
    pub(crate) async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Sqlite(t) => t.commit().await?,
            Tx::Postgres(t) => t.commit().await?,
        }
        Ok(())
    }

    /// Rolls back, which releases the write lock.
    pub(crate) async fn rollback(self) -> Result<(), StoreError> {
        match self {
            Tx::Sqlite(t) => t.rollback().await?,
            Tx::Postgres(t) => t.rollback().await?,
        }
        Ok(())
    }
}

const SELECT_SNAPSHOT: &str =
    "SELECT version, snapshot, hash, created_at, summary, author FROM config_versions";

impl Exec<'_> {
    /// The highest committed version, 0 when there is none.
    pub(crate) async fn head(&mut self) -> Result<u64, StoreError> {
        let v: Option<i64> = on!(self, c => sqlx::query_scalar("SELECT MAX(version) FROM config_versions")
            .fetch_one(&mut **c)
            .await?);
        v.map_or(Ok(0), from_db)
    }

    /// How many versions are stored.
    pub(crate) async fn count(&mut self) -> Result<i64, StoreError> {
        Ok(
            on!(self, c => sqlx::query_scalar("SELECT COUNT(*) FROM config_versions")
                .fetch_one(&mut **c)
                .await?),
        )
    }

    /// The newest version's row.
    pub(crate) async fn latest(&mut self) -> Result<Option<StoredVersion>, StoreError> {
        let sql = AssertSqlSafe(format!("{SELECT_SNAPSHOT} ORDER BY version DESC LIMIT 1"));
        on!(self, c => sqlx::query(sql)
            .fetch_optional(&mut **c)
            .await?
            .map(|row| stored(&row))
            .transpose())
    }

    /// One version's row.
    pub(crate) async fn version(
        &mut self,
        version: i64,
    ) -> Result<Option<StoredVersion>, StoreError> {
        let sql = AssertSqlSafe(format!("{SELECT_SNAPSHOT} WHERE version = $1"));
        on!(self, c => sqlx::query(sql)
            .bind(version)
            .fetch_optional(&mut **c)
            .await?
            .map(|row| stored(&row))
            .transpose())
    }

    /// Metadata of the newest `limit` versions, newest first.
    pub(crate) async fn list(&mut self, limit: i64) -> Result<Vec<ConfigVersion>, StoreError> {
        const SQL: &str = "SELECT version, hash, created_at, summary, author FROM config_versions \
                           ORDER BY version DESC LIMIT $1";
        on!(self, c => sqlx::query(SQL)
            .bind(limit)
            .fetch_all(&mut **c)
            .await?
            .iter()
            .map(|row| {
                Ok(ConfigVersion {
                    version: from_db(row.try_get("version")?)?,
                    hash: row.try_get("hash")?,
                    created_at: row.try_get("created_at")?,
                    summary: row.try_get("summary")?,
                    author: row.try_get("author")?,
                })
            })
            .collect())
    }

    /// Every stored version number.
    pub(crate) async fn numbers(&mut self) -> Result<Vec<i64>, StoreError> {
        Ok(
            on!(self, c => sqlx::query_scalar("SELECT version FROM config_versions ORDER BY version")
                .fetch_all(&mut **c)
                .await?),
        )
    }

    /// Appends a version (the schema refuses anything but head + 1).
    pub(crate) async fn insert(&mut self, v: &StoredVersion) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO config_versions \
                           (version, snapshot, hash, created_at, summary, author) \
                           VALUES ($1, $2, $3, $4, $5, $6)";
        on!(self, c => sqlx::query(SQL)
            .bind(v.version)
            .bind(&v.snapshot)
            .bind(&v.hash)
            .bind(&v.created_at)
            .bind(&v.summary)
            .bind(&v.author)
            .execute(&mut **c)
            .await
            .map(drop)?);
        Ok(())
    }

    /// Tells every listening replica that `version` is committed; sent when
    /// the transaction commits (nothing to do on SQLite: one process).
    pub(crate) async fn notify(&mut self, version: i64) -> Result<(), StoreError> {
        if let Exec::Postgres(c) = self {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(PG_CHANNEL)
                .bind(version.to_string())
                .execute(&mut **c)
                .await?;
        }
        Ok(())
    }

    /// Sends `payload` on the `NOTIFY` channel `channel` (Postgres only).
    pub(crate) async fn notify_on(
        &mut self,
        channel: &str,
        payload: &str,
    ) -> Result<(), StoreError> {
        if let Exec::Postgres(c) = self {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(channel)
                .bind(payload)
                .execute(&mut **c)
                .await?;
        }
        Ok(())
    }

    /// Replaces a version's hash (only when the hash key is first made).
    pub(crate) async fn set_hash(&mut self, version: i64, hash: &str) -> Result<(), StoreError> {
        on!(self, c => sqlx::query("UPDATE config_versions SET hash = $1 WHERE version = $2")
            .bind(hash)
            .bind(version)
            .execute(&mut **c)
            .await
            .map(drop)?);
        Ok(())
    }

    /// The stored hash key, if one was made.
    pub(crate) async fn hash_key(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(
            on!(self, c => sqlx::query_scalar("SELECT key FROM hash_key WHERE id = 1")
                .fetch_optional(&mut **c)
                .await?),
        )
    }

    /// Stores the hash key.
    pub(crate) async fn insert_hash_key(&mut self, key: &[u8]) -> Result<(), StoreError> {
        on!(self, c => sqlx::query("INSERT INTO hash_key (id, key) VALUES (1, $1)")
            .bind(key)
            .execute(&mut **c)
            .await
            .map(drop)?);
        Ok(())
    }

    /// The secrets key's check value (nonce, ciphertext), if a private key was ever stored.
    pub(crate) async fn key_check(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>, StoreError> {
        const SQL: &str = "SELECT nonce, ciphertext FROM secrets_key_check WHERE id = 1";
        on!(self, c => sqlx::query(SQL)
            .fetch_optional(&mut **c)
            .await?
            .map(|row| Ok((row.try_get("nonce")?, row.try_get("ciphertext")?)))
            .transpose())
    }

    /// Stores the check value unless one exists.
    pub(crate) async fn insert_key_check(
        &mut self,
        nonce: &[u8],
        ciphertext: &[u8],
    ) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO secrets_key_check (id, nonce, ciphertext) \
                           VALUES (1, $1, $2) ON CONFLICT (id) DO NOTHING";
        on!(self, c => sqlx::query(SQL)
            .bind(nonce)
            .bind(ciphertext)
            .execute(&mut **c)
            .await
            .map(drop)?);
        Ok(())
    }
}

fn stored<R>(row: &R) -> Result<StoredVersion, StoreError>
where
    R: sqlx::Row,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(StoredVersion {
        version: row.try_get("version")?,
        snapshot: row.try_get("snapshot")?,
        hash: row.try_get("hash")?,
        created_at: row.try_get("created_at")?,
        summary: row.try_get("summary")?,
        author: row.try_get("author")?,
    })
}

/// A stored version number (never negative: the schema checks it).
pub(crate) fn from_db(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative version {v}")))
}

/// A version number as stored.
pub(crate) fn to_db(version: u64) -> Result<i64, StoreError> {
    i64::try_from(version).map_err(|_| StoreError::NotFound(format!("version {version} not found")))
}

fn migration(version: i64, description: &str, sql: &'static str) -> Migration {
    Migration::new(
        version,
        description.to_owned().into(),
        MigrationType::Simple,
        AssertSqlSafe(sql).into_sql_str(),
        false,
    )
}

/// The SQLite schema, embedded in the binary (migrations/*.sql).
fn sqlite_migrator() -> Migrator {
    Migrator::with_migrations(vec![
        migration(
            1,
            "config versions",
            include_str!("../../migrations/0001_config_versions.sql"),
        ),
        migration(
            2,
            "hash key",
            include_str!("../../migrations/0002_hash_key.sql"),
        ),
        migration(
            3,
            "certificates",
            include_str!("../../migrations/0003_certificates.sql"),
        ),
    ])
}

/// The same schema for Postgres (migrations/postgres/*.sql), plus the shared
/// data-plane registry. Its own migrations table, so the control plane and
/// the auth service can share one database (their tables have different names).
fn postgres_migrator() -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![
        migration(
            1,
            "config versions",
            include_str!("../../migrations/postgres/0001_config_versions.sql"),
        ),
        migration(
            2,
            "hash key",
            include_str!("../../migrations/postgres/0002_hash_key.sql"),
        ),
        migration(
            3,
            "certificates",
            include_str!("../../migrations/postgres/0003_certificates.sql"),
        ),
        migration(
            4,
            "data-plane registry",
            include_str!("../../migrations/postgres/0004_data_planes.sql"),
        ),
    ]);
    // "dangerous" only for a database that already recorded migrations under
    // another name; Postgres support starts with this name.
    migrator.dangerous_set_table_name("_control_plane_migrations");
    migrator
}
