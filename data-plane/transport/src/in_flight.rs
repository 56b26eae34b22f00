//! Requests in flight at an upstream instance: counted from the moment one
//! is sent until its answer's body ends (the guard travels with the body),
//! for the least-request balancer and `/ops/upstreams`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The count of one instance.
#[derive(Debug, Default)]
pub struct InFlightCount(AtomicU64);

impl InFlightCount {
    /// Requests in flight now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Counts one request until the guard drops.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.0.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }
}

/// One request counted as in flight until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<InFlightCount>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_until_its_guard_drops() {
        let count = Arc::new(InFlightCount::default());
        let a = count.start();
        let b = count.start();
        assert_eq!(count.get(), 2);
        drop(a);
        assert_eq!(count.get(), 1);
        drop(b);
        assert_eq!(count.get(), 0);
    }
}
