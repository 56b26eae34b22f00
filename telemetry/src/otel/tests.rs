use parking_lot::{Condvar, Mutex};
use std::time::Instant;

use opentelemetry::trace::Status;

use super::*;

/// Collects exported spans and the resource it was given.
#[derive(Debug, Clone, Default)]
struct Collect {
    spans: Arc<Mutex<Vec<SpanData>>>,
    resource: Arc<Mutex<Option<Resource>>>,
    fail: bool,
}

impl SpanExporter for Collect {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if self.fail {
            return Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                "collector down".into(),
            ));
        }
        self.spans.lock().extend(batch);
        Ok(())
    }
    fn set_resource(&mut self, resource: &Resource) {
        *self.resource.lock() = Some(resource.clone());
    }
}

/// Blocks every export until the gate opens, like a collector that hangs.
#[derive(Debug, Clone, Default)]
struct Hang {
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Hang {
    fn open(&self) {
        *self.gate.0.lock() = true;
        self.gate.1.notify_all();
    }
}

impl SpanExporter for Hang {
    async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
        let (lock, cv) = &*self.gate;
        let mut open = lock.lock();
        while !*open {
            cv.wait(&mut open);
        }
        Ok(())
    }
}

fn options(sampler: Sampler) -> TracerOptions {
    TracerOptions {
        instance_id: Some("node-1".into()),
        sampler,
        ..TracerOptions::new("data-plane")
    }
}

fn attr_of<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn disabled_tracer_still_propagates_ids() {
    let tracer = Tracer::disabled();
    assert!(!tracer.is_exporting());
    let parent: TraceContext = PARENT.parse().unwrap();
    let mut span = tracer.server_span(Some(&parent), &http::Method::GET, "/api/users/1");
    assert!(!span.is_recording());
    span.set_route("users");
    span.set_status_code(200);
    let ctx = span.context();
    assert_eq!(ctx.trace_id, parent.trace_id);
    assert_ne!(ctx.span_id, parent.span_id);
    assert!(
        ctx.is_sampled(),
        "parent-based default follows the sampled parent"
    );
    let client = span.client_span(&http::Method::GET);
    assert!(!client.is_recording());
    assert_eq!(client.context().trace_id, parent.trace_id);
    assert_ne!(client.context().span_id, ctx.span_id);
    assert_eq!(tracer.stats(), ExportStats::default());

    let root = tracer.server_span(None, &http::Method::GET, "/");
    assert_ne!(root.context().trace_id, parent.trace_id);
    assert!(root.context().flags & TraceContext::FLAG_RANDOM != 0);
}

#[test]
fn exports_server_and_client_spans_with_parents_and_semconv_attributes() {
    let collect = Collect::default();
    let tracer = Tracer::with_exporter(options(Sampler::always_on()), collect.clone());
    let parent: TraceContext = PARENT.parse().unwrap();

    let mut server = tracer.server_span(Some(&parent), &http::Method::GET, "/api/users/1");
    assert!(server.is_recording());
    server.set_route("users");
    server.set_attribute(attr::RATE_LIMIT_DECISION, "allowed");
    let mut client = server.client_span(&http::Method::GET);
    client.set_server_address("127.0.0.1", 8081);
    client.set_upstream_instance("users-1");
    client.set_status_code(200);
    let client_ctx = client.context();
    client.end();
    server.set_upstream_instance("users-1");
    server.set_status_code(200);
    let server_ctx = server.context();
    server.end();

    // A rejected request: dropped without `end`, marked as an error.
    let mut rejected = tracer.server_span(None, &http::Method::POST, "/api/orders");
    rejected.set_status_code(429);
    rejected.set_status_error("rate_limited");
    let rejected_ctx = rejected.context();
    drop(rejected);

    tracer.force_flush().unwrap();
    let spans = collect.spans.lock().clone();
    assert_eq!(spans.len(), 3);

    let c = &spans[0];
    assert_eq!(c.span_kind, SpanKind::Client);
    assert_eq!(c.name, "GET");
    assert_eq!(c.span_context.span_id().to_bytes(), client_ctx.span_id);
    assert_eq!(c.parent_span_id.to_bytes(), server_ctx.span_id);
    assert!(!c.parent_span_is_remote);
    assert_eq!(attr_of(c, attr::SERVER_PORT), Some(&Value::I64(8081)));
    assert_eq!(
        attr_of(c, attr::UPSTREAM_INSTANCE),
        Some(&Value::from("users-1"))
    );
    assert_eq!(c.status, Status::Unset);

    let s = &spans[1];
    assert_eq!(s.span_kind, SpanKind::Server);
    assert_eq!(s.name, "GET users");
    assert_eq!(s.span_context.trace_id().to_bytes(), parent.trace_id);
    assert_eq!(s.parent_span_id.to_bytes(), parent.span_id);
    assert!(s.parent_span_is_remote);
    assert!(s.span_context.is_sampled());
    assert_eq!(
        attr_of(s, attr::HTTP_REQUEST_METHOD),
        Some(&Value::from("GET"))
    );
    assert_eq!(
        attr_of(s, attr::URL_PATH),
        Some(&Value::from("/api/users/1"))
    );
    assert_eq!(attr_of(s, attr::HTTP_ROUTE), Some(&Value::from("users")));
    assert_eq!(
        attr_of(s, attr::HTTP_RESPONSE_STATUS_CODE),
        Some(&Value::I64(200))
    );
    assert_eq!(
        attr_of(s, attr::RATE_LIMIT_DECISION),
        Some(&Value::from("allowed"))
    );
    assert!(s.end_time >= s.start_time);

    let r = &spans[2];
    assert_eq!(r.span_context.span_id().to_bytes(), rejected_ctx.span_id);
    assert_eq!(r.parent_span_id, SpanId::INVALID);
    assert_eq!(r.name, "POST");
    assert_eq!(r.status, Status::error("rate_limited"));
    assert_eq!(
        attr_of(r, attr::ERROR_TYPE),
        Some(&Value::from("rate_limited"))
    );
    assert_eq!(
        attr_of(r, attr::HTTP_RESPONSE_STATUS_CODE),
        Some(&Value::I64(429))
    );

    let resource = collect.resource.lock().clone().unwrap();
    assert_eq!(
        resource.get(&opentelemetry::Key::new("service.name")),
        Some(Value::from("data-plane"))
    );
    assert_eq!(
        resource.get(&opentelemetry::Key::new("service.instance.id")),
        Some(Value::from("node-1"))
    );
    assert_eq!(
        tracer.stats(),
        ExportStats {
            exported: 3,
            ..ExportStats::default()
        }
    );
}

#[test]
fn server_5xx_is_an_error_but_4xx_only_when_marked_and_client_4xx_is() {
    let collect = Collect::default();
    let tracer = Tracer::with_exporter(options(Sampler::always_on()), collect.clone());
    let mut a = tracer.server_span(None, &http::Method::GET, "/");
    a.set_status_code(503);
    a.end();
    let mut b = tracer.server_span(None, &http::Method::GET, "/");
    b.set_status_code(404);
    let mut c = b.client_span(&http::Method::from_bytes(b"PURGE").unwrap());
    c.set_status_code(404);
    c.end();
    b.end();
    tracer.force_flush().unwrap();
    let spans = collect.spans.lock().clone();
    assert_eq!(spans[0].status, Status::error(""));
    assert_eq!(
        attr_of(&spans[0], attr::ERROR_TYPE),
        Some(&Value::from("503"))
    );
    assert_eq!(spans[1].status, Status::error(""), "client 404");
    assert_eq!(spans[1].name, "HTTP");
    assert_eq!(
        attr_of(&spans[1], attr::HTTP_REQUEST_METHOD),
        Some(&Value::from("_OTHER"))
    );
    assert_eq!(
        attr_of(&spans[1], attr::HTTP_REQUEST_METHOD_ORIGINAL),
        Some(&Value::from("PURGE"))
    );
    assert_eq!(spans[2].status, Status::Unset, "server 404");
}

#[test]
fn unsampled_traces_are_not_recorded_but_keep_their_ids() {
    let collect = Collect::default();
    let tracer = Tracer::with_exporter(options(Sampler::default()), collect.clone());
    let parent: TraceContext = PARENT.parse::<TraceContext>().unwrap().with_sampled(false);
    let span = tracer.server_span(Some(&parent), &http::Method::GET, "/");
    assert!(!span.is_recording());
    assert!(!span.context().is_sampled());
    assert_eq!(span.context().trace_id, parent.trace_id);
    let client = span.client_span(&http::Method::GET);
    assert!(!client.is_recording());
    assert!(!client.context().is_sampled());
    drop(client);
    drop(span);
    tracer.force_flush().unwrap();
    assert!(collect.spans.lock().is_empty());
}

#[test]
fn a_hanging_collector_never_blocks_and_drops_are_counted() {
    let hang = Hang::default();
    let tracer = Tracer::with_exporter(
        TracerOptions {
            max_queue_size: 4,
            max_export_batch_size: 2,
            scheduled_delay: Duration::from_secs(3600),
            ..options(Sampler::always_on())
        },
        hang.clone(),
    );
    // Open the gate after a while in any case, so a regression fails instead of hanging.
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let opener = {
        let hang = hang.clone();
        std::thread::spawn(move || {
            let _ = wait_done.recv_timeout(Duration::from_secs(5));
            hang.open();
        })
    };
    let started = Instant::now();
    for _ in 0..1000 {
        tracer.server_span(None, &http::Method::GET, "/").end();
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(1),
        "finishing spans took {elapsed:?}"
    );
    let stats = tracer.stats();
    assert_eq!(stats.dropped_queue_full, 996, "{stats:?}");
    assert_eq!(stats.queued, 4);
    done.send(()).unwrap();
    opener.join().unwrap();
    tracer.force_flush().unwrap();
    let stats = tracer.stats();
    assert_eq!((stats.exported, stats.queued), (4, 0), "{stats:?}");
}

#[test]
fn failed_exports_are_counted() {
    let collect = Collect {
        fail: true,
        ..Collect::default()
    };
    let tracer = Tracer::with_exporter(options(Sampler::always_on()), collect);
    for _ in 0..3 {
        tracer.server_span(None, &http::Method::GET, "/").end();
    }
    let _ = tracer.force_flush();
    let stats = tracer.stats();
    assert_eq!(
        (stats.dropped_export_failed, stats.exported, stats.queued),
        (3, 0, 0)
    );
}

#[test]
fn shutdown_stops_export() {
    let collect = Collect::default();
    let tracer = Tracer::with_exporter(options(Sampler::always_on()), collect.clone());
    tracer.server_span(None, &http::Method::GET, "/").end();
    tracer.shutdown(Duration::from_secs(5)).unwrap();
    tracer.shutdown(Duration::from_secs(5)).unwrap();
    tracer.server_span(None, &http::Method::GET, "/").end();
    assert_eq!(collect.spans.lock().len(), 1);
}

#[test]
fn options_from_lookup() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }
    };
    let o = TracerOptions::from_lookup("users", Some("users-1"), env(&[])).unwrap();
    assert_eq!(o.service_name, "users");
    assert_eq!(o.instance_id.as_deref(), Some("users-1"));
    assert_eq!(o.endpoint, None);
    assert_eq!(o.sampler, Sampler::default());

    let o = TracerOptions::from_lookup(
        "data-plane",
        None,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SERVICE_NAME", "edge"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
        ]),
    )
    .unwrap();
    assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:4317"));
    assert_eq!(o.service_name, "edge");
    assert_eq!(o.sampler, Sampler::always_on());
    assert_eq!(o.scheduled_delay, Duration::from_millis(200));
    assert_eq!(o.max_queue_size, 100);

    let o = TracerOptions::from_lookup(
        "x",
        None,
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SDK_DISABLED", "true"),
        ]),
    )
    .unwrap();
    assert_eq!(o.endpoint, None);

    let err = TracerOptions::from_lookup("x", None, env(&[("OTEL_BSP_MAX_QUEUE_SIZE", "lots")]))
        .unwrap_err();
    assert!(err.to_string().contains("OTEL_BSP_MAX_QUEUE_SIZE"), "{err}");
}

#[test]
fn tracer_and_spans_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Tracer>();
    send::<ServerSpan>();
    send::<ClientSpan>();
    send_sync::<SpanParent>();
}

#[test]
fn a_span_parent_starts_client_spans_after_its_server_span_ended() {
    let collect = Collect::default();
    let tracer = Tracer::with_exporter(options(Sampler::always_on()), collect.clone());
    let server = tracer.server_span(None, &http::Method::GET, "/x");
    let server_ctx = server.context();
    let parent = server.parent();
    assert_eq!(parent.context(), server_ctx);
    server.end();
    let client = std::thread::spawn(move || {
        let client = ClientSpans::client_span(&parent, &http::Method::HEAD);
        let ctx = client.context();
        client.end();
        ctx
    })
    .join()
    .unwrap();
    assert_eq!(client.trace_id, server_ctx.trace_id);
    tracer.force_flush().unwrap();
    let spans = collect.spans.lock().clone();
    let c = spans
        .iter()
        .find(|s| s.span_kind == SpanKind::Client)
        .expect("client span exported");
    assert_eq!(c.name, "HEAD");
    assert_eq!(c.span_context.span_id().to_bytes(), client.span_id);
    assert_eq!(c.parent_span_id.to_bytes(), server_ctx.span_id);

    // Unsampled: ids still propagate, nothing is recorded.
    let off = Tracer::with_exporter(options(Sampler::always_off()), Collect::default());
    let parent = off.server_span(None, &http::Method::GET, "/x").parent();
    let client = ClientSpans::client_span(&parent, &http::Method::GET);
    assert!(!client.is_recording());
    assert_eq!(client.context().trace_id, parent.context().trace_id);
}

#[test]
fn http_helpers_continue_the_trace_and_set_traceresponse() {
    let collect = Collect::default();
    let tracer = Tracer::with_exporter(options(Sampler::always_on()), collect.clone());
    let mut headers = http::HeaderMap::new();
    headers.insert("traceparent", http::HeaderValue::from_static(PARENT));
    let mut span = tracer.http_server_span(&headers, &http::Method::GET, "/users/1");
    let parent: TraceContext = PARENT.parse().unwrap();
    assert_eq!(span.context().trace_id, parent.trace_id);
    let mut response = http::HeaderMap::new();
    span.record_response(200, &mut response);
    assert_eq!(
        response["traceresponse"],
        span.context().to_string().as_str()
    );
    span.end();
    tracer.force_flush().unwrap();
    let spans = collect.spans.lock();
    assert_eq!(
        attr_of(&spans[0], attr::HTTP_RESPONSE_STATUS_CODE),
        Some(&Value::I64(200))
    );
    assert_eq!(spans[0].parent_span_id.to_bytes(), parent.span_id);
}

#[tokio::test]
async fn a_bad_endpoint_is_a_clear_error_even_inside_async_code() {
    let err = Tracer::new(TracerOptions {
        endpoint: Some("not a url".into()),
        ..TracerOptions::new("data-plane")
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("OTLP exporter for not a url"),
        "{err}"
    );
}

#[tokio::test]
async fn a_tracer_may_be_dropped_inside_async_code() {
    let tracer = Tracer::new(TracerOptions {
        endpoint: Some("http://127.0.0.1:9".into()),
        ..TracerOptions::new("data-plane")
    })
    .unwrap();
    assert!(tracer.is_exporting());
    drop(tracer);
}
