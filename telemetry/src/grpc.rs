//! A tower layer that gives every gRPC call a tonic server handles a SERVER
//! span, continuing the caller's trace from the `traceparent` metadata:
//!
//! ```no_run
//! # fn demo(tracer: gateway_telemetry::Tracer) {
//! let server = tonic::transport::Server::builder()
//!     .layer(gateway_telemetry::grpc::GrpcTraceLayer::new(tracer));
//! # }
//! ```
//!
//! The span is named `package.Service/Method` and carries `rpc.system`,
//! `rpc.service`, `rpc.method` and `rpc.grpc.status_code` (read from the
//! response headers, where tonic puts the status of a call that fails). It
//! ends when the response head is ready, so a long-lived stream gets a short
//! span rather than one lasting hours. The response carries `traceresponse`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use crate::otel::Tracer;
use crate::propagation::{extract, set_traceresponse};

/// Wraps a service with [`GrpcTrace`].
#[derive(Debug, Clone)]
pub struct GrpcTraceLayer {
    tracer: Tracer,
}

impl GrpcTraceLayer {
    /// A layer creating spans with `tracer`.
    pub fn new(tracer: Tracer) -> Self {
        Self { tracer }
    }
}

impl<S> Layer<S> for GrpcTraceLayer {
    type Service = GrpcTrace<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrace {
            inner,
            tracer: self.tracer.clone(),
        }
    }
}

/// The service made by [`GrpcTraceLayer`].
#[derive(Debug, Clone)]
pub struct GrpcTrace<S> {
    inner: S,
    tracer: Tracer,
}

/// gRPC codes that are the server's fault (semconv: only these mark a SERVER span failed).
fn server_fault(code: i64) -> Option<&'static str> {
    match code {
        2 => Some("UNKNOWN"),
        4 => Some("DEADLINE_EXCEEDED"),
        12 => Some("UNIMPLEMENTED"),
        13 => Some("INTERNAL"),
        14 => Some("UNAVAILABLE"),
        15 => Some("DATA_LOSS"),
        _ => None,
    }
}

impl<S, B, ResB> Service<http::Request<B>> for GrpcTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let incoming = extract(request.headers());
        let path = request.uri().path();
        let name = path.strip_prefix('/').unwrap_or(path);
        let mut span = self
            .tracer
            .server_span_named(incoming.parent.as_ref(), name);
        if span.is_recording() {
            span.set_attribute("rpc.system", "grpc");
            if let Some((service, method)) = name.split_once('/') {
                span.set_attribute("rpc.service", service);
                span.set_attribute("rpc.method", method);
            }
        }
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut result = response.await;
            match &mut result {
                Ok(response) => {
                    let code = response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i64>().ok());
                    if let Some(code) = code {
                        span.set_attribute("rpc.grpc.status_code", code);
                        if let Some(fault) = server_fault(code) {
                            span.set_status_error(fault);
                        }
                    } else {
                        // No status in the head: the handler succeeded (a stream may still fail later).
                        span.set_attribute("rpc.grpc.status_code", 0i64);
                    }
                    set_traceresponse(response.headers_mut(), &span.context());
                }
                Err(_) => span.set_status_error("transport"),
            }
            span.end();
            result
        })
    }
}
