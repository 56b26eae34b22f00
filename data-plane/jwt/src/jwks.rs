//! Fetching the auth service's JWKS and turning it into pre-built decoding keys.

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
use jsonwebtoken::DecodingKey;
use serde::Deserialize;
use tokio_rustls::TlsConnector;

use crate::tls::{JwksConnector, chain};

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 256 * 1024;

/// Published keys by `kid`, each decoding key built once.
pub(crate) type KeySet = HashMap<Arc<str>, Arc<DecodingKey>>;

#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
}

/// Builds the key set from a JWKS document. Only Ed25519 signing keys with a `kid` are taken;
/// other keys (RSA, EC, encryption keys) are skipped, because the algorithm is pinned to EdDSA.
pub(crate) fn parse_jwks(body: &[u8]) -> Result<KeySet, String> {
    let set: JwkSet =
        serde_json::from_slice(body).map_err(|e| format!("JWKS is not valid JSON: {e}"))?;
    let mut keys = KeySet::with_capacity(set.keys.len());
    for jwk in set.keys {
        let usable = jwk.kty.as_deref() == Some("OKP")
            && jwk.crv.as_deref() == Some("Ed25519")
            && jwk.alg.as_deref().is_none_or(|a| a == "EdDSA")
            && jwk.use_.as_deref().is_none_or(|u| u == "sig");
        let (Some(kid), Some(x)) = (jwk.kid, jwk.x) else {
            continue;
        };
        if !usable {
            tracing::debug!(%kid, "skipping JWKS key that is not an Ed25519 signing key");
            continue;
        }
        if URL_SAFE_NO_PAD.decode(&x).map(|b| b.len()) != Ok(32) {
            tracing::warn!(%kid, "skipping JWKS key whose x is not 32 base64url bytes");
            continue;
        }
        let key = DecodingKey::from_ed_components(&x).map_err(|e| format!("key {kid}: {e}"))?;
        keys.insert(kid.into(), Arc::new(key));
    }
    Ok(keys)
}

/// JWKS client: plain HTTP (the auth service on a private network), or
/// HTTPS when `tls` is given (see `tls.rs`).
pub(crate) struct JwksClient {
    client: Client<JwksConnector, Empty<Bytes>>,
    uri: Uri,
    timeout: Duration,
}

impl JwksClient {
    pub(crate) fn new(uri: Uri, timeout: Duration, tls: Option<TlsConnector>) -> Self {
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
            uri,
            timeout,
        }
    }

    /// Fetches and parses the JWKS, within the configured timeout. Also returns the response's
    /// `Cache-Control: max-age`, which paces the background refresh.
    pub(crate) async fn fetch(&self) -> Result<(KeySet, Option<Duration>), String> {
        tokio::time::timeout(self.timeout, self.fetch_inner())
            .await
            .map_err(|_| format!("fetching {} timed out after {:?}", self.uri, self.timeout))?
    }

    async fn fetch_inner(&self) -> Result<(KeySet, Option<Duration>), String> {
        let req = Request::get(self.uri.clone())
            .header(header::ACCEPT, "application/jwk-set+json, application/json")
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("fetching {}: {}", self.uri, chain(&e)))?;
        if resp.status() != StatusCode::OK {
            return Err(format!("fetching {}: HTTP {}", self.uri, resp.status()));
        }
        let max_age = resp
            .headers()
            .get(header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(max_age);
        let body = Limited::new(resp.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading {}: {}", self.uri, chain(&*e)))?
            .to_bytes();
        Ok((parse_jwks(&body)?, max_age))
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
        let keys = parse_jwks(doc.as_bytes()).unwrap();
        let mut kids: Vec<&str> = keys.keys().map(|k| &**k).collect();
        kids.sort();
        assert_eq!(kids, vec!["good", "no-alg"]);
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
        assert!(parse_jwks(b"<html>").is_err());
        assert!(parse_jwks(b"{}").is_err());
        assert!(parse_jwks(br#"{"keys":[]}"#).unwrap().is_empty());
    }
}
