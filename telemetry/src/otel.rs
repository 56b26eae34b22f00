//! Request spans for hot paths, exported by OTLP/gRPC through the SDK's batch
//! span processor.
//!
//! This does **not** go through `tracing` spans: a request creates one
//! [`ServerSpan`] (plus a [`ClientSpan`] per upstream attempt) whose ids are
//! always valid, for `traceparent` / `traceresponse` and log lines, but which
//! records attributes and allocates only when the trace is sampled *and* export
//! is on. Otherwise starting, annotating and ending a span costs a sampler
//! check and a couple of random numbers.
//!
//! # Export
//! Enabled only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see
//! [`TracerOptions::from_env`]). Finished spans go to opentelemetry_sdk's
//! [`BatchSpanProcessor`] (a dedicated thread that exports in batches). The
//! tonic exporter runs on a small runtime owned by the [`Tracer`] (one worker
//! thread named `otlp-export`): the tonic OTLP exporter hangs when its channel
//! lives on a current-thread runtime, so we never put it on the caller's, and
//! the binaries may use any runtime flavour they like.
//!
//! A dead or slow collector never slows requests: at most `max_queue_size`
//! spans wait (queued or in an export that has not finished); beyond that a
//! finished span is dropped at once and counted in
//! [`ExportStats::dropped_queue_full`]. Spans of a failed export are counted in
//! [`ExportStats::dropped_export_failed`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanEvents, SpanExporter, SpanLinks,
    SpanProcessor,
};

use crate::error::TelemetryError;
use crate::sampler::Sampler;
use crate::traceparent::TraceContext;

/// Attribute names used on gateway spans: OpenTelemetry HTTP semantic
/// conventions, plus a few `gateway.*` ones for what semconv has no name for.
pub mod attr {
    /// HTTP method, upper case, or `_OTHER` (semconv).
    pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
    /// The original method when `http.request.method` is `_OTHER` (semconv).
    pub const HTTP_REQUEST_METHOD_ORIGINAL: &str = "http.request.method_original";
    /// Request path as received (semconv).
    pub const URL_PATH: &str = "url.path";
    /// The matched route; in the gateway, the route's name (semconv).
    pub const HTTP_ROUTE: &str = "http.route";
    /// Response status code (semconv).
    pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
    /// Low-cardinality error class, e.g. `rate_limited`, `500` (semconv).
    pub const ERROR_TYPE: &str = "error.type";
    /// Host the client span connects to (semconv).
    pub const SERVER_ADDRESS: &str = "server.address";
    /// Port the client span connects to (semconv).
    pub const SERVER_PORT: &str = "server.port";
    /// Address of the downstream client (semconv).
    pub const CLIENT_ADDRESS: &str = "client.address";
    /// Upstream (cluster) name a request is routed to.
    pub const UPSTREAM: &str = "gateway.upstream";
    /// Upstream instance id chosen by the balancer.
    pub const UPSTREAM_INSTANCE: &str = "gateway.upstream.instance";
    /// Rate-limit decision: `allowed`, `limited`, `fallback_allowed`, `fallback_limited`.
    pub const RATE_LIMIT_DECISION: &str = "gateway.rate_limit.decision";
    /// Zero-based upstream attempt number on a CLIENT span (0 = first try).
    pub const ATTEMPT: &str = "gateway.attempt";
}

/// Default batch processor queue bound (spans waiting or being exported).
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 2048;
/// Default delay between two scheduled exports.
pub const DEFAULT_SCHEDULED_DELAY: Duration = Duration::from_millis(5000);
/// Default largest batch sent in one export call.
pub const DEFAULT_MAX_EXPORT_BATCH_SIZE: usize = 512;

/// Everything a [`Tracer`] needs; build with [`TracerOptions::from_env`] in
/// binaries, or by hand in tests.
#[derive(Debug, Clone)]
pub struct TracerOptions {
    /// `service.name` resource attribute.
    pub service_name: String,
    /// `service.instance.id` resource attribute (node id, mock instance id).
    pub instance_id: Option<String>,
    /// OTLP/gRPC collector URL, e.g. `http://127.0.0.1:4317`; `None` disables export.
    pub endpoint: Option<String>,
    /// Head sampler.
    pub sampler: Sampler,
    /// Most spans waiting for export; more are dropped and counted.
    pub max_queue_size: usize,
    /// Delay between scheduled exports.
    pub scheduled_delay: Duration,
    /// Largest batch per export call.
    pub max_export_batch_size: usize,
}

impl TracerOptions {
    /// Defaults: no export, default sampler, standard batch settings.
    pub fn new(service_name: impl Into<String>) -> Self {
        Self {
            service_name: service_name.into(),
            instance_id: None,
            endpoint: None,
            sampler: Sampler::default(),
            max_queue_size: DEFAULT_MAX_QUEUE_SIZE,
            scheduled_delay: DEFAULT_SCHEDULED_DELAY,
            max_export_batch_size: DEFAULT_MAX_EXPORT_BATCH_SIZE,
        }
    }

    /// Reads the standard variables:
    /// * `OTEL_EXPORTER_OTLP_ENDPOINT` — export on when set and non-empty
    ///   (`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off);
    /// * `OTEL_SERVICE_NAME` — overrides `default_service_name` (the binary's name,
    ///   or a mock's service name);
    /// * `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG` — see [`Sampler::from_values`];
    /// * `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_SCHEDULE_DELAY` (ms),
    ///   `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`.
    ///
    /// The exporter itself also reads `OTEL_EXPORTER_OTLP_TIMEOUT`,
    /// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_COMPRESSION`.
    pub fn from_env(
        default_service_name: &str,
        instance_id: Option<&str>,
    ) -> Result<Self, TelemetryError> {
        Self::from_lookup(default_service_name, instance_id, |key| {
            std::env::var(key).ok()
        })
    }

    /// [`from_env`](Self::from_env) with an injectable variable lookup (for tests).
    pub fn from_lookup(
        default_service_name: &str,
        instance_id: Option<&str>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let get = |key: &str| {
            var(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let disabled = get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || get("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none");
        let number = |key: &str, default: u64| -> Result<u64, TelemetryError> {
            match get(key) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    TelemetryError::Config(format!("{key}={v:?} is not a positive integer"))
                }),
            }
        };
        let sampler_name = get("OTEL_TRACES_SAMPLER");
        let sampler_arg = get("OTEL_TRACES_SAMPLER_ARG");
        Ok(Self {
            service_name: get("OTEL_SERVICE_NAME")
                .unwrap_or_else(|| default_service_name.to_owned()),
            instance_id: instance_id.map(str::to_owned),
            endpoint: if disabled {
                None
            } else {
                get("OTEL_EXPORTER_OTLP_ENDPOINT")
            },
            sampler: Sampler::from_values(sampler_name.as_deref(), sampler_arg.as_deref())?,
            max_queue_size: number("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_MAX_QUEUE_SIZE as u64)?
                as usize,
            scheduled_delay: Duration::from_millis(number(
                "OTEL_BSP_SCHEDULE_DELAY",
                DEFAULT_SCHEDULED_DELAY.as_millis() as u64,
            )?),
            max_export_batch_size: number(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                DEFAULT_MAX_EXPORT_BATCH_SIZE as u64,
            )? as usize,
        })
    }
}

/// Export counters, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Spans the collector accepted.
    pub exported: u64,
    /// Spans dropped because `max_queue_size` spans were already waiting
    /// (collector slow or down).
    pub dropped_queue_full: u64,
    /// Spans in export calls that failed (collector unreachable, timeout, rejected).
    pub dropped_export_failed: u64,
    /// Spans waiting right now (queued or in an unfinished export).
    pub queued: u64,
}

/// Creates request spans and exports the sampled ones. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Tracer {
    inner: Arc<Inner>,
}

struct Inner {
    sampler: Sampler,
    service_name: String,
    export: Option<Exporting>,
}

struct Exporting {
    // Declared before `runtime` so the processor (and its thread's channels) go first.
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    counters: Arc<Counters>,
    max_pending: usize,
    shut_down: AtomicBool,
    endpoint: String,
    _runtime: Option<ExportRuntime>,
}

#[derive(Debug, Default)]
struct Counters {
    pending: AtomicUsize,
    exported: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_export_failed: AtomicU64,
}

/// The runtime the tonic channel lives on; shut down without blocking so a
/// `Tracer` may be dropped anywhere, even inside async code.
struct ExportRuntime(Option<tokio::runtime::Runtime>);

impl Drop for ExportRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl fmt::Debug for Tracer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracer")
            .field("service_name", &self.inner.service_name)
            .field("sampler", &self.inner.sampler)
            .field(
                "endpoint",
                &self.inner.export.as_ref().map(|e| e.endpoint.as_str()),
            )
            .finish()
    }
}

impl Tracer {
    /// A tracer that exports nothing (ids are still generated and propagated,
    /// with the default sampler's decision in the `sampled` flag).
    pub fn disabled() -> Self {
        Self::without_export(TracerOptions::new("unknown_service"))
    }

    /// Builds from the environment ([`TracerOptions::from_env`]); exports only
    /// when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Logs one info line saying where
    /// spans go. Call after [`crate::init_logging`]; from sync or async code.
    pub fn from_env(
        default_service_name: &str,
        instance_id: Option<&str>,
    ) -> Result<Self, TelemetryError> {
        Self::new(TracerOptions::from_env(default_service_name, instance_id)?)
    }

    /// Builds from explicit options; exports when `options.endpoint` is set.
    pub fn new(options: TracerOptions) -> Result<Self, TelemetryError> {
        let Some(endpoint) = options.endpoint.clone() else {
            return Ok(Self::without_export(options));
        };
        // Wrapped at once: a plain Runtime dropped on an error path inside async code would panic.
        let runtime = ExportRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("otlp-export")
                .enable_all()
                .build()
                .map_err(TelemetryError::Runtime)?,
        ));
        let exporter = {
            // tonic's lazy channel spawns its worker on the entered runtime.
            let _entered = runtime.0.as_ref().map(|rt| rt.enter());
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|source| TelemetryError::Exporter {
                    endpoint: endpoint.clone(),
                    source,
                })?
        };
        let tracer = Self::with_exporter_inner(options, endpoint, exporter, Some(runtime));
        tracing::info!(
            endpoint = %tracer.inner.export.as_ref().map_or("", |e| e.endpoint.as_str()),
            service.name = %tracer.inner.service_name,
            sampler = %tracer.inner.sampler.describe(),
            "exporting traces by OTLP/gRPC"
        );
        Ok(tracer)
    }

    /// Exports through any [`SpanExporter`] (tests, or another transport);
    /// `options.endpoint` is only used as a label.
    pub fn with_exporter<E: SpanExporter + 'static>(options: TracerOptions, exporter: E) -> Self {
        let label = options
            .endpoint
            .clone()
            .unwrap_or_else(|| "custom exporter".to_owned());
        Self::with_exporter_inner(options, label, exporter, None)
    }

    fn without_export(options: TracerOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                sampler: options.sampler,
                service_name: options.service_name,
                export: None,
            }),
        }
    }

    fn with_exporter_inner<E: SpanExporter + 'static>(
        options: TracerOptions,
        endpoint: String,
        mut exporter: E,
        runtime: Option<ExportRuntime>,
    ) -> Self {
        let mut resource = Resource::builder().with_service_name(options.service_name.clone());
        if let Some(id) = &options.instance_id {
            resource = resource.with_attribute(KeyValue::new("service.instance.id", id.clone()));
        }
        exporter.set_resource(&resource.build());
        let counters = Arc::new(Counters::default());
        let max_queue_size = options.max_queue_size.max(1);
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(max_queue_size)
            .with_scheduled_delay(options.scheduled_delay)
            .with_max_export_batch_size(options.max_export_batch_size.clamp(1, max_queue_size))
            .build();
        let processor = BatchSpanProcessor::builder(CountingExporter {
            inner: exporter,
            counters: counters.clone(),
        })
        .with_batch_config(config)
        .build();
        let scope = InstrumentationScope::builder("gateway-telemetry")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Self {
            inner: Arc::new(Inner {
                sampler: options.sampler,
                service_name: options.service_name,
                export: Some(Exporting {
                    processor,
                    scope,
                    counters,
                    max_pending: max_queue_size,
                    shut_down: AtomicBool::new(false),
                    endpoint,
                    _runtime: runtime,
                }),
            }),
        }
    }

    /// Whether spans are exported at all.
    pub fn is_exporting(&self) -> bool {
        self.inner.export.is_some()
    }

    /// The `service.name` in use.
    pub fn service_name(&self) -> &str {
        &self.inner.service_name
    }

    /// Starts the SERVER span of an incoming HTTP request. `parent` is the
    /// valid incoming `traceparent`, if any (see [`crate::propagation::extract`]).
    /// Records `http.request.method` and `url.path`; the span is named
    /// `{method}` until [`ServerSpan::set_route`] makes it `{method} {route}`.
    pub fn server_span(
        &self,
        parent: Option<&TraceContext>,
        method: &http::Method,
        path: &str,
    ) -> ServerSpan {
        let (ctx, record) = self.start(parent);
        let rec = record.then(|| {
            let mut rec = http_recording(
                self.inner.clone(),
                SpanKind::Server,
                parent.map(|p| (p.span_id, true)),
                method,
            );
            rec.attributes
                .push(KeyValue::new(attr::URL_PATH, path.to_owned()));
            Box::new(rec)
        });
        ServerSpan(SpanCore { ctx, rec })
    }

    /// [`server_span`](Self::server_span) continuing the trace in `headers`
    /// (strictly parsed; invalid or absent: a new trace). Use
    /// [`crate::propagation::extract`] instead when `tracestate` must be forwarded.
    pub fn http_server_span(
        &self,
        headers: &http::HeaderMap,
        method: &http::Method,
        path: &str,
    ) -> ServerSpan {
        let parent = crate::propagation::extract(headers).parent;
        self.server_span(parent.as_ref(), method, path)
    }

    /// Starts a SERVER span with a given name and no HTTP attributes (e.g. a
    /// gRPC call, named `package.Service/Method`).
    pub fn server_span_named(&self, parent: Option<&TraceContext>, name: &str) -> ServerSpan {
        let (ctx, record) = self.start(parent);
        let rec = record.then(|| {
            Box::new(Recording::new(
                self.inner.clone(),
                SpanKind::Server,
                parent.map(|p| (p.span_id, true)),
                Cow::Owned(name.to_owned()),
                "",
            ))
        });
        ServerSpan(SpanCore { ctx, rec })
    }

    /// Counters of the export pipeline (all zero when export is off).
    pub fn stats(&self) -> ExportStats {
        match &self.inner.export {
            None => ExportStats::default(),
            Some(e) => ExportStats {
                exported: e.counters.exported.load(Ordering::Relaxed),
                dropped_queue_full: e.counters.dropped_queue_full.load(Ordering::Relaxed),
                dropped_export_failed: e.counters.dropped_export_failed.load(Ordering::Relaxed),
                queued: e.counters.pending.load(Ordering::Relaxed) as u64,
            },
        }
    }

    /// Exports everything finished so far and waits (up to 5 s) for it.
    /// Blocks the calling thread: use from tests or shutdown paths.
    pub fn force_flush(&self) -> Result<(), TelemetryError> {
        match &self.inner.export {
            None => Ok(()),
            Some(e) => e
                .processor
                .force_flush()
                .map_err(|err| TelemetryError::Export(err.to_string())),
        }
    }

    /// Flushes what is queued and stops exporting; later spans are discarded.
    /// Blocks the calling thread for at most `timeout` (call it at the end of
    /// `main`, after the servers stopped). Idempotent.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), TelemetryError> {
        match &self.inner.export {
            Some(e) if !e.shut_down.swap(true, Ordering::AcqRel) => e
                .processor
                .shutdown_with_timeout(timeout)
                .map_err(|err| TelemetryError::Export(err.to_string())),
            _ => Ok(()),
        }
    }

    /// Ids for a new span under `parent` and whether to record it.
    #[inline]
    fn start(&self, parent: Option<&TraceContext>) -> (TraceContext, bool) {
        let ctx = match parent {
            Some(p) => p.child(),
            None => TraceContext::new_root(false),
        };
        let sampled = self.inner.sampler.should_sample(parent, &ctx.trace_id);
        let record = sampled && self.inner.export.is_some();
        (ctx.with_sampled(sampled), record)
    }
}

/// A recording for an HTTP span: named `{method}`, with `http.request.method`.
fn http_recording(
    tracer: Arc<Inner>,
    kind: SpanKind,
    parent: Option<([u8; 8], bool)>,
    method: &http::Method,
) -> Recording {
    let (method_attr, name) = method_names(method);
    let mut rec = Recording::new(tracer, kind, parent, Cow::Borrowed(name), name);
    rec.attributes
        .push(KeyValue::new(attr::HTTP_REQUEST_METHOD, method_attr));
    if method_attr == "_OTHER" {
        rec.attributes.push(KeyValue::new(
            attr::HTTP_REQUEST_METHOD_ORIGINAL,
            method.as_str().to_owned(),
        ));
    }
    rec
}

/// Semconv names for a method: (`http.request.method` value, span-name prefix).
fn method_names(method: &http::Method) -> (&'static str, &'static str) {
    let known = match method.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "PATCH" => "PATCH",
        "TRACE" => "TRACE",
        "CONNECT" => "CONNECT",
        _ => return ("_OTHER", "HTTP"),
    };
    (known, known)
}

/// The data of a span being recorded (only exists for sampled spans when export is on).
struct Recording {
    tracer: Arc<Inner>,
    kind: SpanKind,
    parent: Option<([u8; 8], bool)>,
    name: Cow<'static, str>,
    /// Span-name prefix for HTTP spans (`GET`), used when the route becomes known.
    method: &'static str,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    status: Status,
}

impl Recording {
    fn new(
        tracer: Arc<Inner>,
        kind: SpanKind,
        parent: Option<([u8; 8], bool)>,
        name: Cow<'static, str>,
        method: &'static str,
    ) -> Self {
        Self {
            tracer,
            kind,
            parent,
            name,
            method,
            start: SystemTime::now(),
            attributes: Vec::with_capacity(8),
            status: Status::Unset,
        }
    }

    fn set(&mut self, key: &'static str, value: Value) {
        match self.attributes.iter_mut().find(|kv| kv.key.as_str() == key) {
            Some(kv) => kv.value = value,
            None => self.attributes.push(KeyValue::new(key, value)),
        }
    }

    fn finish(self, ctx: TraceContext) {
        let Some(export) = &self.tracer.export else {
            return;
        };
        if export.shut_down.load(Ordering::Relaxed) {
            return;
        }
        let counters = &export.counters;
        if counters.pending.fetch_add(1, Ordering::AcqRel) >= export.max_pending {
            counters.pending.fetch_sub(1, Ordering::AcqRel);
            counters.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let (parent_span_id, parent_span_is_remote) = match self.parent {
            Some((id, remote)) => (SpanId::from_bytes(id), remote),
            None => (SpanId::INVALID, false),
        };
        export.processor.on_end(SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(ctx.trace_id),
                SpanId::from_bytes(ctx.span_id),
                TraceFlags::new(ctx.flags),
                false,
                TraceState::NONE,
            ),
            parent_span_id,
            parent_span_is_remote,
            span_kind: self.kind,
            name: self.name,
            start_time: self.start,
            end_time: SystemTime::now(),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: self.status,
            instrumentation_scope: export.scope.clone(),
        });
    }
}

/// A value for [`ServerSpan::set_attribute`] / [`ClientSpan::set_attribute`],
/// converted only when the span is recorded.
pub trait AttributeValue {
    /// The OpenTelemetry value.
    fn into_value(self) -> Value;
}

impl AttributeValue for &str {
    fn into_value(self) -> Value {
        Value::from(self.to_owned())
    }
}
impl AttributeValue for String {
    fn into_value(self) -> Value {
        Value::from(self)
    }
}
impl AttributeValue for bool {
    fn into_value(self) -> Value {
        Value::Bool(self)
    }
}
impl AttributeValue for i64 {
    fn into_value(self) -> Value {
        Value::I64(self)
    }
}
impl AttributeValue for u16 {
    fn into_value(self) -> Value {
        Value::I64(self.into())
    }
}
impl AttributeValue for u32 {
    fn into_value(self) -> Value {
        Value::I64(self.into())
    }
}
impl AttributeValue for u64 {
    fn into_value(self) -> Value {
        Value::I64(i64::try_from(self).unwrap_or(i64::MAX))
    }
}
impl AttributeValue for f64 {
    fn into_value(self) -> Value {
        Value::F64(self)
    }
}

struct SpanCore {
    ctx: TraceContext,
    rec: Option<Box<Recording>>,
}

impl SpanCore {
    #[inline]
    fn set_attribute(&mut self, key: &'static str, value: impl AttributeValue) {
        if let Some(rec) = &mut self.rec {
            rec.set(key, value.into_value());
        }
    }

    fn set_status_code(&mut self, status: u16, error_from: u16) {
        if let Some(rec) = &mut self.rec {
            rec.set(attr::HTTP_RESPONSE_STATUS_CODE, Value::I64(status.into()));
            if status >= error_from && !matches!(rec.status, Status::Error { .. }) {
                let code = itoa::Buffer::new().format(status).to_owned();
                rec.set(attr::ERROR_TYPE, Value::from(code));
                rec.status = Status::error("");
            }
        }
    }

    fn set_status_error(&mut self, error_type: &str) {
        if let Some(rec) = &mut self.rec {
            rec.set(attr::ERROR_TYPE, Value::from(error_type.to_owned()));
            rec.status = Status::error(error_type.to_owned());
        }
    }
}

impl Drop for SpanCore {
    fn drop(&mut self) {
        if let Some(rec) = self.rec.take() {
            rec.finish(self.ctx);
        }
    }
}

macro_rules! common_span_methods {
    () => {
        /// This span's context: its trace id, its own span id and the flags.
        #[inline]
        pub fn context(&self) -> TraceContext {
            self.0.ctx
        }

        /// Whether attributes are recorded (sampled and export on); when false,
        /// every setter is a no-op, so skip computing costly values.
        #[inline]
        pub fn is_recording(&self) -> bool {
            self.0.rec.is_some()
        }

        /// Sets (or replaces) an attribute; see [`attr`] for the names in use.
        #[inline]
        pub fn set_attribute(&mut self, key: &'static str, value: impl AttributeValue) {
            self.0.set_attribute(key, value);
        }

        /// Records the upstream instance id (`gateway.upstream.instance`).
        #[inline]
        pub fn set_upstream_instance(&mut self, instance_id: &str) {
            self.0.set_attribute(attr::UPSTREAM_INSTANCE, instance_id);
        }

        /// Marks the span failed with a low-cardinality reason (`unauthorized`,
        /// `rate_limited`, `circuit_open`, `timeout`, ...), set as the status
        /// description and as `error.type`.
        #[inline]
        pub fn set_status_error(&mut self, error_type: &str) {
            self.0.set_status_error(error_type);
        }

        /// Ends the span now (dropping it does the same).
        #[inline]
        pub fn end(self) {
            drop(self);
        }
    };
}

/// The gateway's span for one incoming request (kind SERVER). Ends on
/// [`end`](Self::end) or drop, so early returns (401, 429, 503) still close it.
pub struct ServerSpan(SpanCore);

impl ServerSpan {
    common_span_methods!();

    /// Records the matched route (`http.route`) and names the span `{method} {route}`.
    pub fn set_route(&mut self, route: &str) {
        if let Some(rec) = &mut self.0.rec {
            rec.set(attr::HTTP_ROUTE, Value::from(route.to_owned()));
            if !rec.method.is_empty() {
                rec.name = Cow::Owned(format!("{} {route}", rec.method));
            }
        }
    }

    /// Records `http.response.status_code`; 5xx also marks the span failed
    /// (semconv: a 4xx is the client's fault, not the server's — use
    /// [`set_status_error`](Self::set_status_error) for gateway rejections).
    pub fn set_status_code(&mut self, status: u16) {
        self.0.set_status_code(status, 500);
    }

    /// Records the response status ([`set_status_code`](Self::set_status_code))
    /// and sets `traceresponse` naming this span on the response headers.
    pub fn record_response(&mut self, status: u16, headers: &mut http::HeaderMap) {
        self.set_status_code(status);
        crate::propagation::set_traceresponse(headers, &self.0.ctx);
    }

    /// Starts a CLIENT span for one upstream attempt; put its
    /// [`context`](ClientSpan::context) in the outgoing `traceparent`.
    pub fn client_span(&self, method: &http::Method) -> ClientSpan {
        client_span_under(
            self.0.ctx,
            self.0.rec.as_ref().map(|server| &server.tracer),
            method,
        )
    }

    /// A handle that starts CLIENT spans under this span from elsewhere: a
    /// task of its own that may outlive this request (request coalescing).
    pub fn parent(&self) -> SpanParent {
        SpanParent {
            ctx: self.0.ctx,
            tracer: self.0.rec.as_ref().map(|server| server.tracer.clone()),
        }
    }
}

fn client_span_under(
    parent: TraceContext,
    recording: Option<&Arc<Inner>>,
    method: &http::Method,
) -> ClientSpan {
    let ctx = parent.child();
    let rec = recording.map(|tracer| {
        Box::new(http_recording(
            tracer.clone(),
            SpanKind::Client,
            Some((parent.span_id, false)),
            method,
        ))
    });
    ClientSpan(SpanCore { ctx, rec })
}

/// Starts CLIENT spans under a [`ServerSpan`] without borrowing it
/// ([`ServerSpan::parent`]). Cheap to clone: one `Arc`, only when recording.
#[derive(Clone)]
pub struct SpanParent {
    ctx: TraceContext,
    tracer: Option<Arc<Inner>>,
}

impl SpanParent {
    /// The parent span's context.
    pub fn context(&self) -> TraceContext {
        self.ctx
    }
}

impl fmt::Debug for SpanParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpanParent")
            .field("context", &self.ctx)
            .field("recording", &self.tracer.is_some())
            .finish()
    }
}

/// What an upstream attempt's CLIENT span is started from: the request's
/// [`ServerSpan`], or a [`SpanParent`] taken from it.
pub trait ClientSpans: Sync {
    /// Starts a CLIENT span for one upstream attempt.
    fn client_span(&self, method: &http::Method) -> ClientSpan;
    /// An owned handle starting the same CLIENT spans, for another task.
    fn parent(&self) -> SpanParent;
}

impl ClientSpans for ServerSpan {
    fn client_span(&self, method: &http::Method) -> ClientSpan {
        ServerSpan::client_span(self, method)
    }

    fn parent(&self) -> SpanParent {
        ServerSpan::parent(self)
    }
}

impl ClientSpans for SpanParent {
    fn client_span(&self, method: &http::Method) -> ClientSpan {
        client_span_under(self.ctx, self.tracer.as_ref(), method)
    }

    fn parent(&self) -> SpanParent {
        self.clone()
    }
}

impl fmt::Debug for ServerSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerSpan")
            .field("context", &self.0.ctx)
            .field("recording", &self.is_recording())
            .finish()
    }
}

/// One upstream attempt (kind CLIENT), child of a [`ServerSpan`].
pub struct ClientSpan(SpanCore);

impl ClientSpan {
    common_span_methods!();

    /// Records `http.response.status_code`; 4xx and 5xx mark the span failed (semconv for clients).
    pub fn set_status_code(&mut self, status: u16) {
        self.0.set_status_code(status, 400);
    }

    /// Records where the attempt goes (`server.address`, `server.port`).
    pub fn set_server_address(&mut self, host: &str, port: u16) {
        self.0.set_attribute(attr::SERVER_ADDRESS, host);
        self.0.set_attribute(attr::SERVER_PORT, port);
    }
}

impl fmt::Debug for ClientSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSpan")
            .field("context", &self.0.ctx)
            .field("recording", &self.is_recording())
            .finish()
    }
}

/// Wraps the real exporter to count outcomes and release queue slots.
#[derive(Debug)]
struct CountingExporter<E> {
    inner: E,
    counters: Arc<Counters>,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        let counter = match result {
            Ok(()) => &self.counters.exported,
            Err(_) => &self.counters.dropped_export_failed,
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        self.counters.pending.fetch_sub(n, Ordering::AcqRel);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests;
