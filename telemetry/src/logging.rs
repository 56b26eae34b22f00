//! Logs: `tracing-subscriber` to stderr as text or JSON, request lines that
//! carry `trace_id` / `span_id`, and the one-line-per-request access log.
//!
//! * [`init_logging`] installs the global subscriber (`RUST_LOG` overrides the
//!   default filter) with a non-blocking, batching stderr writer.
//! * JSON lines are flat objects: `timestamp`, `level`, `target`, `message`
//!   and the event's fields, so `trace_id` / `span_id` sit at the top level.
//! * Lines tied to a request use [`req_info!`](crate::req_info) and friends,
//!   which add `trace_id` and `span_id` from a [`TraceContext`]; formatting
//!   the ids costs nothing unless the line is actually emitted.
//! * [`access_log`] emits the access line at INFO with target `access`
//!   (silence it with `RUST_LOG=info,access=off`).

use std::fmt;
use std::io::IsTerminal;
use std::str::FromStr;
use std::time::Duration;

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::error::TelemetryError;
use crate::log_writer::{DEFAULT_BUFFER_BYTES, NonBlocking, WriterGuard};
use crate::traceparent::TraceContext;

/// Log line format (`--log-format text|json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (the default in containers).
    Json,
}

impl FromStr for LogFormat {
    type Err = TelemetryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(TelemetryError::Config(format!(
                "log format {other:?} is not one of: text, json"
            ))),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Keeps log output running; hold it in `main` until the process ends
/// (dropping it flushes buffered lines).
#[must_use = "dropping the guard stops log output"]
pub struct LogGuard {
    writer: WriterGuard,
}

impl LogGuard {
    /// Log lines dropped because stderr could not keep up.
    pub fn dropped_lines(&self) -> u64 {
        self.writer.dropped_lines()
    }
}

impl fmt::Debug for LogGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogGuard")
            .field("dropped_lines", &self.dropped_lines())
            .finish()
    }
}

/// Installs the global log subscriber writing to stderr.
///
/// `default_filter` is an `EnvFilter` directive list (e.g. `"info"` or
/// `"info,sqlx=warn"`) used when `RUST_LOG` is unset. An invalid `RUST_LOG`,
/// or a second call, is an error.
pub fn init_logging(format: LogFormat, default_filter: &str) -> Result<LogGuard, TelemetryError> {
    let filter = filter_from(std::env::var("RUST_LOG").ok().as_deref(), default_filter)?;
    let (writer, guard) = NonBlocking::new(std::io::stderr(), DEFAULT_BUFFER_BYTES)
        .map_err(|e| TelemetryError::Logging(e.to_string()))?;
    let ansi = std::io::stderr().is_terminal();
    let subscriber = subscriber(format, filter, writer, ansi);
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| TelemetryError::Logging(e.to_string()))?;
    Ok(LogGuard { writer: guard })
}

/// The filter: `rust_log` when set (and valid), else `default_filter`.
fn filter_from(rust_log: Option<&str>, default_filter: &str) -> Result<EnvFilter, TelemetryError> {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(directives) => EnvFilter::try_new(directives)
            .map_err(|e| TelemetryError::Config(format!("RUST_LOG={directives:?}: {e}"))),
        None => EnvFilter::try_new(default_filter)
            .map_err(|e| TelemetryError::Config(format!("log filter {default_filter:?}: {e}"))),
    }
}

/// Builds (without installing) the subscriber [`init_logging`] uses, writing
/// to any writer; for tests and benches.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Emits a `tracing` event at `$level` with `trace_id` and `span_id` fields
/// taken from a [`TraceContext`](crate::TraceContext), then the usual fields
/// and message: `request_event!(Level::WARN, ctx, upstream = %id, "upstream reset")`.
#[macro_export]
macro_rules! request_event {
    ($level:expr, $ctx:expr, $($rest:tt)+) => {{
        let __ctx: $crate::TraceContext = $ctx;
        $crate::__private::tracing::event!(
            $level,
            trace_id = %__ctx.trace_id_hex(),
            span_id = %__ctx.span_id_hex(),
            $($rest)+
        )
    }};
}

/// `request_event!` at ERROR: `req_error!(span.context(), error = %e, "proxy failed")`.
#[macro_export]
macro_rules! req_error {
    ($ctx:expr, $($rest:tt)+) => { $crate::request_event!($crate::__private::tracing::Level::ERROR, $ctx, $($rest)+) };
}

/// `request_event!` at WARN.
#[macro_export]
macro_rules! req_warn {
    ($ctx:expr, $($rest:tt)+) => { $crate::request_event!($crate::__private::tracing::Level::WARN, $ctx, $($rest)+) };
}

/// `request_event!` at INFO (not on hot paths: the access log is the one INFO line per request).
#[macro_export]
macro_rules! req_info {
    ($ctx:expr, $($rest:tt)+) => { $crate::request_event!($crate::__private::tracing::Level::INFO, $ctx, $($rest)+) };
}

/// `request_event!` at DEBUG.
#[macro_export]
macro_rules! req_debug {
    ($ctx:expr, $($rest:tt)+) => { $crate::request_event!($crate::__private::tracing::Level::DEBUG, $ctx, $($rest)+) };
}

/// One access-log line's content.
#[derive(Debug, Clone, Copy)]
pub struct AccessLog<'a> {
    /// Request method.
    pub method: &'a str,
    /// Name of the matched route; `None` when none matched.
    pub route: Option<&'a str>,
    /// Response status sent to the client.
    pub status: u16,
    /// Upstream instance id that served it; `None` when no attempt was made.
    pub upstream: Option<&'a str>,
    /// Time from request head received to response finished (or head sent).
    pub latency: Duration,
    /// Response body bytes sent to the client.
    pub bytes: u64,
    /// The request's SERVER span context (its trace id and span id are logged).
    pub trace: TraceContext,
}

/// Emits the one INFO line of a request, target `access`, message `request`, fields
/// `method route status upstream latency_ms bytes trace_id span_id`
/// (`route` / `upstream` omitted when `None`).
#[inline]
pub fn access_log(entry: &AccessLog<'_>) {
    tracing::info!(
        target: "access",
        method = entry.method,
        route = entry.route,
        status = entry.status,
        upstream = entry.upstream,
        latency_ms = entry.latency.as_secs_f64() * 1e3,
        bytes = entry.bytes,
        trace_id = %entry.trace.trace_id_hex(),
        span_id = %entry.trace.span_id_hex(),
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::io::Write;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl<'a> MakeWriter<'a> for Capture {
        type Writer = Capture;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }
    impl Capture {
        fn lines(&self) -> Vec<serde_json::Value> {
            String::from_utf8(self.0.lock().clone())
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }
    }

    fn ctx() -> TraceContext {
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap()
    }

    #[test]
    fn json_access_line_has_flat_fields_and_ids() {
        let out = Capture::default();
        let sub = subscriber(LogFormat::Json, EnvFilter::new("info"), out.clone(), false);
        tracing::subscriber::with_default(sub, || {
            access_log(&AccessLog {
                method: "GET",
                route: Some("users"),
                status: 200,
                upstream: Some("users-1"),
                latency: Duration::from_micros(1500),
                bytes: 42,
                trace: ctx(),
            });
            access_log(&AccessLog {
                method: "GET",
                route: None,
                status: 404,
                upstream: None,
                latency: Duration::ZERO,
                bytes: 0,
                trace: ctx(),
            });
        });
        let lines = out.lines();
        assert_eq!(lines.len(), 2);
        let l = &lines[0];
        assert_eq!(l["level"], "INFO");
        assert_eq!(l["target"], "access");
        assert_eq!(l["message"], "request");
        assert_eq!(l["method"], "GET");
        assert_eq!(l["route"], "users");
        assert_eq!(l["status"], 200);
        assert_eq!(l["upstream"], "users-1");
        assert_eq!(l["latency_ms"], 1.5);
        assert_eq!(l["bytes"], 42);
        assert_eq!(l["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(l["span_id"], "00f067aa0ba902b7");
        assert!(l["timestamp"].is_string());
        assert!(lines[1].get("route").is_none() && lines[1].get("upstream").is_none());
    }

    #[test]
    fn request_macros_add_ids_and_access_can_be_silenced() {
        let out = Capture::default();
        let sub = subscriber(
            LogFormat::Json,
            EnvFilter::new("info,access=off"),
            out.clone(),
            false,
        );
        tracing::subscriber::with_default(sub, || {
            crate::req_warn!(ctx(), upstream = "orders-2", "upstream reset");
            crate::req_debug!(ctx(), "filtered out");
            access_log(&AccessLog {
                method: "GET",
                route: None,
                status: 404,
                upstream: None,
                latency: Duration::ZERO,
                bytes: 0,
                trace: ctx(),
            });
        });
        let lines = out.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["level"], "WARN");
        assert_eq!(lines[0]["message"], "upstream reset");
        assert_eq!(lines[0]["upstream"], "orders-2");
        assert_eq!(lines[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(lines[0]["span_id"], "00f067aa0ba902b7");
    }

    #[test]
    fn text_format_and_filters() {
        let out = Capture::default();
        let sub = subscriber(LogFormat::Text, EnvFilter::new("info"), out.clone(), false);
        tracing::subscriber::with_default(sub, || {
            crate::req_error!(ctx(), "boom");
        });
        let text = String::from_utf8(out.0.lock().clone()).unwrap();
        assert!(text.contains("ERROR"), "{text}");
        assert!(
            text.contains("trace_id=4bf92f3577b34da6a3ce929d0e0e4736"),
            "{text}"
        );
        assert!(text.contains("boom"), "{text}");

        assert_eq!("JSON".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
        assert!(
            "yaml"
                .parse::<LogFormat>()
                .unwrap_err()
                .to_string()
                .contains("text, json")
        );
        assert!(filter_from(None, "info").is_ok());
        assert!(filter_from(Some("  "), "debug").is_ok());
        let err = filter_from(Some("info,foo=loud"), "info").unwrap_err();
        assert!(err.to_string().contains("RUST_LOG"), "{err}");
    }
}
