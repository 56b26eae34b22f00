//! A decision and the response header fields that describe it.
//!
//! Every response of a limited route carries:
//! * `X-RateLimit-Limit: <limit>` and `X-RateLimit-Remaining: <remaining>`;
//! * `RateLimit-Policy: "<policy>";q=<limit>;w=<window seconds>` and
//!   `RateLimit: "<policy>";r=<remaining>;t=<seconds until the whole budget is back>`
//!   (IETF draft-ietf-httpapi-ratelimit-headers);
//! * on denial, `Retry-After: <seconds>`.
//!
//! Seconds are always rounded **up**, so a client that waits what it was told
//! never comes back early.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::algorithm::Outcome;
use crate::policy::Policy;

/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `RateLimit-Policy` (IETF).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Where a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// By the shared budget in Redis (or from a denial Redis reported moments ago).
    Shared,
    /// By this replica's local limiter (Redis not configured, slow or down).
    Local,
}

impl Source {
    /// `redis` or `local`, as used in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Shared => "redis",
            Source::Local => "local",
        }
    }
}

/// The verdict on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed; if not, answer 429.
    pub allowed: bool,
    /// The policy's limit (bucket capacity or requests per window).
    pub limit: u32,
    /// Requests still admissible right now, after this one.
    pub remaining: u64,
    /// Time until the whole budget is available again.
    pub reset_after: Duration,
    /// On denial, the time until a request would be admitted (never shorter than the truth).
    pub retry_after: Option<Duration>,
    /// Who decided.
    pub source: Source,
}

impl Decision {
    pub(crate) fn from_outcome(policy: &Policy, outcome: Outcome, source: Source) -> Self {
        Self {
            allowed: outcome.allowed,
            limit: policy.limit(),
            remaining: outcome.remaining,
            reset_after: Duration::from_millis(outcome.reset_after_ms),
            retry_after: (!outcome.allowed)
                .then(|| Duration::from_millis(outcome.retry_after_ms.max(1))),
            source,
        }
    }

    /// `Retry-After` in whole seconds (rounded up, at least 1), on denial.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(|d| ceil_secs(d).max(1))
    }

    /// The `t` of the `RateLimit` field: whole seconds until the budget is
    /// back, rounded up, and never less than `Retry-After`.
    pub fn reset_secs(&self) -> u64 {
        ceil_secs(self.reset_after).max(self.retry_after_secs().unwrap_or(0))
    }
}

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Writes the rate-limit fields of `decision` under `policy` into `headers`,
/// replacing any previous values (e.g. from the upstream's own limiter).
pub fn write_headers(headers: &mut HeaderMap, policy: &Policy, decision: &Decision) {
    // The decision's limit is the policy's; the prebuilt value saves an allocation.
    let limit = if decision.limit == policy.limit() {
        policy.limit_header().clone()
    } else {
        HeaderValue::from(decision.limit)
    };
    headers.insert(X_RATELIMIT_LIMIT.clone(), limit);
    headers.insert(
        X_RATELIMIT_REMAINING.clone(),
        HeaderValue::from(decision.remaining),
    );
    headers.insert(RATELIMIT_POLICY.clone(), policy.policy_header().clone());
    // Written by hand: `format!` cost ≈ 1.4k instructions per request (callgrind).
    let mut numbers = itoa::Buffer::new();
    let name = policy.name().as_bytes();
    let mut ratelimit = Vec::with_capacity(name.len() + 48);
    ratelimit.push(b'"');
    ratelimit.extend_from_slice(name);
    ratelimit.extend_from_slice(b"\";r=");
    ratelimit.extend_from_slice(numbers.format(decision.remaining).as_bytes());
    ratelimit.extend_from_slice(b";t=");
    ratelimit.extend_from_slice(numbers.format(decision.reset_secs()).as_bytes());
    headers.insert(
        RATELIMIT.clone(),
        HeaderValue::from_maybe_shared(bytes::Bytes::from(ratelimit))
            .expect("a validated name and integers"),
    );
    match decision.retry_after_secs() {
        Some(secs) => {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        None => {
            headers.remove(RETRY_AFTER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;

    fn policy() -> Policy {
        Policy::new("api", Algorithm::TokenBucket, 20, 60).unwrap()
    }

    #[test]
    fn an_admitted_request_gets_every_field_but_retry_after() {
        let p = policy();
        let d = Decision::from_outcome(
            &p,
            Outcome {
                allowed: true,
                remaining: 19,
                reset_after_ms: 3_000,
                retry_after_ms: 0,
            },
            Source::Shared,
        );
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("99"));
        write_headers(&mut h, &p, &d);
        assert_eq!(h["x-ratelimit-limit"], "20");
        assert_eq!(h["x-ratelimit-remaining"], "19");
        assert_eq!(h["ratelimit-policy"], "\"api\";q=20;w=60");
        assert_eq!(h["ratelimit"], "\"api\";r=19;t=3");
        assert!(
            h.get("retry-after").is_none(),
            "a stale upstream value is removed"
        );
        assert_eq!(d.retry_after, None);
    }

    #[test]
    fn a_denial_rounds_retry_after_up_to_whole_seconds() {
        let p = policy();
        for (ms, secs) in [
            (1, 1),
            (999, 1),
            (1_000, 1),
            (1_001, 2),
            (2_999, 3),
            (3_000, 3),
        ] {
            let d = Decision::from_outcome(
                &p,
                Outcome {
                    allowed: false,
                    remaining: 0,
                    reset_after_ms: 60_000,
                    retry_after_ms: ms,
                },
                Source::Local,
            );
            assert_eq!(d.retry_after_secs(), Some(secs), "{ms} ms");
            let mut h = HeaderMap::new();
            write_headers(&mut h, &p, &d);
            assert_eq!(h["retry-after"], secs.to_string().as_str());
            assert_eq!(h["x-ratelimit-remaining"], "0");
            assert_eq!(h["ratelimit"], "\"api\";r=0;t=60");
        }
    }

    #[test]
    fn reset_is_never_before_retry_after_and_rounds_up() {
        let p = policy();
        let d = Decision::from_outcome(
            &p,
            Outcome {
                allowed: false,
                remaining: 0,
                reset_after_ms: 1_500,
                retry_after_ms: 2_100,
            },
            Source::Shared,
        );
        assert_eq!(d.retry_after_secs(), Some(3));
        assert_eq!(d.reset_secs(), 3);
        assert_eq!(ceil_secs(Duration::from_millis(1_500)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }
}
