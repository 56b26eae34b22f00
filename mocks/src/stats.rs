//! Counts the requests an instance received, for tests that must know how
//! many calls reached a backend (request coalescing, retries).

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests received by one mock instance, `/health` and `/stats` excepted.
#[derive(Debug, Default)]
pub struct RequestStats {
    requests: AtomicU64,
}

impl RequestStats {
    /// Counts one request (when it arrives, before any delay hook).
    pub fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests counted so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}
