//! "Denied until": remembers keys Redis has just refused, to answer their
//! next requests without a round trip.
//!
//! This never over-admits. After a denial, neither algorithm can admit the key
//! before the `retry_after` Redis reported: a token bucket only refills with
//! time and other replicas only spend, and a fixed window only resets at its
//! end. The deadline is measured from when the answer arrived, which is after
//! Redis computed it, so the cache errs by at most one round trip towards
//! denying a little longer, never shorter. A client hammering a limited key
//! (the usual abuse pattern) then costs no Redis traffic at all.

use crate::algorithm::Outcome;
use crate::policy::{Algorithm, Policy};
use crate::shard::{ShardedMap, Write};

#[derive(Debug, Clone, Copy)]
struct Entry {
    algorithm: Algorithm,
    limit: u32,
    window_seconds: u32,
    /// Local ms at which the key may be admitted again.
    denied_until_ms: u64,
    /// Local ms at which the whole budget is back.
    reset_at_ms: u64,
}

/// See the module documentation.
pub(crate) struct DenyCache {
    map: ShardedMap<Entry>,
}

impl DenyCache {
    pub(crate) fn new(max_keys: usize) -> Self {
        let shards = std::thread::available_parallelism().map_or(4, |n| n.get()) * 4;
        Self {
            map: ShardedMap::new(max_keys, shards),
        }
    }

    /// A denial for `subject` if one is known at `now_ms`, with waits counted from now.
    pub(crate) fn get(&self, policy: &Policy, subject: &[u8], now_ms: u64) -> Option<Outcome> {
        self.map.update(
            policy.name_arc(),
            subject,
            |entry| match entry {
                Some(e)
                    if now_ms < e.denied_until_ms
                        && policy.same_shape(e.algorithm, e.limit, e.window_seconds) =>
                {
                    let outcome = Outcome {
                        allowed: false,
                        remaining: 0,
                        reset_after_ms: e.reset_at_ms.saturating_sub(now_ms),
                        retry_after_ms: e.denied_until_ms - now_ms,
                    };
                    (Some(outcome), Write::Keep)
                }
                Some(_) => (None, Write::Remove),
                None => (None, Write::Keep),
            },
            |_| false,
        )
    }

    /// Records a denial Redis reported; `now_ms` is when its answer arrived.
    pub(crate) fn insert(&self, policy: &Policy, subject: &[u8], outcome: &Outcome, now_ms: u64) {
        debug_assert!(!outcome.allowed);
        let entry = Entry {
            algorithm: policy.algorithm(),
            limit: policy.limit(),
            window_seconds: policy.window_seconds(),
            denied_until_ms: now_ms + outcome.retry_after_ms,
            reset_at_ms: now_ms + outcome.reset_after_ms,
        };
        self.map.update(
            policy.name_arc(),
            subject,
            |_| ((), Write::Set(entry)),
            |e| e.denied_until_ms <= now_ms,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_is_replayed_until_it_expires_with_shrinking_waits() {
        let cache = DenyCache::new(100);
        let p = Policy::new("api", Algorithm::TokenBucket, 20, 60).unwrap();
        assert!(cache.get(&p, b"alice", 0).is_none());
        let denial = Outcome {
            allowed: false,
            remaining: 0,
            reset_after_ms: 60_000,
            retry_after_ms: 3_000,
        };
        cache.insert(&p, b"alice", &denial, 1_000);
        let hit = cache.get(&p, b"alice", 2_000).unwrap();
        assert!(!hit.allowed);
        assert_eq!(hit.retry_after_ms, 2_000);
        assert_eq!(hit.reset_after_ms, 59_000);
        assert!(cache.get(&p, b"bob", 2_000).is_none());
        assert!(
            cache.get(&p, b"alice", 4_000).is_none(),
            "expired at 1000 + 3000"
        );
        assert!(cache.get(&p, b"alice", 2_000).is_none(), "and forgotten");
    }

    #[test]
    fn a_changed_policy_ignores_old_denials() {
        let cache = DenyCache::new(100);
        let p = Policy::new("api", Algorithm::TokenBucket, 20, 60).unwrap();
        let bigger = Policy::new("api", Algorithm::TokenBucket, 40, 60).unwrap();
        let denial = Outcome {
            allowed: false,
            remaining: 0,
            reset_after_ms: 60_000,
            retry_after_ms: 3_000,
        };
        cache.insert(&p, b"alice", &denial, 0);
        assert!(cache.get(&bigger, b"alice", 1).is_none());
    }
}
