//! The OTLP exporter of `otel.rs` against the in-test receiver, over real gRPC.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::{Duration, Instant};

use gateway_telemetry::receiver::{Kind, Receiver, StatusCode};
use gateway_telemetry::{Sampler, TraceContext, Tracer, TracerOptions, attr};

const WAIT: Duration = Duration::from_secs(20);

fn options(endpoint: String, service: &str) -> TracerOptions {
    TracerOptions {
        endpoint: Some(endpoint),
        instance_id: Some(format!("{service}-1")),
        sampler: Sampler::always_on(),
        scheduled_delay: Duration::from_millis(100),
        ..TracerOptions::new(service)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_arrive_with_ids_parents_resource_and_status() {
    let receiver = Receiver::start().await.unwrap();
    let gateway = Tracer::new(options(receiver.endpoint(), "data-plane")).unwrap();
    let backend = Tracer::new(options(receiver.endpoint(), "users")).unwrap();
    assert!(gateway.is_exporting());

    let caller: TraceContext = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        .parse()
        .unwrap();
    let mut server = gateway.server_span(Some(&caller), &http::Method::GET, "/api/users/1");
    server.set_route("users");
    let mut client = server.client_span(&http::Method::GET);
    client.set_upstream_instance("users-1");
    // What the backend sees in its traceparent is the CLIENT span's context.
    let outgoing = client.context().to_string();
    let mut backend_span = backend.server_span(
        Some(&outgoing.parse().unwrap()),
        &http::Method::GET,
        "/users/1",
    );
    backend_span.set_status_code(200);
    backend_span.end();
    client.set_status_code(200);
    client.end();
    server.set_status_code(200);
    server.end();

    let mut limited = gateway.server_span(None, &http::Method::POST, "/auth/login");
    limited.set_route("login");
    limited.set_status_code(429);
    limited.set_status_error("rate_limited");
    let limited_trace = limited.context().trace_id_hex().to_string();
    drop(limited);

    let trace = caller.trace_id_hex().to_string();
    let spans = receiver
        .wait_for(
            |spans| spans.iter().filter(|s| s.trace_id == trace).count() == 3 && spans.len() == 4,
            WAIT,
        )
        .await
        .unwrap();
    let find = |service: &str, kind: Kind| {
        spans
            .iter()
            .find(|s| s.trace_id == trace && s.service_name == service && s.kind == kind)
            .unwrap_or_else(|| panic!("no {kind:?} span from {service} in {spans:#?}"))
    };
    let server = find("data-plane", Kind::Server);
    let client = find("data-plane", Kind::Client);
    let backend_span = find("users", Kind::Server);
    assert_eq!(server.parent_span_id, caller.span_id_hex().to_string());
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(backend_span.parent_span_id, client.span_id);
    assert_eq!(server.name, "GET users");
    assert_eq!(server.service_instance_id.as_deref(), Some("data-plane-1"));
    assert_eq!(backend_span.service_instance_id.as_deref(), Some("users-1"));
    assert_eq!(server.attr(attr::HTTP_ROUTE), Some("users"));
    assert_eq!(server.attr(attr::URL_PATH), Some("/api/users/1"));
    assert_eq!(server.attr(attr::HTTP_RESPONSE_STATUS_CODE), Some("200"));
    assert_eq!(client.attr(attr::UPSTREAM_INSTANCE), Some("users-1"));
    assert_eq!(server.status, StatusCode::Unset);
    assert!(spans.iter().all(|s| s.is_closed()));

    let limited = spans.iter().find(|s| s.trace_id == limited_trace).unwrap();
    assert_eq!(limited.parent_span_id, "");
    assert_eq!(limited.status, StatusCode::Error);
    assert_eq!(limited.status_message, "rate_limited");
    assert_eq!(limited.attr(attr::HTTP_RESPONSE_STATUS_CODE), Some("429"));
    assert_eq!(limited.attr(attr::ERROR_TYPE), Some("rate_limited"));

    // The counter moves when the export call returns, just after the receiver stored the spans.
    let deadline = Instant::now() + WAIT;
    while gateway.stats().exported != 3 {
        assert!(Instant::now() < deadline, "{:?}", gateway.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gateway.stats().dropped_export_failed, 0);
    receiver.shutdown().await;
}

/// The export runtime is the tracer's own, so a caller on a current-thread
/// runtime (where tonic's exporter would otherwise hang) still exports.
#[tokio::test(flavor = "current_thread")]
async fn works_from_a_current_thread_runtime() {
    let receiver = Receiver::start().await.unwrap();
    let tracer = Tracer::new(options(receiver.endpoint(), "auth-service")).unwrap();
    let span = tracer.server_span_named(None, "gateway.v1.AdminService/ListRoutes");
    let trace = span.context().trace_id_hex().to_string();
    span.end();
    let spans = receiver
        .wait_for(|spans| spans.iter().any(|s| s.trace_id == trace), WAIT)
        .await
        .unwrap();
    assert_eq!(spans[0].name, "gateway.v1.AdminService/ListRoutes");
    assert_eq!(spans[0].service_name, "auth-service");
    receiver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_collector_costs_nothing_and_is_counted() {
    let receiver = Receiver::start().await.unwrap();
    let endpoint = receiver.endpoint();
    let tracer = Tracer::new(TracerOptions {
        max_queue_size: 64,
        ..options(endpoint, "data-plane")
    })
    .unwrap();
    // Prove the pipeline works, then kill the collector.
    tracer.server_span(None, &http::Method::GET, "/").end();
    receiver
        .wait_for(|spans| spans.len() == 1, WAIT)
        .await
        .unwrap();
    receiver.shutdown().await;

    let started = Instant::now();
    for _ in 0..10_000 {
        let span = tracer.server_span(None, &http::Method::GET, "/");
        span.client_span(&http::Method::GET).end();
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "20000 spans took {elapsed:?}"
    );

    // Every span is either dropped because the queue was full or lost in a failed export.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = tracer.stats();
        if stats.dropped_queue_full + stats.dropped_export_failed == 20_000 && stats.queued == 0 {
            assert!(stats.dropped_queue_full >= 20_000 - 64, "{stats:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "spans unaccounted for: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(tracer.stats().exported, 1);
}

mod grpc_layer {
    use super::*;
    use gateway_telemetry::grpc::GrpcTraceLayer;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::trace::v1::ResourceSpans;

    /// Any gRPC service will do; this one fails with INTERNAL on an empty request.
    struct Service;

    #[tonic::async_trait]
    impl TraceService for Service {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            if request.get_ref().resource_spans.is_empty() {
                return Err(tonic::Status::internal("boom"));
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn grpc_calls_continue_the_trace_in_metadata() {
        let collector = Receiver::start().await.unwrap();
        let tracer = Tracer::new(options(collector.endpoint(), "control-plane")).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .layer(GrpcTraceLayer::new(tracer))
                .add_service(TraceServiceServer::new(Service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut client = TraceServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();

        let caller = TraceContext::new_root(true);
        let mut ok = tonic::Request::new(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans::default()],
        });
        ok.metadata_mut()
            .insert("traceparent", caller.to_string().parse().unwrap());
        let response = client.export(ok).await.unwrap();
        let back: TraceContext = response
            .metadata()
            .get("traceresponse")
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(back.trace_id, caller.trace_id);

        let failing_caller = TraceContext::new_root(true);
        let mut failing = tonic::Request::new(ExportTraceServiceRequest::default());
        failing
            .metadata_mut()
            .insert("traceparent", failing_caller.to_string().parse().unwrap());
        let status = client.export(failing).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);

        let (ok_trace, failing_trace) = (
            caller.trace_id_hex().to_string(),
            failing_caller.trace_id_hex().to_string(),
        );
        let spans = collector
            .wait_for(
                |spans| {
                    [&ok_trace, &failing_trace]
                        .iter()
                        .all(|t| spans.iter().any(|s| &&s.trace_id == t))
                },
                WAIT,
            )
            .await
            .unwrap();
        let ok_span = spans.iter().find(|s| s.trace_id == ok_trace).unwrap();
        assert_eq!(
            ok_span.name,
            "opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        assert_eq!(ok_span.kind, Kind::Server);
        assert_eq!(ok_span.service_name, "control-plane");
        assert_eq!(ok_span.parent_span_id, caller.span_id_hex().to_string());
        assert_eq!(ok_span.span_id, back.span_id_hex().to_string());
        assert_eq!(ok_span.attr("rpc.system"), Some("grpc"));
        assert_eq!(ok_span.attr("rpc.method"), Some("Export"));
        assert_eq!(ok_span.attr("rpc.grpc.status_code"), Some("0"));
        assert_eq!(ok_span.status, StatusCode::Unset);
        let failed = spans.iter().find(|s| s.trace_id == failing_trace).unwrap();
        assert_eq!(failed.attr("rpc.grpc.status_code"), Some("13"));
        assert_eq!(failed.status, StatusCode::Error);
        assert_eq!(failed.status_message, "INTERNAL");
        server.abort();
        collector.shutdown().await;
    }
}
