//! Signing keys shared by every auth service of a Postgres database (table
//! `signing_keys`, migrations/postgres/0002): all replicas sign with the
//! current key and publish the same JWKS.
//!
//! The rotation schedule is the key directory's ([`crate::keys::plan`]),
//! applied in one transaction that holds an advisory lock: the replica that
//! gets there first generates the successor, the others find it made, so a
//! rotation happens once. Each replica runs [`SharedKeys::maintain`] when its
//! copy says the schedule has work (and at least every minute), then signs
//! with the ring it got back. A successor is made `publish_lead` before it
//! signs, so every replica has it, and publishes it, before any signs with it.
//!
//! Private keys are stored sealed (AES-256-GCM, the kid as associated data)
//! with the key of `--keys-secret-file`; a replica given another key file
//! refuses to start.

use std::path::Path;
use std::sync::Arc;

use ed25519_dalek::pkcs8::EncodePrivateKey as _;
use gateway_database::secrets::SecretsKey;
use sqlx::{PgPool, Postgres, Row as _, Transaction};

use crate::keys::{
    KeyEntry, KeyError, KeyMeta, KeyRing, Maintenance, RotationPolicy, new_key, plan,
};

/// Key of the advisory lock the schedule is applied under (any constant every replica shares).
const ROTATION_LOCK: i64 = 0x6761_7465_7761_7902;

/// The shared key table.
pub struct SharedKeys {
    pool: PgPool,
    secret: SecretsKey,
    policy: RotationPolicy,
}

impl std::fmt::Debug for SharedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKeys")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// One stored key, its private half still sealed.
struct Stored {
    meta: KeyMeta,
    nonce: Vec<u8>,
    sealed: Vec<u8>,
}

impl SharedKeys {
    /// The keys in `pool`'s database, sealed with the key in `secret_file`.
    pub fn new(pool: PgPool, secret_file: &Path, policy: RotationPolicy) -> Result<Self, KeyError> {
        Ok(Self {
            pool,
            secret: SecretsKey::load(secret_file)?,
            policy,
        })
    }

    /// Applies the schedule at `now` (generating the first key of an empty
    /// table) once for every replica, and returns the keys as the database
    /// now holds them, with what this call changed.
    pub async fn maintain(&self, now: u64) -> Result<(KeyRing, Maintenance), KeyError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(ROTATION_LOCK)
            .execute(&mut *tx)
            .await?;
        let mut stored = load(&mut tx).await?;
        let mut report = Maintenance::default();
        if stored.is_empty() {
            // Nothing can have cached a key yet, so the very first key signs immediately.
            let kid = self.insert(&mut tx, &mut stored, now, now).await?;
            tracing::info!(%kid, "generated the first signing key");
        }
        let metas: Vec<KeyMeta> = stored.iter().map(|s| s.meta.clone()).collect();
        let plan = plan(&metas, self.policy, now);
        if let Some(activates_at) = plan.generate {
            let kid = self.insert(&mut tx, &mut stored, now, activates_at).await?;
            if let Some((old, retires_at)) = &plan.retire {
                sqlx::query("UPDATE signing_keys SET retires_at = $1 WHERE kid = $2")
                    .bind(to_db(*retires_at))
                    .bind(old)
                    .execute(&mut *tx)
                    .await?;
                if let Some(s) = stored.iter_mut().find(|s| &s.meta.kid == old) {
                    s.meta.retires_at = Some(*retires_at);
                }
            }
            report.generated = Some((kid, activates_at));
        }
        for kid in &plan.delete {
            sqlx::query("DELETE FROM signing_keys WHERE kid = $1")
                .bind(kid)
                .execute(&mut *tx)
                .await?;
            stored.retain(|s| &s.meta.kid != kid);
            report.deleted.push(kid.clone());
        }
        tx.commit().await?;
        let keys = stored
            .into_iter()
            .map(|s| self.open(s).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((KeyRing::from_keys(self.policy, keys), report))
    }

    /// Generates a key, stores it sealed, and adds it to `stored`.
    async fn insert(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        stored: &mut Vec<Stored>,
        now: u64,
        activates_at: u64,
    ) -> Result<String, KeyError> {
        let (signing, meta) = new_key(now, activates_at);
        let der = signing
            .to_pkcs8_der()
            .map_err(|e| KeyError::Encode(e.to_string()))?;
        let (nonce, sealed) = self.secret.seal_bytes(meta.kid.as_bytes(), der.as_bytes());
        sqlx::query(
            "INSERT INTO signing_keys (kid, alg, created_at, activates_at, retires_at, nonce, sealed_key) \
             VALUES ($1, $2, $3, $4, NULL, $5, $6)",
        )
        .bind(&meta.kid)
        .bind(&meta.alg)
        .bind(to_db(meta.created_at))
        .bind(to_db(meta.activates_at))
        .bind(&nonce)
        .bind(&sealed)
        .execute(&mut **tx)
        .await?;
        let kid = meta.kid.clone();
        stored.push(Stored {
            meta,
            nonce,
            sealed,
        });
        Ok(kid)
    }

    /// Opens a stored key.
    fn open(&self, s: Stored) -> Result<KeyEntry, KeyError> {
        let der = self
            .secret
            .open_bytes(s.meta.kid.as_bytes(), &s.nonce, &s.sealed)
            .map_err(|_| KeyError::Sealed(s.meta.kid.clone()))?;
        KeyEntry::from_pkcs8_der(&der, s.meta)
    }
}

/// Every stored key, ordered by activation.
async fn load(tx: &mut Transaction<'_, Postgres>) -> Result<Vec<Stored>, KeyError> {
    let rows = sqlx::query(
        "SELECT kid, alg, created_at, activates_at, retires_at, nonce, sealed_key \
         FROM signing_keys ORDER BY activates_at, created_at",
    )
    .fetch_all(&mut **tx)
    .await?;
    rows.iter()
        .map(|row| {
            let retires_at: Option<i64> = row.try_get("retires_at")?;
            Ok(Stored {
                meta: KeyMeta {
                    kid: row.try_get("kid")?,
                    alg: row.try_get("alg")?,
                    created_at: from_db(row.try_get("created_at")?),
                    activates_at: from_db(row.try_get("activates_at")?),
                    retires_at: retires_at.map(from_db),
                },
                nonce: row.try_get("nonce")?,
                sealed: row.try_get("sealed_key")?,
            })
        })
        .collect()
}

/// Unix seconds as stored (they fit: i64 seconds outlast the sun).
fn to_db(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn from_db(secs: i64) -> u64 {
    u64::try_from(secs).unwrap_or(0)
}
