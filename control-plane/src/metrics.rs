//! Prometheus metrics of the config stream and of the certificates' expiry,
//! and the optional `--metrics-listen` HTTP endpoint that serves them as text
//! at `GET /metrics`.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use gateway_proto::v1::Certificate;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// Upper bounds (seconds) of the push→ACK latency histogram buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Counters of the config stream. Lock-free; updated from stream tasks.
#[derive(Debug, Default)]
pub struct Metrics {
    pushes: AtomicU64,
    acks: AtomicU64,
    nacks: AtomicU64,
    /// Cumulative-at-render counts per bucket (non-cumulative while stored).
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
}

/// Gauges sampled when the metrics are rendered.
#[derive(Clone, Debug, Default)]
pub struct Gauges {
    /// Data planes with an open stream.
    pub connected: usize,
    /// Data planes known since start.
    pub known: usize,
    /// The current configuration version.
    pub version: u64,
    /// Each certificate of the current configuration (by name) and the
    /// seconds until its `not_after`, negative once it has expired.
    pub certificate_expiry: Vec<(String, i64)>,
}

/// The seconds from `now` to each certificate's `not_after` (negative: expired), by name.
/// A certificate whose `not_after` does not parse (none is stored so) is left out.
pub fn certificate_expiry(certificates: &[Certificate], now: DateTime<Utc>) -> Vec<(String, i64)> {
    certificates
        .iter()
        .filter_map(|c| {
            let not_after = DateTime::parse_from_rfc3339(&c.not_after).ok()?;
            Some((c.name.clone(), not_after.timestamp() - now.timestamp()))
        })
        .collect()
}

impl Metrics {
    /// A snapshot was pushed to a data plane.
    pub fn record_push(&self) {
        self.pushes.fetch_add(1, Ordering::Relaxed);
    }

    /// A push was ACKed `latency` after it was sent.
    pub fn record_ack(&self, latency: Duration) {
        self.acks.fetch_add(1, Ordering::Relaxed);
        let secs = latency.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// A push was NACKed.
    pub fn record_nack(&self) {
        self.nacks.fetch_add(1, Ordering::Relaxed);
    }

    /// ACKs received so far.
    pub fn acks(&self) -> u64 {
        self.acks.load(Ordering::Relaxed)
    }

    /// NACKs received so far.
    pub fn nacks(&self) -> u64 {
        self.nacks.load(Ordering::Relaxed)
    }

    /// Pushes sent so far.
    pub fn pushes(&self) -> u64 {
        self.pushes.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::with_capacity(2048);
        let mut gauge = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            "control_plane_data_planes_connected",
            "Data planes with an open config stream.",
            g.connected as u64,
        );
        gauge(
            "control_plane_data_planes_known",
            "Data planes that connected since the control plane started.",
            g.known as u64,
        );
        gauge(
            "control_plane_config_version",
            "The current configuration version.",
            g.version,
        );
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        counter(
            "control_plane_config_pushes_total",
            "Configuration snapshots pushed to data planes.",
            self.pushes(),
        );
        counter(
            "control_plane_config_acks_total",
            "Pushes that data planes ACKed.",
            self.acks(),
        );
        counter(
            "control_plane_config_nacks_total",
            "Pushes that data planes NACKed (rejected).",
            self.nacks(),
        );
        let name = "control_plane_config_push_ack_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from pushing a snapshot to receiving its ACK.\n# TYPE {name} histogram"
        );
        let mut cumulative = 0;
        for (bound, n) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let sum = self.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
        let name = "control_plane_certificate_expiry_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Seconds until the certificate's not_after, negative once it has expired.\n# TYPE {name} gauge"
        );
        // Names are [a-z0-9-]: nothing to escape in a label value.
        for (cert, seconds) in &g.certificate_expiry {
            let _ = writeln!(out, "{name}{{name=\"{cert}\"}} {seconds}");
        }
        out
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` turns true.
/// `render` produces the body on each scrape.
pub async fn serve(
    listener: gateway_listener::Listener,
    render: impl Fn() -> String + Send + Sync + Clone + 'static,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::shutdown::requested(&mut shutdown) => return,
        };
        let render = render.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let render = render.clone();
            async move { Ok::<_, std::convert::Infallible>(respond(&req, &render)) }
        });
        tokio::spawn(async move {
            let conn = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = conn {
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
}

fn respond(req: &Request<Incoming>, render: &impl Fn() -> String) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            render(),
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "use GET\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found; metrics are at /metrics\n".to_owned(),
        ),
    };
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_counted_from_now_and_negative_once_past() {
        use chrono::TimeZone;
        let now = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
        let cert = |name: &str, not_after: &str| Certificate {
            name: name.into(),
            not_after: not_after.into(),
            ..Default::default()
        };
        let got = certificate_expiry(
            &[
                cert("a", "2030-01-02T00:00:00Z"),
                cert("b", "2029-12-31T23:59:00Z"),
                cert("c", ""),
            ],
            now,
        );
        assert_eq!(got, [("a".to_owned(), 86_400), ("b".to_owned(), -60)]);
    }

    #[test]
    fn renders_counters_gauges_and_a_cumulative_histogram() {
        let m = Metrics::default();
        m.record_push();
        m.record_push();
        m.record_ack(Duration::from_micros(800));
        m.record_ack(Duration::from_millis(30));
        m.record_nack();
        let text = m.render(&Gauges {
            connected: 2,
            known: 3,
            version: 9,
            certificate_expiry: vec![("edge".into(), 86_400), ("old".into(), -5)],
        });
        for line in [
            "control_plane_data_planes_connected 2",
            "control_plane_data_planes_known 3",
            "control_plane_config_version 9",
            "control_plane_config_pushes_total 2",
            "control_plane_config_acks_total 2",
            "control_plane_config_nacks_total 1",
            "control_plane_config_push_ack_seconds_bucket{le=\"0.001\"} 1",
            "control_plane_config_push_ack_seconds_bucket{le=\"0.025\"} 1",
            "control_plane_config_push_ack_seconds_bucket{le=\"0.05\"} 2",
            "control_plane_config_push_ack_seconds_bucket{le=\"+Inf\"} 2",
            "control_plane_config_push_ack_seconds_count 2",
            "control_plane_config_push_ack_seconds_sum 0.0308",
            "# TYPE control_plane_certificate_expiry_seconds gauge",
            "control_plane_certificate_expiry_seconds{name=\"edge\"} 86400",
            "control_plane_certificate_expiry_seconds{name=\"old\"} -5",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
