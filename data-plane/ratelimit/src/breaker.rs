//! The breaker in front of Redis: after a few consecutive failures, stop
//! waiting on it and decide locally until a background probe sees it again.
//!
//! Lock-free: the request path reads one atomic; only failures write.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use tokio::sync::Notify;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Breaker {
    open: AtomicBool,
    consecutive_failures: AtomicU32,
    threshold: u32,
    /// Wakes the prober when the breaker opens.
    opened: Notify,
}

impl Breaker {
    /// A breaker that opens after `threshold` consecutive failures (at least 1).
    /// `open` is the initial state: open until the first probe succeeds.
    pub(crate) fn new(threshold: u32, open: bool) -> Self {
        Self {
            open: AtomicBool::new(open),
            consecutive_failures: AtomicU32::new(0),
            threshold: threshold.max(1),
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

    /// Redis failed or missed the deadline. Returns true if this opened the breaker.
    pub(crate) fn record_failure(&self) -> bool {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel) {
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
        let b = Breaker::new(3, false);
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        b.record_success();
        assert!(!b.record_failure());
        assert!(!b.record_failure());
        assert!(!b.is_open());
        assert!(b.record_failure(), "third in a row opens");
        assert!(b.is_open());
        assert!(!b.record_failure(), "already open");
        b.close();
        assert!(!b.is_open());
        assert!(!b.record_failure(), "the count restarted");
    }

    #[tokio::test]
    async fn opening_wakes_a_waiter_even_if_it_was_not_yet_waiting() {
        let b = Breaker::new(1, false);
        assert!(b.record_failure());
        tokio::time::timeout(std::time::Duration::from_secs(5), b.opened())
            .await
            .expect("the permit from notify_one wakes a later waiter");
    }
}
