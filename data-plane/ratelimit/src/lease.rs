//! Leases: tokens a replica takes from a shared budget ahead of demand, so
//! that a busy key is decided in-process most of the time.
//!
//! A key that one replica decides many times a second (a busy user, one
//! client address) would otherwise cost a Redis script run per batch of
//! concurrent requests. When such a key's run goes to Redis, it asks for a
//! few more tokens than its batch needs ([`Leases::extra`]): the script
//! admits those like any other request, in the same atomic run, and the
//! replica keeps them as a lease ([`Leases::record`]). The key's next requests
//! spend the lease locally ([`Leases::take`]) until it is empty or expires;
//! then the next run goes to Redis again.
//!
//! # Never over-admitting
//! Leased tokens are real: Redis has already spent them from the shared
//! budget, so every replica together still admits at most `limit` per
//! window. A token bucket's tokens stay valid after they were taken (the
//! bucket was charged at that time, and only refills with time); a fixed
//! window's lease expires no later than the window it was taken in ends,
//! measured from when the run was *sent* (Redis computed the window end after
//! that, so the lease never outlives it). Sliding windows and stacked limits
//! are never leased.
//!
//! # What it costs
//! Tokens a replica leased but did not spend are lost to every replica until
//! the budget refills (a token bucket) or the window ends (a fixed window):
//! the shared limit errs towards refusing, never towards admitting. The lease
//! is sized so that this stays small:
//! * at most the key's recent demand on this replica over one lease period
//!   (`period`, default 100 ms): a key seen once a second never gets a lease;
//! * at most 1/[`BUDGET_SHARE`] of the budget Redis last reported left, so a
//!   budget that is nearly spent is decided one request at a time, exactly as
//!   without leases, and limits below [`BUDGET_SHARE`] are never leased;
//! * at most `max_tokens` (default 1,000).
//!
//! Headers stay truthful for the replica: a leased decision reports the
//! budget Redis left plus the lease still held, which is what the next run
//! on this replica would see had nothing else spent.

use std::time::Duration;

use crate::algorithm::Outcome;
use crate::policy::{Algorithm, Policy};
use crate::shard::{ShardedMap, Write};

/// A lease never holds more than this share of what Redis last reported left.
pub(crate) const BUDGET_SHARE: u64 = 64;

/// How leases are sized and how long they live.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseSettings {
    /// Most tokens one lease holds; 0 turns leasing off.
    pub(crate) max_tokens: u32,
    /// Demand is estimated over this period, and a lease lives at most this long.
    pub(crate) period: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    algorithm: Algorithm,
    limit: u32,
    window_seconds: u32,
    /// Tokens left to spend.
    tokens: u32,
    /// What Redis reported left of the budget after the run that took this lease.
    base_remaining: u64,
    /// Local ms at which the whole budget is back (as Redis reported it).
    reset_at_ms: u64,
    /// Local ms of the run's answer: where demand is counted from.
    since_ms: u64,
    /// Local ms after which the tokens may no longer be spent.
    expires_at_ms: u64,
    /// Requests of this key decided on this replica since `since_ms` (the run's included).
    served: u32,
}

/// What a run left for [`Leases::record`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunAnswer {
    /// Requests of the batch the run decided (the leased tokens not included).
    pub(crate) requests: u32,
    /// Tokens admitted beyond them: the lease.
    pub(crate) leased: u32,
    /// The budget Redis reported left after the run.
    pub(crate) remaining: u64,
    /// Milliseconds until the whole budget is back, as Redis reported.
    pub(crate) reset_after_ms: u64,
}

/// See the module documentation.
pub(crate) struct Leases {
    settings: LeaseSettings,
    map: ShardedMap<Lease>,
}

impl Leases {
    pub(crate) fn new(settings: LeaseSettings, max_keys: usize) -> Self {
        let shards = std::thread::available_parallelism().map_or(4, |n| n.get()) * 4;
        Self {
            settings,
            map: ShardedMap::new(max_keys, shards),
        }
    }

    fn enabled_for(&self, policy: &Policy) -> bool {
        self.settings.max_tokens > 0
            && matches!(
                policy.algorithm(),
                Algorithm::TokenBucket | Algorithm::FixedWindow
            )
    }

    /// Spends one leased token of `subject` at `now_ms`, if a live lease holds one.
    pub(crate) fn take(&self, policy: &Policy, subject: &[u8], now_ms: u64) -> Option<Outcome> {
        if !self.enabled_for(policy) {
            return None;
        }
        self.map.update(
            policy.name_arc(),
            subject,
            |lease| match lease {
                Some(l) if policy.same_shape(l.algorithm, l.limit, l.window_seconds) => {
                    let mut l = *l;
                    l.served = l.served.saturating_add(1);
                    if l.tokens == 0 || now_ms >= l.expires_at_ms {
                        // Counted as demand for the next run's lease.
                        l.tokens = 0;
                        return (None, Write::Set(l));
                    }
                    l.tokens -= 1;
                    let outcome = Outcome {
                        allowed: true,
                        remaining: l.base_remaining + u64::from(l.tokens),
                        reset_after_ms: l.reset_at_ms.saturating_sub(now_ms),
                        retry_after_ms: 0,
                    };
                    (Some(outcome), Write::Set(l))
                }
                Some(_) => (None, Write::Remove),
                None => (None, Write::Keep),
            },
            |l| l.tokens == 0 || l.expires_at_ms <= now_ms,
        )
    }

    /// Tokens worth asking Redis for beyond a batch of `subject`, at `now_ms`:
    /// this replica's recent demand for the key over one lease period, within
    /// the bounds of the module documentation. 0 for a key not seen before.
    pub(crate) fn extra(&self, policy: &Policy, subject: &[u8], now_ms: u64) -> u32 {
        if !self.enabled_for(policy) {
            return 0;
        }
        let period_ms = self.settings.period.as_millis().max(1) as u64;
        self.map.update(
            policy.name_arc(),
            subject,
            |lease| {
                let extra = match lease {
                    Some(l) if policy.same_shape(l.algorithm, l.limit, l.window_seconds) => {
                        let elapsed = now_ms.saturating_sub(l.since_ms).max(1);
                        let demand = u64::from(l.served) * period_ms / elapsed;
                        let share = (l.base_remaining + u64::from(l.tokens)) / BUDGET_SHARE;
                        demand.min(share).min(u64::from(self.settings.max_tokens))
                    }
                    _ => 0,
                };
                (extra as u32, Write::Keep)
            },
            |_| false,
        )
    }

    /// Keeps what a run of `subject` answered: its leased tokens, and the
    /// budget and demand the next lease is sized by. `sent_ms` is when the
    /// run was sent, `now_ms` when its answer arrived.
    pub(crate) fn record(
        &self,
        policy: &Policy,
        subject: &[u8],
        answer: RunAnswer,
        sent_ms: u64,
        now_ms: u64,
    ) {
        if !self.enabled_for(policy) {
            return;
        }
        let period_ms = self.settings.period.as_millis() as u64;
        let expires_at_ms = match policy.algorithm() {
            // Redis computed the window's end after the run was sent.
            Algorithm::FixedWindow => sent_ms + answer.reset_after_ms.min(period_ms),
            _ => sent_ms + period_ms,
        };
        self.map.update(
            policy.name_arc(),
            subject,
            |current| {
                // Tokens still held from an earlier run (runs of one key can
                // overlap) are kept. A live fixed-window lease ends with its
                // window, and this run was answered before that, so it was
                // decided in the same window and the new expiry bounds both.
                let held = current
                    .filter(|l| {
                        policy.same_shape(l.algorithm, l.limit, l.window_seconds)
                            && now_ms < l.expires_at_ms
                    })
                    .map_or(0, |l| l.tokens);
                let lease = Lease {
                    algorithm: policy.algorithm(),
                    limit: policy.limit(),
                    window_seconds: policy.window_seconds(),
                    tokens: held.saturating_add(answer.leased),
                    base_remaining: answer.remaining,
                    reset_at_ms: now_ms + answer.reset_after_ms,
                    since_ms: now_ms,
                    expires_at_ms,
                    served: answer.requests,
                };
                ((), Write::Set(lease))
            },
            |l| l.tokens == 0 || l.expires_at_ms <= now_ms,
        );
    }

    /// Keys held (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases(max_tokens: u32) -> Leases {
        Leases::new(
            LeaseSettings {
                max_tokens,
                period: Duration::from_millis(100),
            },
            1000,
        )
    }

    fn answer(requests: u32, leased: u32, remaining: u64) -> RunAnswer {
        RunAnswer {
            requests,
            leased,
            remaining,
            reset_after_ms: 60_000,
        }
    }

    #[test]
    fn a_key_not_seen_before_asks_for_nothing_extra() {
        let l = leases(1000);
        let p = Policy::new("api", Algorithm::TokenBucket, 1_000_000, 60).unwrap();
        assert_eq!(l.extra(&p, b"alice", 0), 0);
        assert!(l.take(&p, b"alice", 0).is_none());
    }

    #[test]
    fn demand_sizes_the_lease_within_the_budget_share_and_the_cap() {
        let l = leases(1000);
        let p = Policy::new("api", Algorithm::TokenBucket, 1_000_000, 60).unwrap();
        // 20 requests decided by a run at t=0, the next run at t=10 ms: 2 per ms,
        // 200 over a 100 ms period.
        l.record(&p, b"alice", answer(20, 0, 900_000), 0, 0);
        assert_eq!(l.extra(&p, b"alice", 10), 200);
        // The cap.
        l.record(&p, b"alice", answer(500, 0, 900_000), 0, 0);
        assert_eq!(l.extra(&p, b"alice", 1), 1000);
        // A nearly spent budget: at most 1/64 of what is left (6399 / 64 = 99).
        l.record(&p, b"alice", answer(500, 0, 6_399), 0, 0);
        assert_eq!(l.extra(&p, b"alice", 1), 99);
        // A key seen once a second gets nothing extra.
        l.record(&p, b"alice", answer(1, 0, 900_000), 0, 0);
        assert_eq!(l.extra(&p, b"alice", 1_000), 0);
        // Leasing off.
        let off = leases(0);
        off.record(&p, b"alice", answer(500, 0, 900_000), 0, 0);
        assert_eq!(off.extra(&p, b"alice", 1), 0);
    }

    #[test]
    fn small_limits_are_never_leased() {
        let l = leases(1000);
        let p = Policy::new("api", Algorithm::TokenBucket, 63, 60).unwrap();
        l.record(&p, b"alice", answer(1, 0, 62), 0, 0);
        assert_eq!(l.extra(&p, b"alice", 1), 0);
    }

    #[test]
    fn leased_tokens_are_spent_once_each_with_truthful_remaining() {
        let l = leases(1000);
        let p = Policy::new("api", Algorithm::TokenBucket, 1_000_000, 60).unwrap();
        l.record(&p, b"alice", answer(1, 3, 5_000), 0, 2);
        let remaining: Vec<u64> = (0..3)
            .map(|_| l.take(&p, b"alice", 10).unwrap())
            .map(|o| {
                assert!(o.allowed);
                assert_eq!(o.reset_after_ms, 60_000 + 2 - 10);
                o.remaining
            })
            .collect();
        assert_eq!(remaining, [5_002, 5_001, 5_000]);
        assert!(l.take(&p, b"alice", 10).is_none(), "the lease is spent");
        // Those five requests (the run's one, three leased, and the one that
        // found the lease spent and goes to Redis) are the demand for the next
        // run's lease, so a spent lease is kept: 5 in 8 ms, 62 per 100 ms.
        assert_eq!(l.len(), 1);
        assert_eq!(l.extra(&p, b"alice", 10), 5 * 100 / 8);
        // Another subject has no lease.
        assert!(l.take(&p, b"bob", 10).is_none());
    }

    #[test]
    fn overlapping_runs_add_their_leases_up() {
        let l = leases(1000);
        let p = Policy::new("api", Algorithm::TokenBucket, 1_000_000, 60).unwrap();
        l.record(&p, b"alice", answer(1, 3, 5_000), 0, 1);
        assert!(l.take(&p, b"alice", 2).is_some());
        // A second run of the key, sent before the first answered, brings 4 more.
        l.record(&p, b"alice", answer(2, 4, 4_000), 0, 3);
        let spent = std::iter::from_fn(|| l.take(&p, b"alice", 4)).count();
        assert_eq!(spent, 2 + 4);
        // An expired lease's tokens are not carried over.
        l.record(&p, b"alice", answer(1, 3, 5_000), 0, 1);
        l.record(&p, b"alice", answer(1, 1, 5_000), 200, 201);
        assert_eq!(std::iter::from_fn(|| l.take(&p, b"alice", 202)).count(), 1);
    }

    #[test]
    fn a_token_bucket_lease_expires_after_one_period() {
        let l = leases(1000);
        let p = Policy::new("api", Algorithm::TokenBucket, 1_000_000, 60).unwrap();
        l.record(&p, b"alice", answer(1, 10, 5_000), 1_000, 1_003);
        assert!(l.take(&p, b"alice", 1_099).is_some());
        assert!(
            l.take(&p, b"alice", 1_100).is_none(),
            "sent at 1000 + 100 ms"
        );
    }

    #[test]
    fn a_fixed_window_lease_never_outlives_its_window() {
        let l = leases(1000);
        let p = Policy::new("fw", Algorithm::FixedWindow, 1_000_000, 60).unwrap();
        // Redis said the window ends 30 ms after it ran, which was after the
        // run was sent at 1000: the lease ends by 1030 at the latest.
        let a = RunAnswer {
            reset_after_ms: 30,
            ..answer(1, 10, 5_000)
        };
        l.record(&p, b"k", a, 1_000, 1_005);
        assert!(l.take(&p, b"k", 1_029).is_some());
        assert!(l.take(&p, b"k", 1_030).is_none());
    }

    #[test]
    fn sliding_windows_and_changed_policies_are_not_leased() {
        let l = leases(1000);
        let sw = Policy::new("sw", Algorithm::SlidingWindow, 1_000_000, 60).unwrap();
        l.record(&sw, b"k", answer(100, 10, 5_000), 0, 0);
        assert!(l.take(&sw, b"k", 1).is_none());
        assert_eq!(l.extra(&sw, b"k", 1), 0);
        let p = Policy::new("api", Algorithm::TokenBucket, 1_000_000, 60).unwrap();
        let changed = Policy::new("api", Algorithm::TokenBucket, 2_000_000, 60).unwrap();
        l.record(&p, b"k", answer(100, 10, 5_000), 0, 0);
        assert!(l.take(&changed, b"k", 1).is_none());
        assert_eq!(l.extra(&changed, b"k", 1), 0);
    }
}
