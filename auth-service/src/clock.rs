//! Wall-clock time in Unix seconds, injectable for tests.

use std::time::{SystemTime, UNIX_EPOCH};

/// Source of the current time in Unix seconds.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Seconds since the Unix epoch.
    fn now(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}
