//! `data-plane`: parses the command line, sets up logging and tracing, and hands over to the library.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use data_plane::DataPlane;
use data_plane::args::{Args, LogFormat};

// jemalloc instead of glibc's malloc (BENCHMARKS.md, eighth session): every request makes
// a few allocations of 1 KiB or more (its future's box, the response's header map), and
// glibc sweeps all its fastbins (`malloc_consolidate`) before each of those; its allocator
// was 12 % of the workers' user time. jemalloc: 1.1-1.4 µs less user time per request on a
// slow host (0.3-0.5 µs on a fast one), idle RSS +1.3 MB. (mimalloc saved about as much but
// doubled idle RSS, over the 15 MB target.)
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// The main runtime runs only the background work (config stream, health checks, ops listener,
// Redis connection); requests are served by the proxy workers, one thread per core.
#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let format = match args.log_format {
        LogFormat::Text => gateway_telemetry::LogFormat::Text,
        LogFormat::Json => gateway_telemetry::LogFormat::Json,
    };
    let _logs = gateway_telemetry::init_logging(format, "info").context("logging")?;
    let tracer = gateway_telemetry::Tracer::from_env("data-plane", Some(&args.node_id()))
        .context("tracing")?;
    let result = data_plane::run(
        DataPlane::new(args).tracer(tracer.clone()),
        shutdown_signal(),
    )
    .await
    .context("data-plane failed");
    // Flushes queued spans; blocks for at most 2 s, so off the async workers.
    let flushed =
        tokio::task::spawn_blocking(move || tracer.shutdown(Duration::from_secs(2))).await;
    if let Ok(Err(e)) = flushed {
        tracing::warn!(error = %e, "could not flush the last spans");
    }
    result
}

/// Resolves on SIGINT or SIGTERM so the listeners can drain and the process exit 0.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
