//! Prometheus metrics, hand-rolled on atomics (no registry, no locks on the
//! request path). Counters live next to what they count: per route in
//! [`RouteMetrics`], per upstream instance in [`InstanceMetrics`]; process-wide
//! ones in [`Metrics`]. This layer only counts: the `/metrics` page, which
//! walks the current configuration snapshot, is written by the application
//! (`app/exposition.rs`).
//!
//! Route and instance counters are carried over when a new configuration keeps
//! the route (same name) or the instance (same upstream, id and url).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use gateway_transport::upstream_error::UpstreamError;
use http::{Method, StatusCode};

mod cache;
mod certificates;
mod composition;
mod connections;
mod mirror;
mod policy;
mod proxy;

pub use cache::{ResponseCacheMetrics, write_response_cache};
pub use certificates::write_certificates;
pub use composition::{CoalesceAlone, PartMetrics, PartOutcome};
pub use connections::write_connections;
pub use mirror::{MirrorMetrics, MirrorOutcome};
pub use policy::{PolicyMetrics, PolicyRefusal};
pub use proxy::WebSocketMetrics;

const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "OTHER",
];
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// Latency bucket upper bounds in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// `le` labels of [`BUCKETS`], then +Inf.
const BUCKET_LABELS: [&str; 15] = [
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
    "2.5", "5", "10", "+Inf",
];

fn method_index(m: &Method) -> usize {
    match *m {
        Method::GET => 0,
        Method::HEAD => 1,
        Method::POST => 2,
        Method::PUT => 3,
        Method::DELETE => 4,
        Method::PATCH => 5,
        Method::OPTIONS => 6,
        _ => 7,
    }
}

fn class_index(s: StatusCode) -> usize {
    (s.as_u16() / 100).clamp(1, 5) as usize - 1
}

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Non-cumulative counts per bucket; the last slot is +Inf.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (b, le) in self.buckets.iter().zip(BUCKET_LABELS) {
            cumulative += b.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

/// Counters of one route (or of requests that matched none).
#[derive(Debug, Default)]
pub struct RouteMetrics {
    requests: [[AtomicU64; 5]; 8],
    latency: Histogram,
    /// Requests answered with an identical request's upstream response (`coalesce` routes).
    pub coalesced: AtomicU64,
    coalesce_alone: [AtomicU64; 2],
    /// Requests refused by a route policy, by reason.
    pub policy: PolicyMetrics,
    /// WebSocket tunnels (`websocket` routes).
    pub websocket: WebSocketMetrics,
    /// Requests of a `split` route sent to another side than the weights
    /// chose, because that one had no available instance.
    pub split_failovers: AtomicU64,
    /// Mirrored copies by outcome (`mirror` routes).
    pub mirror: MirrorMetrics,
}

impl RouteMetrics {
    /// Counts one answered request; `elapsed` is the time to the response head.
    pub fn record(&self, method: &Method, status: StatusCode, elapsed: Duration) {
        self.requests[method_index(method)][class_index(status)].fetch_add(1, Ordering::Relaxed);
        self.latency.observe(elapsed);
    }

    /// Writes this route's `gateway_requests_total` lines (non-zero ones only).
    pub fn write_requests(&self, out: &mut String, route: &str) {
        for (mi, method) in METHODS.iter().enumerate() {
            for (ci, class) in CLASSES.iter().enumerate() {
                let n = self.requests[mi][ci].load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "gateway_requests_total{{route=\"{}\",method=\"{method}\",status=\"{class}\"}} {n}",
                        esc(route)
                    );
                }
            }
        }
    }

    /// Writes this route's `gateway_request_duration_seconds` histogram, once
    /// it has seen a request.
    pub fn write_latency(&self, out: &mut String, route: &str) {
        if self.latency.count() > 0 {
            self.latency.write(
                out,
                "gateway_request_duration_seconds",
                &format!("route=\"{}\"", esc(route)),
            );
        }
    }

    /// Requests counted for a method and status class (tests and diagnostics).
    pub fn count(&self, method: &Method, status: StatusCode) -> u64 {
        self.requests[method_index(method)][class_index(status)].load(Ordering::Relaxed)
    }

    /// Counts a request of a `coalesce` route that went upstream on its own.
    pub fn coalesce_alone(&self, reason: CoalesceAlone) {
        self.coalesce_alone[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests counted by [`coalesce_alone`](Self::coalesce_alone) for `reason`.
    pub fn coalesced_alone(&self, reason: CoalesceAlone) -> u64 {
        self.coalesce_alone[reason as usize].load(Ordering::Relaxed)
    }
}

/// The `kind` labels of `gateway_upstream_errors_total`, in order: could not
/// connect (or nothing of the request was written), no response head in time,
/// the exchange failed after the request was sent, the instance answered 5xx,
/// the TLS handshake with an https:// instance failed.
const ERROR_KINDS: [&str; 5] = ["connect", "timeout", "protocol", "status_5xx", "tls"];
const TLS: usize = 4;
const STATUS_5XX: usize = 3;

/// Counters of one upstream instance.
#[derive(Debug, Default)]
pub struct InstanceMetrics {
    /// Requests sent (or attempted) to this instance, retries included.
    pub attempts: AtomicU64,
    /// Attempts that were a retry moved to this instance after another failed.
    pub retries: AtomicU64,
    errors: [AtomicU64; 5],
    /// Times its breaker opened.
    pub breaker_opened: AtomicU64,
    /// Active health checks that failed.
    pub health_check_failures: AtomicU64,
}

impl InstanceMetrics {
    /// Counts a failed attempt, by what failed.
    pub fn failed(&self, error: &UpstreamError) {
        let kind = if error.is_timeout() {
            1
        } else if error.is_tls() {
            TLS
        } else if error.never_reached() {
            0
        } else {
            2
        };
        self.errors[kind].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a 5xx answer.
    pub fn status_5xx(&self) {
        self.errors[STATUS_5XX].fetch_add(1, Ordering::Relaxed);
    }

    /// The error counters with their `kind` labels, in label order.
    pub fn errors(&self) -> [(&'static str, u64); 5] {
        std::array::from_fn(|i| (ERROR_KINDS[i], self.errors[i].load(Ordering::Relaxed)))
    }
}

/// Process-wide metrics of one data plane.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests answered before a route was chosen (400, 404, 413, 431, 503 not ready).
    pub unmatched: RouteMetrics,
    /// Snapshots accepted (ACKed).
    pub config_acks: AtomicU64,
    /// Snapshots refused (NACKed).
    pub config_nacks: AtomicU64,
    /// When the configuration being served was applied, in ms since the Unix epoch (0: never).
    pub config_applied_unix_ms: AtomicU64,
    /// Whether the config stream to the control plane is open.
    pub control_plane_connected: AtomicBool,
    /// Config streams opened (first connection included).
    pub control_plane_connects: AtomicU64,
    /// The response cache's counters (`Route.cache`).
    pub response_cache: std::sync::Arc<ResponseCacheMetrics>,
    /// Mirrored copies in flight in the replica (capped by --mirror-max-in-flight).
    pub mirror_in_flight: AtomicU64,
}

/// `s` escaped for a label value.
pub fn esc(s: &str) -> std::borrow::Cow<'_, str> {
    if s.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        s.into()
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a metric family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Appends the trace export counters: `gateway_trace_spans_exported_total`,
/// `gateway_trace_spans_dropped_total{reason="queue_full"|"export_failed"}` and
/// `gateway_trace_spans_queued`.
pub fn render_trace_stats(out: &mut String, s: &gateway_telemetry::ExportStats) {
    header(
        out,
        "gateway_trace_spans_exported_total",
        "counter",
        "Spans the OTLP collector accepted.",
    );
    let _ = writeln!(out, "gateway_trace_spans_exported_total {}", s.exported);
    header(
        out,
        "gateway_trace_spans_dropped_total",
        "counter",
        "Spans dropped: export queue full (collector slow or down), or export failed.",
    );
    let _ = writeln!(
        out,
        "gateway_trace_spans_dropped_total{{reason=\"queue_full\"}} {}\n\
         gateway_trace_spans_dropped_total{{reason=\"export_failed\"}} {}",
        s.dropped_queue_full, s.dropped_export_failed
    );
    header(
        out,
        "gateway_trace_spans_queued",
        "gauge",
        "Spans waiting for export.",
    );
    let _ = writeln!(out, "gateway_trace_spans_queued {}", s.queued);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let mut out = String::new();
        h.write(&mut out, "x", "route=\"r\"");
        assert!(
            out.contains("x_bucket{route=\"r\",le=\"0.0005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{route=\"r\",le=\"0.005\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("x_bucket{route=\"r\",le=\"10\"} 2\n"), "{out}");
        assert!(
            out.contains("x_bucket{route=\"r\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("x_count{route=\"r\"} 3\n"), "{out}");
    }

    #[test]
    fn route_counters_by_method_and_class() {
        let r = RouteMetrics::default();
        r.record(&Method::GET, StatusCode::OK, Duration::ZERO);
        r.record(&Method::GET, StatusCode::NO_CONTENT, Duration::ZERO);
        r.record(
            &Method::from_bytes(b"PURGE").unwrap(),
            StatusCode::BAD_GATEWAY,
            Duration::ZERO,
        );
        assert_eq!(r.count(&Method::GET, StatusCode::OK), 2);
        assert_eq!(
            r.count(
                &Method::from_bytes(b"LINK").unwrap(),
                StatusCode::GATEWAY_TIMEOUT
            ),
            1
        );
    }
}
