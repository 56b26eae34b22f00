//! The `mock-service` command: parses flags and runs the server. The binary's
//! `main.rs` calls it, and so does devstack's own binary
//! (`devstack serve mock-service …`).

use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gateway_telemetry::{Tracer, init_logging};

use crate::MockConfig;
use crate::args::Args;
use crate::config::{IdentityOptions, parse_delay, parse_fail_rate, parse_fail_status};

/// Runs a mock backend with `args` (the program name first), on a runtime of its own.
pub fn main(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<()> {
    let args = Args::parse_from(args);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let _logs = init_logging(args.log_format, "info")?;

    let fail_rate = parse_fail_rate(std::env::var("FAIL_RATE").ok().as_deref())?;
    let instance_id = args
        .instance_id
        .unwrap_or_else(|| format!("{}-{}", args.service, std::process::id()));
    let delay = parse_delay("DELAY_MS", std::env::var("DELAY_MS").ok().as_deref())?;
    let drain = parse_delay(
        "DRAIN_DELAY_MS",
        std::env::var("DRAIN_DELAY_MS").ok().as_deref(),
    )?;
    let fail_status = parse_fail_status(std::env::var("FAIL_STATUS").ok().as_deref())?;
    let config = MockConfig::new(args.service, instance_id, fail_rate)?
        .with_delay(delay)
        .with_fail_status(fail_status)
        .with_identity_secret(
            args.identity_secret.as_deref().unwrap_or_default(),
            &IdentityOptions {
                audience: args.identity_audience.clone(),
                shadow: args.identity_shadow,
                accept_v2: args.identity_accept_v2,
            },
        )?;
    // Spans are exported only when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    let tracer = Tracer::from_env(config.service.name(), Some(&config.instance_id))?;

    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(crate::tls::acceptor(cert, key, args.client_ca.as_deref())?)
        }
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        service = %config.service,
        instance = %config.instance_id,
        fail_rate,
        delay_ms = delay.as_millis() as u64,
        verifies_identity = config.identity.is_some(),
        identity_audience = config.identity.as_deref().map_or("", |v| v.audience()),
        tls = tls.is_some(),
        client_certificates = args.client_ca.is_some(),
        "mock-service listening"
    );
    let draining = config.clone();
    let shutdown = async move {
        shutdown_signal().await;
        if !drain.is_zero() {
            // Health checks see 503 and stop sending; then in-flight requests finish.
            tracing::info!(
                drain_ms = drain.as_millis() as u64,
                "draining: /health answers 503, requests are still served"
            );
            draining.start_draining();
            tokio::time::sleep(drain).await;
        }
    };
    match tls {
        None => crate::serve(listener, config, tracer.clone(), shutdown).await?,
        Some(tls) => crate::serve_tls(listener, config, tracer.clone(), tls, shutdown).await?,
    }
    // Flushing spans blocks; keep it off the async workers.
    tokio::task::spawn_blocking(move || tracer.shutdown(Duration::from_secs(2))).await??;
    tracing::info!("mock-service stopped");
    Ok(())
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
