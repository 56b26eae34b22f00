//! The rate-limit stage: [`RouteLimiter`] plugs `gateway-ratelimit`'s
//! [`RateLimiter`](gateway_ratelimit::RateLimiter) (Redis budgets shared by
//! every replica, local fallback) into the pipeline's [`RateLimiter`] hook.
//!
//! Every response of a limited route carries `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining`, `RateLimit-Policy` and `RateLimit`; a refusal adds
//! `Retry-After` (and becomes a 429 problem document in `error.rs`).
//!
//! A `gateway_ratelimit::Policy` is built once per policy name, not per
//! request: routes naming one policy share it (the control plane guarantees
//! equal settings), so a small map keyed by name, checked against the route's
//! settings on every hit, is all the caching needed. Lookups take a read lock
//! for a hash probe and never hold it across `.await`.

use std::collections::HashMap;
use std::sync::RwLock;

use futures::future::BoxFuture;
use gateway_proto::v1::{RateLimit, RateLimitAlgorithm};
use gateway_ratelimit::{Algorithm, Policy, RateLimiter as Limiter, write_headers};
use http::HeaderMap;

use crate::hooks::{LimitKey, RateLimited, RateLimiter};

/// Enforces route rate limits with `gateway-ratelimit`.
pub struct RouteLimiter {
    limiter: Limiter,
    /// Compiled policies by name; `None`: the settings cannot be compiled (refused, fail closed).
    policies: RwLock<HashMap<Box<str>, Option<Policy>>>,
}

impl std::fmt::Debug for RouteLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteLimiter")
            .field("shared", &self.limiter.is_shared())
            .finish_non_exhaustive()
    }
}

fn algorithm(limit: &RateLimit) -> Algorithm {
    match RateLimitAlgorithm::try_from(limit.algorithm) {
        Ok(RateLimitAlgorithm::FixedWindow) => Algorithm::FixedWindow,
        // TOKEN_BUCKET is the proto default; validation rejects unknown values.
        _ => Algorithm::TokenBucket,
    }
}

fn same_settings(p: &Policy, limit: &RateLimit) -> bool {
    p.algorithm() == algorithm(limit)
        && p.limit() == limit.limit
        && p.window_seconds() == limit.window_seconds
}

impl RouteLimiter {
    /// Wraps a limiter.
    pub fn new(limiter: Limiter) -> Self {
        Self {
            limiter,
            policies: RwLock::new(HashMap::new()),
        }
    }

    /// The wrapped limiter (stats, whether Redis is in use).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The compiled policy of `limit`, built on first use and whenever its settings change.
    fn policy(&self, limit: &RateLimit) -> Option<Policy> {
        {
            let map = self.policies.read().unwrap_or_else(|e| e.into_inner());
            match map.get(limit.policy.as_str()) {
                Some(Some(p)) if same_settings(p, limit) => return Some(p.clone()),
                Some(None) => return None,
                _ => {}
            }
        }
        let compiled = match Policy::new(
            &limit.policy,
            algorithm(limit),
            limit.limit,
            limit.window_seconds,
        ) {
            Ok(p) => Some(p),
            Err(error) => {
                tracing::warn!(%error, "rate limit policy cannot be enforced; its routes answer 429");
                None
            }
        };
        self.policies
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(limit.policy.as_str().into(), compiled.clone());
        compiled
    }
}

impl RateLimiter for RouteLimiter {
    fn check<'a>(
        &'a self,
        limit: &'a RateLimit,
        key: LimitKey<'a>,
    ) -> BoxFuture<'a, Result<Option<HeaderMap>, RateLimited>> {
        Box::pin(async move {
            let Some(policy) = self.policy(limit) else {
                // Limits are never silently off: an unusable policy refuses.
                return Err(RateLimited::new(
                    &limit.policy,
                    limit.limit,
                    limit.window_seconds,
                    0,
                    limit.window_seconds,
                ));
            };
            let decision = match key {
                LimitKey::User(subject) => self.limiter.check(&policy, subject).await,
                LimitKey::Ip(ip) => {
                    // An IP's text form, on the stack: no allocation per request.
                    let mut buf = [0u8; 45];
                    let n = {
                        use std::io::Write as _;
                        let mut w = &mut buf[..];
                        let _ = write!(w, "{ip}");
                        45 - w.len()
                    };
                    self.limiter.check(&policy, &buf[..n]).await
                }
            };
            let mut headers = HeaderMap::with_capacity(5);
            write_headers(&mut headers, &policy, &decision);
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
        }
    }

    #[tokio::test]
    async fn allowed_and_denied_requests_carry_the_budget_headers() {
        let l = local();
        let rl = limit("api", 2, 60);
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        for remaining in ["1", "0"] {
            let h = l.check(&rl, LimitKey::Ip(ip)).await.unwrap().unwrap();
            assert_eq!(h["x-ratelimit-limit"], "2");
            assert_eq!(h["x-ratelimit-remaining"], remaining);
            assert_eq!(h["ratelimit-policy"], "\"api\";q=2;w=60");
            assert!(h["ratelimit"].to_str().unwrap().starts_with("\"api\";r="));
            assert!(!h.contains_key(RETRY_AFTER));
        }
        let denied = l.check(&rl, LimitKey::Ip(ip)).await.unwrap_err();
        let h = &denied.headers;
        assert_eq!(h["x-ratelimit-remaining"], "0");
        let retry: u64 = h[RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        // Another address has its own budget.
        let other: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(l.check(&rl, LimitKey::Ip(other)).await.is_ok());
        // And users are counted apart from addresses.
        assert!(l.check(&rl, LimitKey::User(b"alice")).await.is_ok());
        let stats = l.limiter().stats();
        assert_eq!(stats.denied_local, 1);
        let mut metrics = String::new();
        l.write_metrics(&mut metrics);
        assert!(
            metrics.contains("gateway_ratelimit_fallbacks_total 0"),
            "{metrics}"
        );
    }

    #[tokio::test]
    async fn policies_are_compiled_once_and_follow_setting_changes() {
        let l = local();
        let ip: IpAddr = "192.0.2.8".parse().unwrap();
        for _ in 0..3 {
            l.check(&limit("api", 10, 60), LimitKey::Ip(ip))
                .await
                .unwrap();
        }
        assert_eq!(l.policies.read().unwrap().len(), 1);
        // A new configuration changes the policy's limit: the new one applies.
        let h = l
            .check(&limit("api", 50, 60), LimitKey::Ip(ip))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(h["x-ratelimit-limit"], "50");
        assert_eq!(l.policies.read().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_unusable_policy_refuses_instead_of_admitting() {
        let l = local();
        // limit × window (ms) over 2^53 cannot be enforced exactly.
        let rl = limit("huge", u32::MAX, 86_400);
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let denied = l.check(&rl, LimitKey::Ip(ip)).await.unwrap_err();
        assert!(denied.headers.contains_key(RETRY_AFTER));
    }
}
