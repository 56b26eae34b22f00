//! The rate-limit stage: [`RouteLimiter`] plugs `gateway-ratelimit`'s
//! [`RateLimiter`](gateway_ratelimit::RateLimiter) (Redis budgets shared by
//! every replica, local fallback) into the pipeline's [`RateLimiter`] hook.
//!
//! A route's limits (`rate_limit` and the stacked `rate_limits`) are decided
//! together, all or nothing (`RateLimiter::check_all`); a route with one limit
//! takes the single-limit path. Every response of a limited route carries
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `RateLimit-Policy` and
//! `RateLimit` of the limit that shapes the verdict (the most restrictive one,
//! or the refusing one); a refusal adds `Retry-After` (and becomes a 429
//! problem document in `error.rs`).
//!
//! A route's limits are compiled with the snapshot ([`RouteLimit::compile`]):
//! the budget as a `gateway_ratelimit::Policy` and the key as a [`LimitBy`]
//! (a header name parsed once). A limit that cannot be enforced exactly is a
//! compile error, so the configuration is refused (NACK) instead of the route
//! answering 429 to everyone; the request path only looks the values up.

use futures::future::BoxFuture;
use gateway_proto::v1::{RateLimit, RateLimitAlgorithm, RateLimitKey};
use gateway_proto::validate::MAX_RATE_LIMITS;
use gateway_ratelimit::{
    Algorithm, MAX_STACKED, Policy, PolicyError, RateLimiter as Limiter, write_headers,
};
use http::HeaderMap;
use http::header::HeaderName;

use crate::policy::hooks::{LimitKey, RateLimited, RateLimiter};

/// One rate limit of a route, compiled once per snapshot.
#[derive(Debug, Clone)]
pub struct RouteLimit {
    /// The budget: name, algorithm, limit and window.
    pub policy: Policy,
    /// What the budget is counted per.
    pub by: LimitBy,
}

/// What a limit's budget is counted per (`RateLimit.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitBy {
    /// The client address (`KEY_IP`).
    Ip,
    /// The verified subject (`KEY_USER`).
    User,
    /// The name of the API key that authenticated the caller (`KEY_API_KEY`).
    ApiKey,
    /// The whole route (`KEY_ROUTE`).
    Route,
    /// The value of this request header (`KEY_HEADER` with `key_header`).
    Header(HeaderName),
}

/// Why a route's rate limit cannot be compiled (validation refuses each case first).
#[derive(Debug, thiserror::Error)]
pub enum RateLimitCompileError {
    /// The budget cannot be enforced (name, zero limit or window, too large).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// `key_header` is not a header name.
    #[error("rate limit policy {policy:?}: key_header {header:?} is not a valid header name")]
    Header {
        /// Policy name.
        policy: String,
        /// The header.
        header: String,
    },
}

impl RouteLimit {
    /// Compiles one `RateLimit` of a validated route.
    pub fn compile(limit: &RateLimit) -> Result<Self, RateLimitCompileError> {
        let algorithm = match RateLimitAlgorithm::try_from(limit.algorithm) {
            Ok(RateLimitAlgorithm::FixedWindow) => Algorithm::FixedWindow,
            Ok(RateLimitAlgorithm::SlidingWindow) => Algorithm::SlidingWindow,
            // TOKEN_BUCKET is the proto default; validation rejects unknown values.
            _ => Algorithm::TokenBucket,
        };
        let policy = Policy::new(&limit.policy, algorithm, limit.limit, limit.window_seconds)?;
        let by = match RateLimitKey::try_from(limit.key) {
            Ok(RateLimitKey::KeyUser) => LimitBy::User,
            Ok(RateLimitKey::KeyApiKey) => LimitBy::ApiKey,
            Ok(RateLimitKey::KeyRoute) => LimitBy::Route,
            Ok(RateLimitKey::KeyHeader) => LimitBy::Header(
                HeaderName::from_bytes(limit.key_header.to_ascii_lowercase().as_bytes()).map_err(
                    |_| RateLimitCompileError::Header {
                        policy: limit.policy.clone(),
                        header: limit.key_header.clone(),
                    },
                )?,
            ),
            // KEY_IP is the proto default; validation rejects unknown values.
            _ => LimitBy::Ip,
        };
        Ok(Self { policy, by })
    }
}

/// Enforces route rate limits with `gateway-ratelimit`.
pub struct RouteLimiter {
    limiter: Limiter,
}

impl std::fmt::Debug for RouteLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteLimiter")
            .field("shared", &self.limiter.is_shared())
            .finish_non_exhaustive()
    }
}

// The pipeline passes at most MAX_RATE_LIMITS limits; the limiter takes that many at once.
const _: () = assert!(MAX_RATE_LIMITS <= MAX_STACKED);
// Validation refuses the budgets the limiter cannot count, by the same bound.
const _: () =
    assert!(gateway_proto::validate::MAX_BUDGET_MILLIS == gateway_ratelimit::MAX_TOKEN_MILLIS);

impl RouteLimiter {
    /// Wraps a limiter.
    pub fn new(limiter: Limiter) -> Self {
        Self { limiter }
    }

    /// The wrapped limiter (stats, whether Redis is in use).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

/// The refusal when more limits are passed than the limiter decides at once:
/// limits are never silently dropped.
fn too_many(limit: &RouteLimit) -> RateLimited {
    let p = &limit.policy;
    RateLimited::new(
        p.name(),
        p.limit(),
        p.window_seconds(),
        0,
        p.window_seconds(),
    )
}

impl RateLimiter for RouteLimiter {
    fn check<'a>(
        &'a self,
        limits: &'a [RouteLimit],
        keys: &'a [LimitKey<'a>],
    ) -> BoxFuture<'a, Result<Option<HeaderMap>, RateLimited>> {
        Box::pin(async move {
            let n = limits.len().min(keys.len());
            if n == 0 {
                return Ok(None);
            }
            if n > MAX_STACKED {
                return Err(too_many(&limits[0]));
            }
            // An IP's text form, on the stack: no allocation per request. Every
            // KEY_IP limit of a request counts the same address.
            let mut ip_text = [0u8; 45];
            let mut ip_len = 0;
            if let Some(ip) = keys[..n].iter().find_map(|k| match k {
                LimitKey::Ip(ip) => Some(ip),
                _ => None,
            }) {
                ip_len = crate::policy::sanitize::write_ip(*ip, &mut ip_text);
            }
            let subject = |key: &LimitKey<'a>| -> &[u8] {
                match *key {
                    LimitKey::User(s) | LimitKey::ApiKey(s) | LimitKey::Header(s) => s,
                    LimitKey::Route(name) => name.as_bytes(),
                    LimitKey::Ip(_) => &ip_text[..ip_len],
                }
            };
            let (policy, decision) = if n == 1 {
                let policy = &limits[0].policy;
                (policy, self.limiter.check(policy, subject(&keys[0])).await)
            } else {
                let mut stack: [(&Policy, &[u8]); MAX_STACKED] =
                    [(&limits[0].policy, b""); MAX_STACKED];
                for (slot, (limit, key)) in stack.iter_mut().zip(limits.iter().zip(keys)) {
                    *slot = (&limit.policy, subject(key));
                }
                let (i, decision) = self.limiter.check_all(&stack[..n]).await;
                (stack[i].0, decision)
            };
            let mut headers = HeaderMap::with_capacity(5);
            write_headers(&mut headers, policy, &decision);
            if decision.allowed {
                Ok(Some(headers))
            } else {
                Err(RateLimited { headers })
            }
        })
    }

    fn write_metrics(&self, out: &mut String) {
        self.limiter.stats().write_prometheus(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::RateLimitKey;
    use gateway_ratelimit::RateLimiterOptions;
    use http::header::RETRY_AFTER;
    use std::net::IpAddr;

    fn local() -> RouteLimiter {
        RouteLimiter::new(Limiter::new(None, RateLimiterOptions::default()).unwrap())
    }

    fn limit(policy: &str, limit: u32, window_seconds: u32) -> RateLimit {
        RateLimit {
            policy: policy.into(),
            algorithm: RateLimitAlgorithm::FixedWindow as i32,
            key: RateLimitKey::KeyIp as i32,
            limit,
            window_seconds,
            key_header: String::new(),
        }
    }

    fn compiled(limit: &RateLimit) -> RouteLimit {
        RouteLimit::compile(limit).unwrap()
    }

    #[tokio::test]
    async fn allowed_and_denied_requests_carry_the_budget_headers() {
        let l = local();
        let rl = compiled(&limit("api", 2, 60));
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        for remaining in ["1", "0"] {
            let h = l
                .check(std::slice::from_ref(&rl), &[LimitKey::Ip(ip)])
                .await
                .unwrap()
                .unwrap();
            assert_eq!(h["x-ratelimit-limit"], "2");
            assert_eq!(h["x-ratelimit-remaining"], remaining);
            assert_eq!(h["ratelimit-policy"], "\"api\";q=2;w=60");
            assert!(h["ratelimit"].to_str().unwrap().starts_with("\"api\";r="));
            assert!(!h.contains_key(RETRY_AFTER));
        }
        let denied = l
            .check(std::slice::from_ref(&rl), &[LimitKey::Ip(ip)])
            .await
            .unwrap_err();
        let h = &denied.headers;
        assert_eq!(h["x-ratelimit-remaining"], "0");
        let retry: u64 = h[RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        // Another address has its own budget.
        let other: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(
            l.check(std::slice::from_ref(&rl), &[LimitKey::Ip(other)])
                .await
                .is_ok()
        );
        // And users are counted apart from addresses.
        assert!(
            l.check(std::slice::from_ref(&rl), &[LimitKey::User(b"alice")])
                .await
                .is_ok()
        );
        let stats = l.limiter().stats();
        assert_eq!(stats.denied_local, 1);
        let mut metrics = String::new();
        l.write_metrics(&mut metrics);
        assert!(
            metrics.contains("gateway_ratelimit_fallbacks_total 0"),
            "{metrics}"
        );
    }

    #[test]
    fn compiling_parses_the_key_once_and_refuses_what_cannot_be_enforced() {
        let by_header = RateLimit {
            key: RateLimitKey::KeyHeader as i32,
            key_header: "X-Client".into(),
            ..limit("client", 10, 60)
        };
        let c = compiled(&by_header);
        assert_eq!(c.by, LimitBy::Header(HeaderName::from_static("x-client")));
        assert_eq!(c.policy.name(), "client");
        assert_eq!(c.policy.algorithm(), Algorithm::FixedWindow);
        assert_eq!((c.policy.limit(), c.policy.window_seconds()), (10, 60));
        for (key, by) in [
            (RateLimitKey::KeyIp, LimitBy::Ip),
            (RateLimitKey::KeyUser, LimitBy::User),
            (RateLimitKey::KeyApiKey, LimitBy::ApiKey),
            (RateLimitKey::KeyRoute, LimitBy::Route),
        ] {
            let l = RateLimit {
                key: key as i32,
                ..limit("k", 1, 1)
            };
            assert_eq!(compiled(&l).by, by);
        }
        // limit × window (ms) over 2^53 cannot be enforced exactly: refused, never admitted.
        let err = RouteLimit::compile(&limit("huge", u32::MAX, 86_400)).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        let bad_header = RateLimit {
            key_header: "bad header".into(),
            ..by_header
        };
        let err = RouteLimit::compile(&bad_header).unwrap_err();
        assert!(err.to_string().contains("not a valid header name"), "{err}");
    }

    #[tokio::test]
    async fn stacked_limits_admit_only_together_and_report_the_most_restrictive() {
        let l = local();
        let route = RateLimit {
            key: RateLimitKey::KeyRoute as i32,
            algorithm: RateLimitAlgorithm::TokenBucket as i32,
            ..limit("whole", 3, 3600)
        };
        let per_client = RateLimit {
            key: RateLimitKey::KeyHeader as i32,
            key_header: "x-client".into(),
            ..limit("client", 2, 3600)
        };
        let per_ip = RateLimit {
            algorithm: RateLimitAlgorithm::SlidingWindow as i32,
            ..limit("ip", 100, 60)
        };
        let limits = [per_ip, route, per_client].map(|l| compiled(&l));
        let ip: IpAddr = "192.0.2.10".parse().unwrap();
        let keys = |client: &'static [u8]| {
            [
                LimitKey::Ip(ip),
                LimitKey::Route("orders"),
                LimitKey::Header(client),
            ]
        };
        // "a" twice: its own budget of 2 is the most restrictive.
        for remaining in ["1", "0"] {
            let h = l.check(&limits, &keys(b"a")).await.unwrap().unwrap();
            assert_eq!(h["ratelimit-policy"], "\"client\";q=2;w=3600");
            assert_eq!(h["x-ratelimit-remaining"], remaining);
        }
        // Refused by its own budget, several times: nothing else is spent.
        for _ in 0..3 {
            let denied = l.check(&limits, &keys(b"a")).await.unwrap_err();
            assert_eq!(denied.headers["ratelimit-policy"], "\"client\";q=2;w=3600");
            assert!(denied.headers.contains_key(RETRY_AFTER));
        }
        // "b": the route has 1 left, the tighter limit now.
        let h = l.check(&limits, &keys(b"b")).await.unwrap().unwrap();
        assert_eq!(h["ratelimit-policy"], "\"whole\";q=3;w=3600");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        let denied = l.check(&limits, &keys(b"c")).await.unwrap_err();
        assert_eq!(denied.headers["ratelimit-policy"], "\"whole\";q=3;w=3600");
        // The per-IP sliding window spent only the 3 admitted.
        let h = l
            .check(&limits[..1], &keys(b"d")[..1])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(h["x-ratelimit-remaining"], "96");
    }
}
