//! A compiled rate-limit policy: the plain-Rust form of `gateway.v1.RateLimit`.
//!
//! The data plane converts each route's proto `RateLimit` into a [`Policy`] once,
//! when it compiles a configuration snapshot, so the request path only reads it.
//! The key kind (`KEY_USER` / `KEY_IP`) is not part of this type: the data plane
//! picks the subject string and passes it to [`crate::RateLimiter::check`].

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

/// Largest `limit × window` (in token-milliseconds) a policy may have.
///
/// Both the Rust arithmetic and the Lua scripts keep a token bucket's level in
/// token-milliseconds; Lua numbers are IEEE doubles, exact up to 2^53. Keeping
/// the product under that bound keeps the Lua arithmetic exact (e.g. 100 000
/// requests per day is 8.64 × 10^12, far below 9 × 10^15).
pub const MAX_TOKEN_MILLIS: u64 = 1 << 53;

/// Longest name a policy may have (same as a route name).
const MAX_NAME_LEN: usize = 63;

/// How a budget is spent and refilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A bucket of `limit` tokens, refilled continuously so that it goes from
    /// empty to full in `window`. Allows bursts of up to `limit`.
    TokenBucket,
    /// At most `limit` requests per window of `window`, windows aligned to
    /// multiples of `window` since the Unix epoch (Redis's clock) or since the
    /// limiter started (local fallback).
    FixedWindow,
    /// A sliding-window counter: the current fixed window's count plus the
    /// previous one's, weighted by how much of it the sliding window still
    /// covers (see [`crate::stacked`] for the arithmetic and its error bound).
    SlidingWindow,
}

impl Algorithm {
    /// The name used in logs and metrics: `token_bucket`, `fixed_window` or `sliding_window`.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
        }
    }
}

/// Why a policy could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The name is empty, too long, or uses characters other than `[a-z0-9-]`.
    #[error(
        "rate limit policy name {0:?} is invalid: it must match [a-z0-9][a-z0-9-]* and be at most 63 characters"
    )]
    InvalidName(String),
    /// `limit` was 0.
    #[error("rate limit policy {0:?}: limit must be greater than 0")]
    ZeroLimit(String),
    /// `window_seconds` was 0.
    #[error("rate limit policy {0:?}: window_seconds must be greater than 0")]
    ZeroWindow(String),
    /// `limit × window` does not fit the exact arithmetic of the Lua scripts.
    #[error(
        "rate limit policy {name:?}: limit {limit} per {window_seconds} s is too large (limit × window in milliseconds must not exceed 2^53)"
    )]
    TooLarge {
        /// Policy name.
        name: String,
        /// Requested limit.
        limit: u32,
        /// Requested window in seconds.
        window_seconds: u32,
    },
}

/// A validated, immutable rate-limit policy. Cheap to clone (one `Arc`).
///
/// Routes naming the same policy share one budget per subject, so two routes
/// must build equal policies from equal proto messages (they do: equality is by value).
#[derive(Debug, Clone)]
pub struct Policy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: Arc<str>,
    algorithm: Algorithm,
    limit: u32,
    window_seconds: u32,
    /// `RateLimit-Policy` field value, built once: it never changes for a policy.
    policy_header: HeaderValue,
    /// `X-RateLimit-Limit` field value, built once (cloning it does not allocate).
    limit_header: HeaderValue,
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.inner.name == other.inner.name
            && self.inner.algorithm == other.inner.algorithm
            && self.inner.limit == other.inner.limit
            && self.inner.window_seconds == other.inner.window_seconds
    }
}

impl Eq for Policy {}

impl Policy {
    /// Validates and compiles a policy.
    ///
    /// `name` must match `[a-z0-9][a-z0-9-]*` (at most 63 characters), which
    /// also keeps it safe inside Redis hash tags and quoted header parameters.
    pub fn new(
        name: &str,
        algorithm: Algorithm,
        limit: u32,
        window_seconds: u32,
    ) -> Result<Self, PolicyError> {
        if !is_valid_name(name) {
            return Err(PolicyError::InvalidName(name.to_owned()));
        }
        if limit == 0 {
            return Err(PolicyError::ZeroLimit(name.to_owned()));
        }
        if window_seconds == 0 {
            return Err(PolicyError::ZeroWindow(name.to_owned()));
        }
        if u128::from(limit) * u128::from(window_seconds) * 1000 > u128::from(MAX_TOKEN_MILLIS) {
            return Err(PolicyError::TooLarge {
                name: name.to_owned(),
                limit,
                window_seconds,
            });
        }
        let policy_header =
            HeaderValue::try_from(format!("\"{name}\";q={limit};w={window_seconds}"))
                .expect("a validated name and two integers form a valid header value");
        Ok(Self {
            inner: Arc::new(Inner {
                name: Arc::from(name),
                algorithm,
                limit,
                window_seconds,
                policy_header,
                limit_header: HeaderValue::from(limit),
            }),
        })
    }

    /// The budget name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The budget name as a shared string (cloning it does not allocate).
    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.inner.name
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// Bucket capacity, or requests per window.
    pub fn limit(&self) -> u32 {
        self.inner.limit
    }

    /// Window (or whole-bucket refill time) in seconds.
    pub fn window_seconds(&self) -> u32 {
        self.inner.window_seconds
    }

    /// Window (or whole-bucket refill time).
    pub fn window(&self) -> Duration {
        Duration::from_secs(u64::from(self.inner.window_seconds))
    }

    /// Window in milliseconds, the unit of every calculation.
    pub fn window_ms(&self) -> u64 {
        u64::from(self.inner.window_seconds) * 1000
    }

    /// The prebuilt `RateLimit-Policy` field value: `"<name>";q=<limit>;w=<window>`.
    pub fn policy_header(&self) -> &HeaderValue {
        &self.inner.policy_header
    }

    /// The prebuilt `X-RateLimit-Limit` field value.
    pub fn limit_header(&self) -> &HeaderValue {
        &self.inner.limit_header
    }

    /// The Redis key of `subject`'s budget: `rl:{<subject>}:<policy>`.
    ///
    /// The subject is the hash tag: on Redis Cluster every budget of one
    /// subject maps to one slot, so stacked limits of one subject are decided
    /// in one script run (see `redis.rs` for limits of different subjects).
    /// A subject holding `}` ends the tag early, and an empty one leaves the
    /// key untagged; the key is still the same for every decision of that
    /// (policy, subject), and slots are computed from the key itself.
    pub fn redis_key(&self, subject: impl AsRef<[u8]>) -> Vec<u8> {
        let subject = subject.as_ref();
        let mut key = Vec::with_capacity(6 + self.inner.name.len() + subject.len());
        key.extend_from_slice(b"rl:{");
        key.extend_from_slice(subject);
        key.extend_from_slice(b"}:");
        key.extend_from_slice(self.inner.name.as_bytes());
        key
    }

    /// The settings the arithmetic needs.
    pub(crate) fn shape(&self) -> crate::stacked::Shape {
        crate::stacked::Shape {
            algorithm: self.inner.algorithm,
            limit: self.inner.limit,
            window_ms: self.window_ms(),
        }
    }

    /// True when `other` has the same algorithm, limit and window (the name aside).
    pub(crate) fn same_shape(&self, algorithm: Algorithm, limit: u32, window_seconds: u32) -> bool {
        self.inner.algorithm == algorithm
            && self.inner.limit == limit
            && self.inner.window_seconds == window_seconds
    }
}

/// `[a-z0-9][a-z0-9-]*`, 1..=63 characters.
fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_policy_exposes_its_fields_and_header() {
        let p = Policy::new("api", Algorithm::TokenBucket, 20, 60).unwrap();
        assert_eq!(p.name(), "api");
        assert_eq!(p.algorithm(), Algorithm::TokenBucket);
        assert_eq!(p.limit(), 20);
        assert_eq!(p.window(), Duration::from_secs(60));
        assert_eq!(p.window_ms(), 60_000);
        assert_eq!(p.policy_header(), "\"api\";q=20;w=60");
        assert_eq!(p.limit_header(), "20");
        assert_eq!(p.redis_key("alice"), b"rl:{alice}:api");
        assert_eq!(p.redis_key("127.0.0.1"), b"rl:{127.0.0.1}:api");
    }

    #[test]
    fn bad_policies_are_refused_with_a_clear_error() {
        let err = Policy::new("", Algorithm::TokenBucket, 1, 1).unwrap_err();
        assert!(matches!(err, PolicyError::InvalidName(_)));
        for bad in ["Api", "-api", "a{b}", "a:b", "a\"b", &"a".repeat(64)] {
            assert!(
                matches!(
                    Policy::new(bad, Algorithm::FixedWindow, 1, 1),
                    Err(PolicyError::InvalidName(_))
                ),
                "{bad:?} must be refused"
            );
        }
        let err = Policy::new("api", Algorithm::TokenBucket, 0, 60).unwrap_err();
        assert_eq!(err, PolicyError::ZeroLimit("api".into()));
        assert!(err.to_string().contains("limit must be greater than 0"));
        let err = Policy::new("api", Algorithm::TokenBucket, 5, 0).unwrap_err();
        assert_eq!(err, PolicyError::ZeroWindow("api".into()));
        let err = Policy::new("api", Algorithm::TokenBucket, u32::MAX, u32::MAX).unwrap_err();
        assert!(matches!(err, PolicyError::TooLarge { .. }), "{err}");
        // The largest sane policies still fit.
        Policy::new("day", Algorithm::TokenBucket, 100_000_000, 86_400).unwrap();
    }

    #[test]
    fn equality_is_by_value() {
        let a = Policy::new("api", Algorithm::TokenBucket, 20, 60).unwrap();
        let b = Policy::new("api", Algorithm::TokenBucket, 20, 60).unwrap();
        let c = Policy::new("api", Algorithm::FixedWindow, 20, 60).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.same_shape(Algorithm::TokenBucket, 20, 60));
        assert!(!a.same_shape(Algorithm::TokenBucket, 21, 60));
    }
}
