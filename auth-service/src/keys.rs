//! Ed25519 signing keys: persistence in `--key-dir`, rotation schedule, JWKS publication.
//!
//! Lifecycle of a key (all times are Unix seconds, passed in as `now` so tests can drive it):
//!
//! ```text
//! created ── published in JWKS ──▶ activates_at ── signs ──▶ successor activates ── still published ──▶ retires_at (deleted)
//!         └──── publish lead ────┘                                                └── access TTL + margin ──┘
//! ```
//!
//! * A successor is generated `publish_lead` seconds before the current key's interval ends, so
//!   every verifier that refreshes its JWKS at least that often knows the key before it sees a
//!   token signed with it. The JWKS `max-age` is at most half the publish lead.
//! * When a successor is generated, the current key gets `retires_at` = the successor's
//!   activation + access-token TTL + a margin: it stays published until every token it could
//!   have signed has expired, then its files are deleted.
//! * After a long downtime the overdue successor still waits out its publish lead; the old key
//!   keeps signing until then, so no token is ever signed by an unpublished key.
//!
//! Files: `<kid>.pem` (PKCS#8, mode 0600) and `<kid>.json` (metadata, written last, so a key
//! exists only once both are complete). One auth-service process owns a key directory.
//!
//! With a Postgres `--database` the keys live in the database instead
//! ([`crate::shared_keys`]), which applies the same schedule ([`plan`]) once for every replica;
//! each replica then holds a [`KeyRing`] without a directory, as the database has it.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::{
    DecodePrivateKey as _, EncodePrivateKey as _, spki::der::pem::LineEnding,
};
use jsonwebtoken::EncodingKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::tokens::ACCESS_TOKEN_TTL_SECS;

/// Extra time a retired key stays published beyond the access-token lifetime, covering the
/// verifiers' leeway and clock skew.
pub const RETIRE_MARGIN_SECS: u64 = 60;
/// Upper bound of the JWKS `Cache-Control: max-age`.
pub const MAX_JWKS_MAX_AGE_SECS: u64 = 60;

/// When keys are created, start signing and stop being published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    /// Seconds a key is the signing key.
    pub interval: u64,
    /// Seconds a new key is published before it signs (always below `interval`).
    pub publish_lead: u64,
    /// Seconds a key stays published after it stopped signing.
    pub retire_after: u64,
}

impl RotationPolicy {
    /// Builds a policy; the publish lead is capped at half the interval (and at least 1 s) so a
    /// key is always published before it signs and is the signing key for a while.
    pub fn new(interval: Duration, publish_lead: Duration) -> Self {
        let interval = interval.as_secs().max(2);
        let publish_lead = publish_lead.as_secs().clamp(1, interval / 2);
        Self {
            interval,
            publish_lead,
            retire_after: ACCESS_TOKEN_TTL_SECS + RETIRE_MARGIN_SECS,
        }
    }

    /// `Cache-Control: max-age` for the JWKS: at most half the publish lead, so a cache that
    /// honours it sees a new key well before that key signs.
    pub fn jwks_max_age(&self) -> u64 {
        (self.publish_lead / 2).clamp(1, MAX_JWKS_MAX_AGE_SECS)
    }
}

/// Persisted metadata of one key (`<kid>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyMeta {
    /// Key id: the RFC 7638 JWK thumbprint of the public key.
    pub kid: String,
    /// Always `EdDSA`.
    pub alg: String,
    /// When the key was generated (and published).
    pub created_at: u64,
    /// When the key starts signing.
    pub activates_at: u64,
    /// When the key stops being published; set once a successor exists.
    pub retires_at: Option<u64>,
}

/// One loaded key: metadata, the pre-built signing key and the public half.
pub struct KeyEntry {
    /// Metadata as persisted.
    pub meta: KeyMeta,
    encoding: EncodingKey,
    public_x: String,
}

impl std::fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print private key material.
        f.debug_struct("KeyEntry")
            .field("meta", &self.meta)
            .field("x", &self.public_x)
            .finish_non_exhaustive()
    }
}

impl KeyEntry {
    /// A key from its PKCS#8 DER form, checked against `meta.kid`.
    pub fn from_pkcs8_der(der: &[u8], meta: KeyMeta) -> Result<Self, KeyError> {
        let signing = SigningKey::from_pkcs8_der(der)
            .map_err(|e| KeyError::Encode(format!("key {}: {e}", meta.kid)))?;
        let x = URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes());
        if jwk_thumbprint(&x) != meta.kid {
            return Err(KeyError::Encode(format!(
                "key {}: kid does not match the private key",
                meta.kid
            )));
        }
        Self::from_signing_key(&signing, meta)
    }

    fn from_signing_key(key: &SigningKey, meta: KeyMeta) -> Result<Self, KeyError> {
        let der = key
            .to_pkcs8_der()
            .map_err(|e| KeyError::Encode(e.to_string()))?;
        Ok(Self {
            encoding: EncodingKey::from_ed_der(der.as_bytes()),
            public_x: URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes()),
            meta,
        })
    }

    /// Key id (`kid` header of tokens it signs).
    pub fn kid(&self) -> &str {
        &self.meta.kid
    }

    /// The pre-built `jsonwebtoken` signing key.
    pub fn encoding_key(&self) -> &EncodingKey {
        &self.encoding
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Jwk<'_> {
        Jwk {
            kty: "OKP",
            crv: "Ed25519",
            x: &self.public_x,
            kid: &self.meta.kid,
            alg: "EdDSA",
            use_: "sig",
        }
    }
}

/// A public JSON Web Key (RFC 8037 OKP / Ed25519).
#[derive(Debug, Serialize)]
pub struct Jwk<'a> {
    /// Key type, `OKP`.
    pub kty: &'static str,
    /// Curve, `Ed25519`.
    pub crv: &'static str,
    /// Public key, base64url.
    pub x: &'a str,
    /// Key id.
    pub kid: &'a str,
    /// Algorithm, `EdDSA`.
    pub alg: &'static str,
    /// Key use, `sig`.
    #[serde(rename = "use")]
    pub use_: &'static str,
}

/// A JWK Set.
#[derive(Debug, Serialize)]
pub struct JwkSet<'a> {
    /// The published keys.
    pub keys: Vec<Jwk<'a>>,
}

/// Failure to load, create or persist keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// File system failure.
    #[error("key directory {path}: {source}")]
    Io {
        /// File or directory involved.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A key file exists but cannot be used.
    #[error("key file {path} is unusable: {reason}")]
    Corrupt {
        /// File involved.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// PKCS#8 encoding failed.
    #[error("encoding a key: {0}")]
    Encode(String),
    /// The shared key table failed (Postgres down, or a statement refused).
    #[error("signing keys in the database: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored private key does not open with the `--keys-secret-file` key.
    #[error(
        "signing key {0} in the database cannot be decrypted with --keys-secret-file: every auth \
         service of a database must be given the key file the keys were stored with"
    )]
    Sealed(String),
    /// The `--keys-secret-file` was refused.
    #[error(transparent)]
    SecretsKey(#[from] gateway_database::secrets::SecretsKeyError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What [`KeyRing::maintain`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Maintenance {
    /// Key generated (and published), with its activation time.
    pub generated: Option<(String, u64)>,
    /// Keys deleted because every token they signed has expired.
    pub deleted: Vec<String>,
}

/// What the rotation schedule asks for at a moment, whatever holds the keys.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Generate a successor that activates then (the newest key then retires at `retire`'s time).
    pub generate: Option<u64>,
    /// The key to give a retirement time, and that time.
    pub retire: Option<(String, u64)>,
    /// Keys to delete: every token they signed has expired.
    pub delete: Vec<String>,
}

/// The schedule at `now` for `keys` (sorted by activation, never empty): a
/// successor `publish_lead` before the newest key's interval ends, and the
/// deletion of retired keys other than the signing one.
pub fn plan(keys: &[KeyMeta], policy: RotationPolicy, now: u64) -> Plan {
    let mut plan = Plan::default();
    let Some(newest) = keys.last() else {
        return plan;
    };
    let rotate_at = newest.activates_at + policy.interval - policy.publish_lead;
    if now >= rotate_at {
        // Never sign with a key that has not been published for the full lead time.
        let activates_at = (newest.activates_at + policy.interval).max(now + policy.publish_lead);
        plan.generate = Some(activates_at);
        plan.retire = Some((newest.kid.clone(), activates_at + policy.retire_after));
    }
    // A successor activates in the future, so it never changes which key signs now.
    let signing = keys
        .iter()
        .rev()
        .find(|k| k.activates_at <= now)
        .unwrap_or(&keys[0]);
    plan.delete = keys
        .iter()
        .filter(|k| k.kid != signing.kid && k.retires_at.is_some_and(|r| r <= now))
        .map(|k| k.kid.clone())
        .collect();
    plan
}

/// A new Ed25519 key and its metadata.
pub fn new_key(now: u64, activates_at: u64) -> (SigningKey, KeyMeta) {
    let signing = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let x = URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes());
    let meta = KeyMeta {
        kid: jwk_thumbprint(&x),
        alg: "EdDSA".to_owned(),
        created_at: now,
        activates_at,
        retires_at: None,
    };
    (signing, meta)
}

/// The keys in force, ordered by activation time: those of a key directory,
/// or (without one) the copy of the database's keys a replica signs with.
#[derive(Debug)]
pub struct KeyRing {
    /// `None` for a copy of the shared keys: the database owns them.
    dir: Option<PathBuf>,
    policy: RotationPolicy,
    keys: Vec<Arc<KeyEntry>>,
}

impl KeyRing {
    /// Loads the keys in `dir` (creating it), generates the first key if there is none, and
    /// applies the schedule once at `now`.
    pub fn load_or_init(dir: &Path, policy: RotationPolicy, now: u64) -> Result<Self, KeyError> {
        create_private_dir(dir)?;
        let mut keys = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let path = entry.map_err(io_err(dir))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                keys.push(Arc::new(load_key(&path)?));
            } else if path.extension().is_some_and(|e| e == "pem")
                && !path.with_extension("json").exists()
            {
                tracing::warn!(path = %path.display(), "ignoring key file without metadata (interrupted generation?)");
            }
        }
        keys.sort_by_key(|k| (k.meta.activates_at, k.meta.created_at));
        let mut ring = Self {
            dir: Some(dir.to_path_buf()),
            policy,
            keys,
        };
        if ring.keys.is_empty() {
            // Nothing can have cached a key yet, so the very first key signs immediately.
            let kid = ring.generate(now, now)?;
            tracing::info!(%kid, "generated the first signing key");
        }
        ring.maintain(now)?;
        Ok(ring)
    }

    /// A ring of keys held elsewhere (the shared table), with no directory.
    pub fn from_keys(policy: RotationPolicy, mut keys: Vec<Arc<KeyEntry>>) -> Self {
        keys.sort_by_key(|k| (k.meta.activates_at, k.meta.created_at));
        Self {
            dir: None,
            policy,
            keys,
        }
    }

    /// The rotation policy in force.
    pub fn policy(&self) -> RotationPolicy {
        self.policy
    }

    /// The key that signs at `now`: the most recently activated one.
    pub fn signing_key(&self, now: u64) -> Arc<KeyEntry> {
        self.keys
            .iter()
            .rev()
            .find(|k| k.meta.activates_at <= now)
            // Only reachable if the clock went backwards past the first activation.
            .or_else(|| self.keys.first())
            .cloned()
            .expect("a key ring always holds at least one key")
    }

    /// Keys published at `now`: everything not yet retired (including keys not yet signing).
    pub fn published(&self, now: u64) -> impl Iterator<Item = &Arc<KeyEntry>> {
        self.keys
            .iter()
            .filter(move |k| k.meta.retires_at.is_none_or(|r| now < r))
    }

    /// The JWKS document at `now`.
    pub fn jwks_json(&self, now: u64) -> String {
        let set = JwkSet {
            keys: self.published(now).map(|k| k.jwk()).collect(),
        };
        serde_json::to_string(&set).expect("a JWK set always serialises")
    }

    /// Generates a successor when the current interval nears its end and deletes keys whose
    /// tokens have all expired ([`plan`]), in memory and in the key directory.
    pub fn maintain(&mut self, now: u64) -> Result<Maintenance, KeyError> {
        let mut report = Maintenance::default();
        let metas: Vec<KeyMeta> = self.keys.iter().map(|k| k.meta.clone()).collect();
        let plan = plan(&metas, self.policy, now);
        if let Some(activates_at) = plan.generate {
            let kid = self.generate(now, activates_at)?;
            if let Some((old, retires_at)) = &plan.retire {
                self.set_retirement(old, *retires_at)?;
            }
            report.generated = Some((kid, activates_at));
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.keys)
            .into_iter()
            .partition(|k| plan.delete.contains(&k.meta.kid));
        self.keys = kept;
        for key in gone {
            if let Some(dir) = &self.dir {
                remove_key_files(dir, &key.meta.kid)?;
            }
            report.deleted.push(key.meta.kid.clone());
        }
        Ok(report)
    }

    /// The next time [`KeyRing::maintain`] has work to do (successor or deletion), after `now`.
    pub fn next_maintenance(&self, now: u64) -> u64 {
        let newest = &self.keys.last().expect("non-empty").meta;
        let rotate_at = newest.activates_at + self.policy.interval - self.policy.publish_lead;
        self.keys
            .iter()
            .filter_map(|k| k.meta.retires_at)
            .chain(std::iter::once(rotate_at))
            .min()
            .unwrap_or(rotate_at)
            .max(now + 1)
    }

    /// Number of keys held (published or awaiting deletion).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when no key is held (never the case after [`KeyRing::load_or_init`]).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn generate(&mut self, now: u64, activates_at: u64) -> Result<String, KeyError> {
        let (signing, meta) = new_key(now, activates_at);
        if let Some(dir) = &self.dir {
            let pem = signing
                .to_pkcs8_pem(LineEnding::LF)
                .map_err(|e| KeyError::Encode(e.to_string()))?;
            let pem_path = dir.join(format!("{}.pem", meta.kid));
            write_atomic(&pem_path, pem.as_bytes(), true)?;
            write_meta(dir, &meta)?;
        }
        let kid = meta.kid.clone();
        self.keys
            .push(Arc::new(KeyEntry::from_signing_key(&signing, meta)?));
        self.keys
            .sort_by_key(|k| (k.meta.activates_at, k.meta.created_at));
        Ok(kid)
    }

    fn set_retirement(&mut self, kid: &str, retires_at: u64) -> Result<(), KeyError> {
        let Some(pos) = self.keys.iter().position(|k| k.meta.kid == kid) else {
            return Ok(());
        };
        let old = &self.keys[pos];
        let mut meta = old.meta.clone();
        meta.retires_at = Some(retires_at);
        if let Some(dir) = &self.dir {
            write_meta(dir, &meta)?;
        }
        self.keys[pos] = Arc::new(KeyEntry {
            meta,
            encoding: old.encoding.clone(),
            public_x: old.public_x.clone(),
        });
        Ok(())
    }
}

/// RFC 7638 thumbprint of an Ed25519 JWK, used as its `kid`.
pub fn jwk_thumbprint(x: &str) -> String {
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

fn load_key(meta_path: &Path) -> Result<KeyEntry, KeyError> {
    let corrupt = |reason: String| KeyError::Corrupt {
        path: meta_path.to_path_buf(),
        reason,
    };
    let text = fs::read_to_string(meta_path).map_err(io_err(meta_path))?;
    let meta: KeyMeta = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    if meta.alg != "EdDSA" {
        return Err(corrupt(format!("unsupported alg {:?}", meta.alg)));
    }
    let pem_path = meta_path.with_extension("pem");
    let pem = fs::read_to_string(&pem_path).map_err(io_err(&pem_path))?;
    let signing = SigningKey::from_pkcs8_pem(&pem).map_err(|e| KeyError::Corrupt {
        path: pem_path.clone(),
        reason: e.to_string(),
    })?;
    let x = URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes());
    if jwk_thumbprint(&x) != meta.kid {
        return Err(corrupt("kid does not match the private key".to_owned()));
    }
    KeyEntry::from_signing_key(&signing, meta)
}

fn write_meta(dir: &Path, meta: &KeyMeta) -> Result<(), KeyError> {
    let json = serde_json::to_vec_pretty(meta).expect("metadata serialises");
    write_atomic(&dir.join(format!("{}.json", meta.kid)), &json, false)
}

fn remove_key_files(dir: &Path, kid: &str) -> Result<(), KeyError> {
    // Metadata first: a key without metadata is ignored on load.
    for ext in ["json", "pem"] {
        let path = dir.join(format!("{kid}.{ext}"));
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path)(e)),
        }
    }
    Ok(())
}

fn create_private_dir(dir: &Path) -> Result<(), KeyError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(io_err(dir))
}

/// Write to a temporary file, fsync, rename: readers see the old or the new content, never half.
fn write_atomic(path: &Path, contents: &[u8], private: bool) -> Result<(), KeyError> {
    let tmp = path.with_extension("tmp");
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(&tmp).map_err(io_err(&tmp))?;
    file.write_all(contents).map_err(io_err(&tmp))?;
    file.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RotationPolicy {
        // interval 100 s, lead 20 s; retired keys stay 960 s (TTL 900 + margin 60).
        RotationPolicy::new(Duration::from_secs(100), Duration::from_secs(20))
    }

    fn meta(kid: &str, activates_at: u64, retires_at: Option<u64>) -> KeyMeta {
        KeyMeta {
            kid: kid.into(),
            alg: "EdDSA".into(),
            created_at: activates_at,
            activates_at,
            retires_at,
        }
    }

    /// The schedule both stores apply (the key directory here, the shared table in shared_keys.rs).
    #[test]
    fn plan_generates_once_due_and_deletes_only_retired_keys_that_do_not_sign() {
        let p = policy();
        let one = [meta("a", 1000, None)];
        // Before interval - lead (100 - 20): nothing to do.
        assert_eq!(plan(&one, p, 1079), Plan::default());
        // Due: the successor activates when the interval ends, the old key retires after the TTL.
        let due = plan(&one, p, 1080);
        assert_eq!(due.generate, Some(1100));
        assert_eq!(due.retire, Some(("a".into(), 1100 + p.retire_after)));
        assert!(due.delete.is_empty());
        // Overdue after a long downtime: the successor still waits out the full lead.
        assert_eq!(plan(&one, p, 5000).generate, Some(5020));
        // A retired key goes once its time has come, but never the key that signs.
        let two = [meta("a", 1000, Some(1200)), meta("b", 1100, None)];
        assert!(plan(&two, p, 1199).delete.is_empty());
        assert_eq!(plan(&two, p, 1200).delete, ["a"]);
        let lone = [meta("a", 1000, Some(1200))];
        assert!(plan(&lone, p, 5000).delete.is_empty());
    }

    fn kids(ring: &KeyRing, now: u64) -> Vec<String> {
        ring.published(now).map(|k| k.kid().to_owned()).collect()
    }

    #[test]
    fn publish_lead_is_capped_and_bounds_max_age() {
        let p = RotationPolicy::new(Duration::from_secs(4), Duration::from_secs(120));
        assert_eq!(p.publish_lead, 2);
        assert_eq!(p.jwks_max_age(), 1);
        let p = RotationPolicy::new(Duration::from_secs(86_400), Duration::from_secs(120));
        assert_eq!(p.publish_lead, 120);
        assert_eq!(p.jwks_max_age(), MAX_JWKS_MAX_AGE_SECS);
    }

    #[test]
    fn new_key_is_published_before_it_signs_and_old_key_stays_until_its_tokens_expire() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_000_000;
        let mut ring = KeyRing::load_or_init(dir.path(), policy(), t0).unwrap();
        let first = ring.signing_key(t0).kid().to_owned();
        assert_eq!(kids(&ring, t0), vec![first.clone()]);

        // Just before the rotation point nothing happens.
        assert_eq!(ring.maintain(t0 + 79).unwrap(), Maintenance::default());
        assert_eq!(ring.next_maintenance(t0 + 79), t0 + 80);

        // At interval - lead the successor is generated and published, but does not sign yet.
        let m = ring.maintain(t0 + 80).unwrap();
        let (second, activates) = m.generated.clone().unwrap();
        assert_eq!(activates, t0 + 100);
        assert_eq!(kids(&ring, t0 + 80), vec![first.clone(), second.clone()]);
        assert_eq!(ring.signing_key(t0 + 99).kid(), first);
        assert_eq!(ring.signing_key(t0 + 100).kid(), second);

        // The first key stays published until TTL + margin after it stopped signing.
        let retire = t0 + 100 + ACCESS_TOKEN_TTL_SECS + RETIRE_MARGIN_SECS;
        assert!(kids(&ring, retire - 1).contains(&first));
        assert!(!kids(&ring, retire).contains(&first));

        // Rotations keep happening every interval; the first key is deleted once retired.
        let mut now = t0 + 80;
        while now <= retire {
            now = ring.next_maintenance(now);
            ring.maintain(now).unwrap();
        }
        assert!(!dir.path().join(format!("{first}.pem")).exists());
        assert!(!dir.path().join(format!("{first}.json")).exists());
        assert!(dir.path().join(format!("{second}.json")).exists());
        // Every published key either signs now, will sign, or signed less than TTL+margin ago.
        for key in ring.published(now) {
            if let Some(r) = key.meta.retires_at {
                assert!(r > now);
            }
        }
    }

    #[test]
    fn restart_keeps_keys_and_schedule() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 5_000;
        let mut ring = KeyRing::load_or_init(dir.path(), policy(), t0).unwrap();
        ring.maintain(t0 + 85).unwrap();
        let before: Vec<KeyMeta> = ring.keys.iter().map(|k| k.meta.clone()).collect();
        let x_before: Vec<String> = ring.keys.iter().map(|k| k.public_x.clone()).collect();
        drop(ring);

        let ring = KeyRing::load_or_init(dir.path(), policy(), t0 + 86).unwrap();
        let after: Vec<KeyMeta> = ring.keys.iter().map(|k| k.meta.clone()).collect();
        let x_after: Vec<String> = ring.keys.iter().map(|k| k.public_x.clone()).collect();
        assert_eq!(before, after);
        assert_eq!(x_before, x_after);
        assert_eq!(ring.signing_key(t0 + 86).kid(), before[0].kid);
    }

    #[test]
    fn after_a_long_downtime_the_successor_still_waits_out_its_publish_lead() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 10_000;
        let ring = KeyRing::load_or_init(dir.path(), policy(), t0).unwrap();
        let first = ring.signing_key(t0).kid().to_owned();
        drop(ring);

        let later = t0 + 10_000;
        let ring = KeyRing::load_or_init(dir.path(), policy(), later).unwrap();
        // The overdue key keeps signing while its successor is published for the full lead.
        assert_eq!(ring.signing_key(later).kid(), first);
        assert_eq!(ring.len(), 2);
        let successor = ring.keys.last().unwrap();
        assert_eq!(successor.meta.activates_at, later + 20);
        assert_eq!(ring.signing_key(later + 20).kid(), successor.kid());
    }

    #[test]
    fn jwks_holds_public_keys_only() {
        let dir = tempfile::tempdir().unwrap();
        let ring = KeyRing::load_or_init(dir.path(), policy(), 1).unwrap();
        let jwks: serde_json::Value = serde_json::from_str(&ring.jwks_json(1)).unwrap();
        let key = &jwks["keys"][0];
        let fields: Vec<&str> = key
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(fields.len(), 6, "{fields:?}");
        for f in ["kty", "crv", "x", "kid", "alg", "use"] {
            assert!(key.get(f).is_some(), "missing {f}");
        }
        assert!(key.get("d").is_none());
        assert_eq!(key["kty"], "OKP");
        assert_eq!(key["alg"], "EdDSA");
        assert_eq!(
            key["kid"].as_str().unwrap(),
            jwk_thumbprint(key["x"].as_str().unwrap())
        );
    }

    #[test]
    fn corrupt_key_files_are_reported_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let ring = KeyRing::load_or_init(dir.path(), policy(), 1).unwrap();
        let kid = ring.signing_key(1).kid().to_owned();
        fs::write(dir.path().join(format!("{kid}.pem")), "not a key").unwrap();
        let err = KeyRing::load_or_init(dir.path(), policy(), 2).unwrap_err();
        assert!(err.to_string().contains("unusable"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn private_key_files_are_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let ring = KeyRing::load_or_init(dir.path(), policy(), 1).unwrap();
        let kid = ring.signing_key(1).kid().to_owned();
        let mode = fs::metadata(dir.path().join(format!("{kid}.pem")))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
    }
}
