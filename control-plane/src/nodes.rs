//! The registry of data planes: who is connected, what each has ACKed or NACKed.
//!
//! Each control plane keeps the streams it holds in memory. With SQLite that
//! is the whole registry: after a restart the list starts empty and fills
//! again as data planes reconnect (they do within their backoff, ≤ 30 s).
//! With Postgres every change is also written to the shared `data_planes`
//! table (`nodes/shared.rs`), and `ListDataPlanes` on any control plane reads
//! that table, so it lists every data plane of every replica; a data plane
//! whose control plane stopped beating for [`HEARTBEAT_TIMEOUT`] shows
//! DISCONNECTED until it reconnects somewhere.

use crate::clock::{now_utc, rfc3339};
use crate::error::StoreError;
use crate::metrics::Metrics;
use chrono::{DateTime, Utc};
use gateway_clock::Clock;
use gateway_proto::v1::{DataPlaneState, DataPlaneStatus, Node};
use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

mod shared;

pub use shared::{FORGET_AFTER, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT};

/// Identifies one config stream, so a stale stream of a node that has since
/// reconnected cannot overwrite the state of the newer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamId(u64);

#[derive(Debug)]
struct Entry {
    hostname: String,
    build_version: String,
    /// The node's latest stream on this control plane.
    stream: StreamId,
    /// Whether that stream is still open.
    open: bool,
    /// When it opened (Unix ms).
    connected_at: i64,
    /// The version the node serves: what it said on connect, then what it ACKed.
    acked_version: Option<u64>,
    last_nack_version: Option<u64>,
    last_nack_error: String,
    last_seen: DateTime<Utc>,
    /// Changed since it was last written to the shared registry.
    dirty: bool,
}

/// Every data plane that has connected to this process since it started
/// (and, with a shared registry, every data plane of every control plane).
pub struct NodeRegistry {
    entries: Mutex<BTreeMap<String, Entry>>,
    next_stream: AtomicU64,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    shared: Option<shared::Shared>,
}

impl std::fmt::Debug for NodeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRegistry")
            .field("nodes", &self.lock().len())
            .field("shared", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

impl NodeRegistry {
    /// An empty in-memory registry that records ACK/NACK counts and latencies in `metrics`.
    pub fn new(clock: Arc<dyn Clock>, metrics: Arc<Metrics>) -> Self {
        NodeRegistry {
            entries: Mutex::new(BTreeMap::new()),
            next_stream: AtomicU64::new(1),
            clock,
            metrics,
            shared: None,
        }
    }

    /// A registry shared through Postgres with every control plane of the
    /// database; `listen` names this one in the `control_planes` table.
    /// [`NodeRegistry::run`] must run for it to be written.
    pub fn shared(
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        pool: sqlx::PgPool,
        listen: String,
    ) -> Self {
        NodeRegistry {
            shared: Some(shared::Shared::new(pool, listen)),
            ..Self::new(clock, metrics)
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

    /// Wakes the shared registry's writer, if there is one.
    fn changed(&self) {
        if let Some(shared) = &self.shared {
            shared.wake();
        }
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
            stream: id,
            open: false,
            connected_at: 0,
            acked_version: None,
            last_nack_version: None,
            last_nack_error: String::new(),
            last_seen: now,
            dirty: true,
        });
        e.hostname.clone_from(&node.hostname);
        e.build_version.clone_from(&node.build_version);
        e.stream = id;
        e.open = true;
        e.connected_at = now.timestamp_millis();
        e.acked_version = serving;
        e.last_seen = now;
        e.dirty = true;
        drop(entries);
        self.changed();
        id
    }

    /// With a shared registry, fetches the NACK history the node left on any
    /// control plane, so a version it rejected elsewhere is not pushed to it
    /// here either. Without one (or when the database cannot answer) nothing
    /// changes: the node would reject that version again, which is harmless.
    pub async fn recall(&self, node_id: &str) {
        let Some(shared) = &self.shared else {
            return;
        };
        match shared.nack_history(node_id).await {
            Ok(Some((version, error))) => {
                let mut entries = self.lock();
                if let Some(e) = entries.get_mut(node_id)
                    && e.last_nack_version.is_none_or(|v| v < version)
                {
                    e.last_nack_version = Some(version);
                    e.last_nack_error = error;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(node = node_id, error = %e, "NACK history not read"),
        }
    }

    /// Applies `f` to the node's entry if `stream` is still its current, open stream.
    fn update(&self, node_id: &str, stream: StreamId, f: impl FnOnce(&mut Entry)) {
        let now = now_utc(&*self.clock);
        let mut entries = self.lock();
        if let Some(e) = entries.get_mut(node_id)
            && e.open
            && e.stream == stream
        {
            e.last_seen = now;
            e.dirty = true;
            f(e);
        }
        drop(entries);
        self.changed();
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
        self.update(node_id, stream, |e| e.open = false);
    }

    /// The last version this node NACKed; it must never be pushed to it again.
    pub fn last_nack_version(&self, node_id: &str) -> Option<u64> {
        self.lock().get(node_id).and_then(|e| e.last_nack_version)
    }

    /// How many nodes have an open stream to this control plane.
    pub fn connected(&self) -> usize {
        self.lock().values().filter(|e| e.open).count()
    }

    /// How many nodes this control plane has seen since it started.
    pub fn known(&self) -> usize {
        self.lock().len()
    }

    /// Every known node, sorted by id, with its state relative to
    /// `current_version`: this process's nodes, or with a shared registry
    /// every control plane's (then the database must answer).
    pub async fn list(&self, current_version: u64) -> Result<Vec<DataPlaneStatus>, StoreError> {
        match &self.shared {
            None => Ok(self.list_local(current_version)),
            Some(shared) => shared.list(current_version).await,
        }
    }

    /// The nodes of this process, sorted by id.
    pub fn list_local(&self, current_version: u64) -> Vec<DataPlaneStatus> {
        self.lock()
            .iter()
            .map(|(id, e)| DataPlaneStatus {
                node_id: id.clone(),
                hostname: e.hostname.clone(),
                connected: e.open,
                acked_version: e.acked_version.unwrap_or(0),
                last_nack_version: e.last_nack_version.unwrap_or(0),
                last_nack_error: e.last_nack_error.clone(),
                last_seen: rfc3339(e.last_seen),
                status: state(
                    e.open,
                    e.acked_version,
                    e.last_nack_version,
                    current_version,
                ) as i32,
                build_version: e.build_version.clone(),
            })
            .collect()
    }

    /// Writes the shared registry until `shutdown`: a heartbeat every
    /// [`HEARTBEAT_INTERVAL`], and every change as soon as it happens. Returns
    /// at once for an in-memory registry.
    pub async fn run(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        if let Some(shared) = &self.shared {
            shared.run(&self, shutdown).await;
        }
    }

    /// The entries changed since the last write, marked clean.
    fn take_dirty(&self) -> Vec<shared::Row> {
        let mut entries = self.lock();
        entries
            .iter_mut()
            .filter(|(_, e)| e.dirty)
            .map(|(id, e)| {
                e.dirty = false;
                shared::Row {
                    node_id: id.clone(),
                    hostname: e.hostname.clone(),
                    build_version: e.build_version.clone(),
                    stream: i64::try_from(e.stream.0).unwrap_or(i64::MAX),
                    connected_at: e.connected_at,
                    connected: e.open,
                    acked_version: e.acked_version.and_then(|v| i64::try_from(v).ok()),
                    last_nack_version: e.last_nack_version.and_then(|v| i64::try_from(v).ok()),
                    last_nack_error: e.last_nack_error.clone(),
                    last_seen: rfc3339(e.last_seen),
                }
            })
            .collect()
    }

    /// Marks entries dirty again after a failed write.
    fn mark_dirty(&self, ids: impl IntoIterator<Item = String>) {
        let mut entries = self.lock();
        for id in ids {
            if let Some(e) = entries.get_mut(&id) {
                e.dirty = true;
            }
        }
    }
}

/// A node's state: DISCONNECTED without an open stream; NACKED when it
/// rejected the current version; SYNCED when it serves it; else STALE.
fn state(
    open: bool,
    acked: Option<u64>,
    last_nack: Option<u64>,
    current_version: u64,
) -> DataPlaneState {
    if !open {
        DataPlaneState::Disconnected
    } else if last_nack == Some(current_version) {
        DataPlaneState::Nacked
    } else if acked == Some(current_version) {
        DataPlaneState::Synced
    } else {
        DataPlaneState::Stale
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
        DataPlaneState::try_from(r.list_local(current)[0].status).unwrap()
    }

    #[test]
    fn stale_until_the_current_version_is_acked() {
        let r = registry();
        let s = r.connect(&node("dp"), None);
        assert_eq!(state(&r, 3), DataPlaneState::Stale);
        r.ack("dp", s, 3, Duration::from_millis(2));
        assert_eq!(state(&r, 3), DataPlaneState::Synced);
        assert_eq!(state(&r, 4), DataPlaneState::Stale);
        let l = &r.list_local(3)[0];
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
        let l = &r.list_local(2)[0];
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
        assert!(r.list_local(0)[0].connected);
        assert_eq!(r.connected(), 1);
        r.disconnect("dp", new);
        assert_eq!(r.connected(), 0);
    }

    #[test]
    fn lists_sorted_by_node_id() {
        let r = registry();
        r.connect(&node("b"), None);
        r.connect(&node("a"), None);
        let ids: Vec<_> = r.list_local(0).into_iter().map(|d| d.node_id).collect();
        assert_eq!(ids, ["a", "b"]);
    }
}
