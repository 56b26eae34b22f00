//! Prometheus metrics, hand-rolled on atomics (no registry, no locks on the
//! request path). Counters live next to what they count: per route in
//! [`RouteMetrics`], per upstream instance in [`InstanceMetrics`]; process-wide
//! ones in [`Metrics`]. [`render`] writes the text exposition format from the
//! current configuration snapshot.
//!
//! Route and instance counters are carried over when a new configuration keeps
//! the route (same name) or the instance (same upstream, id and url).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{Method, StatusCode};

use crate::breaker::BreakerState;
use crate::config::Compiled;

mod composition;
mod connections;
mod policy;
mod proxy;

use composition::render_composition;
pub use composition::{CoalesceAlone, PartMetrics, PartOutcome};
pub use connections::write_connections;
use policy::render_policy;
pub use policy::{PolicyMetrics, PolicyRefusal};
pub use proxy::WebSocketMetrics;
use proxy::render_proxy;

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
}

impl RouteMetrics {
    /// Counts one answered request; `elapsed` is the time to the response head.
    pub fn record(&self, method: &Method, status: StatusCode, elapsed: Duration) {
        self.requests[method_index(method)][class_index(status)].fetch_add(1, Ordering::Relaxed);
        self.latency.observe(elapsed);
    }

    /// Requests counted for a method and status class (tests and diagnostics).
    pub fn count(&self, method: &Method, status: StatusCode) -> u64 {
        self.requests[method_index(method)][class_index(status)].load(Ordering::Relaxed)
    }

    /// Counts a request of a `coalesce` route that went upstream on its own.
    pub fn coalesce_alone(&self, reason: CoalesceAlone) {
        self.coalesce_alone[reason as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Kinds of upstream errors, a label of `gateway_upstream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamErrorKind {
    /// Could not connect (or the fresh connection died before the request was written).
    Connect,
    /// No response head within the route timeout.
    Timeout,
    /// The connection failed after the request was sent.
    Protocol,
    /// The instance answered 5xx.
    Status5xx,
}

impl UpstreamErrorKind {
    fn all() -> [Self; 4] {
        [
            Self::Connect,
            Self::Timeout,
            Self::Protocol,
            Self::Status5xx,
        ]
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Protocol => "protocol",
            Self::Status5xx => "status_5xx",
        }
    }
}

/// Counters of one upstream instance.
#[derive(Debug, Default)]
pub struct InstanceMetrics {
    /// Requests sent (or attempted) to this instance, retries included.
    pub attempts: AtomicU64,
    /// Attempts that were a retry moved to this instance after another failed.
    pub retries: AtomicU64,
    errors: [AtomicU64; 4],
    /// Times its breaker opened.
    pub breaker_opened: AtomicU64,
    /// Active health checks that failed.
    pub health_check_failures: AtomicU64,
}

impl InstanceMetrics {
    /// Counts an upstream error.
    pub fn error(&self, kind: UpstreamErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Errors counted of one kind.
    pub fn errors(&self, kind: UpstreamErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
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
}

fn esc(s: &str) -> std::borrow::Cow<'_, str> {
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
pub(crate) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
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

/// Renders every metric in the Prometheus text format (version 0.0.4).
pub fn render(m: &Metrics, cfg: &Compiled) -> String {
    let mut out = String::with_capacity(4096);
    let routes = || {
        std::iter::once(("", &m.unmatched))
            .chain(cfg.router.routes().iter().map(|r| (&*r.name, &*r.metrics)))
    };

    header(
        &mut out,
        "gateway_requests_total",
        "counter",
        "Requests answered by the proxy listener, by route (empty: none matched), method and status class.",
    );
    for (route, rm) in routes() {
        for (mi, method) in METHODS.iter().enumerate() {
            for (ci, class) in CLASSES.iter().enumerate() {
                let n = rm.requests[mi][ci].load(Ordering::Relaxed);
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
    header(
        &mut out,
        "gateway_request_duration_seconds",
        "histogram",
        "Time from request to response head, by route.",
    );
    // Routes that have seen no request yet export no histogram (keeps large tables cheap to scrape).
    for (route, rm) in routes().filter(|(_, rm)| rm.latency.count() > 0) {
        rm.latency.write(
            &mut out,
            "gateway_request_duration_seconds",
            &format!("route=\"{}\"", esc(route)),
        );
    }

    render_composition(&mut out, cfg);
    render_policy(&mut out, cfg);
    render_proxy(&mut out, cfg);

    let instances = || {
        cfg.upstreams
            .iter()
            .flat_map(|u| u.instances.iter().map(move |i| (u, i)))
    };
    let labels = |u: &str, i: &str| format!("upstream=\"{}\",instance=\"{}\"", esc(u), esc(i));

    header(
        &mut out,
        "gateway_upstream_attempts_total",
        "counter",
        "Requests sent to an upstream instance, retries included.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_attempts_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.attempts.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "gateway_upstream_retries_total",
        "counter",
        "Retries sent to an upstream instance after another instance failed (default once-rules and route retry policies).",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_retries_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.retries.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "gateway_upstream_errors_total",
        "counter",
        "Upstream failures by instance and kind (connect, timeout, protocol, status_5xx).",
    );
    for (u, i) in instances() {
        for kind in UpstreamErrorKind::all() {
            let _ = writeln!(
                out,
                "gateway_upstream_errors_total{{{},kind=\"{}\"}} {}",
                labels(&u.name, &i.id),
                kind.as_str(),
                i.metrics.errors(kind)
            );
        }
    }
    header(
        &mut out,
        "gateway_upstream_in_flight",
        "gauge",
        "Requests in progress at an upstream instance.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_in_flight{{{}}} {}",
            labels(&u.name, &i.id),
            i.in_flight()
        );
    }
    header(
        &mut out,
        "gateway_upstream_healthy",
        "gauge",
        "1 when active health checks consider the instance healthy (always 1 without checks).",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_healthy{{{}}} {}",
            labels(&u.name, &i.id),
            u8::from(i.is_healthy())
        );
    }
    header(
        &mut out,
        "gateway_upstream_health_check_failures_total",
        "counter",
        "Active health checks that failed.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_upstream_health_check_failures_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.health_check_failures.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "gateway_circuit_breaker_state",
        "gauge",
        "1 for the current breaker state of an instance (closed, open, half_open).",
    );
    for (u, i) in instances() {
        let now = i.breaker.state();
        for s in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            let _ = writeln!(
                out,
                "gateway_circuit_breaker_state{{{},state=\"{}\"}} {}",
                labels(&u.name, &i.id),
                s.as_str(),
                u8::from(s == now)
            );
        }
    }
    header(
        &mut out,
        "gateway_circuit_breaker_opened_total",
        "counter",
        "Times an instance's breaker opened.",
    );
    for (u, i) in instances() {
        let _ = writeln!(
            out,
            "gateway_circuit_breaker_opened_total{{{}}} {}",
            labels(&u.name, &i.id),
            i.metrics.breaker_opened.load(Ordering::Relaxed)
        );
    }

    header(
        &mut out,
        "gateway_config_version",
        "gauge",
        "Version of the configuration being served (0: none loaded).",
    );
    let _ = writeln!(out, "gateway_config_version {}", cfg.version);
    header(
        &mut out,
        "gateway_config_loaded",
        "gauge",
        "1 once a configuration is loaded.",
    );
    let _ = writeln!(out, "gateway_config_loaded {}", u8::from(cfg.loaded));
    header(
        &mut out,
        "gateway_config_last_applied_timestamp_seconds",
        "gauge",
        "When the configuration being served was applied (Unix time; 0: never).",
    );
    let applied_ms = m.config_applied_unix_ms.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "gateway_config_last_applied_timestamp_seconds {}.{:03}",
        applied_ms / 1000,
        applied_ms % 1000
    );
    header(
        &mut out,
        "gateway_config_updates_total",
        "counter",
        "Configuration snapshots received from the control plane, by result (ack, nack).",
    );
    let _ = writeln!(
        out,
        "gateway_config_updates_total{{result=\"ack\"}} {}",
        m.config_acks.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "gateway_config_updates_total{{result=\"nack\"}} {}",
        m.config_nacks.load(Ordering::Relaxed)
    );
    header(
        &mut out,
        "gateway_control_plane_connected",
        "gauge",
        "1 while the configuration stream to the control plane is open.",
    );
    let _ = writeln!(
        out,
        "gateway_control_plane_connected {}",
        u8::from(m.control_plane_connected.load(Ordering::Relaxed))
    );
    header(
        &mut out,
        "gateway_control_plane_connects_total",
        "counter",
        "Configuration streams opened to the control plane.",
    );
    let _ = writeln!(
        out,
        "gateway_control_plane_connects_total {}",
        m.control_plane_connects.load(Ordering::Relaxed)
    );
    out
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
