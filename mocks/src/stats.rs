//! Counts the requests an instance received, for tests that must know how
//! many calls reached a backend (request coalescing, retries), and keeps the
//! last few of them (method, path, headers, body size) for tests that must
//! see what arrived (traffic mirroring).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value;

/// Requests kept in [`RequestStats::recent`].
pub const RECENT: usize = 64;

/// Requests received by one mock instance, `/health` and `/stats` excepted.
#[derive(Debug, Default)]
pub struct RequestStats {
    requests: AtomicU64,
    recent: Mutex<VecDeque<Value>>,
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

    /// Keeps the description of one request, dropping the oldest past [`RECENT`].
    pub fn keep(&self, request: Value) {
        let mut recent = self.recent.lock();
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(request);
    }

    /// The requests kept, oldest first.
    pub fn recent(&self) -> Vec<Value> {
        self.recent.lock().iter().cloned().collect()
    }
}
