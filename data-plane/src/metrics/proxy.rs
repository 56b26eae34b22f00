//! Counters of the forwarding features: WebSocket tunnels per route
//! (`gateway_websocket_tunnels_open`, `gateway_websocket_tunnels_total`) and
//! route retries per upstream (`gateway_retries_total{upstream,reason}`,
//! `gateway_retry_budget_refusals_total{upstream}`).

use std::sync::atomic::{AtomicU64, Ordering};

/// WebSocket tunnel counters of one route.
#[derive(Debug, Default)]
pub struct WebSocketMetrics {
    open: AtomicU64,
    total: AtomicU64,
}

impl WebSocketMetrics {
    /// Counts a tunnel that starts (after the upstream's 101).
    pub fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a tunnel that ended.
    pub fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Tunnels open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Tunnels opened so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}
