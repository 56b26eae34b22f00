//! Costs on the request path: parsing the incoming trace headers, injecting
//! the outgoing ones, and a request's spans (unsampled, and sampled with export on).
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gateway_telemetry::{Sampler, TraceContext, TraceState, Tracer, TracerOptions, propagation};
use http::{HeaderMap, HeaderValue, Method};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.bench_function("traceparent_valid", |b| {
        b.iter(|| TraceContext::parse(black_box(PARENT.as_bytes())))
    });
    g.bench_function("traceparent_invalid_zero_span", |b| {
        let bad = b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        b.iter(|| TraceContext::parse(black_box(bad)))
    });
    g.bench_function("tracestate_2_members", |b| {
        b.iter(|| TraceState::parse(black_box("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")))
    });
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", HeaderValue::from_static(PARENT));
    headers.insert(
        "tracestate",
        HeaderValue::from_static("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
    );
    headers.insert("host", HeaderValue::from_static("example.com"));
    headers.insert("accept", HeaderValue::from_static("*/*"));
    g.bench_function("extract_from_headers", |b| {
        b.iter(|| propagation::extract(black_box(&headers)))
    });
    g.finish();
}

fn inject(c: &mut Criterion) {
    let mut g = c.benchmark_group("inject");
    let ctx: TraceContext = PARENT.parse().unwrap();
    g.bench_function("encode_55_bytes", |b| b.iter(|| black_box(&ctx).encode()));
    g.bench_function("header_value", |b| {
        b.iter(|| black_box(&ctx).to_header_value())
    });
    let state = HeaderValue::from_static("rojo=00f067aa0ba902b7");
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("example.com"));
    headers.insert("traceparent", HeaderValue::from_static(PARENT));
    g.bench_function("inject_traceparent_tracestate", |b| {
        b.iter(|| propagation::inject(&mut headers, black_box(&ctx), Some(&state)))
    });
    g.bench_function("child_context", |b| b.iter(|| black_box(&ctx).child()));
    g.bench_function("new_root_context", |b| {
        b.iter(|| TraceContext::new_root(black_box(true)))
    });
    g.finish();
}

#[derive(Debug)]
struct Discard;
impl SpanExporter for Discard {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        drop(batch);
        Ok(())
    }
}

fn spans(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_spans");
    let parent: TraceContext = PARENT.parse().unwrap();
    let unsampled_parent = parent.with_sampled(false);
    let request = |tracer: &Tracer, parent: &TraceContext| {
        let mut server = tracer.server_span(Some(parent), &Method::GET, "/api/users/1");
        server.set_route("users");
        let mut client = server.client_span(&Method::GET);
        client.set_upstream_instance("users-1");
        client.set_status_code(200);
        let out = client.context().encode();
        client.end();
        server.set_status_code(200);
        server.end();
        out
    };
    let exporting = Tracer::with_exporter(TracerOptions::new("bench"), Discard);
    g.bench_function("unsampled_server_and_client", |b| {
        b.iter(|| request(&exporting, black_box(&unsampled_parent)))
    });
    let disabled = Tracer::disabled();
    g.bench_function("export_off_server_and_client", |b| {
        b.iter(|| request(&disabled, black_box(&parent)))
    });
    let sampled = Tracer::with_exporter(
        TracerOptions {
            sampler: Sampler::always_on(),
            max_queue_size: 1 << 16,
            scheduled_delay: Duration::from_millis(100),
            ..TracerOptions::new("bench")
        },
        Discard,
    );
    g.bench_function("sampled_exported_server_and_client", |b| {
        b.iter(|| request(&sampled, black_box(&parent)))
    });
    g.finish();
    let stats = sampled.stats();
    eprintln!("sampled run: {stats:?}");
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = parse, inject, spans
}
criterion_main!(benches);
