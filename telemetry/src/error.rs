//! The crate's error type.

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A standard `OTEL_*` variable or an option has a value we cannot use.
    #[error("telemetry configuration: {0}")]
    Config(String),
    /// The OTLP exporter could not be built (bad endpoint, ...).
    #[error("OTLP exporter for {endpoint}: {source}")]
    Exporter {
        /// The endpoint that was configured.
        endpoint: String,
        /// What the exporter reported.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The export runtime's thread could not be started.
    #[error("starting the OTLP export runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Flushing or shutting down the exporter failed (e.g. the collector is unreachable).
    #[error("OTLP export: {0}")]
    Export(String),
    /// A global log subscriber was already installed.
    #[error("installing the log subscriber: {0}")]
    Logging(String),
}
