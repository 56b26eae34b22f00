//! The replica-local limiter: the same policies and arithmetic as the Redis
//! scripts, with the budgets kept in this process.
//!
//! It decides when Redis is slow, down, or not configured. Its budgets are
//! per replica, so during a Redis outage N replicas together admit up to
//! N × `limit` per window (see the crate documentation).

use crate::algorithm::{self, Outcome, fixed_window_is_over, token_bucket_is_full};
use crate::policy::{Algorithm, Policy};
use crate::shard::{ShardedMap, Write};
use crate::stacked::{self, LimitOutcome, MAX_STACKED, State, sliding_window_is_idle};

/// Per-key state, tagged with the policy shape it was computed for so that a
/// configuration change (new limit or window) starts a fresh budget instead
/// of misreading the old one.
#[derive(Debug, Clone, Copy)]
struct Entry {
    limit: u32,
    window_seconds: u32,
    state: State,
}

impl Entry {
    fn algorithm(&self) -> Algorithm {
        match self.state {
            State::TokenBucket(_) => Algorithm::TokenBucket,
            State::FixedWindow(_) => Algorithm::FixedWindow,
            State::SlidingWindow(_) => Algorithm::SlidingWindow,
        }
    }

    /// True when forgetting the entry changes nothing: a full bucket, a past window.
    fn is_idle(&self, now_ms: u64) -> bool {
        let window_ms = u64::from(self.window_seconds) * 1000;
        match self.state {
            State::TokenBucket(s) => token_bucket_is_full(self.limit, window_ms, s, now_ms),
            State::FixedWindow(s) => fixed_window_is_over(window_ms, s, now_ms),
            State::SlidingWindow(s) => sliding_window_is_idle(window_ms, s, now_ms),
        }
    }

    /// The entry's state if it was computed for `policy`'s shape.
    fn state_for(entry: Option<&Entry>, policy: &Policy) -> Option<State> {
        entry
            .filter(|e| policy.same_shape(e.algorithm(), e.limit, e.window_seconds))
            .map(|e| e.state)
    }

    fn new(policy: &Policy, state: State) -> Self {
        Self {
            limit: policy.limit(),
            window_seconds: policy.window_seconds(),
            state,
        }
    }
}

/// A bounded in-process limiter. Times are milliseconds on the caller's clock.
pub struct LocalLimiter {
    map: ShardedMap<Entry>,
}

impl LocalLimiter {
    /// A limiter tracking at most about `max_keys` budgets; when full it drops
    /// idle ones first, then arbitrary ones (which can only over-admit the
    /// forgotten keys, and only under that memory pressure).
    pub fn new(max_keys: usize) -> Self {
        let shards = std::thread::available_parallelism().map_or(4, |n| n.get()) * 4;
        Self {
            map: ShardedMap::new(max_keys, shards),
        }
    }

    /// Decides one request of `subject` under `policy` at `now_ms`.
    pub fn check_at(&self, policy: &Policy, subject: impl AsRef<[u8]>, now_ms: u64) -> Outcome {
        let subject = subject.as_ref();
        let limit = policy.limit();
        let window_ms = policy.window_ms();
        self.map.update(
            policy.name_arc(),
            subject,
            |entry| {
                let state = Entry::state_for(entry, policy);
                let (outcome, next) = match policy.algorithm() {
                    Algorithm::TokenBucket => {
                        let prev = match state {
                            Some(State::TokenBucket(s)) => Some(s),
                            _ => None,
                        };
                        let (o, s) = algorithm::token_bucket(limit, window_ms, prev, now_ms);
                        (o, s.map(State::TokenBucket))
                    }
                    Algorithm::FixedWindow => {
                        let prev = match state {
                            Some(State::FixedWindow(s)) => Some(s),
                            _ => None,
                        };
                        let (o, s) = algorithm::fixed_window(limit, window_ms, prev, now_ms);
                        (o, s.map(State::FixedWindow))
                    }
                    Algorithm::SlidingWindow => sliding_window(policy, state, now_ms),
                };
                let write = match next {
                    Some(state) => Write::Set(Entry::new(policy, state)),
                    None => Write::Keep,
                };
                (outcome, write)
            },
            |e| e.is_idle(now_ms),
        )
    }

    /// Decides one request under every limit of `limits` (policy, subject) at
    /// `now_ms`, all or nothing: admitted only if every limit admits it, and
    /// only then spent from each (see [`crate::stacked`]). Returns the index of
    /// the limit that describes the verdict ([`stacked::shaping`]) and its outcome.
    ///
    /// # Panics
    /// If `limits` is empty or holds more than [`MAX_STACKED`] entries.
    pub fn check_all_at(&self, limits: &[(&Policy, &[u8])], now_ms: u64) -> (usize, Outcome) {
        let n = limits.len();
        assert!((1..=MAX_STACKED).contains(&n), "1 to {MAX_STACKED} limits");
        let mut keys: [(&std::sync::Arc<str>, &[u8]); MAX_STACKED] =
            [(limits[0].0.name_arc(), limits[0].1); MAX_STACKED];
        let mut shapes = [limits[0].0.shape(); MAX_STACKED];
        for (i, (policy, subject)) in limits.iter().enumerate() {
            keys[i] = (policy.name_arc(), subject);
            shapes[i] = policy.shape();
        }
        self.map.update_many(
            &keys[..n],
            |entries| {
                let mut states = [None; MAX_STACKED];
                for (i, (policy, _)) in limits.iter().enumerate() {
                    states[i] = Entry::state_for(entries[i].as_ref(), policy);
                }
                let mut out = [LimitOutcome::default(); MAX_STACKED];
                let admitted =
                    stacked::decide(&shapes[..n], &mut states[..n], now_ms, 1, &mut out[..n]);
                let (allow, deny) = stacked::shaping(&out[..n]);
                let index = if admitted == 1 { allow } else { deny };
                if admitted == 1 {
                    for (i, (policy, _)) in limits.iter().enumerate() {
                        entries[i] = states[i].map(|state| Entry::new(policy, state));
                    }
                }
                ((index, outcome(admitted == 1, out[index])), admitted == 1)
            },
            |e| e.is_idle(now_ms),
        )
    }

    /// Number of budgets currently tracked.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no budget is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One sliding-window decision: the stacked model with one limit. Out of
/// line, so that the other algorithms' path stays as small as it was.
#[inline(never)]
fn sliding_window(policy: &Policy, state: Option<State>, now_ms: u64) -> (Outcome, Option<State>) {
    let mut states = [state];
    let mut out = [LimitOutcome::default()];
    let admitted = stacked::decide(&[policy.shape()], &mut states, now_ms, 1, &mut out);
    let o = outcome(admitted == 1, out[0]);
    (o, (admitted == 1).then_some(states[0]).flatten())
}

/// One limit's figures as the outcome of a request it admitted or refused.
fn outcome(allowed: bool, o: LimitOutcome) -> Outcome {
    Outcome {
        allowed,
        remaining: o.remaining,
        reset_after_ms: o.reset_after_ms,
        retry_after_ms: if allowed { 0 } else { o.retry_after_ms },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_token_bucket_enforces_burst_and_refill_per_subject() {
        let local = LocalLimiter::new(1_000);
        let api = Policy::new("api", Algorithm::TokenBucket, 3, 3).unwrap();
        let t0 = 10_000;
        let admitted = (0..5)
            .filter(|_| local.check_at(&api, "alice", t0).allowed)
            .count();
        assert_eq!(admitted, 3);
        // Another subject has its own budget.
        assert!(local.check_at(&api, "bob", t0).allowed);
        let denied = local.check_at(&api, "alice", t0 + 999);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 1);
        assert!(local.check_at(&api, "alice", t0 + 1_000).allowed);
    }

    #[test]
    fn local_fixed_window_resets_at_the_window_edge() {
        let local = LocalLimiter::new(1_000);
        let login = Policy::new("login", Algorithm::FixedWindow, 5, 60).unwrap();
        let start = 60_000 * 100;
        for i in 0..5 {
            let o = local.check_at(&login, "10.0.0.1", start + i);
            assert!(o.allowed);
            assert_eq!(o.remaining, 4 - i);
        }
        let o = local.check_at(&login, "10.0.0.1", start + 30_000);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ms, 30_000);
        assert!(local.check_at(&login, "10.0.0.1", start + 60_000).allowed);
    }

    #[test]
    fn a_changed_policy_starts_a_fresh_budget() {
        let local = LocalLimiter::new(1_000);
        let small = Policy::new("api", Algorithm::TokenBucket, 1, 60).unwrap();
        let big = Policy::new("api", Algorithm::TokenBucket, 2, 60).unwrap();
        let window = Policy::new("api", Algorithm::FixedWindow, 1, 60).unwrap();
        assert!(local.check_at(&small, "u", 0).allowed);
        assert!(!local.check_at(&small, "u", 0).allowed);
        assert!(local.check_at(&big, "u", 0).allowed);
        assert!(local.check_at(&window, "u", 0).allowed);
        assert!(!local.check_at(&window, "u", 0).allowed);
    }

    #[test]
    fn memory_is_bounded_by_forgetting_idle_budgets() {
        let local = LocalLimiter::new(256);
        let p = Policy::new("ip", Algorithm::FixedWindow, 1, 1).unwrap();
        for i in 0..10_000u64 {
            // Each second, a new crowd of clients; old windows are idle.
            local.check_at(&p, format!("10.0.{}.{}", i / 256, i % 256), i * 10);
        }
        assert!(local.len() <= 256 + 64, "{} entries", local.len());
        assert!(!local.is_empty());
    }

    #[test]
    fn local_sliding_window_counts_the_previous_window() {
        let local = LocalLimiter::new(1_000);
        let p = Policy::new("sw", Algorithm::SlidingWindow, 2, 1).unwrap();
        assert!(local.check_at(&p, "u", 10_000).allowed);
        assert!(local.check_at(&p, "u", 10_000).allowed);
        let denied = local.check_at(&p, "u", 10_500);
        assert!(!denied.allowed);
        // In the next window the 2 weigh 2 × (1000 − e) / 1000: one fits from e = 500.
        assert_eq!(denied.retry_after_ms, 1_000);
        assert!(!local.check_at(&p, "u", 11_499).allowed);
        assert!(local.check_at(&p, "u", 11_500).allowed);
    }

    #[test]
    fn stacked_local_decisions_are_all_or_nothing() {
        let local = LocalLimiter::new(1_000);
        let route = Policy::new("route", Algorithm::TokenBucket, 3, 3600).unwrap();
        let ip = Policy::new("ip", Algorithm::FixedWindow, 1, 3600).unwrap();
        let both = |subject: &'static str| [(&route, &b"r"[..]), (&ip, subject.as_bytes())];
        let (i, o) = local.check_all_at(&both("a"), 0);
        assert!(o.allowed);
        assert_eq!((i, o.remaining), (1, 0), "the IP limit has less left");
        // Refused by the IP limit: the route budget is not touched.
        for _ in 0..5 {
            let (i, o) = local.check_all_at(&both("a"), 1);
            assert!(!o.allowed);
            assert_eq!(i, 1);
            assert_eq!(o.retry_after_ms, 3_600_000 - 1);
        }
        let (i, o) = local.check_all_at(&both("b"), 2);
        assert!(o.allowed);
        assert_eq!((i, o.remaining), (1, 0));
        assert_eq!(
            local.check_at(&route, "r", 3).remaining,
            0,
            "2 + this one spent"
        );
        let (i, o) = local.check_all_at(&both("c"), 4);
        assert!(!o.allowed);
        assert_eq!(i, 0, "now the route refuses");
        // ... and the IP budget of "c" is untouched.
        assert!(local.check_at(&ip, "c", 5).allowed);
    }
}
