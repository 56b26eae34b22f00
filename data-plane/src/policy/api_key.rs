//! The API-key stage of `AUTH_API_KEY` routes: the caller's `X-API-Key` is
//! hashed (SHA-256) and looked up among the hashes of the snapshot's keys.
//!
//! Data planes never see keys, only their SHA-256 (the control plane stores
//! nothing else). A key is 32 random bytes, so an unsalted fast hash is
//! enough, and hashing before the lookup means the hash map's timing can tell
//! an attacker nothing about a real key. A revoked key disappears from the
//! next snapshot: it stops working on a replica as soon as that replica has
//! the version (one push).
//!
//! The table is built once per snapshot with every key's identity header
//! values ready, so an admitted request costs one SHA-256 of the header and
//! three header inserts of shared values.

use std::collections::HashMap;

use gateway_proto::v1::ApiKey;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest as _, Sha256};

use crate::metrics::PolicyRefusal;
use crate::policy::hooks::Identity;
pub use crate::policy::sanitize::X_API_KEY_NAME;

/// The request header holding the key (consumed: never forwarded).
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Why an `AUTH_API_KEY` request was refused (401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ApiKeyError {
    /// No `X-API-Key` header.
    #[error("an API key is required")]
    Missing,
    /// No key with that hash (wrong, revoked, or sent more than once).
    #[error("the API key is invalid or revoked")]
    Invalid,
}

impl ApiKeyError {
    /// The `reason` it is counted under in `gateway_policy_refusals_total`.
    pub fn refusal(self) -> PolicyRefusal {
        match self {
            Self::Missing => PolicyRefusal::ApiKeyMissing,
            Self::Invalid => PolicyRefusal::ApiKeyInvalid,
        }
    }
}

/// An API key of a snapshot that cannot be used (validation refuses it first;
/// kept so compiling never panics).
#[derive(Debug, thiserror::Error)]
#[error("api key {name:?}: {reason}")]
pub struct ApiKeyCompileError {
    /// The key's name.
    pub name: String,
    /// Why.
    pub reason: &'static str,
}

/// The API keys of one snapshot, by SHA-256.
#[derive(Default)]
pub struct ApiKeys {
    by_hash: HashMap<[u8; 32], Identity>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("keys", &self.by_hash.len())
            .finish()
    }
}

impl ApiKeys {
    /// Builds the table from a snapshot's keys.
    pub fn compile(keys: &[ApiKey]) -> Result<Self, ApiKeyCompileError> {
        let mut by_hash = HashMap::with_capacity(keys.len());
        for k in keys {
            let bad = |reason| ApiKeyCompileError {
                name: k.name.clone(),
                reason,
            };
            let mut hash = [0u8; 32];
            gateway_hex::decode_to_slice(&k.key_sha256, &mut hash)
                .map_err(|_| bad("key_sha256 is not 64 hex digits"))?;
            let value = |s: &str| HeaderValue::from_str(s).map_err(|_| bad("not a header value"));
            let identity = Identity {
                subject: value(&k.subject)?,
                role: value(&k.role)?,
                api_key: Some(value(&k.name)?),
            };
            if by_hash.insert(hash, identity).is_some() {
                return Err(bad("two keys have the same hash"));
            }
        }
        Ok(Self { by_hash })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The identity of the request's `X-API-Key`.
    pub fn verify(&self, headers: &HeaderMap) -> Result<&Identity, ApiKeyError> {
        let mut values = headers.get_all(&X_API_KEY).iter();
        let key = values.next().ok_or(ApiKeyError::Missing)?;
        if values.next().is_some() {
            return Err(ApiKeyError::Invalid);
        }
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_hash.get(&hash).ok_or(ApiKeyError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "gw_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn record(name: &str, key: &str) -> ApiKey {
        ApiKey {
            name: name.into(),
            subject: format!("svc-{name}"),
            role: "service".into(),
            key_sha256: gateway_hex::encode(Sha256::digest(key.as_bytes())),
            ..Default::default()
        }
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&X_API_KEY, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn known_keys_give_their_identity() {
        let keys =
            ApiKeys::compile(&[record("billing", KEY), record("other", "gw_other")]).unwrap();
        assert_eq!(keys.len(), 2);
        let id = keys.verify(&headers(&[KEY])).unwrap();
        assert_eq!(id.subject, "svc-billing");
        assert_eq!(id.role, "service");
        assert_eq!(id.api_key.as_ref().unwrap(), "billing");
        assert_eq!(format!("{keys:?}"), "ApiKeys { keys: 2 }");
    }

    #[test]
    fn missing_unknown_and_repeated_keys_are_refused() {
        let keys = ApiKeys::compile(&[record("billing", KEY)]).unwrap();
        assert_eq!(keys.verify(&headers(&[])), Err(ApiKeyError::Missing));
        assert_eq!(
            keys.verify(&headers(&["gw_nope"])),
            Err(ApiKeyError::Invalid)
        );
        assert_eq!(
            keys.verify(&headers(&[&KEY[..KEY.len() - 1]])),
            Err(ApiKeyError::Invalid)
        );
        assert_eq!(
            keys.verify(&headers(&[KEY, KEY])),
            Err(ApiKeyError::Invalid)
        );
        assert_eq!(
            ApiKeys::default().verify(&headers(&[KEY])),
            Err(ApiKeyError::Invalid)
        );
        assert_eq!(ApiKeyError::Missing.refusal(), PolicyRefusal::ApiKeyMissing);
    }

    #[test]
    fn bad_records_do_not_compile() {
        let mut r = record("a", KEY);
        r.key_sha256 = "zz".into();
        assert!(ApiKeys::compile(&[r]).is_err());
        assert!(ApiKeys::compile(&[record("a", KEY), record("b", KEY)]).is_err());
    }
}
