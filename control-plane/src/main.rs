//! `control-plane` binary: parses flags, sets up logging, runs the server until SIGINT/SIGTERM.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;
use control_plane::{Args, ControlPlane, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    control_plane::logging::init(args.log_format);
    let cp = ControlPlane::start(Settings::from(&args))
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
    tracing::info!("stopped");
    Ok(())
}
