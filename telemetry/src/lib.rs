//! Telemetry shared by every gateway binary (docs/data-plane.md "Tracing", issue 6).
//!
//! * [`traceparent`] / [`tracestate`]: W3C Trace Context parsing and formatting.
//! * [`propagation`]: reading and writing those headers on `http` messages.
//! * [`otel`]: cheap request spans ([`Tracer`], [`ServerSpan`], [`ClientSpan`])
//!   exported by OTLP/gRPC with the batch span processor when
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//! * [`grpc`]: a tower layer giving tonic servers a SERVER span per call.
//! * [`logging`]: text/JSON logs with `trace_id` / `span_id`, and the access log.
//! * `receiver` (feature `receiver`): an in-test OTLP/gRPC trace collector.
//!
//! Typical `main`:
//! ```no_run
//! # fn main() -> Result<(), gateway_telemetry::TelemetryError> {
//! use gateway_telemetry::{init_logging, LogFormat, Tracer};
//! let _logs = init_logging(LogFormat::Json, "info")?;
//! let tracer = Tracer::from_env("data-plane", Some("node-1"))?;
//! // ... run the servers, passing `tracer.clone()` to the request handlers ...
//! tracer.shutdown(std::time::Duration::from_secs(2))?;
//! # Ok(()) }
//! ```

pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod log_writer;
pub mod logging;
pub mod otel;
pub mod propagation;
#[cfg(feature = "receiver")]
pub mod receiver;
pub mod sampler;
pub mod traceparent;
pub mod tracestate;

pub use error::TelemetryError;
pub use logging::{AccessLog, LogFormat, LogGuard, access_log, init_logging};
pub use otel::{
    ClientSpan, ClientSpans, ExportStats, ServerSpan, SpanParent, Tracer, TracerOptions, attr,
};
pub use propagation::{Incoming, extract, inject, set_traceresponse};
pub use sampler::Sampler;
pub use traceparent::{SpanIdHex, TraceContext, TraceIdHex, TraceparentError};
pub use tracestate::{TraceState, TracestateError};

#[doc(hidden)]
pub mod __private {
    pub use tracing;
}
