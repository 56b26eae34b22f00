//! Access tokens: short-lived EdDSA JWTs with a `kid` header.

use jsonwebtoken::{Algorithm, Header};
use serde::{Deserialize, Serialize};

use crate::keys::KeyEntry;

/// Lifetime of an access token: 15 minutes.
pub const ACCESS_TOKEN_TTL_SECS: u64 = 15 * 60;

/// Claims of an access token (all required by the gateway).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessClaims {
    /// Subject: the user name.
    pub sub: String,
    /// Role, forwarded to backends as `X-User-Role`.
    pub role: String,
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// Expiry (Unix seconds).
    pub exp: u64,
    /// Issued at.
    pub iat: u64,
    /// Not before.
    pub nbf: u64,
    /// Unique token id (128 random bits, base64url).
    pub jti: String,
}

/// Issuer and audience written into every token.
#[derive(Debug, Clone)]
pub struct TokenIssuer {
    /// `iss`.
    pub issuer: String,
    /// `aud`.
    pub audience: String,
}

/// Signing failed (only possible with a broken key).
#[derive(Debug, thiserror::Error)]
#[error("signing an access token with key {kid}: {source}")]
pub struct SignError {
    kid: String,
    source: jsonwebtoken::errors::Error,
}

impl TokenIssuer {
    /// Signs an access token for `sub`/`role` at `now` with `key`.
    pub fn issue(
        &self,
        key: &KeyEntry,
        sub: &str,
        role: &str,
        now: u64,
    ) -> Result<String, SignError> {
        use base64::Engine as _;
        let claims = AccessClaims {
            sub: sub.to_owned(),
            role: role.to_owned(),
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            exp: now + ACCESS_TOKEN_TTL_SECS,
            iat: now,
            nbf: now,
            jti: base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(rand::random::<[u8; 16]>()),
        };
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(key.kid().to_owned());
        jsonwebtoken::encode(&header, &claims, key.encoding_key()).map_err(|source| SignError {
            kid: key.kid().to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{KeyRing, RotationPolicy};
    use jsonwebtoken::{DecodingKey, Validation};
    use std::time::Duration;

    #[test]
    fn issued_token_verifies_with_the_published_key_and_carries_every_claim() {
        let dir = tempfile::tempdir().unwrap();
        let now = jsonwebtoken::get_current_timestamp();
        let ring = KeyRing::load_or_init(
            dir.path(),
            RotationPolicy::new(Duration::from_secs(3600), Duration::from_secs(60)),
            now,
        )
        .unwrap();
        let issuer = TokenIssuer {
            issuer: "gateway-auth".into(),
            audience: "gateway".into(),
        };
        let key = ring.signing_key(now);
        let token = issuer.issue(&key, "alice", "user", now).unwrap();

        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.alg, Algorithm::EdDSA);
        assert_eq!(header.kid.as_deref(), Some(key.kid()));

        let jwks: serde_json::Value = serde_json::from_str(&ring.jwks_json(now)).unwrap();
        let x = jwks["keys"][0]["x"].as_str().unwrap();
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_issuer(&["gateway-auth"]);
        validation.set_audience(&["gateway"]);
        validation.set_required_spec_claims(&["exp", "nbf", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<AccessClaims>(
            &token,
            &DecodingKey::from_ed_components(x).unwrap(),
            &validation,
        )
        .unwrap();
        let c = data.claims;
        assert_eq!((c.sub.as_str(), c.role.as_str()), ("alice", "user"));
        assert_eq!(c.exp, now + ACCESS_TOKEN_TTL_SECS);
        assert_eq!((c.iat, c.nbf), (now, now));
        assert_eq!(c.jti.len(), 22);

        let other = issuer.issue(&key, "alice", "user", now).unwrap();
        let other =
            jsonwebtoken::dangerous::insecure_decode_claims::<AccessClaims>(&other).unwrap();
        assert_ne!(other.jti, c.jti, "jti must be unique");
    }
}
