//! `control-plane` binary: parses flags, sets up logging, runs the server until SIGINT/SIGTERM.

use anyhow::Context;
use clap::Parser;
use control_plane::{Args, ControlPlane, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    control_plane::logging::init(args.log_format);
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
