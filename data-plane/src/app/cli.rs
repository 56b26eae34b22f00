//! The `data-plane` command: parses the command line, sets up logging and
//! tracing, and runs [`crate::app::DataPlane`] until SIGINT/SIGTERM. The binary's
//! `main.rs` calls it (with jemalloc as its allocator), and so does devstack's
//! own binary (`devstack serve data-plane …`).

use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;

use crate::app::DataPlane;
use crate::app::args::{Args, LogFormat};

/// Runs the data plane with `args` (the program name first). The main runtime
/// runs only the background work (config stream, health checks, ops listener,
/// Redis connection); requests are served by the proxy workers, one thread per core.
pub fn main(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<()> {
    let args = Args::parse_from(args);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let format = match args.log_format {
        LogFormat::Text => gateway_telemetry::LogFormat::Text,
        LogFormat::Json => gateway_telemetry::LogFormat::Json,
    };
    let _logs = gateway_telemetry::init_logging(format, "info").context("logging")?;
    let tracer = gateway_telemetry::Tracer::from_env("data-plane", Some(&args.node_id()))
        .context("tracing")?;
    let result = crate::app::run(
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
