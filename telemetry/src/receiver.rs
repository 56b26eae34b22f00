//! An in-test OTLP/gRPC trace receiver (feature `receiver`).
//!
//! Serves `opentelemetry.proto.collector.trace.v1.TraceService/Export` on
//! `127.0.0.1:0`, keeps every span in memory in a simplified form, and lets a
//! test wait for a condition over them:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use gateway_telemetry::receiver::Receiver;
//! let receiver = Receiver::start().await?;
//! // ... start processes with OTEL_EXPORTER_OTLP_ENDPOINT = receiver.endpoint() ...
//! let spans = receiver
//!     .wait_for(|spans| spans.iter().any(|s| s.service_name == "users"), Duration::from_secs(20))
//!     .await?;
//! receiver.shutdown().await;
//! # Ok(()) }
//! ```

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

/// Span kind as in OTLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Not specified by the producer.
    Unspecified,
    /// An internal operation.
    Internal,
    /// Handling an incoming request.
    Server,
    /// Making an outgoing request.
    Client,
    /// Sending a message.
    Producer,
    /// Receiving a message.
    Consumer,
}

impl Kind {
    fn from_otlp(kind: i32) -> Self {
        match kind {
            1 => Self::Internal,
            2 => Self::Server,
            3 => Self::Client,
            4 => Self::Producer,
            5 => Self::Consumer,
            _ => Self::Unspecified,
        }
    }
}

/// Span status code as in OTLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCode {
    /// No status set.
    Unset,
    /// Explicitly successful.
    Ok,
    /// Failed.
    Error,
}

/// One received span, simplified for assertions.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// 16 lowercase hex digits, or empty for a root span.
    pub parent_span_id: String,
    /// Span name.
    pub name: String,
    /// Span kind.
    pub kind: Kind,
    /// The resource's `service.name`.
    pub service_name: String,
    /// The resource's `service.instance.id`, if any.
    pub service_instance_id: Option<String>,
    /// Status code.
    pub status: StatusCode,
    /// Status message (for errors).
    pub status_message: String,
    /// Span attributes; numbers and booleans as their decimal / `true` text.
    pub attributes: BTreeMap<String, String>,
    /// Start time, ns since the Unix epoch.
    pub start_unix_nanos: u64,
    /// End time, ns since the Unix epoch.
    pub end_unix_nanos: u64,
}

impl ReceivedSpan {
    /// An attribute's value as text.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// Whether the span was ended (an end time at or after its start).
    pub fn is_closed(&self) -> bool {
        self.end_unix_nanos != 0 && self.end_unix_nanos >= self.start_unix_nanos
    }
}

impl fmt::Display for ReceivedSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} {:?} {:?} trace={} span={} parent={} status={:?}",
            self.service_name,
            self.service_instance_id.as_deref().unwrap_or("-"),
            self.name,
            self.kind,
            self.trace_id,
            self.span_id,
            if self.parent_span_id.is_empty() {
                "-"
            } else {
                &self.parent_span_id
            },
            self.status,
        )?;
        for (k, v) in &self.attributes {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

/// [`Receiver::wait_for`] gave up; carries what had arrived, for the failure message.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {waited:?} waiting for spans; {} received:{}", spans.len(), list(spans))]
pub struct WaitTimeout {
    /// How long it waited.
    pub waited: Duration,
    /// Every span received by then.
    pub spans: Vec<ReceivedSpan>,
}

fn list(spans: &[ReceivedSpan]) -> String {
    spans.iter().map(|s| format!("\n  {s}")).collect()
}

#[derive(Default)]
struct Store {
    spans: Mutex<Vec<ReceivedSpan>>,
    changed: Notify,
}

/// A running receiver; [`shutdown`](Self::shutdown) (or drop) stops it.
pub struct Receiver {
    addr: SocketAddr,
    store: Arc<Store>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Receiver {
    /// Binds `127.0.0.1:0` and starts serving on the current runtime.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Store::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let service = TraceServiceServer::new(Collector {
            store: store.clone(),
        });
        let task = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            addr,
            store,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The URL to put in `OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. `http://127.0.0.1:43123`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store.spans.lock().clone()
    }

    /// Waits until `condition` holds over the spans received so far (checked
    /// on every arrival) and returns them, or fails after `timeout`.
    pub async fn wait_for<F>(
        &self,
        mut condition: F,
        timeout: Duration,
    ) -> Result<Vec<ReceivedSpan>, WaitTimeout>
    where
        F: FnMut(&[ReceivedSpan]) -> bool,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the check, so an arrival in between is not missed.
            let changed = self.store.changed.notified();
            let spans = self.spans();
            if condition(&spans) {
                return Ok(spans);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(WaitTimeout {
                    waited: timeout,
                    spans: self.spans(),
                });
            }
        }
    }

    /// Stops serving (existing connections are told to go away) and waits up
    /// to 5 s for the server to finish; later exports to the endpoint fail.
    pub async fn shutdown(mut self) {
        self.stop_now().await;
    }

    async fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct Collector {
    store: Arc<Store>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let resource_attrs = resource_spans
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service_name = resource_attrs
                .get("service.name")
                .cloned()
                .unwrap_or_default();
            let service_instance_id = resource_attrs.get("service.instance.id").cloned();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    let (status, status_message) = match span.status {
                        Some(s) => (
                            match s.code {
                                1 => StatusCode::Ok,
                                2 => StatusCode::Error,
                                _ => StatusCode::Unset,
                            },
                            s.message,
                        ),
                        None => (StatusCode::Unset, String::new()),
                    };
                    received.push(ReceivedSpan {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        name: span.name,
                        kind: Kind::from_otlp(span.kind),
                        service_name: service_name.clone(),
                        service_instance_id: service_instance_id.clone(),
                        status,
                        status_message,
                        attributes: attributes(&span.attributes),
                        start_unix_nanos: span.start_time_unix_nano,
                        end_unix_nanos: span.end_time_unix_nano,
                    });
                }
            }
        }
        self.store.spans.lock().extend(received);
        self.store.changed.notify_waiters();
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    if bytes.iter().all(|b| *b == 0) {
        return String::new();
    }
    gateway_hex::encode(bytes)
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
