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
use gateway_proto::spec::RateLimitSpec;
use gateway_proto::v1::RateLimitAlgorithm;
use gateway_proto::validate::MAX_RATE_LIMITS;
use gateway_ratelimit::{
    Algorithm, MAX_STACKED, Policy, PolicyError, RateLimiter as Limiter, write_headers,
};
use http::HeaderMap;

use crate::policy::hooks::{LimitKey, RateLimited, RateLimiter};

/// One rate limit of a route, compiled once per snapshot.
#[derive(Debug, Clone)]
pub struct RouteLimit {
    /// The budget: name, algorithm, limit and window.
    pub policy: Policy,
    /// What the budget is counted per.
    pub by: LimitBy,
}

/// What a limit's budget is counted per: the typed `RateLimit.key`
/// (`KEY_HEADER` carries its header name, parsed once).
pub use gateway_proto::spec::LimitKey as LimitBy;

/// Why a route's rate limit cannot be compiled: the limiter refuses the
/// budget (validation refuses each such case first; kept so a limit is never
/// silently off).
pub type RateLimitCompileError = PolicyError;

impl RouteLimit {
    /// Compiles one validated rate limit of a route.
    pub fn compile(limit: &RateLimitSpec<'_>) -> Result<Self, RateLimitCompileError> {
        let algorithm = match limit.algorithm {
            RateLimitAlgorithm::FixedWindow => Algorithm::FixedWindow,
            RateLimitAlgorithm::SlidingWindow => Algorithm::SlidingWindow,
            RateLimitAlgorithm::TokenBucket => Algorithm::TokenBucket,
        };
        let policy = Policy::new(limit.policy, algorithm, limit.limit, limit.window_seconds)?;
        Ok(Self {
            policy,
            by: limit.key.clone(),
        })
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
    use gateway_ratelimit::RateLimiterOptions;
    use http::header::HeaderName;
    use http::header::RETRY_AFTER;
    use std::net::IpAddr;

    fn local() -> RouteLimiter {
        RouteLimiter::new(Limiter::new(None, RateLimiterOptions::default()).unwrap())
    }

    fn limit(policy: &str, limit: u32, window_seconds: u32) -> RateLimitSpec<'_> {
        RateLimitSpec {
            policy,
            algorithm: RateLimitAlgorithm::FixedWindow,
            key: LimitBy::Ip,
            limit,
            window_seconds,
        }
    }

    fn compiled(limit: &RateLimitSpec<'_>) -> RouteLimit {
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
    fn compiling_builds_the_budget_and_refuses_what_cannot_be_enforced() {
        let by_header = RateLimitSpec {
            key: LimitBy::Header(HeaderName::from_static("x-client")),
            ..limit("client", 10, 60)
        };
        let c = compiled(&by_header);
        assert_eq!(c.by, LimitBy::Header(HeaderName::from_static("x-client")));
        assert_eq!(c.policy.name(), "client");
        assert_eq!(c.policy.algorithm(), Algorithm::FixedWindow);
        assert_eq!((c.policy.limit(), c.policy.window_seconds()), (10, 60));
        // limit × window (ms) over 2^53 cannot be enforced exactly: refused, never admitted.
        let err = RouteLimit::compile(&limit("huge", u32::MAX, 86_400)).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    #[tokio::test]
    async fn stacked_limits_admit_only_together_and_report_the_most_restrictive() {
        let l = local();
        let route = RateLimitSpec {
            key: LimitBy::Route,
            algorithm: RateLimitAlgorithm::TokenBucket,
            ..limit("whole", 3, 3600)
        };
        let per_client = RateLimitSpec {
            key: LimitBy::Header(HeaderName::from_static("x-client")),
            ..limit("client", 2, 3600)
        };
        let per_ip = RateLimitSpec {
            algorithm: RateLimitAlgorithm::SlidingWindow,
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
