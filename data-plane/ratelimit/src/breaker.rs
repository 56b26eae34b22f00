//! The breaker in front of Redis: once Redis has failed for a while, stop
//! waiting on it and decide locally until a background probe sees it again.
//!
//! It opens when at least `threshold` consecutive decisions failed **and**
//! that streak of failures has lasted at least `min_span`. The span matters:
//! a CPU stall of a few milliseconds on a busy host makes every in-flight
//! decision miss its deadline at once, and opening on that burst alone would
//! make the replica local for a whole probe interval although Redis is fine.
//! A dead Redis keeps failing, so it still trips the breaker within `min_span`
//! (each decision meanwhile waits at most its deadline).
//!
//! Lock-free: the request path reads one atomic; only failures write.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use tokio::sync::Notify;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Breaker {
    open: AtomicBool,
    consecutive_failures: AtomicU32,
    /// When (ms, caller's clock) the current streak of failures began.
    streak_started_ms: AtomicU64,
    threshold: u32,
    min_span_ms: u64,
    /// Wakes the prober when the breaker opens.
    opened: Notify,
}

impl Breaker {
    /// A breaker that opens after `threshold` consecutive failures (at least 1)
    /// spanning at least `min_span_ms`. `open` is the initial state: open
    /// until the first probe succeeds.
    pub(crate) fn new(threshold: u32, min_span_ms: u64, open: bool) -> Self {
        Self {
            open: AtomicBool::new(open),
            consecutive_failures: AtomicU32::new(0),
            streak_started_ms: AtomicU64::new(0),
            threshold: threshold.max(1),
            min_span_ms,
            opened: Notify::new(),
        }
    }

    /// Whether decisions should skip Redis.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// A Redis answer arrived in time.
    pub(crate) fn record_success(&self) {
        // Read first: successes are the common case and need not dirty the cache line.
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Redis failed or missed the deadline at `now_ms`. Returns true if this opened the breaker.
    pub(crate) fn record_failure(&self, now_ms: u64) -> bool {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures == 1 {
            self.streak_started_ms.store(now_ms, Ordering::Release);
            // A streak that starts now cannot have lasted min_span yet, unless min_span is 0.
        }
        let span = now_ms.saturating_sub(self.streak_started_ms.load(Ordering::Acquire));
        if failures >= self.threshold
            && span >= self.min_span_ms
            && !self.open.swap(true, Ordering::AcqRel)
        {
            // notify_one keeps a permit if the prober is busy, so no wake-up is lost.
            self.opened.notify_one();
            return true;
        }
        false
    }

    /// A probe reached Redis: resume shared limiting.
    pub(crate) fn close(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }

    /// Resolves after the breaker next opens (or at once if a wake-up is pending).
    pub(crate) async fn opened(&self) {
        self.opened.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = Breaker::new(3, 0, false);
        assert!(!b.record_failure(0));
        assert!(!b.record_failure(0));
        b.record_success();
        assert!(!b.record_failure(0));
        assert!(!b.record_failure(0));
        assert!(!b.is_open());
        assert!(b.record_failure(0), "third in a row opens");
        assert!(b.is_open());
        assert!(!b.record_failure(0), "already open");
        b.close();
        assert!(!b.is_open());
        assert!(!b.record_failure(0), "the count restarted");
    }

    #[test]
    fn a_burst_of_failures_in_one_instant_does_not_open_it() {
        let b = Breaker::new(3, 50, false);
        // A CPU stall: 16 in-flight decisions miss the deadline together.
        for _ in 0..16 {
            assert!(!b.record_failure(1_000));
        }
        // Redis answers the next one: the streak is over.
        b.record_success();
        assert!(!b.record_failure(1_030));
        assert!(!b.record_failure(1_060), "only 30 ms into this streak");
        assert!(b.record_failure(1_080), "failing for 50 ms: open");
        assert!(b.is_open());
    }

    #[tokio::test]
    async fn opening_wakes_a_waiter_even_if_it_was_not_yet_waiting() {
        let b = Breaker::new(1, 0, false);
        assert!(b.record_failure(0));
        tokio::time::timeout(std::time::Duration::from_secs(5), b.opened())
            .await
            .expect("the permit from notify_one wakes a later waiter");
    }
}
