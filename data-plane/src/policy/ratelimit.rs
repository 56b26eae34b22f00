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
//! A `gateway_ratelimit::Policy` is built once per policy name, not per
//! request: routes naming one policy share it (the control plane guarantees
//! equal settings), so a small map keyed by name, checked against the route's
//! settings on every hit, is all the caching needed. Lookups take a read lock
//! for a hash probe and never hold it across `.await`.

use parking_lot::RwLock;
use std::collections::HashMap;

use futures::future::BoxFuture;
use gateway_proto::v1::{RateLimit, RateLimitAlgorithm};
use gateway_proto::validate::MAX_RATE_LIMITS;
use gateway_ratelimit::{Algorithm, MAX_STACKED, Policy, RateLimiter as Limiter, write_headers};
use http::HeaderMap;

use crate::policy::hooks::{LimitKey, RateLimited, RateLimiter};

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

// The pipeline passes at most MAX_RATE_LIMITS limits; the limiter takes that many at once.
const _: () = assert!(MAX_RATE_LIMITS <= MAX_STACKED);

fn algorithm(limit: &RateLimit) -> Algorithm {
    match RateLimitAlgorithm::try_from(limit.algorithm) {
        Ok(RateLimitAlgorithm::FixedWindow) => Algorithm::FixedWindow,
        Ok(RateLimitAlgorithm::SlidingWindow) => Algorithm::SlidingWindow,
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
            let map = self.policies.read();
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
            .insert(limit.policy.as_str().into(), compiled.clone());
        compiled
    }
}

/// A refusal for a limit whose policy cannot be compiled: limits are never silently off.
fn unusable(limit: &RateLimit) -> RateLimited {
    RateLimited::new(
        &limit.policy,
        limit.limit,
        limit.window_seconds,
        0,
        limit.window_seconds,
    )
}

impl RateLimiter for RouteLimiter {
    fn check<'a>(
        &'a self,
        limits: &'a [RateLimit],
        keys: &'a [LimitKey<'a>],
    ) -> BoxFuture<'a, Result<Option<HeaderMap>, RateLimited>> {
        Box::pin(async move {
            let n = limits.len().min(keys.len());
            if n == 0 {
                return Ok(None);
            }
            if n > MAX_STACKED {
                return Err(unusable(&limits[0]));
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
                let policy = self
                    .policy(&limits[0])
                    .ok_or_else(|| unusable(&limits[0]))?;
                let decision = self.limiter.check(&policy, subject(&keys[0])).await;
                (policy, decision)
            } else {
                let mut policies: [Option<Policy>; MAX_STACKED] = Default::default();
                for (slot, limit) in policies.iter_mut().zip(&limits[..n]) {
                    *slot = Some(self.policy(limit).ok_or_else(|| unusable(limit))?);
                }
                let mut stack: [(&Policy, &[u8]); MAX_STACKED] =
                    [(policies[0].as_ref().expect("compiled above"), b""); MAX_STACKED];
                for (i, slot) in stack[..n].iter_mut().enumerate() {
                    *slot = (
                        policies[i].as_ref().expect("compiled above"),
                        subject(&keys[i]),
                    );
                }
                let (i, decision) = self.limiter.check_all(&stack[..n]).await;
                (stack[i].0.clone(), decision)
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
            key_header: String::new(),
        }
    }

    #[tokio::test]
    async fn allowed_and_denied_requests_carry_the_budget_headers() {
        let l = local();
        let rl = limit("api", 2, 60);
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

    #[tokio::test]
    async fn policies_are_compiled_once_and_follow_setting_changes() {
        let l = local();
        let ip: IpAddr = "192.0.2.8".parse().unwrap();
        for _ in 0..3 {
            l.check(&[limit("api", 10, 60)], &[LimitKey::Ip(ip)])
                .await
                .unwrap();
        }
        assert_eq!(l.policies.read().len(), 1);
        // A new configuration changes the policy's limit: the new one applies.
        let h = l
            .check(&[limit("api", 50, 60)], &[LimitKey::Ip(ip)])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(h["x-ratelimit-limit"], "50");
        assert_eq!(l.policies.read().len(), 1);
    }

    #[tokio::test]
    async fn an_unusable_policy_refuses_instead_of_admitting() {
        let l = local();
        // limit × window (ms) over 2^53 cannot be enforced exactly.
        let rl = limit("huge", u32::MAX, 86_400);
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let denied = l
            .check(std::slice::from_ref(&rl), &[LimitKey::Ip(ip)])
            .await
            .unwrap_err();
        assert!(denied.headers.contains_key(RETRY_AFTER));
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
        let limits = [per_ip, route, per_client];
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
