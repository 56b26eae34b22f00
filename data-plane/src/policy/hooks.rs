//! Extension points for pipeline stages implemented outside this crate:
//! token verification (the `jwt` crate) and rate limiting (the `ratelimit`
//! crate). The pipeline calls them at their fixed place; plugging one in is one
//! call: `DataPlane::new(args).authenticator(Arc::new(..)).rate_limiter(Arc::new(..))`.
//!
//! Without an [`Authenticator`] an `AUTH_JWT` route refuses every request
//! (fail closed: there is nothing to verify tokens with). When none is given,
//! [`DataPlane::start`](crate::app::DataPlane::start) plugs in [`crate::policy::jwt::JwtAuth`]
//! if `--jwks-url` is set, and always a [`crate::policy::ratelimit::RouteLimiter`]
//! (shared through `--redis-url`, else replica-local), so limits are never off.

use std::net::IpAddr;

use futures::future::BoxFuture;
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;

pub use crate::policy::ratelimit::{LimitBy, RouteLimit};

/// Who the caller is, after verification. Forwarded as `X-User-Id` / `X-User-Role`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The token subject (`sub`).
    pub subject: HeaderValue,
    /// The caller's role (`role`).
    pub role: HeaderValue,
    /// The name of the API key that authenticated the caller (`AUTH_API_KEY`
    /// routes); `None` for callers with a JWT.
    pub api_key: Option<HeaderValue>,
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
    /// The token's `iss` is none of the configured JWT issuers (a route with
    /// `jwt_issuers`).
    #[error("the bearer token's issuer is unknown")]
    UnknownIssuer,
    /// The token's `iss` is a configured JWT issuer, but not one this route
    /// accepts.
    #[error("the bearer token's issuer is not accepted on this route")]
    IssuerNotAccepted,
}

/// Verifies the caller of an `AUTH_JWT` route.
pub trait Authenticator: Send + Sync + 'static {
    /// Checks the request's credentials (usually `Authorization: Bearer`).
    /// Called only for `AUTH_JWT` routes, after routing, before rate limiting.
    fn authenticate<'a>(&'a self, req: &'a Parts) -> BoxFuture<'a, Result<Identity, AuthError>>;

    /// Appends this stage's counters to `/metrics` (Prometheus text). Default: none.
    fn write_metrics(&self, _out: &mut String) {}
}

/// A request refused by the rate limiter (answered 429).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    /// Response fields telling the client how to back off: `Retry-After`, and
    /// usually `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `RateLimit-Policy`
    /// and `RateLimit`. [`RateLimited::new`] builds them all.
    pub headers: HeaderMap,
}

impl RateLimited {
    /// A refusal with the standard fields: `Retry-After`, `X-RateLimit-Limit`,
    /// `X-RateLimit-Remaining`, and the IETF `RateLimit-Policy: "p";q=LIMIT;w=WINDOW`
    /// and `RateLimit: "p";r=REMAINING;t=RETRY_AFTER` (draft-ietf-httpapi-ratelimit-headers).
    pub fn new(
        policy: &str,
        limit: u32,
        window_seconds: u32,
        remaining: u32,
        retry_after_seconds: u32,
    ) -> Self {
        let mut h = HeaderMap::with_capacity(5);
        h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds));
        h.insert("x-ratelimit-limit", HeaderValue::from(limit));
        h.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
        // A validated policy name is [a-z0-9-]: always a valid field value.
        if let Ok(v) = HeaderValue::try_from(format!("\"{policy}\";q={limit};w={window_seconds}")) {
            h.insert("ratelimit-policy", v);
        }
        if let Ok(v) = HeaderValue::try_from(format!(
            "\"{policy}\";r={remaining};t={retry_after_seconds}"
        )) {
            h.insert("ratelimit", v);
        }
        Self { headers: h }
    }
}

/// What a rate limit is counted per, for one request: the value of its [`LimitBy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKey<'a> {
    /// The verified subject (`KEY_USER`).
    User(&'a [u8]),
    /// The client address (`KEY_IP`).
    Ip(IpAddr),
    /// The name of the API key that authenticated the caller (`KEY_API_KEY`).
    ApiKey(&'a [u8]),
    /// The whole route, whoever calls (`KEY_ROUTE`): the route's name.
    Route(&'a str),
    /// The value of the route's `key_header` (`KEY_HEADER`); empty when the
    /// request has no such header, so those requests share one budget.
    Header(&'a [u8]),
}

/// Decides whether a request fits its route's rate limits.
pub trait RateLimiter: Send + Sync + 'static {
    /// Decides one request under every limit of its route at once:
    /// `limits[i]` is counted per `keys[i]` (same length, `rate_limit` first,
    /// then `rate_limits`). The request must fit every limit, and spends from
    /// each only when it does. `Ok` lets it through; its headers, if any (e.g.
    /// `X-RateLimit-Remaining` of the most restrictive limit), are added to the
    /// response. `Err` answers 429 with the refusal's headers.
    fn check<'a>(
        &'a self,
        limits: &'a [RouteLimit],
        keys: &'a [LimitKey<'a>],
    ) -> BoxFuture<'a, Result<Option<HeaderMap>, RateLimited>>;

    /// Appends this stage's counters to `/metrics` (Prometheus text). Default: none.
    fn write_metrics(&self, _out: &mut String) {}
}
