//! When each data plane last ACKed a configuration, and which version: the
//! web console's overview shows it next to `ListDataPlanes`' `last_seen`
//! (which every message, status reports included, advances). Kept in memory
//! per node id, like the registry; recorded by the config stream on each ACK.

use chrono::{DateTime, Utc};
use gateway_clock::Clock;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::now_utc;

/// The last ACK of each node: the version and when it arrived.
pub struct AckTimes {
    last: Mutex<HashMap<String, (u64, DateTime<Utc>)>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for AckTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckTimes")
            .field("nodes", &self.last.lock().len())
            .finish_non_exhaustive()
    }
}

impl AckTimes {
    /// None yet; times from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        AckTimes {
            last: Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// `node_id` ACKed `version` now.
    pub fn record(&self, node_id: &str, version: u64) {
        let now = now_utc(&*self.clock);
        self.last.lock().insert(node_id.to_owned(), (version, now));
    }

    /// The version `node_id` last ACKed and when, if it ever did.
    pub fn get(&self, node_id: &str) -> Option<(u64, DateTime<Utc>)> {
        self.last.lock().get(node_id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn keeps_the_last_ack_of_each_node() {
        let clock = Arc::new(gateway_clock::ManualClock::new(Duration::from_secs(100)));
        let acks = AckTimes::new(clock.clone());
        assert_eq!(acks.get("dp"), None);
        acks.record("dp", 3);
        clock.advance(Duration::from_secs(5));
        acks.record("dp", 4);
        acks.record("other", 1);
        let (version, at) = acks.get("dp").unwrap();
        assert_eq!((version, at.timestamp()), (4, 105));
    }
}
