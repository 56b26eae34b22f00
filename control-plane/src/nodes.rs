//! The registry of data planes: who is connected, what each has ACKed or NACKed.
//!
//! Kept in memory only: after a control-plane restart the list starts empty and
//! fills again as data planes reconnect (they do within their backoff, ≤ 30 s).

use crate::clock::{now_utc, rfc3339};
use crate::metrics::Metrics;
use chrono::{DateTime, Utc};
use gateway_clock::Clock;
use gateway_proto::v1::{DataPlaneState, DataPlaneStatus, Node};
use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Identifies one config stream, so a stale stream of a node that has since
/// reconnected cannot overwrite the state of the newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamId(u64);

#[derive(Debug)]
struct Entry {
    hostname: String,
    build_version: String,
    /// The open stream, `None` once it closed.
    stream: Option<StreamId>,
    /// The version the node serves: what it said on connect, then what it ACKed.
    acked_version: Option<u64>,
    last_nack_version: Option<u64>,
    last_nack_error: String,
    last_seen: DateTime<Utc>,
}

/// Every data plane that has connected since this process started.
pub struct NodeRegistry {
    entries: Mutex<BTreeMap<String, Entry>>,
    next_stream: AtomicU64,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for NodeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRegistry")
            .field("nodes", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl NodeRegistry {
    /// An empty registry that records ACK/NACK counts and latencies in `metrics`.
    pub fn new(clock: Arc<dyn Clock>, metrics: Arc<Metrics>) -> Self {
        NodeRegistry {
            entries: Mutex::new(BTreeMap::new()),
            next_stream: AtomicU64::new(1),
            clock,
            metrics,
        }
    }

    /// The metrics this registry records into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        // The map holds plain data that no panic can leave half-updated.
        self.entries.lock()
    }

    /// A node opened a stream, announcing the version it already serves (if any).
    /// Its NACK history is kept: a version it rejected before is not resent.
    pub fn connect(&self, node: &Node, serving: Option<u64>) -> StreamId {
        let id = StreamId(self.next_stream.fetch_add(1, Ordering::Relaxed));
        let now = now_utc(&*self.clock);
        let mut entries = self.lock();
        let e = entries.entry(node.id.clone()).or_insert_with(|| Entry {
            hostname: String::new(),
            build_version: String::new(),
            stream: None,
            acked_version: None,
            last_nack_version: None,
            last_nack_error: String::new(),
            last_seen: now,
        });
        e.hostname.clone_from(&node.hostname);
        e.build_version.clone_from(&node.build_version);
        e.stream = Some(id);
        e.acked_version = serving;
        e.last_seen = now;
        id
    }

    /// Applies `f` to the node's entry if `stream` is still its current stream.
    fn update(&self, node_id: &str, stream: StreamId, f: impl FnOnce(&mut Entry)) {
        let now = now_utc(&*self.clock);
        let mut entries = self.lock();
        if let Some(e) = entries.get_mut(node_id)
            && e.stream == Some(stream)
        {
            e.last_seen = now;
            f(e);
        }
    }

    /// A message arrived that is neither an ACK nor a NACK of the last push.
    pub fn seen(&self, node_id: &str, stream: StreamId) {
        self.update(node_id, stream, |_| {});
    }

    /// The node ACKed `version`, `latency` after it was pushed.
    pub fn ack(&self, node_id: &str, stream: StreamId, version: u64, latency: Duration) {
        self.metrics.record_ack(latency);
        self.update(node_id, stream, |e| e.acked_version = Some(version));
    }

    /// The node NACKed `version` with `error`.
    pub fn nack(&self, node_id: &str, stream: StreamId, version: u64, error: &str) {
        self.metrics.record_nack();
        self.update(node_id, stream, |e| {
            e.last_nack_version = Some(version);
            error.clone_into(&mut e.last_nack_error);
        });
    }

    /// The node's stream closed.
    pub fn disconnect(&self, node_id: &str, stream: StreamId) {
        self.update(node_id, stream, |e| e.stream = None);
    }

    /// The last version this node NACKed; it must never be pushed to it again.
    pub fn last_nack_version(&self, node_id: &str) -> Option<u64> {
        self.lock().get(node_id).and_then(|e| e.last_nack_version)
    }

    /// How many nodes have an open stream.
    pub fn connected(&self) -> usize {
        self.lock().values().filter(|e| e.stream.is_some()).count()
    }

    /// Every known node, sorted by id, with its state relative to `current_version`.
    pub fn list(&self, current_version: u64) -> Vec<DataPlaneStatus> {
        self.lock()
            .iter()
            .map(|(id, e)| {
                let status = if e.stream.is_none() {
                    DataPlaneState::Disconnected
                } else if e.last_nack_version == Some(current_version) {
                    DataPlaneState::Nacked
                } else if e.acked_version == Some(current_version) {
                    DataPlaneState::Synced
                } else {
                    DataPlaneState::Stale
                };
                DataPlaneStatus {
                    node_id: id.clone(),
                    hostname: e.hostname.clone(),
                    connected: e.stream.is_some(),
                    acked_version: e.acked_version.unwrap_or(0),
                    last_nack_version: e.last_nack_version.unwrap_or(0),
                    last_nack_error: e.last_nack_error.clone(),
                    last_seen: rfc3339(e.last_seen),
                    status: status as i32,
                    build_version: e.build_version.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn registry() -> NodeRegistry {
        let t = Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap();
        let clock = gateway_clock::ManualClock::new(Duration::from_secs(t.timestamp() as u64));
        NodeRegistry::new(Arc::new(clock), Arc::new(Metrics::default()))
    }

    fn node(id: &str) -> Node {
        Node {
            id: id.into(),
            hostname: "host-a".into(),
            build_version: "1.2.3".into(),
        }
    }

    fn state(r: &NodeRegistry, current: u64) -> DataPlaneState {
        DataPlaneState::try_from(r.list(current)[0].status).unwrap()
    }

    #[test]
    fn stale_until_the_current_version_is_acked() {
        let r = registry();
        let s = r.connect(&node("dp"), None);
        assert_eq!(state(&r, 3), DataPlaneState::Stale);
        r.ack("dp", s, 3, Duration::from_millis(2));
        assert_eq!(state(&r, 3), DataPlaneState::Synced);
        assert_eq!(state(&r, 4), DataPlaneState::Stale);
        let l = &r.list(3)[0];
        assert_eq!(
            (l.hostname.as_str(), l.build_version.as_str()),
            ("host-a", "1.2.3")
        );
        assert_eq!(l.last_seen, "2025-01-02T03:04:05.000Z");
        assert_eq!(l.acked_version, 3);
        assert_eq!(r.metrics().acks(), 1);
    }

    #[test]
    fn a_node_announcing_the_current_version_is_synced() {
        let r = registry();
        r.connect(&node("dp"), Some(7));
        assert_eq!(state(&r, 7), DataPlaneState::Synced);
    }

    #[test]
    fn nack_is_recorded_and_survives_reconnects() {
        let r = registry();
        let s = r.connect(&node("dp"), Some(1));
        r.nack("dp", s, 2, "route \"a\": bad");
        assert_eq!(state(&r, 2), DataPlaneState::Nacked);
        let l = &r.list(2)[0];
        assert_eq!((l.last_nack_version, l.acked_version), (2, 1));
        assert_eq!(l.last_nack_error, "route \"a\": bad");
        r.disconnect("dp", s);
        assert_eq!(state(&r, 2), DataPlaneState::Disconnected);
        r.connect(&node("dp"), Some(1));
        assert_eq!(r.last_nack_version("dp"), Some(2));
        assert_eq!(state(&r, 2), DataPlaneState::Nacked);
        assert_eq!(r.metrics().nacks(), 1);
    }

    #[test]
    fn an_old_stream_cannot_touch_a_reconnected_node() {
        let r = registry();
        let old = r.connect(&node("dp"), None);
        let new = r.connect(&node("dp"), None);
        r.disconnect("dp", old);
        assert!(r.list(0)[0].connected);
        assert_eq!(r.connected(), 1);
        r.disconnect("dp", new);
        assert_eq!(r.connected(), 0);
    }

    #[test]
    fn lists_sorted_by_node_id() {
        let r = registry();
        r.connect(&node("b"), None);
        r.connect(&node("a"), None);
        let ids: Vec<_> = r.list(0).into_iter().map(|d| d.node_id).collect();
        assert_eq!(ids, ["a", "b"]);
    }
}
