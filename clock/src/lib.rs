//! The one injectable wall clock of the workspace.
//!
//! Code that records or compares calendar time (token `exp` and `nbf`, key
//! rotation, `created_at`, a data plane's last contact) takes an
//! `Arc<dyn Clock>`: services pass [`SystemClock`], tests and benches a
//! [`ManualClock`] they move by hand, so nothing has to sleep to see time pass.
//! Durations and deadlines use tokio's clock instead (`tokio::time::pause`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Time since the Unix epoch (zero for a system clock set before 1970).
    fn now(&self) -> Duration;

    /// Whole seconds since the Unix epoch (what JWTs and key rotation count in).
    fn unix_secs(&self) -> u64 {
        self.now().as_secs()
    }
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// A clock that only moves when told to (tests and benches), to the millisecond.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ManualClock {
    /// A clock reading `now` (since the Unix epoch).
    pub fn new(now: Duration) -> Self {
        Self(AtomicU64::new(millis(now)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(millis(by), Ordering::SeqCst);
    }

    /// Sets the clock to `now` (since the Unix epoch), backwards too.
    pub fn set(&self, now: Duration) {
        self.0.store(millis(now), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Duration::from_millis(1_700_000_000_250));
        assert_eq!(clock.unix_secs(), 1_700_000_000);
        clock.advance(Duration::from_millis(800));
        assert_eq!(clock.now(), Duration::from_millis(1_700_000_001_050));
        clock.set(Duration::from_secs(5));
        assert_eq!(clock.unix_secs(), 5);
    }

    #[test]
    fn the_system_clock_is_after_2024() {
        assert!(SystemClock.unix_secs() > 1_704_067_200);
    }
}
