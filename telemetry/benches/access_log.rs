//! Cost of the one access-log line per request, as a request thread pays it.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    reason = "benchmark code: unwrap stops the run where it failed; criterion_group! makes undocumented functions"
)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gateway_telemetry::log_writer::NonBlocking;
use gateway_telemetry::logging::subscriber;
use gateway_telemetry::{AccessLog, LogFormat, TraceContext, access_log};
use tracing_subscriber::EnvFilter;

fn entry(trace: TraceContext) -> AccessLog<'static> {
    AccessLog {
        method: "GET",
        route: Some("users"),
        status: 200,
        upstream: Some("users-1"),
        latency: Duration::from_micros(812),
        bytes: 1234,
        trace,
    }
}

fn bench(c: &mut Criterion) {
    let trace: TraceContext = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .unwrap();
    let mut g = c.benchmark_group("access_log");
    let sink = || std::io::sink;

    let cases: [(&str, LogFormat, &str); 3] = [
        ("json_format_only", LogFormat::Json, "info"),
        ("text_format_only", LogFormat::Text, "info"),
        ("filtered_out", LogFormat::Json, "info,access=off"),
    ];
    for (name, format, filter) in cases {
        let sub = subscriber(format, EnvFilter::new(filter), sink(), false);
        tracing::subscriber::with_default(sub, || {
            g.bench_function(name, |b| b.iter(|| access_log(black_box(&entry(trace)))));
        });
    }

    // What init_logging installs: the non-blocking batching writer, here onto /dev/null.
    let devnull = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let (writer, guard) = NonBlocking::new(devnull, 4 << 20).unwrap();
    let sub = subscriber(
        LogFormat::Json,
        EnvFilter::new("info"),
        writer.clone(),
        false,
    );
    tracing::subscriber::with_default(sub, || {
        g.bench_function("json_nonblocking_devnull", |b| {
            b.iter(|| access_log(black_box(&entry(trace))))
        });
    });
    eprintln!(
        "non-blocking writer dropped {} lines",
        writer.dropped_lines()
    );
    drop(guard);

    // For comparison: one write(2) per line, as a plain stderr writer does.
    let file = std::sync::Arc::new(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap(),
    );
    let sub = subscriber(
        LogFormat::Json,
        EnvFilter::new("info"),
        move || Shared(file.clone()),
        false,
    );
    tracing::subscriber::with_default(sub, || {
        g.bench_function("json_syscall_per_line_devnull", |b| {
            b.iter(|| access_log(black_box(&entry(trace))))
        });
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);

/// A shared file handle: every line is one `write(2)`.
struct Shared(std::sync::Arc<std::fs::File>);
impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (&*self.0).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
