//! One attempt at an upstream instance, from the pick to its outcome.
//!
//! An [`Attempt`] owns what every attempt must account for: the instance's
//! counters (attempts, retries, errors by kind), the CLIENT span (its context
//! goes upstream as `traceparent`), the instance's in-flight count and the
//! breaker permit. It ends one of two ways: [`answered`](Attempt::answered)
//! (the span records the status, a 5xx is an outlier failure and, with the
//! upstream's `count_5xx`, a breaker failure; the in-flight
//! count is handed to the response body) or [`failed`](Attempt::failed) (the
//! span and the counters record the [`UpstreamError`], the breaker counts a
//! failure unless the client's side failed). Forwarding and its retries
//! ([`proxy::forward`](super::proxy::forward), which aggregation parts and
//! coalescing leaders call too) and WebSocket handshakes all start their
//! attempts here, so they are counted, traced and reported one way.

use gateway_telemetry::{ClientSpan, ClientSpans, inject};
use gateway_transport::body::RequestBody;
use gateway_transport::in_flight::InFlight;
use gateway_transport::upstream_error::{Side, UpstreamError};
use http::header::HeaderValue;
use http::{Request, StatusCode};
use std::sync::atomic::Ordering;

use super::balancer::Pick;
use super::breaker::{Permit, Transition};
use super::outlier;
use super::{InstanceState, UpstreamEntry};

/// The request's trace, for the attempts' CLIENT spans.
pub struct Trace<'s, 'a> {
    /// Parent of every attempt's CLIENT span: the request's SERVER span, or a
    /// [`gateway_telemetry::SpanParent`] of it for calls in a task of their own.
    pub span: &'s dyn ClientSpans,
    /// The caller's validated `tracestate`, forwarded as is.
    pub tracestate: Option<&'s HeaderValue>,
    /// Set to the id of each instance tried; the last one answered (or failed).
    pub served_by: &'s mut Option<&'a str>,
}

/// One attempt in progress.
pub struct Attempt<'a> {
    upstream: &'a UpstreamEntry,
    instance: &'a InstanceState,
    permit: Permit<'a>,
    span: ClientSpan,
    in_flight: InFlight,
}

/// The low-cardinality name of a failure, for the span's `error.type`.
pub fn error_label(error: &UpstreamError) -> &'static str {
    if error.is_timeout() {
        "timeout"
    } else if error.is_tls() {
        "tls"
    } else if error.never_reached() {
        "connect"
    } else if error.side() == Side::Client {
        "client_body"
    } else {
        "upstream"
    }
}

impl<'a> Attempt<'a> {
    /// Starts an attempt of `req` on the instance in `pick`: counts it (as a
    /// retry when `retries` > 0), records the instance as the one serving the
    /// request, opens the CLIENT span and writes its `traceparent` into `req`,
    /// and counts the request in flight.
    pub fn start(
        upstream: &'a UpstreamEntry,
        pick: Pick<'a>,
        req: &mut Request<RequestBody>,
        trace: &mut Trace<'_, 'a>,
        retries: u32,
    ) -> Self {
        let Pick {
            instance, permit, ..
        } = pick;
        instance.metrics.attempts.fetch_add(1, Ordering::Relaxed);
        if retries > 0 {
            instance.metrics.retries.fetch_add(1, Ordering::Relaxed);
        }
        *trace.served_by = Some(&instance.id);
        let mut span = trace.span.client_span(req.method());
        span.set_upstream_instance(&instance.id);
        if retries > 0 {
            span.set_attribute(gateway_telemetry::attr::ATTEMPT, retries + 1);
        }
        inject(req.headers_mut(), &span.context(), trace.tracestate);
        Self {
            upstream,
            instance,
            permit,
            span,
            in_flight: instance.start_request(),
        }
    }

    /// The instance of this attempt.
    pub fn instance(&self) -> &'a InstanceState {
        self.instance
    }

    /// The instance answered `status`: the span records it; a 5xx is counted
    /// as `status_5xx`, and is a breaker failure only where the upstream's
    /// `count_5xx` says so (by default any answer is a success: the instance
    /// is reachable, and clients cannot open breakers by asking for 500s).
    /// Returns the in-flight count, to hold until the response body ends.
    pub fn answered(self, status: StatusCode) -> InFlight {
        let Self {
            upstream,
            instance,
            permit,
            mut span,
            in_flight,
        } = self;
        span.set_status_code(status.as_u16());
        span.end();
        if status.is_server_error() {
            instance.metrics.status_5xx();
        }
        if status.is_server_error() && upstream.breaker.count_5xx {
            report(upstream, instance, failure(upstream, permit));
        } else {
            report(upstream, instance, permit.success());
        }
        outlier::record(upstream, instance, status.is_server_error());
        in_flight
    }

    /// The attempt failed with `error`: the span and the instance's counters
    /// record it and the breaker counts a failure, unless the client's side
    /// failed (its body), which says nothing about the instance.
    pub fn failed(self, error: &UpstreamError) {
        let Self {
            upstream,
            instance,
            permit,
            mut span,
            in_flight: _,
        } = self;
        span.set_status_error(error_label(error));
        span.end();
        if error.side() == Side::Client {
            return;
        }
        instance.metrics.failed(error);
        tracing::debug!(upstream = %upstream.name, instance = %instance.id, %error, "upstream attempt failed");
        report(upstream, instance, failure(upstream, permit));
        outlier::record(upstream, instance, true);
    }
}

/// Reports a failure through `permit`; the breaker opens only while the
/// upstream's cap on instances out of rotation allows one more.
fn failure(upstream: &UpstreamEntry, permit: Permit<'_>) -> Option<Transition> {
    permit.failure_capped(|| upstream.may_take_out_one())
}

/// Logs and counts a breaker transition of `instance`.
fn report(upstream: &UpstreamEntry, instance: &InstanceState, t: Option<Transition>) {
    match t {
        Some(Transition::Opened) => {
            instance
                .metrics
                .breaker_opened
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(upstream = %upstream.name, instance = %instance.id, "circuit breaker opened");
        }
        Some(Transition::Closed) => {
            tracing::info!(upstream = %upstream.name, instance = %instance.id, "circuit breaker closed");
        }
        None => {}
    }
}
