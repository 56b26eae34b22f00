//! Content hash of a configuration: the same routes, upstreams, API keys and
//! certificates always give the same hash, whatever the version number or the order they
//! were given in.
//!
//! The hash is shown to every viewer (`GetConfig`, `ListConfigVersions`) and
//! by the data planes' unauthenticated ops `/config`, so it must not let
//! anyone test a guess of a secret offline. Secrets are therefore never
//! hashed as they are: each one (an upstream's `identity_signing_secret`, an
//! API key's `key_sha256`, a certificate's `private_key_pem`) is first
//! replaced by a keyed digest,
//! `hex(HMAC-SHA256(key, field name || 0x00 || secret))`, under a [`HashKey`]
//! that only the control plane holds. Changing only a secret still changes
//! the hash (data planes see a new version and hash), while the hash of a
//! configuration with a guessed secret cannot be computed without the key.

use std::borrow::Cow;
use std::fmt;

use hmac::{Hmac, KeyInit as _, Mac as _};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::v1::{ApiKey, Certificate, JwtIssuer, Route, Upstream};

/// Bytes in a [`HashKey`].
pub const HASH_KEY_LEN: usize = 32;

/// Protobuf field numbers of `ConfigSnapshot` the hash covers, so the hashed
/// bytes are those of a `ConfigSnapshot` holding only these four lists.
const ROUTES_TAG: u32 = 3;
const UPSTREAMS_TAG: u32 = 4;
const API_KEYS_TAG: u32 = 8;
const CERTIFICATES_TAG: u32 = 10;
const JWT_ISSUERS_TAG: u32 = 12;

/// The secret key of the digests that stand in for secrets in
/// [`config_hash`]: random, made once per configuration database and never
/// sent anywhere. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct HashKey([u8; HASH_KEY_LEN]);

impl HashKey {
    /// A key from its bytes (which must come from a CSPRNG).
    pub fn from_bytes(bytes: [u8; HASH_KEY_LEN]) -> Self {
        HashKey(bytes)
    }

    /// The key's bytes, to store it.
    pub fn as_bytes(&self) -> &[u8; HASH_KEY_LEN] {
        &self.0
    }

    /// `hex(HMAC-SHA256(key, field || 0x00 || secret))`; empty for an empty
    /// secret, so "no secret" stays visible as such. The field name keeps the
    /// same bytes in two different fields from giving the same digest.
    pub fn secret_digest(&self, field: &str, secret: &str) -> String {
        if secret.is_empty() {
            return String::new();
        }
        let mut mac = Hmac::<sha2_hmac::Sha256>::new_from_slice(&self.0)
            .expect("HMAC takes a key of any length");
        mac.update(field.as_bytes());
        mac.update(&[0]);
        mac.update(secret.as_bytes());
        gateway_hex::encode(mac.finalize().into_bytes())
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(..)")
    }
}

/// The upstream as it is hashed: `identity_signing_secret` replaced by its
/// keyed digest (borrowed as is when it has no secret).
pub fn masked_upstream<'a>(u: &'a Upstream, key: &HashKey) -> Cow<'a, Upstream> {
    if u.identity_signing_secret.is_empty() {
        return Cow::Borrowed(u);
    }
    let mut masked = u.clone();
    masked.identity_signing_secret =
        key.secret_digest("identity_signing_secret", &u.identity_signing_secret);
    Cow::Owned(masked)
}

/// The API key as it is hashed: `key_sha256` replaced by its keyed digest.
pub fn masked_api_key<'a>(k: &'a ApiKey, key: &HashKey) -> Cow<'a, ApiKey> {
    if k.key_sha256.is_empty() {
        return Cow::Borrowed(k);
    }
    let mut masked = k.clone();
    masked.key_sha256 = key.secret_digest("key_sha256", &k.key_sha256);
    Cow::Owned(masked)
}

/// The certificate as it is hashed: `private_key_pem` replaced by its keyed
/// digest, and the output-only `private_key_set` left out (it only restates
/// whether there is a key).
pub fn masked_certificate<'a>(c: &'a Certificate, key: &HashKey) -> Cow<'a, Certificate> {
    if c.private_key_pem.is_empty() && !c.private_key_set {
        return Cow::Borrowed(c);
    }
    let mut masked = c.clone();
    masked.private_key_pem = key.secret_digest("private_key_pem", &c.private_key_pem);
    masked.private_key_set = false;
    Cow::Owned(masked)
}

/// Hex SHA-256 of the canonical encoding of a configuration with every
/// secret replaced by its keyed digest ([`masked_upstream`],
/// [`masked_api_key`], [`masked_certificate`]): the protobuf encoding of a
/// `ConfigSnapshot` holding only the routes, upstreams, API keys and
/// certificates, each list sorted by name. A configuration without
/// certificates hashes as it did before they existed.
///
/// prost encodes fields in tag order and this model has no maps, so the
/// encoding (and therefore the hash) is deterministic. The lists are
/// streamed into the digest one message at a time: nothing is copied but an
/// upstream, key or certificate that has a secret.
pub fn config_hash(
    routes: &[Route],
    upstreams: &[Upstream],
    api_keys: &[ApiKey],
    certificates: &[Certificate],
    key: &HashKey,
) -> String {
    config_hash_with_issuers(routes, upstreams, api_keys, certificates, &[], key)
}

/// [`config_hash`] over the JWT issuers too (`ConfigSnapshot` field 12, after
/// the certificates): without issuers it is exactly [`config_hash`], so the
/// hashes of versions written before issuers existed stay what they were.
pub fn config_hash_with_issuers(
    routes: &[Route],
    upstreams: &[Upstream],
    api_keys: &[ApiKey],
    certificates: &[Certificate],
    jwt_issuers: &[JwtIssuer],
    key: &HashKey,
) -> String {
    let mut routes: Vec<&Route> = routes.iter().collect();
    routes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut upstreams: Vec<&Upstream> = upstreams.iter().collect();
    upstreams.sort_by(|a, b| a.name.cmp(&b.name));
    let mut api_keys: Vec<&ApiKey> = api_keys.iter().collect();
    api_keys.sort_by(|a, b| a.name.cmp(&b.name));
    let mut certificates: Vec<&Certificate> = certificates.iter().collect();
    certificates.sort_by(|a, b| a.name.cmp(&b.name));

    let mut digest = Sha256::new();
    let mut scratch = Vec::new();
    for r in routes {
        feed(&mut digest, &mut scratch, ROUTES_TAG, r);
    }
    for u in upstreams {
        feed(
            &mut digest,
            &mut scratch,
            UPSTREAMS_TAG,
            masked_upstream(u, key).as_ref(),
        );
    }
    for k in api_keys {
        feed(
            &mut digest,
            &mut scratch,
            API_KEYS_TAG,
            masked_api_key(k, key).as_ref(),
        );
    }
    for c in certificates {
        feed(
            &mut digest,
            &mut scratch,
            CERTIFICATES_TAG,
            masked_certificate(c, key).as_ref(),
        );
    }
    let mut jwt_issuers: Vec<&JwtIssuer> = jwt_issuers.iter().collect();
    jwt_issuers.sort_by(|a, b| a.name.cmp(&b.name));
    for i in jwt_issuers {
        feed(&mut digest, &mut scratch, JWT_ISSUERS_TAG, i);
    }
    gateway_hex::encode(digest.finalize())
}

/// Adds one field (`tag`, length, message) of the encoding to the digest.
fn feed<M: Message>(digest: &mut Sha256, scratch: &mut Vec<u8>, tag: u32, message: &M) {
    scratch.clear();
    prost::encoding::message::encode(tag, message, scratch);
    digest.update(scratch.as_slice());
}

/// Hex SHA-256 of bytes as they are: the hash of a configuration before
/// secrets were masked (databases written before the hash key existed are
/// checked with it once, when their hashes are recomputed).
pub fn plain_sha256(bytes: &[u8]) -> String {
    gateway_hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_issuers_change_the_hash_and_none_keep_the_old_one() {
        let k = key(1);
        let issuer = |aud: &str| JwtIssuer {
            name: "idp".into(),
            issuer: "https://idp".into(),
            audiences: vec![aud.into()],
            ..Default::default()
        };
        let plain = config_hash(&[], &[], &[], &[], &k);
        assert_eq!(plain, config_hash_with_issuers(&[], &[], &[], &[], &[], &k));
        let with = config_hash_with_issuers(&[], &[], &[], &[], &[issuer("a")], &k);
        assert_ne!(with, plain);
        assert_ne!(
            with,
            config_hash_with_issuers(&[], &[], &[], &[], &[issuer("b")], &k)
        );
    }
    use crate::v1::{ConfigSnapshot, Instance};

    fn route(name: &str) -> Route {
        Route {
            name: name.into(),
            path_prefix: format!("/{name}"),
            upstream: "u".into(),
            ..Default::default()
        }
    }

    fn upstream(secret: &str) -> Upstream {
        Upstream {
            name: "u".into(),
            instances: vec![Instance {
                id: "i1".into(),
                url: "http://127.0.0.1:9000".into(),
                ..Default::default()
            }],
            identity_signing_secret: secret.into(),
            ..Default::default()
        }
    }

    fn key(byte: u8) -> HashKey {
        HashKey::from_bytes([byte; HASH_KEY_LEN])
    }

    /// The plain SHA-256 of a `ConfigSnapshot` encoding: what anyone can
    /// compute from a configuration, secrets included, without the key.
    fn plain(routes: &[Route], upstreams: &[Upstream], api_keys: &[ApiKey]) -> String {
        plain_sha256(
            &ConfigSnapshot {
                routes: routes.to_vec(),
                upstreams: upstreams.to_vec(),
                api_keys: api_keys.to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
    }

    #[test]
    fn order_does_not_matter_but_content_does() {
        let k = key(1);
        let a = config_hash(&[route("a"), route("b")], &[], &[], &[], &k);
        let b = config_hash(&[route("b"), route("a")], &[], &[], &[], &k);
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        let c = config_hash(&[route("a"), route("c")], &[], &[], &[], &k);
        assert_ne!(a, c);
    }

    #[test]
    fn without_secrets_the_hash_is_the_sha256_of_the_snapshot_encoding() {
        let routes = [route("a"), route("b")];
        let upstreams = [upstream("")];
        let keys = [ApiKey {
            name: "k".into(),
            subject: "s".into(),
            ..Default::default()
        }];
        assert_eq!(
            config_hash(&routes, &upstreams, &keys, &[], &key(1)),
            plain(&routes, &upstreams, &keys)
        );
        assert_eq!(
            config_hash(&[], &[], &[], &[], &key(1)),
            plain(&[], &[], &[])
        );
    }

    #[test]
    fn a_secret_changes_the_hash_but_cannot_be_checked_without_the_key() {
        let secret = "correct-horse-battery-staple-0123456789";
        let routes = [route("a")];
        let with = [upstream(secret)];
        let k = key(7);
        let hash = config_hash(&routes, &with, &[], &[], &k);
        // A new secret alone gives a new hash (data planes see the change).
        let other = config_hash(
            &routes,
            &[upstream("another-secret-of-32-characters-xx")],
            &[],
            &[],
            &k,
        );
        assert_ne!(hash, other);
        assert_ne!(hash, config_hash(&routes, &[upstream("")], &[], &[], &k));
        // Someone who guessed the secret right cannot confirm it: the plain
        // hash of the configuration with that secret is not what is shown...
        assert_ne!(hash, plain(&routes, &with, &[]));
        // ...nor is the hash under any other key (here: all zeros).
        assert_ne!(hash, config_hash(&routes, &with, &[], &[], &key(0)));
        // ...nor the plain hash with the secret replaced by its unkeyed SHA-256.
        let mut unkeyed = upstream("");
        unkeyed.identity_signing_secret = plain_sha256(secret.as_bytes());
        assert_ne!(hash, plain(&routes, &[unkeyed], &[]));
        // The same key gives the same hash: stable across restarts.
        assert_eq!(hash, config_hash(&routes, &with, &[], &[], &key(7)));
    }

    #[test]
    fn api_key_hashes_are_masked_too() {
        let api_key = |sha: &str| ApiKey {
            name: "k".into(),
            subject: "s".into(),
            role: "r".into(),
            key_sha256: sha.into(),
            ..Default::default()
        };
        let a = [api_key(&"a".repeat(64))];
        let b = [api_key(&"b".repeat(64))];
        let k = key(3);
        assert_ne!(
            config_hash(&[], &[], &a, &[], &k),
            config_hash(&[], &[], &b, &[], &k)
        );
        assert_ne!(config_hash(&[], &[], &a, &[], &k), plain(&[], &[], &a));
        assert_eq!(
            masked_api_key(&a[0], &k).key_sha256,
            k.secret_digest("key_sha256", &"a".repeat(64))
        );
    }

    #[test]
    fn certificate_keys_are_masked_and_certificates_hash_under_their_own_field() {
        let cert = |pem: &str| Certificate {
            name: "edge".into(),
            sni_hosts: vec!["api.example.com".into()],
            cert_chain_pem: "-----BEGIN CERTIFICATE-----".into(),
            private_key_pem: pem.into(),
            ..Default::default()
        };
        let k = key(4);
        let with = [cert("-----BEGIN PRIVATE KEY-----\nsecret\n")];
        let hash = config_hash(&[], &[], &[], &with, &k);
        assert_ne!(hash, config_hash(&[], &[], &[], &[], &k));
        assert_ne!(hash, config_hash(&[], &[], &[], &[cert("other")], &k));
        // The key is masked: the plain encoding does not give the hash...
        let plain_with = plain_sha256(
            &ConfigSnapshot {
                certificates: with.to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_ne!(hash, plain_with);
        // ...the masked one does, and private_key_set (output only) does not count.
        let masked = masked_certificate(&with[0], &k).into_owned();
        assert_eq!(
            masked.private_key_pem,
            k.secret_digest("private_key_pem", &with[0].private_key_pem)
        );
        let plain_masked = plain_sha256(
            &ConfigSnapshot {
                certificates: vec![masked.clone()],
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(hash, plain_masked);
        let mut shown = with[0].clone();
        shown.private_key_set = true;
        assert_eq!(hash, config_hash(&[], &[], &[], &[shown], &k));
    }

    #[test]
    fn digests_depend_on_key_field_and_secret() {
        let k = key(9);
        let d = k.secret_digest("identity_signing_secret", "s3cret");
        assert_eq!(d.len(), 64);
        assert_ne!(d, key(8).secret_digest("identity_signing_secret", "s3cret"));
        assert_ne!(d, k.secret_digest("key_sha256", "s3cret"));
        assert_ne!(d, k.secret_digest("identity_signing_secret", "s3cret!"));
        assert_eq!(k.secret_digest("identity_signing_secret", ""), "");
        assert_eq!(format!("{k:?}"), "HashKey(..)");
    }
}
