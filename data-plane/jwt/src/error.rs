//! Why a token was refused, and why a verifier could not be built.

/// A token was refused. Every variant means "401 with `WWW-Authenticate: Bearer`" to the client;
/// the variants exist for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// No token was presented.
    #[error("no bearer token")]
    Missing,
    /// Not a JWS compact token (wrong number of segments, bad base64, bad JSON, too long).
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The header names an algorithm the issuer does not allow (`none`, `HS256`, ...), or one
    /// its key does not admit (an RS256 header on a P-256 key).
    #[error("algorithm {0:?} is not accepted by this issuer or its key")]
    DisallowedAlgorithm(String),
    /// The header has no `kid`, and the issuer publishes more than one key.
    #[error("token header has no kid")]
    MissingKid,
    /// No published key has this `kid`, even after refreshing the JWKS.
    #[error("no signing key with kid {0:?}")]
    UnknownKid(String),
    /// The JWKS could not be fetched and no key for this `kid` is known.
    #[error("signing keys unavailable: {0}")]
    KeysUnavailable(String),
    /// The signature does not verify with the key named by `kid`.
    #[error("signature does not verify")]
    BadSignature,
    /// `exp` (plus leeway) has passed.
    #[error("token expired")]
    Expired,
    /// `nbf` (minus leeway) is still in the future.
    #[error("token not valid yet (nbf)")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("wrong issuer")]
    WrongIssuer,
    /// `aud` does not contain the configured audience.
    #[error("wrong audience")]
    WrongAudience,
    /// A required claim (`exp`, `nbf`, `iss`, `aud`, `sub`) is absent.
    #[error("required claim {0:?} missing")]
    MissingClaim(String),
    /// Claims are present but unusable (wrong types, no `role`, ...).
    #[error("invalid claims: {0}")]
    InvalidClaims(String),
}

impl JwtError {
    /// Value for the `WWW-Authenticate` header of the 401 (RFC 6750 §3): no error code when no
    /// token was sent, `invalid_token` otherwise.
    pub fn www_authenticate(&self) -> &'static str {
        match self {
            Self::Missing => "Bearer",
            _ => r#"Bearer error="invalid_token""#,
        }
    }

    /// Short stable label for metrics (`missing`, `malformed`, `bad_signature`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed(_) => "malformed",
            Self::DisallowedAlgorithm(_) => "disallowed_algorithm",
            Self::MissingKid => "missing_kid",
            Self::UnknownKid(_) => "unknown_kid",
            Self::KeysUnavailable(_) => "keys_unavailable",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongIssuer => "wrong_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::MissingClaim(_) => "missing_claim",
            Self::InvalidClaims(_) => "invalid_claims",
        }
    }
}

/// A [`crate::JwtConfig`] that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtConfigError {
    /// The JWKS URL does not parse or is neither `http://` nor `https://`.
    #[error("jwks_url {url:?}: {reason}")]
    JwksUrl {
        /// What was given.
        url: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A CA was given for an `http://` JWKS URL, where it could never be used.
    #[error("jwks_ca is given but jwks_url {url:?} is not https://")]
    CaWithoutTls {
        /// The URL.
        url: String,
    },
    /// The CA file cannot be read or holds no usable certificate.
    #[error("jwks_ca {}: {reason}", path.display())]
    Ca {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// An `https://` JWKS URL without a CA, and no usable system root certificate.
    #[error(
        "https:// jwks_url without jwks_ca needs the system's root certificates, and none is usable ({0}); give the CA with jwks_ca"
    )]
    SystemRoots(String),
    /// rustls refused the TLS settings.
    #[error("TLS settings for the JWKS: {0}")]
    Tls(String),
    /// Issuer, audiences, algorithms or a claim name is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
}
