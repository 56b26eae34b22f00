//! Users in SQLite, or in Postgres shared by several auth services, with
//! Argon2id password hashes. Every statement is written once with `$N`
//! parameters both engines read; `on!` runs it on the engine's pool.
//!
//! Hashing and verification run on the blocking pool (they take tens of milliseconds and ~19 MiB
//! each at the argon2 crate's default parameters), bounded by a semaphore so a login flood queues
//! instead of exhausting memory. A login for a user that does not exist is verified against a
//! dummy hash with the same parameters, so it costs the same time as a wrong password.

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use argon2::Argon2;
use argon2::password_hash::{PasswordHasher as _, PasswordVerifier as _};
use gateway_database::Database;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlSafeStr as _, SqlitePool};
use tokio::sync::Semaphore;

/// Longest accepted password (bytes); longer input is refused before hashing.
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// A user as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Login name, used as the token subject.
    pub username: String,
    /// Role forwarded to backends.
    pub role: String,
}

/// What `users add` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddOutcome {
    /// A new user was created.
    Created(String),
    /// An existing user got a new password and role (`--replace`).
    Replaced(String),
}

impl std::fmt::Display for AddOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Created(n) => write!(f, "user {n:?} created"),
            Self::Replaced(n) => write!(f, "user {n:?} updated (password and role replaced)"),
        }
    }
}

/// User store failures.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// Database failure.
    #[error("user database: {0}")]
    Db(#[from] sqlx::Error),
    /// Migration failure.
    #[error("migrating the user database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Hashing failed or a stored hash is unreadable.
    #[error("password hashing: {0}")]
    Hash(String),
    /// The blocking hashing task died.
    #[error("password hashing task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// Invalid user name, role or password.
    #[error("{0}")]
    Invalid(String),
    /// The user exists and `--replace` was not given.
    #[error("user {0:?} already exists (use --replace to change its password and role)")]
    Exists(String),
    /// `users delete` of a user that does not exist.
    #[error("no user {0:?}")]
    NotFound(String),
    /// Reading the password failed.
    #[error("reading the password: {0}")]
    Io(#[from] std::io::Error),
}

/// The users' database: one SQLite file, or Postgres.
#[derive(Debug, Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs `$body` with `$p` bound to the engine's own pool.
macro_rules! on {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            Pool::Sqlite($p) => $body,
            Pool::Postgres($p) => $body,
        }
    };
}

/// Users in SQLite or Postgres.
#[derive(Debug, Clone)]
pub struct UserStore {
    pool: Pool,
    /// Same-parameter hash of a random password, verified when the user does not exist.
    dummy_hash: Arc<str>,
    hashing: Arc<Semaphore>,
    /// Argon2 verifications run (by [`UserStore::verify`]): the same count for
    /// an unknown user as for a wrong password is what makes them cost the same.
    verifications: Arc<AtomicU64>,
}

fn migration(version: i64, description: &'static str, sql: &'static str) -> Migration {
    Migration::new(
        version,
        Cow::Borrowed(description),
        MigrationType::Simple,
        sql.into_sql_str(),
        false,
    )
}

fn sqlite_migrator() -> Migrator {
    Migrator::with_migrations(vec![migration(
        1,
        "users",
        include_str!("../migrations/0001_users.sql"),
    )])
}

/// The Postgres schema: the users, and the signing keys ([`crate::shared_keys`]).
/// Its own migrations table, so the auth service and the control plane can
/// share one database (their tables have different names).
fn postgres_migrator() -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![
        migration(
            1,
            "users",
            include_str!("../migrations/postgres/0001_users.sql"),
        ),
        migration(
            2,
            "signing keys",
            include_str!("../migrations/postgres/0002_signing_keys.sql"),
        ),
    ]);
    // "dangerous" only for a database that already recorded migrations under
    // another name; Postgres support starts with this name.
    migrator.dangerous_set_table_name("_auth_service_migrations");
    migrator
}

impl UserStore {
    /// Opens (creating if needed) the SQLite file and applies migrations.
    pub async fn open(path: &Path) -> Result<Self, UserError> {
        Self::connect(&Database::sqlite(path)).await
    }

    /// Opens `database` (a SQLite file, created if needed, or Postgres) and applies migrations.
    pub async fn connect(database: &Database) -> Result<Self, UserError> {
        let pool = match database {
            Database::Sqlite(path) => {
                gateway_database::sqlite_file::prepare(path)?;
                let options = SqliteConnectOptions::from_str("sqlite:")?
                    .filename(path)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(std::time::Duration::from_secs(5));
                let pool = SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options)
                    .await?;
                sqlite_migrator().run(&pool).await?;
                Pool::Sqlite(pool)
            }
            Database::Postgres(url) => {
                let pool = gateway_database::postgres::pool(url, 8, "gateway-auth-service").await?;
                // sqlx's Postgres migrator holds an advisory lock: replicas starting together migrate once.
                postgres_migrator().run(&pool).await?;
                Pool::Postgres(pool)
            }
        };
        let permits = std::thread::available_parallelism().map_or(2, |n| n.get());
        let dummy_password: [u8; 32] = rand::random();
        let dummy_hash =
            tokio::task::spawn_blocking(move || hash_password(&dummy_password)).await??;
        Ok(Self {
            pool,
            dummy_hash: dummy_hash.into(),
            hashing: Arc::new(Semaphore::new(permits)),
            verifications: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The Postgres pool, when the users live there (the shared signing keys use it too).
    pub fn postgres_pool(&self) -> Option<PgPool> {
        match &self.pool {
            Pool::Sqlite(_) => None,
            Pool::Postgres(p) => Some(p.clone()),
        }
    }

    /// Adds a user (or replaces one with `replace`).
    pub async fn add_user(
        &self,
        username: &str,
        role: &str,
        password: String,
        replace: bool,
    ) -> Result<AddOutcome, UserError> {
        validate_username(username)?;
        validate_role(role)?;
        if password.is_empty() {
            return Err(UserError::Invalid("the password must not be empty".into()));
        }
        if password.len() > MAX_PASSWORD_BYTES {
            return Err(UserError::Invalid(format!(
                "the password must be at most {MAX_PASSWORD_BYTES} bytes"
            )));
        }
        let hash = self
            .run_hashing(move || hash_password(password.as_bytes()))
            .await??;
        let existing = self.find(username).await?.is_some();
        if existing && !replace {
            return Err(UserError::Exists(username.to_owned()));
        }
        const SQL: &str = "INSERT INTO users (username, password_hash, role) VALUES ($1, $2, $3) \
             ON CONFLICT (username) DO UPDATE SET password_hash = excluded.password_hash, role = excluded.role";
        on!(&self.pool, p => sqlx::query(SQL)
            .bind(username)
            .bind(&hash)
            .bind(role)
            .execute(p)
            .await
            .map(drop)?);
        Ok(if existing {
            AddOutcome::Replaced(username.to_owned())
        } else {
            AddOutcome::Created(username.to_owned())
        })
    }

    /// Every user, ordered by name.
    pub async fn list(&self) -> Result<Vec<User>, UserError> {
        let rows: Vec<(String, String)> = on!(&self.pool, p =>
            sqlx::query_as("SELECT username, role FROM users ORDER BY username")
                .fetch_all(p)
                .await?);
        Ok(rows
            .into_iter()
            .map(|(username, role)| User { username, role })
            .collect())
    }

    /// Removes a user. Their access tokens stay valid until they expire (at most
    /// [`crate::tokens::ACCESS_TOKEN_TTL_SECS`]); their next refresh is refused and revokes
    /// the family.
    pub async fn delete(&self, username: &str) -> Result<(), UserError> {
        let deleted = on!(&self.pool, p => sqlx::query("DELETE FROM users WHERE username = $1")
            .bind(username)
            .execute(p)
            .await?
            .rows_affected());
        if deleted == 0 {
            return Err(UserError::NotFound(username.to_owned()));
        }
        Ok(())
    }

    /// Looks a user up by name.
    pub async fn find(&self, username: &str) -> Result<Option<User>, UserError> {
        Ok(self.find_with_hash(username).await?.map(|(u, _)| u))
    }

    async fn find_with_hash(&self, username: &str) -> Result<Option<(User, String)>, UserError> {
        let row: Option<(String, String, String)> = on!(&self.pool, p =>
            sqlx::query_as("SELECT username, role, password_hash FROM users WHERE username = $1")
                .bind(username)
                .fetch_optional(p)
                .await?);
        Ok(row.map(|(username, role, hash)| (User { username, role }, hash)))
    }

    /// Checks a login. Unknown user and wrong password both give `Ok(None)` after the same work.
    pub async fn verify(&self, username: &str, password: &str) -> Result<Option<User>, UserError> {
        let found = if username.is_empty() || username.len() > 256 {
            None
        } else {
            self.find_with_hash(username).await?
        };
        let (user, hash) = match found {
            Some((user, hash)) => (Some(user), hash),
            None => (None, self.dummy_hash.to_string()),
        };
        // Over-long passwords are still hashed (truncated) so their timing looks like any other.
        let password = password.as_bytes()[..password.len().min(MAX_PASSWORD_BYTES)].to_vec();
        let verifications = Arc::clone(&self.verifications);
        let ok = self
            .run_hashing(move || {
                let ok = Argon2::default()
                    .verify_password(&password, hash.as_str())
                    .is_ok();
                verifications.fetch_add(1, Ordering::Relaxed);
                ok
            })
            .await?;
        Ok(if ok { user } else { None })
    }

    async fn run_hashing<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, UserError> {
        let _permit = self
            .hashing
            .acquire()
            .await
            .expect("semaphore never closed");
        Ok(tokio::task::spawn_blocking(f).await?)
    }
}

fn hash_password(password: &[u8]) -> Result<String, UserError> {
    Argon2::default()
        .hash_password(password)
        .map(|h| h.to_string())
        .map_err(|e| UserError::Hash(e.to_string()))
}

/// Whether `name` is a valid user name (1–64 of A–Z a–z 0–9 . _ @ -); only such names can
/// be added, so only they can ever log in.
pub fn validate_username(name: &str) -> Result<(), UserError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'));
    if ok {
        Ok(())
    } else {
        Err(UserError::Invalid(format!(
            "user name {name:?} must be 1-64 characters of A-Z a-z 0-9 . _ @ -"
        )))
    }
}

/// Whether `role` is a valid role (1–32 of a–z 0–9 _ -, starting with a letter).
pub fn validate_role(role: &str) -> Result<(), UserError> {
    let ok = (1..=32).contains(&role.len())
        && role.starts_with(|c: char| c.is_ascii_lowercase())
        && role
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(UserError::Invalid(format!(
            "role {role:?} must be 1-32 characters of a-z 0-9 _ - starting with a letter"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (tempfile::TempDir, UserStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = UserStore::open(&dir.path().join("auth.db")).await.unwrap();
        (dir, store)
    }

    /// Issue 41, item 10: the users' file (password hashes) is readable by its owner only.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_database_file_is_mode_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let (dir, _s) = store().await;
        let mode = std::fs::metadata(dir.path().join("auth.db"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn add_then_verify() {
        let (_dir, s) = store().await;
        assert_eq!(
            s.add_user("alice", "user", "wonderland".into(), false)
                .await
                .unwrap(),
            AddOutcome::Created("alice".into())
        );
        let u = s.verify("alice", "wonderland").await.unwrap().unwrap();
        assert_eq!(
            u,
            User {
                username: "alice".into(),
                role: "user".into()
            }
        );
        assert!(s.verify("alice", "wrong").await.unwrap().is_none());
        assert!(s.verify("nobody", "wonderland").await.unwrap().is_none());
        assert!(s.verify("", "").await.unwrap().is_none());

        let err = s
            .add_user("alice", "admin", "x".into(), false)
            .await
            .unwrap_err();
        assert!(matches!(err, UserError::Exists(_)), "{err}");
        assert_eq!(
            s.add_user("alice", "admin", "new".into(), true)
                .await
                .unwrap(),
            AddOutcome::Replaced("alice".into())
        );
        assert_eq!(
            s.verify("alice", "new").await.unwrap().unwrap().role,
            "admin"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn stored_hash_is_argon2id_with_default_params() {
        let (_dir, s) = store().await;
        s.add_user("bob", "admin", "builder".into(), false)
            .await
            .unwrap();
        let (_, hash) = s.find_with_hash("bob").await.unwrap().unwrap();
        let p = argon2::Params::default();
        let expected = format!(
            "$argon2id$v=19$m={},t={},p={}$",
            p.m_cost(),
            p.t_cost(),
            p.p_cost()
        );
        assert!(hash.starts_with(&expected), "{hash}");
        assert!(!hash.contains("builder"));
        assert!(s.dummy_hash.starts_with(&expected));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn bad_names_roles_and_passwords_are_refused() {
        let (_dir, s) = store().await;
        for (name, role, pw) in [
            ("", "user", "x"),
            ("a b", "user", "x"),
            ("alice", "User", "x"),
            ("alice", "", "x"),
            ("alice", "user", ""),
        ] {
            let err = s.add_user(name, role, pw.into(), false).await.unwrap_err();
            assert!(
                matches!(err, UserError::Invalid(_)),
                "{name:?} {role:?}: {err}"
            );
        }
        let long = "x".repeat(MAX_PASSWORD_BYTES + 1);
        assert!(s.add_user("alice", "user", long, false).await.is_err());
    }

    /// Not timed (a shared machine makes timings flaky): the same work is one
    /// Argon2 verification on every path, against a hash with the same
    /// parameters (`stored_hash_is_argon2id_with_default_params` checks the dummy's).
    #[tokio::test(flavor = "multi_thread")]
    async fn unknown_user_does_the_same_work_as_a_wrong_password() {
        let (_dir, s) = store().await;
        s.add_user("alice", "user", "wonderland".into(), false)
            .await
            .unwrap();
        let runs = || s.verifications.load(Ordering::Relaxed);
        let before = runs();
        assert!(s.verify("alice", "nope").await.unwrap().is_none());
        assert_eq!(runs(), before + 1, "a wrong password is verified");
        assert!(s.verify("mallory", "nope").await.unwrap().is_none());
        assert_eq!(
            runs(),
            before + 2,
            "an unknown user is verified against the dummy hash"
        );
        assert!(s.verify(&"x".repeat(300), "nope").await.unwrap().is_none());
        assert_eq!(runs(), before + 3, "an over-long name is verified too");
        assert!(s.verify("alice", "wonderland").await.unwrap().is_some());
        assert_eq!(runs(), before + 4);
    }
}
