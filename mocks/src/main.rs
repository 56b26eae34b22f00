//! `mock-service` binary: parses flags and runs the library's server.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use mock_service::config::parse_fail_rate;
use mock_service::{MockConfig, Service};

/// A demo backend (users or orders) with fault hooks.
#[derive(Debug, Parser)]
#[command(name = "mock-service", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "MOCK_LISTEN", default_value = "127.0.0.1:7001")]
    listen: SocketAddr,
    /// Which service to play: users or orders.
    #[arg(long, env = "MOCK_SERVICE", default_value = "users")]
    service: Service,
    /// Instance id, returned in X-Instance-Id and "instance".
    #[arg(long, env = "MOCK_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(&args.log_format);

    let fail_rate = parse_fail_rate(std::env::var("FAIL_RATE").ok().as_deref())?;
    let instance_id = args
        .instance_id
        .unwrap_or_else(|| format!("{}-{}", args.service, std::process::id()));
    let config = MockConfig::new(args.service, instance_id, fail_rate)?;

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        service = %config.service,
        instance = %config.instance_id,
        fail_rate,
        "mock-service listening"
    );
    mock_service::serve(listener, config, shutdown_signal()).await?;
    tracing::info!("mock-service stopped");
    Ok(())
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
