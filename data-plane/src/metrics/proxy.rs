//! Counters of the forwarding features: WebSocket tunnels per route
//! (`gateway_websocket_tunnels_open`, `gateway_websocket_tunnels_total`) and
//! route retries per upstream (`gateway_retries_total{upstream,reason}`,
//! `gateway_retry_budget_refusals_total{upstream}`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{esc, header};
use crate::config::Compiled;
use crate::retry::RetryReason;

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

/// Appends the tunnel counters of every `websocket` route and the retry
/// counters of every upstream (zeros included).
pub(super) fn render_proxy(out: &mut String, cfg: &Compiled) {
    let ws_routes = || cfg.router.routes().iter().filter(|r| r.websocket.is_some());
    header(
        out,
        "gateway_websocket_tunnels_open",
        "gauge",
        "WebSocket tunnels open now, by route.",
    );
    for r in ws_routes() {
        let _ = writeln!(
            out,
            "gateway_websocket_tunnels_open{{route=\"{}\"}} {}",
            esc(&r.name),
            r.metrics.websocket.open()
        );
    }
    header(
        out,
        "gateway_websocket_tunnels_total",
        "counter",
        "WebSocket tunnels opened (upstream answered 101), by route.",
    );
    for r in ws_routes() {
        let _ = writeln!(
            out,
            "gateway_websocket_tunnels_total{{route=\"{}\"}} {}",
            esc(&r.name),
            r.metrics.websocket.total()
        );
    }
    header(
        out,
        "gateway_retries_total",
        "counter",
        "Retries sent under a route retry policy, by upstream and reason (connect_failure, status_5xx, timeout).",
    );
    for u in &cfg.upstreams {
        for reason in RetryReason::ALL {
            let _ = writeln!(
                out,
                "gateway_retries_total{{upstream=\"{}\",reason=\"{}\"}} {}",
                esc(&u.name),
                reason.as_str(),
                u.retry.retries(reason)
            );
        }
    }
    header(
        out,
        "gateway_retry_budget_refusals_total",
        "counter",
        "Retries not sent because the upstream's retry budget was spent, by upstream.",
    );
    for u in &cfg.upstreams {
        let _ = writeln!(
            out,
            "gateway_retry_budget_refusals_total{{upstream=\"{}\"}} {}",
            esc(&u.name),
            u.retry.refused()
        );
    }
}
