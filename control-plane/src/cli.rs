//! The `control-plane` command: parses flags, sets up logging, runs the
//! server until SIGINT/SIGTERM. The binary's `main.rs` calls it, and so does
//! devstack's own binary (`devstack serve control-plane …`).

use std::ffi::OsString;

use anyhow::Context;
use clap::Parser;

use crate::{Args, ControlPlane, Settings};

/// Runs the control plane with `args` (the program name first), on a runtime of its own.
pub fn main(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<()> {
    let args = Args::parse_from(args);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    crate::logging::init(args.log_format);
    let tracer = gateway_telemetry::Tracer::from_env("control-plane", None)
        .context("OpenTelemetry settings are invalid")?;
    let settings = Settings {
        tracer: tracer.clone(),
        ..Settings::from(&args)
    };
    let cp = ControlPlane::start(settings)
        .await
        .context("control plane failed to start")?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let signal = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down");
    };
    cp.run_until(signal)
        .await
        .context("control plane stopped with an error")?;
    // Flush the spans still queued; a dead collector only costs the timeout.
    if let Err(e) = tracer.shutdown(std::time::Duration::from_secs(2)) {
        tracing::warn!(error = %e, "spans not flushed");
    }
    tracing::info!("stopped");
    Ok(())
}
