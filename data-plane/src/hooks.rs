//! Extension points for pipeline stages implemented outside this crate:
//! token verification (the `jwt` crate) and rate limiting (the `ratelimit`
//! crate). The pipeline calls them at their fixed place; plugging one in is one
//! field on [`crate::pipeline::Pipeline`].
//!
//! Without an [`Authenticator`] an `AUTH_JWT` route refuses every request
//! (fail closed: there is nothing to verify tokens with). Without a
//! [`RateLimiter`] rate limits are not enforced.

use std::net::IpAddr;

use futures::future::BoxFuture;
use gateway_proto::v1::RateLimit;
use http::HeaderValue;
use http::request::Parts;

/// Who the caller is, after verification. Forwarded as `X-User-Id` / `X-User-Role`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The token subject (`sub`).
    pub subject: HeaderValue,
    /// The caller's role (`role`).
    pub role: HeaderValue,
}

/// Why a caller was refused (every variant answers 401 with `WWW-Authenticate: Bearer`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    #[error("a bearer token is required")]
    Missing,
    /// The token failed verification (signature, algorithm, exp/nbf, iss/aud, unknown kid).
    #[error("the bearer token is invalid or expired")]
    Invalid,
    /// No verifier is configured on this data plane.
    #[error("token verification is not configured on this gateway")]
    NotConfigured,
}

/// Verifies the caller of an `AUTH_JWT` route.
pub trait Authenticator: Send + Sync + 'static {
    /// Checks the request's credentials (usually `Authorization: Bearer`).
    /// Called only for `AUTH_JWT` routes, after routing, before rate limiting.
    fn authenticate<'a>(&'a self, req: &'a Parts) -> BoxFuture<'a, Result<Identity, AuthError>>;
}

/// A refused request, with what the client needs to back off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    /// The budget (policy) name.
    pub policy: String,
    /// Its limit (`X-RateLimit-Limit`, `q` of `RateLimit-Policy`).
    pub limit: u32,
    /// Its window in seconds (`w` of `RateLimit-Policy`).
    pub window_seconds: u32,
    /// Remaining requests (`X-RateLimit-Remaining`, `r` of `RateLimit`); 0 when refused.
    pub remaining: u32,
    /// Seconds until a request may succeed (`Retry-After`, `t` of `RateLimit`).
    pub retry_after_seconds: u32,
}

/// What a rate limit is counted per.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKey<'a> {
    /// The verified subject (`KEY_USER`).
    User(&'a [u8]),
    /// The client address (`KEY_IP`).
    Ip(IpAddr),
}

/// Decides whether a request fits its route's rate limit.
pub trait RateLimiter: Send + Sync + 'static {
    /// `Ok` to let the request through; `Err` to answer 429.
    fn check<'a>(
        &'a self,
        limit: &'a RateLimit,
        key: LimitKey<'a>,
    ) -> BoxFuture<'a, Result<(), RateLimited>>;
}
