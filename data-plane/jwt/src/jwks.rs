//! Fetching an issuer's JWKS (directly, or through its OpenID Connect discovery document) and
//! turning it into pre-built decoding keys, each pinned to the algorithms its type admits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tokio_rustls::TlsConnector;

use crate::tls::{JwksConnector, chain};

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 256 * 1024;

/// Published keys by `kid`, each decoding key built once with the algorithms it may verify.
pub(crate) type KeySet = HashMap<Arc<str>, Arc<Key>>;

/// One published key: its decoding key and the algorithms pinned to it, taken from the
/// JWK's `kty` / `crv` / `alg` and the issuer's allowed list, never from a token.
pub(crate) struct Key {
    pub(crate) decoding: DecodingKey,
    pub(crate) algs: AlgSet,
}

/// The algorithms this crate verifies: EdDSA (Ed25519), ES256 (P-256), ES384 (P-384),
/// RS256 and PS256 (RSA, 2048 to 8192 bits).
pub const SUPPORTED_ALGORITHMS: [Algorithm; 5] = [
    Algorithm::EdDSA,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::RS256,
    Algorithm::PS256,
];

/// A set of [`SUPPORTED_ALGORITHMS`], one bit each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AlgSet(u8);

impl AlgSet {
    pub(crate) fn of(algs: &[Algorithm]) -> Self {
        Self(algs.iter().filter_map(|&a| bit(a)).fold(0, |m, b| m | b))
    }
    pub(crate) fn contains(self, alg: Algorithm) -> bool {
        bit(alg).is_some_and(|b| self.0 & b != 0)
    }
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }
    fn and(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
}

fn bit(alg: Algorithm) -> Option<u8> {
    SUPPORTED_ALGORITHMS
        .iter()
        .position(|&a| a == alg)
        .map(|i| 1 << i)
}

#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
    n: Option<String>,
    e: Option<String>,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
}

/// Length of a base64url field in bytes (leading zero bytes of an RSA modulus not counted).
fn decoded_len(field: &str, strip_zeros: bool) -> Option<usize> {
    let bytes = URL_SAFE_NO_PAD.decode(field).ok()?;
    let skip = if strip_zeros {
        bytes.iter().take_while(|&&b| b == 0).count()
    } else {
        0
    };
    Some(bytes.len() - skip)
}

/// The algorithms a JWK's type admits and its decoding key; `None` (skipped) when the key is
/// not a usable signing key.
fn key_of(jwk: &Jwk) -> Option<(AlgSet, Result<DecodingKey, jsonwebtoken::errors::Error>)> {
    let named = |alg: Algorithm| {
        // A JWK's own `alg`, when given, narrows the key to that one algorithm.
        jwk.alg
            .as_deref()
            .is_none_or(|a| a.parse::<Algorithm>().ok() == Some(alg))
    };
    match (jwk.kty.as_deref()?, jwk.crv.as_deref()) {
        ("OKP", Some("Ed25519")) => {
            let x = jwk.x.as_deref()?;
            (named(Algorithm::EdDSA) && decoded_len(x, false) == Some(32)).then(|| {
                (
                    AlgSet::of(&[Algorithm::EdDSA]),
                    DecodingKey::from_ed_components(x),
                )
            })
        }
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (alg, len) = if crv == "P-256" {
                (Algorithm::ES256, 32)
            } else {
                (Algorithm::ES384, 48)
            };
            let (x, y) = (jwk.x.as_deref()?, jwk.y.as_deref()?);
            (named(alg) && decoded_len(x, false) == Some(len) && decoded_len(y, false) == Some(len))
                .then(|| (AlgSet::of(&[alg]), DecodingKey::from_ec_components(x, y)))
        }
        ("RSA", _) => {
            let (n, e) = (jwk.n.as_deref()?, jwk.e.as_deref()?);
            let bits = decoded_len(n, true)? * 8;
            if !(2048..=8192).contains(&bits) {
                return None;
            }
            let algs = [Algorithm::RS256, Algorithm::PS256]
                .into_iter()
                .filter(|&a| named(a))
                .collect::<Vec<_>>();
            Some((AlgSet::of(&algs), DecodingKey::from_rsa_components(n, e)))
        }
        _ => None,
    }
}

/// Builds the key set from a JWKS document. Only signing keys with a `kid` whose type admits
/// one of `allowed` are taken (Ed25519 for EdDSA, P-256 for ES256, P-384 for ES384, RSA of
/// 2048 to 8192 bits for RS256 / PS256, narrowed by the JWK's `alg` when it has one); other
/// keys (encryption keys, HMAC secrets, other curves, short RSA moduli) are skipped.
pub(crate) fn parse_jwks(body: &[u8], allowed: AlgSet) -> Result<KeySet, String> {
    let set: JwkSet =
        serde_json::from_slice(body).map_err(|e| format!("JWKS is not valid JSON: {e}"))?;
    let mut keys = KeySet::with_capacity(set.keys.len());
    for jwk in set.keys {
        let Some(kid) = jwk.kid.clone() else {
            continue;
        };
        if jwk.use_.as_deref().is_some_and(|u| u != "sig") {
            tracing::debug!(%kid, "skipping JWKS key that is not a signing key");
            continue;
        }
        let Some((algs, key)) = key_of(&jwk) else {
            tracing::debug!(%kid, "skipping JWKS key of an unsupported type or size");
            continue;
        };
        let algs = algs.and(allowed);
        if algs.is_empty() {
            tracing::debug!(%kid, "skipping JWKS key for algorithms this issuer does not allow");
            continue;
        }
        let decoding = key.map_err(|e| format!("key {kid}: {e}"))?;
        keys.insert(kid.into(), Arc::new(Key { decoding, algs }));
    }
    Ok(keys)
}

/// Where the keys come from: the JWKS itself, or an OpenID Connect discovery document
/// (`/.well-known/openid-configuration`) whose `jwks_uri` names it.
pub(crate) enum Source {
    Jwks(Uri),
    Discovery {
        uri: Uri,
        /// The discovery document's `issuer` must be exactly this (OpenID Connect Discovery §4.3).
        issuer: String,
        /// Hosts besides `uri`'s that its `jwks_uri` may name.
        jwks_hosts: Vec<String>,
    },
}

#[derive(Deserialize)]
struct DiscoveryDocument {
    issuer: String,
    jwks_uri: String,
}

/// JWKS client: plain HTTP (the auth service on a private network), or
/// HTTPS when `tls` is given (see `tls.rs`).
pub(crate) struct JwksClient {
    client: Client<JwksConnector, Empty<Bytes>>,
    source: Source,
    allowed: AlgSet,
    timeout: Duration,
}

impl JwksClient {
    pub(crate) fn new(
        source: Source,
        allowed: AlgSet,
        timeout: Duration,
        tls: Option<TlsConnector>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        // The scheme was checked when the verifier was built; https:// gets TLS on top.
        connector.enforce_http(false);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1)
            .build(JwksConnector::new(connector, tls));
        Self {
            client,
            source,
            allowed,
            timeout,
        }
    }

    /// Fetches and parses the JWKS (after the discovery document, when that is the source),
    /// within the configured timeout. Also returns the JWKS response's `Cache-Control: max-age`,
    /// which paces the background refresh.
    pub(crate) async fn fetch(&self) -> Result<(KeySet, Option<Duration>), String> {
        let what = match &self.source {
            Source::Jwks(uri) | Source::Discovery { uri, .. } => uri,
        };
        tokio::time::timeout(self.timeout, self.fetch_inner())
            .await
            .map_err(|_| format!("fetching {what} timed out after {:?}", self.timeout))?
    }

    async fn fetch_inner(&self) -> Result<(KeySet, Option<Duration>), String> {
        let jwks_uri = match &self.source {
            Source::Jwks(uri) => uri.clone(),
            Source::Discovery {
                uri,
                issuer,
                jwks_hosts,
            } => {
                let (body, _) = self.get(uri, "application/json").await?;
                let doc: DiscoveryDocument = serde_json::from_slice(&body)
                    .map_err(|e| format!("{uri}: not an OpenID Connect discovery document: {e}"))?;
                if doc.issuer != *issuer {
                    return Err(format!(
                        "{uri}: the discovery document's issuer {:?} is not {issuer:?}",
                        doc.issuer
                    ));
                }
                let jwks: Uri = doc
                    .jwks_uri
                    .parse()
                    .map_err(|_| format!("{uri}: jwks_uri {:?} is not a URL", doc.jwks_uri))?;
                // The TLS settings were chosen for the discovery URL's scheme.
                if jwks.scheme() != uri.scheme() || jwks.host().is_none() {
                    return Err(format!(
                        "{uri}: jwks_uri {:?} must be absolute and use the discovery URL's scheme",
                        doc.jwks_uri
                    ));
                }
                let host = jwks.host().unwrap_or_default();
                let same = |h: &str| h.eq_ignore_ascii_case(host);
                if !same(uri.host().unwrap_or_default()) && !jwks_hosts.iter().any(|h| same(h)) {
                    return Err(format!(
                        "{uri}: jwks_uri {:?} is on host {host:?}, neither the discovery URL's nor one of the issuer's jwks_hosts",
                        doc.jwks_uri
                    ));
                }
                jwks
            }
        };
        let (body, max_age) = self
            .get(&jwks_uri, "application/jwk-set+json, application/json")
            .await?;
        Ok((parse_jwks(&body, self.allowed)?, max_age))
    }

    /// One GET: the body (bounded) and the response's `Cache-Control: max-age`.
    async fn get(&self, uri: &Uri, accept: &str) -> Result<(Bytes, Option<Duration>), String> {
        let req = Request::get(uri.clone())
            .header(header::ACCEPT, accept)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("fetching {uri}: {}", chain(&e)))?;
        if resp.status() != StatusCode::OK {
            return Err(format!("fetching {uri}: HTTP {}", resp.status()));
        }
        let max_age = resp
            .headers()
            .get(header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(max_age);
        let body = Limited::new(resp.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading {uri}: {}", chain(&*e)))?
            .to_bytes();
        Ok((body, max_age))
    }
}

/// The `max-age` directive of a `Cache-Control` value.
fn max_age(cache_control: &str) -> Option<Duration> {
    cache_control.split(',').find_map(|directive| {
        let (name, value) = directive.trim().split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("max-age") {
            return None;
        }
        value
            .trim()
            .trim_matches('"')
            .parse()
            .ok()
            .map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ed25519_signing_keys_are_taken() {
        let x = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let doc = format!(
            r#"{{"keys":[
            {{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"good","alg":"EdDSA","use":"sig"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"no-alg"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"enc","use":"enc"}},
            {{"kty":"OKP","crv":"X25519","x":"{x}","kid":"x25519"}},
            {{"kty":"RSA","n":"abc","e":"AQAB","kid":"rsa"}},
            {{"kty":"oct","k":"c2VjcmV0","kid":"hmac"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"hs","alg":"HS256"}},
            {{"kty":"OKP","crv":"Ed25519","x":"AAAA","kid":"short"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{x}"}}
        ]}}"#
        );
        let keys = parse_jwks(doc.as_bytes(), AlgSet::of(&[Algorithm::EdDSA])).unwrap();
        let mut kids: Vec<&str> = keys.keys().map(|k| &**k).collect();
        kids.sort();
        assert_eq!(kids, vec!["good", "no-alg"]);
    }

    #[test]
    fn each_key_is_pinned_by_its_type_and_the_allowed_list() {
        let b = |n: usize| URL_SAFE_NO_PAD.encode(vec![7u8; n]);
        let (x32, x48, n2048, n1024) = (b(32), b(48), b(256), b(128));
        let doc = format!(
            r#"{{"keys":[
            {{"kty":"EC","crv":"P-256","x":"{x32}","y":"{x32}","kid":"p256"}},
            {{"kty":"EC","crv":"P-384","x":"{x48}","y":"{x48}","kid":"p384"}},
            {{"kty":"EC","crv":"P-256","x":"{x48}","y":"{x48}","kid":"p256-wrong-size"}},
            {{"kty":"EC","crv":"P-256","x":"{x32}","y":"{x32}","kid":"p256-says-es384","alg":"ES384"}},
            {{"kty":"RSA","n":"{n2048}","e":"AQAB","kid":"rsa"}},
            {{"kty":"RSA","n":"{n2048}","e":"AQAB","kid":"rsa-ps","alg":"PS256"}},
            {{"kty":"RSA","n":"{n1024}","e":"AQAB","kid":"rsa-short"}},
            {{"kty":"RSA","n":"{n2048}","e":"AQAB","kid":"rsa-enc","use":"enc"}}
        ]}}"#
        );
        let all = AlgSet::of(&SUPPORTED_ALGORITHMS);
        let keys = parse_jwks(doc.as_bytes(), all).unwrap();
        let mut kids: Vec<&str> = keys.keys().map(|k| &**k).collect();
        kids.sort();
        assert_eq!(kids, vec!["p256", "p384", "rsa", "rsa-ps"]);
        let algs = |kid: &str| keys[kid].algs;
        assert_eq!(algs("p256"), AlgSet::of(&[Algorithm::ES256]));
        assert_eq!(algs("p384"), AlgSet::of(&[Algorithm::ES384]));
        assert_eq!(
            algs("rsa"),
            AlgSet::of(&[Algorithm::RS256, Algorithm::PS256])
        );
        assert_eq!(algs("rsa-ps"), AlgSet::of(&[Algorithm::PS256]));

        // An ES256-only issuer keeps no RSA key at all.
        let keys = parse_jwks(doc.as_bytes(), AlgSet::of(&[Algorithm::ES256])).unwrap();
        let mut kids: Vec<&str> = keys.keys().map(|k| &**k).collect();
        kids.sort();
        assert_eq!(kids, vec!["p256"]);
        // An RS256-only issuer narrows an RSA key without alg to RS256.
        let keys = parse_jwks(doc.as_bytes(), AlgSet::of(&[Algorithm::RS256])).unwrap();
        assert_eq!(keys["rsa"].algs, AlgSet::of(&[Algorithm::RS256]));
        assert!(!keys.contains_key("rsa-ps"));
    }

    #[test]
    fn max_age_is_read_from_cache_control() {
        assert_eq!(max_age("public, max-age=60"), Some(Duration::from_secs(60)));
        assert_eq!(max_age("MAX-AGE=\"5\""), Some(Duration::from_secs(5)));
        assert_eq!(max_age("no-cache"), None);
        assert_eq!(max_age("max-age=soon"), None);
    }

    #[test]
    fn garbage_is_an_error() {
        let all = AlgSet::of(&SUPPORTED_ALGORITHMS);
        assert!(parse_jwks(b"<html>", all).is_err());
        assert!(parse_jwks(b"{}", all).is_err());
        assert!(parse_jwks(br#"{"keys":[]}"#, all).unwrap().is_empty());
    }
}
