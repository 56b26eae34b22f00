//! Versioned configuration storage in SQLite or Postgres (sqlx; the two
//! engines' differences are in `store/db.rs`).
//!
//! Every committed configuration is one row of `config_versions`; the current
//! configuration is the row with the highest version, and version 0 (no row) is
//! the empty configuration. Each mutation is one transaction that takes the
//! database's write lock first (`BEGIN IMMEDIATE` in SQLite; in Postgres a
//! transaction-level advisory lock that every control plane of the database
//! takes): load the current version, apply the change, validate the whole
//! result, insert version + 1, commit. Writers, in this process or another,
//! on this machine or (Postgres) another, serialize instead of failing at
//! commit time, and versions stay gap-free (a trigger also enforces it).
//!
//! Durability: WAL journal with `synchronous = FULL`. WAL alone already keeps the
//! file consistent if the process is killed at any moment (a torn write is just an
//! uncommitted WAL frame); FULL also fsyncs the WAL on every commit so a version
//! that was reported to an operator and pushed to data planes survives a power
//! loss. Losing it would be worse than slow: the next commit would reuse the
//! number for different content while data planes believe they already have it.
//! Commits are rare (operator changes), so the fsync costs nothing that matters.
//!
//! After each commit the new snapshot is published on a `watch` channel, which
//! is what config streams follow (no polling) and what reads are served from.
//! With Postgres the commit also sends a `NOTIFY`; every other control plane
//! of the database hears it (`store/follow.rs`), reads the new head and
//! publishes it on its own channel.
//!
//! Content hashes: every version's `hash` is [`Config::hash`] under the
//! database's own hash key (table `hash_key`, 32 random bytes made at first
//! open), so the hash every viewer sees covers secrets only through keyed
//! digests. The key lives next to the secrets it protects, in this database,
//! and nowhere else. A database written before the key existed gets the key and
//! all its hashes recomputed, in one transaction, the first time it is opened.
//!
//! Private keys: a certificate's key is stored sealed with the
//! `--secrets-key-file` key ([`crate::secrets`]), inside the version's
//! snapshot; the published snapshot holds it in the clear, for the config
//! streams. A database holding sealed keys is opened only with their key.

use crate::changes::{self, Action, Change, Kind};
use crate::clock::{now_utc, rfc3339, system_clock};
use crate::config::{Config, ConfigRef, Mutation};
use crate::database::Database;
use crate::error::StoreError;
use crate::secrets::SecretsKey;
use db::{Exec, Pool, StoredVersion, from_db, to_db};
use gateway_clock::Clock;
use gateway_proto::hash::{HASH_KEY_LEN, HashKey, plain_sha256};
use gateway_proto::v1::{ConfigSnapshot, ConfigVersion};
use rand::RngCore as _;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::{Mutex, watch};

mod db;
mod follow;

pub use db::{PG_ACQUIRE_TIMEOUT, PG_CHANNEL};
pub use follow::RESYNC_INTERVAL;

/// `author` recorded when the caller is not identified.
pub const ANONYMOUS: &str = "anonymous";

/// Default number of versions `ListConfigVersions` returns.
pub const DEFAULT_VERSION_LIMIT: u32 = 50;

/// Caller-supplied conditions of a mutation.
#[derive(Clone, Debug, Default)]
pub struct MutateOptions {
    /// Commit only if this is still the current version (compare-and-swap).
    pub expected_version: Option<u64>,
    /// Validate and diff, commit nothing.
    pub dry_run: bool,
    /// Who asks; `None` records [`ANONYMOUS`].
    pub author: Option<String>,
}

/// The result of a mutation.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The version now current; with `dry_run`, the version a commit would create.
    /// When nothing changed, the unchanged current version.
    pub version: u64,
    /// Whether a new version was written.
    pub committed: bool,
    /// What differs from the previous configuration.
    pub changes: Vec<Change>,
    /// What was accepted but deserves attention (certificates added or
    /// changed that are expired, not yet valid, or do not cover an SNI host).
    pub warnings: Vec<String>,
}

/// The configuration database and the published current snapshot.
pub struct Store {
    pool: Pool,
    /// Where `pool` leads: the commit follower opens its own listening connection.
    database: Database,
    /// Serializes this process's writers so they queue in order instead of
    /// contending for the database's write lock, and so snapshots are
    /// published in version order. The database's lock (`BEGIN IMMEDIATE`,
    /// or Postgres' advisory lock) still guards against other processes.
    writer: Mutex<()>,
    current: watch::Sender<Arc<ConfigSnapshot>>,
    clock: Arc<dyn Clock>,
    /// Key of the digests that stand in for secrets in content hashes.
    hash_key: HashKey,
    /// Seals and opens certificates' private keys (`--secrets-key-file`).
    secrets: Option<Arc<SecretsKey>>,
    /// Where cache purges announced by other control planes go (`follow.rs`).
    purges: std::sync::OnceLock<Arc<crate::purge::Purges>>,
    /// This process among the control planes on one Postgres: its own purge
    /// notifications are not handed to its streams a second time.
    origin: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("database", &self.database)
            .field("current_version", &self.current.borrow().version)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) the SQLite file, runs migrations and loads the current version.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_clock(path, system_clock()).await
    }

    /// [`Store::open`] with an injected clock for `created_at`.
    pub async fn open_with_clock(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        Self::open_with(path, clock, None).await
    }

    /// [`Store::open_with_clock`] with the key that seals certificates'
    /// private keys. Without one, a private key cannot be stored
    /// ([`StoreError::NoSecretsKey`]). A database that already holds sealed
    /// keys is opened only with their key: otherwise [`StoreError::WrongSecretsKey`].
    pub async fn open_with(
        path: &Path,
        clock: Arc<dyn Clock>,
        secrets: Option<SecretsKey>,
    ) -> Result<Self, StoreError> {
        Self::connect(&Database::sqlite(path), clock, secrets).await
    }

    /// [`Store::open_with`] for either engine: a SQLite file, or a Postgres
    /// database that other control planes may share (then
    /// [`Store::follow_commits`] keeps this one's published snapshot current).
    pub async fn connect(
        database: &Database,
        clock: Arc<dyn Clock>,
        secrets: Option<SecretsKey>,
    ) -> Result<Self, StoreError> {
        let pool = Pool::open(database).await?;
        let mut conn = pool.acquire().await?;
        check_secrets_key(&mut conn.exec(), secrets.as_ref()).await?;
        let secrets = secrets.map(Arc::new);
        let hash_key = load_or_make_hash_key(&mut conn, secrets.as_deref()).await?;
        let latest = load_latest(&mut conn.exec(), &hash_key, secrets.as_deref()).await?;
        drop(conn);
        let (current, _) = watch::channel(Arc::new(latest));
        Ok(Store {
            pool,
            database: database.clone(),
            writer: Mutex::new(()),
            current,
            clock,
            hash_key,
            secrets,
            purges: std::sync::OnceLock::new(),
            origin: rand::random(),
        })
    }

    /// Closes the connection pool (checkpointing is left to SQLite).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// The database this store writes to.
    pub fn database(&self) -> &Database {
        &self.database
    }

    /// The connection pool, when the database is Postgres (the shared data-plane registry uses it).
    pub fn postgres_pool(&self) -> Option<sqlx::PgPool> {
        self.pool.postgres().cloned()
    }

    /// The current configuration.
    pub fn current(&self) -> Arc<ConfigSnapshot> {
        self.current.borrow().clone()
    }

    /// Follows the current configuration: the receiver sees every commit (the latest one, at least).
    pub fn subscribe(&self) -> watch::Receiver<Arc<ConfigSnapshot>> {
        self.current.subscribe()
    }

    /// Whether no version has ever been committed.
    pub async fn is_empty(&self) -> Result<bool, StoreError> {
        let mut conn = self.pool.acquire().await?;
        Ok(conn.exec().count().await? == 0)
    }

    /// One version: 0 is the empty configuration; an unknown version is `NotFound`.
    pub async fn snapshot(&self, version: u64) -> Result<ConfigSnapshot, StoreError> {
        let mut conn = self.pool.acquire().await?;
        load_version(
            &mut conn.exec(),
            version,
            &self.hash_key,
            self.secrets.as_deref(),
        )
        .await
    }

    /// Metadata of the newest `limit` versions, newest first (`0` means [`DEFAULT_VERSION_LIMIT`]).
    pub async fn versions(&self, limit: u32) -> Result<Vec<ConfigVersion>, StoreError> {
        let limit = if limit == 0 {
            DEFAULT_VERSION_LIMIT
        } else {
            limit
        };
        let mut conn = self.pool.acquire().await?;
        conn.exec().list(i64::from(limit)).await
    }

    /// Applies one mutation: validates the whole resulting configuration and,
    /// unless it is a dry run or changes nothing, commits it as the next version.
    pub async fn mutate(
        &self,
        mutation: Mutation,
        options: &MutateOptions,
    ) -> Result<Outcome, StoreError> {
        if options.dry_run {
            let mut conn = self.pool.acquire().await?;
            let current = self.latest_in(&mut conn.exec()).await?;
            drop(conn);
            let planned = self
                .plan_off_runtime(current.clone(), mutation, options)
                .await?;
            let version = if planned.unchanged {
                current.version
            } else {
                current.version + 1
            };
            return Ok(Outcome {
                version,
                committed: false,
                changes: planned.changes,
                warnings: planned.warnings,
            });
        }
        self.commit(Pending::Ready(Box::new(mutation)), options)
            .await
    }

    /// Commits a new version whose content equals `version`'s (`NotFound` if it does not exist).
    pub async fn rollback(
        &self,
        version: u64,
        options: &MutateOptions,
    ) -> Result<Outcome, StoreError> {
        if version == 0 {
            return Err(StoreError::Invalid(
                "version: required; versions start at 1".into(),
            ));
        }
        self.commit(Pending::Rollback(version), options).await
    }

    /// The current version as the database sees it on `conn`. The published
    /// snapshot is used when it is that version (always with SQLite; with
    /// Postgres, unless another replica committed since), which saves
    /// decoding it again.
    async fn latest_in(&self, conn: &mut Exec<'_>) -> Result<Arc<ConfigSnapshot>, StoreError> {
        let latest = conn.head().await?;
        let cached = self.current();
        if cached.version == latest {
            Ok(cached)
        } else {
            Ok(Arc::new(
                load_latest(conn, &self.hash_key, self.secrets.as_deref()).await?,
            ))
        }
    }

    /// Publishes `snapshot` unless the published one is as new: the
    /// published version never moves backwards, whichever replica committed.
    fn publish(&self, snapshot: Arc<ConfigSnapshot>) -> bool {
        self.current.send_if_modified(|cur| {
            if snapshot.version > cur.version {
                *cur = snapshot;
                true
            } else {
                false
            }
        })
    }

    /// The write path shared by every mutation.
    async fn commit(
        &self,
        pending: Pending,
        options: &MutateOptions,
    ) -> Result<Outcome, StoreError> {
        let _writer = self.writer.lock().await;
        let mut conn = self.pool.acquire().await?;
        let outcome = self.commit_on(&mut conn, pending, options).await;
        if let Err(e @ (StoreError::Database(_) | StoreError::Unavailable(_))) = &outcome {
            // SQLite may have ended the transaction itself (a full disk, an
            // I/O error); sqlx's ROLLBACK on drop then finds none and the
            // connection stays "in a transaction" for sqlx, refusing every
            // later BEGIN. A Postgres connection may be dead. It is not given
            // back to the pool.
            tracing::warn!(error = %e, "a configuration write failed; closing its database connection");
            conn.close_on_drop();
        }
        outcome
    }

    /// [`Store::commit`]'s transaction, on `conn`.
    async fn commit_on(
        &self,
        conn: &mut db::Conn,
        pending: Pending,
        options: &MutateOptions,
    ) -> Result<Outcome, StoreError> {
        let mut tx = conn.begin_write().await?;
        let current = self.latest_in(&mut tx.exec()).await?;
        check_expected(options.expected_version, current.version)?;
        let mutation = match pending {
            Pending::Ready(m) => *m,
            // Read the old version inside the transaction, like everything else.
            Pending::Rollback(version) => {
                let old = load_version(
                    &mut tx.exec(),
                    version,
                    &self.hash_key,
                    self.secrets.as_deref(),
                )
                .await?;
                Mutation::Rollback {
                    version,
                    content: Config::new(old.routes, old.upstreams)
                        .with_certificates(old.certificates)
                        .with_jwt_issuers(old.jwt_issuers),
                }
            }
        };
        let planned = self
            .plan_off_runtime(current.clone(), mutation, options)
            .await?;
        if planned.unchanged {
            // Idempotent: re-applying the current content creates no version.
            tx.rollback().await?;
            return Ok(Outcome {
                version: current.version,
                committed: false,
                changes: planned.changes,
                warnings: planned.warnings,
            });
        }
        let version = current.version + 1;
        let created_at = rfc3339(now_utc(&*self.clock));
        let author = options.author.as_deref().unwrap_or(ANONYMOUS);
        let row = StoredVersion {
            version: to_db(version)?,
            snapshot: planned.encoded,
            hash: planned.hash,
            created_at,
            summary: planned.summary,
            author: author.to_owned(),
        };
        let mut exec = tx.exec();
        exec.insert(&row).await?;
        if let Some(secrets) = &self.secrets
            && (planned
                .config
                .certificates
                .iter()
                .any(|c| !c.private_key_pem.is_empty())
                || planned
                    .config
                    .upstreams
                    .iter()
                    .any(|u| !u.identity_signing_secret.is_empty()))
        {
            // With the first sealed secret: from now on only this key opens the database.
            let (nonce, ciphertext) = secrets.check_value();
            exec.insert_key_check(&nonce, &ciphertext).await?;
        }
        exec.notify(row.version).await?;
        tx.commit().await?;
        tracing::info!(version, summary = %row.summary, author, "committed configuration");
        for warning in &planned.warnings {
            tracing::warn!(version, %warning, "accepted with a warning");
        }
        self.publish(Arc::new(ConfigSnapshot {
            version,
            hash: row.hash,
            routes: planned.config.routes,
            upstreams: planned.config.upstreams,
            api_keys: planned.config.api_keys,
            certificates: planned.config.certificates,
            jwt_issuers: planned.config.jwt_issuers,
            created_at: row.created_at,
            summary: row.summary,
            author: row.author,
            redacted: false,
        }));
        Ok(Outcome {
            version,
            committed: true,
            changes: planned.changes,
            warnings: planned.warnings,
        })
    }
}

impl Store {
    /// [`plan`] on the blocking pool: validating and diffing 10,000 routes takes
    /// tens of milliseconds, which must not stall the config streams sharing the runtime.
    async fn plan_off_runtime(
        &self,
        current: Arc<ConfigSnapshot>,
        mutation: Mutation,
        options: &MutateOptions,
    ) -> Result<Planned, StoreError> {
        let expected_version = options.expected_version;
        let key = self.hash_key.clone();
        let secrets = self.secrets.clone();
        let now = now_utc(&*self.clock).timestamp();
        tokio::task::spawn_blocking(move || {
            plan(
                &current,
                mutation,
                expected_version,
                &key,
                secrets.as_deref(),
                now,
            )
        })
        .await
        .map_err(|e| StoreError::Internal(format!("validation task failed: {e}")))?
    }
}

/// A mutation to commit, possibly still to be read from the database.
enum Pending {
    /// Boxed: a `Route` is large (and grows with every route setting).
    Ready(Box<Mutation>),
    Rollback(u64),
}

/// A validated resulting configuration, ready to write.
struct Planned {
    config: Config,
    encoded: Vec<u8>,
    hash: String,
    summary: String,
    changes: Vec<Change>,
    warnings: Vec<String>,
    /// Same content as the current version.
    unchanged: bool,
}

/// Applies, validates, encodes (sealing private keys) and diffs a mutation;
/// `now` (Unix seconds) dates the certificate warnings.
fn plan(
    current: &ConfigSnapshot,
    mutation: Mutation,
    expected_version: Option<u64>,
    hash_key: &HashKey,
    secrets: Option<&SecretsKey>,
    now: i64,
) -> Result<Planned, StoreError> {
    check_expected(expected_version, current.version)?;
    let summary = mutation.fixed_summary();
    let old = ConfigRef::from(current);
    let mut config = mutation.apply(old)?;
    // Said before anything else: no certificate can be stored without the flag.
    if secrets.is_none() && !config.certificates.is_empty() {
        return Err(StoreError::NoSecretsKey);
    }
    let notes = config.validate()?;
    let encoded = config.encode(secrets)?;
    let hash = config.hash(hash_key);
    let changes = changes::diff(old, config.view());
    let summary = summary.unwrap_or_else(|| format!("apply: {}", changes::summarize(&changes)));
    // Warn about what this commit brings, not about every old certificate again.
    let warnings = changes
        .iter()
        .filter(|c| c.kind == Kind::Certificate && c.action != Action::Removed)
        .filter_map(|c| notes.iter().find(|n| n.name == c.name))
        .flat_map(|n| n.warnings(now))
        .collect();
    Ok(Planned {
        unchanged: hash == current.hash,
        config,
        encoded,
        hash,
        summary,
        changes,
        warnings,
    })
}

fn check_expected(expected: Option<u64>, current: u64) -> Result<(), StoreError> {
    match expected {
        Some(expected) if expected != current => {
            Err(StoreError::VersionMismatch { expected, current })
        }
        _ => Ok(()),
    }
}

/// Refuses to open a database whose private keys `secrets` cannot open: its
/// check value was sealed with another key, or no key was given at all.
async fn check_secrets_key(
    conn: &mut Exec<'_>,
    secrets: Option<&SecretsKey>,
) -> Result<(), StoreError> {
    let Some((nonce, ciphertext)) = conn.key_check().await? else {
        return Ok(());
    };
    match secrets {
        Some(key) if key.verifies(&nonce, &ciphertext) => Ok(()),
        Some(_) => Err(StoreError::WrongSecretsKey(
            "the --secrets-key-file key is not the one this database's private keys were \
             encrypted with; start with the key file it was created with"
                .into(),
        )),
        None => Err(StoreError::WrongSecretsKey(
            "this database holds certificates' private keys encrypted with a secrets key; \
             start with --secrets-key-file FILE (CONTROL_PLANE_SECRETS_KEY_FILE) naming that key"
                .into(),
        )),
    }
}

/// The database's hash key. The first open of a database without one makes
/// it (32 bytes from the OS-seeded CSPRNG) and, in the same transaction,
/// recomputes the hash of every stored version with it: those hashes were
/// plain SHA-256 over the secrets. Each old hash is checked against its
/// content first, so a corrupt row stops the open instead of being blessed.
async fn load_or_make_hash_key(
    conn: &mut db::Conn,
    secrets: Option<&SecretsKey>,
) -> Result<HashKey, StoreError> {
    // Read without the lock first: every open but the very first finds the key.
    if let Some(bytes) = conn.exec().hash_key().await? {
        return hash_key_from(bytes);
    }
    // Under the write lock, so replicas opening a new database together make one key.
    let mut tx = conn.begin_write().await?;
    let mut exec = tx.exec();
    if let Some(bytes) = exec.hash_key().await? {
        tx.rollback().await?;
        return hash_key_from(bytes);
    }
    let mut bytes = [0u8; HASH_KEY_LEN];
    rand::rng().fill_bytes(&mut bytes);
    let key = HashKey::from_bytes(bytes);
    exec.insert_hash_key(&bytes[..]).await?;
    // One row at a time: a long history of large configurations never sits in memory at once.
    let versions = exec.numbers().await?;
    for &version in &versions {
        let row = exec
            .version(version)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("version {version} vanished")))?;
        if plain_sha256(&row.snapshot) != row.hash {
            return Err(StoreError::Corrupt(format!(
                "version {version}: content does not match its hash"
            )));
        }
        let config = Config::decode(&row.snapshot, secrets)
            .map_err(|e| StoreError::Corrupt(format!("version {version}: {e}")))?;
        exec.set_hash(version, &config.hash(&key)).await?;
    }
    tx.commit().await?;
    if !versions.is_empty() {
        tracing::info!(
            versions = versions.len(),
            "made the hash key and recomputed the stored configuration hashes with it"
        );
    }
    Ok(key)
}

fn hash_key_from(bytes: Vec<u8>) -> Result<HashKey, StoreError> {
    let bytes: [u8; HASH_KEY_LEN] = bytes.try_into().map_err(|b: Vec<u8>| {
        StoreError::Corrupt(format!(
            "hash_key: {} bytes, expected {HASH_KEY_LEN}",
            b.len()
        ))
    })?;
    Ok(HashKey::from_bytes(bytes))
}

/// The empty configuration every database starts at.
fn version_zero(hash_key: &HashKey) -> ConfigSnapshot {
    ConfigSnapshot {
        version: 0,
        hash: Config::default().hash(hash_key),
        summary: "empty initial configuration".into(),
        ..Default::default()
    }
}

async fn load_latest(
    conn: &mut Exec<'_>,
    hash_key: &HashKey,
    secrets: Option<&SecretsKey>,
) -> Result<ConfigSnapshot, StoreError> {
    match conn.latest().await? {
        Some(row) => snapshot_from_row(row, hash_key, secrets),
        None => Ok(version_zero(hash_key)),
    }
}

async fn load_version(
    conn: &mut Exec<'_>,
    version: u64,
    hash_key: &HashKey,
    secrets: Option<&SecretsKey>,
) -> Result<ConfigSnapshot, StoreError> {
    if version == 0 {
        return Ok(version_zero(hash_key));
    }
    match conn.version(to_db(version)?).await? {
        Some(row) => snapshot_from_row(row, hash_key, secrets),
        None => Err(StoreError::NotFound(format!("version {version} not found"))),
    }
}

fn snapshot_from_row(
    row: StoredVersion,
    hash_key: &HashKey,
    secrets: Option<&SecretsKey>,
) -> Result<ConfigSnapshot, StoreError> {
    let version = from_db(row.version)?;
    let config = Config::decode(&row.snapshot, secrets)
        .map_err(|e| StoreError::Corrupt(format!("version {version}: {e}")))?;
    if config.hash(hash_key) != row.hash {
        return Err(StoreError::Corrupt(format!(
            "version {version}: content does not match its hash"
        )));
    }
    Ok(ConfigSnapshot {
        version,
        hash: row.hash,
        routes: config.routes,
        upstreams: config.upstreams,
        api_keys: config.api_keys,
        certificates: config.certificates,
        jwt_issuers: config.jwt_issuers,
        created_at: row.created_at,
        summary: row.summary,
        author: row.author,
        redacted: false,
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod certificate_tests;
