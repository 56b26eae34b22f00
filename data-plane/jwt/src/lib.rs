//! Edge JWT verification for the data plane (docs/data-plane.md, "Authenticate"): the
//! gateway's own auth service (EdDSA) and any OpenID Connect issuer (EdDSA, ES256, ES384,
//! RS256, PS256), one [`JwtVerifier`] per issuer.
//!
//! ```no_run
//! # async fn demo(headers: http::HeaderMap) -> Result<(), Box<dyn std::error::Error>> {
//! use gateway_jwt::{JwtConfig, JwtVerifier, bearer_token};
//! let verifier = JwtVerifier::new(JwtConfig {
//!     jwks_url: "http://127.0.0.1:4000/.well-known/jwks.json".into(),
//!     ..JwtConfig::default()
//! })?;
//! let identity = verifier.verify(bearer_token(&headers).unwrap_or("")).await?;
//! println!("{} ({})", identity.sub, identity.role);
//! # Ok(()) }
//! ```
//!
//! * The JWKS is fetched over `https://` (rustls with ring; the server's certificate checked
//!   against `jwks_ca` or the system's roots) or, on a private network only, plain `http://`.
//! * Data planes hold public keys only, fetched from the issuer's JWKS (or its OpenID Connect
//!   discovery document's `jwks_uri`) and kept as pre-built decoding keys per `kid`; an unknown
//!   `kid` triggers one refresh (single-flight, cooldown), and a background task refreshes
//!   periodically so rotated keys appear.
//! * The algorithm is pinned per key, from the JWK's type (and `alg`) and the issuer's allowed
//!   list, never from the token alone (no `none`, no HMAC with a public key as secret, no RS256
//!   on an ES256 key); `kid` is required when the issuer publishes more than one key; `exp`,
//!   `iss`, `aud` and the configured user id and role claims are required; `exp`/`nbf` get a
//!   leeway.
//! * Verified tokens are cached (bounded, keyed hash, full-token compare, `exp` checked on every
//!   hit), so signature checks do not bound throughput.
//!
//! Every [`JwtError`] means 401 to the client, with [`JwtError::www_authenticate`] as the
//! `WWW-Authenticate` value.

mod bearer;
mod cache;
mod error;
mod jwks;
mod tls;
mod verifier;

pub use bearer::{bearer_candidate, bearer_token, is_b64token};
pub use error::{JwtConfigError, JwtError};
pub use gateway_clock::{Clock, ManualClock, SystemClock};
pub use jsonwebtoken::Algorithm;
pub use jwks::SUPPORTED_ALGORITHMS;
#[doc(hidden)]
pub use verifier::fuzzing;
pub use verifier::{
    Identity, JwtConfig, JwtStats, JwtVerifier, MAX_TOKEN_BYTES, RESERVED_SUB_PREFIX, claim,
    unverified_issuer,
};
