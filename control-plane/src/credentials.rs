//! Credentials in the configuration: API keys (made here, stored only as
//! SHA-256) and upstreams' write-only `identity_signing_secret` (carried over
//! between versions, never shown by a read), and the redaction of every read
//! (certificates' private keys included, [`crate::certificates`]).
//!
//! Why SHA-256 and not a password hash (Argon2) for API keys: a key is 32
//! random bytes from a CSPRNG, so there is nothing to brute-force that a slow
//! hash would protect (2^256 guesses either way), while every data plane
//! verifies a key on every request: a hash-map lookup of SHA-256(key) costs
//! about a microsecond, Argon2 tens of milliseconds.

use gateway_proto::v1::{ApiKey, ConfigSnapshot, Upstream};
use rand::RngCore as _;
use sha2::{Digest, Sha256};

use crate::certificates::redact_certificate;
use crate::error::StoreError;

/// Prefix of every API key, so leaked keys are easy to recognise (secret scanners).
pub const KEY_PREFIX: &str = "gw_";
/// Random bytes in a key.
pub const KEY_BYTES: usize = 32;
/// Hex digits after [`KEY_PREFIX`] kept as the key's non-secret `prefix` (32 of its 256 bits).
const SHOWN_HEX_DIGITS: usize = 8;

/// A new API key: `gw_` and 64 hex digits of CSPRNG output (rand's
/// `ThreadRng`, ChaCha12 seeded from the OS), with its SHA-256 and display prefix.
pub struct NewKey {
    /// The key itself, returned once to the caller and never stored.
    pub key: String,
    /// Lowercase hex SHA-256 of `key`.
    pub sha256: String,
    /// `gw_` and the first 8 hex digits.
    pub prefix: String,
}

impl std::fmt::Debug for NewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewKey")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Makes a new random API key.
pub fn generate_key() -> NewKey {
    let mut bytes = [0u8; KEY_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    let key = format!("{KEY_PREFIX}{}", gateway_hex::encode(bytes));
    NewKey {
        sha256: key_sha256(&key),
        prefix: key[..KEY_PREFIX.len() + SHOWN_HEX_DIGITS].to_owned(),
        key,
    }
}

/// Lowercase hex SHA-256 of a key, as stored and as data planes compute it.
pub fn key_sha256(key: &str) -> String {
    gateway_hex::encode(Sha256::digest(key.as_bytes()))
}

/// Resolves the write-only secret of `new` against the upstream of the same
/// name in the current configuration: a new secret replaces it, `clear`
/// removes it, an empty one keeps it. The output-only and input-only flags
/// are reset: they are never stored.
pub fn carry_secret(new: &mut Upstream, current: Option<&Upstream>) -> Result<(), StoreError> {
    if new.clear_identity_signing_secret && !new.identity_signing_secret.is_empty() {
        return Err(StoreError::Invalid(format!(
            "upstream \"{}\": identity_signing_secret and clear_identity_signing_secret cannot both be set",
            new.name
        )));
    }
    if new.clear_identity_signing_secret {
        new.identity_signing_secret.clear();
    } else if new.identity_signing_secret.is_empty()
        && let Some(current) = current
    {
        new.identity_signing_secret
            .clone_from(&current.identity_signing_secret);
    }
    new.clear_identity_signing_secret = false;
    new.identity_signing_secret_set = false;
    Ok(())
}

/// An upstream as operators see it: the secret replaced by `identity_signing_secret_set`.
pub fn redact_upstream(u: &Upstream) -> Upstream {
    let mut u = u.clone();
    u.identity_signing_secret_set = !u.identity_signing_secret.is_empty();
    u.identity_signing_secret.clear();
    u
}

/// An API key as operators see it: without its hash.
pub fn redact_key(k: &ApiKey) -> ApiKey {
    ApiKey {
        key_sha256: String::new(),
        ..k.clone()
    }
}

/// A snapshot as operators see it (`GetConfig`): no key hash, no signing
/// secret, no private key, `redacted` set. The content `hash` stays the stored one so it can
/// be compared with `ListConfigVersions` and the data planes' `/config`; it
/// covers secrets only as keyed digests ([`gateway_proto::config_hash`]), so
/// showing it reveals nothing about them.
pub fn redact_snapshot(s: &ConfigSnapshot) -> ConfigSnapshot {
    ConfigSnapshot {
        version: s.version,
        hash: s.hash.clone(),
        routes: s.routes.clone(),
        upstreams: s.upstreams.iter().map(redact_upstream).collect(),
        created_at: s.created_at.clone(),
        summary: s.summary.clone(),
        author: s.author.clone(),
        api_keys: s.api_keys.iter().map(redact_key).collect(),
        certificates: s.certificates.iter().map(redact_certificate).collect(),
        jwt_issuers: s.jwt_issuers.clone(),
        redacted: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_hashed() {
        let a = generate_key();
        let b = generate_key();
        assert_ne!(a.key, b.key);
        assert_eq!(a.key.len(), 3 + 64);
        assert!(a.key.starts_with("gw_"));
        assert!(a.key[3..].bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a.sha256, key_sha256(&a.key));
        assert!(gateway_proto::validate::is_sha256_hex(&a.sha256));
        assert_eq!(a.prefix, a.key[..11]);
        assert!(!format!("{a:?}").contains(&a.key));
    }

    #[test]
    fn key_hash_known_answer() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            key_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    fn upstream(secret: &str) -> Upstream {
        Upstream {
            name: "u".into(),
            identity_signing_secret: secret.into(),
            ..Default::default()
        }
    }

    #[test]
    fn secrets_carry_over_unless_replaced_or_cleared() {
        let cur = upstream("old-secret");
        let mut keep = upstream("");
        keep.identity_signing_secret_set = true; // output-only: ignored
        carry_secret(&mut keep, Some(&cur)).unwrap();
        assert_eq!(keep.identity_signing_secret, "old-secret");
        assert!(!keep.identity_signing_secret_set);

        let mut replace = upstream("new-secret");
        carry_secret(&mut replace, Some(&cur)).unwrap();
        assert_eq!(replace.identity_signing_secret, "new-secret");

        let mut clear = upstream("");
        clear.clear_identity_signing_secret = true;
        carry_secret(&mut clear, Some(&cur)).unwrap();
        assert_eq!(clear.identity_signing_secret, "");
        assert!(!clear.clear_identity_signing_secret);

        let mut both = upstream("x");
        both.clear_identity_signing_secret = true;
        assert!(matches!(
            carry_secret(&mut both, Some(&cur)),
            Err(StoreError::Invalid(_))
        ));

        let mut fresh = upstream("");
        carry_secret(&mut fresh, None).unwrap();
        assert_eq!(fresh.identity_signing_secret, "");
    }

    #[test]
    fn redaction_hides_secrets_and_hashes() {
        let s = ConfigSnapshot {
            version: 3,
            hash: "h".into(),
            upstreams: vec![upstream("top-secret-value"), upstream("")],
            api_keys: vec![ApiKey {
                name: "k".into(),
                key_sha256: "a".repeat(64),
                ..Default::default()
            }],
            certificates: vec![gateway_proto::v1::Certificate {
                name: "c".into(),
                cert_chain_pem: "chain".into(),
                private_key_pem: "-----BEGIN PRIVATE KEY-----".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = redact_snapshot(&s);
        assert_eq!(r.certificates[0].private_key_pem, "");
        assert!(r.certificates[0].private_key_set);
        assert_eq!(r.certificates[0].cert_chain_pem, "chain");
        assert!(r.redacted);
        assert_eq!((r.version, r.hash.as_str()), (3, "h"));
        assert_eq!(r.upstreams[0].identity_signing_secret, "");
        assert!(r.upstreams[0].identity_signing_secret_set);
        assert!(!r.upstreams[1].identity_signing_secret_set);
        assert_eq!(r.api_keys[0].key_sha256, "");
        assert_eq!(r.api_keys[0].name, "k");
    }
}
