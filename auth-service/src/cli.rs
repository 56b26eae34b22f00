//! The `auth-service` command: parses the command line, sets up logging, and
//! runs the server or a `users` subcommand. The binary's `main.rs` calls it,
//! and so does devstack's own binary (`devstack serve auth-service …`).

use std::ffi::OsString;
use std::io::IsTerminal as _;

use anyhow::Context as _;
use clap::Parser as _;
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, Command, LogFormat, UsersCommand};
use crate::users_cli::{self, PasswordInput};

/// Runs the auth service with `args` (the program name first), on a runtime of its own.
pub fn main(args: impl IntoIterator<Item = OsString>) -> anyhow::Result<()> {
    let cli = Cli::parse_from(args);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    init_logging(cli.log_format);
    match &cli.command {
        None => {
            let tracer = gateway_telemetry::Tracer::from_env("auth-service", None)
                .context("OpenTelemetry settings are invalid")?;
            let config = crate::args::ServerConfig {
                tracer: tracer.clone(),
                ..cli.server_config()?
            };
            let result = crate::run(config, shutdown_signal())
                .await
                .context("auth-service failed");
            // Flush queued spans; a dead collector only costs the timeout.
            if let Err(e) = tracer.shutdown(std::time::Duration::from_secs(2)) {
                tracing::warn!(error = %e, "spans not flushed");
            }
            result
        }
        Some(Command::Users { command }) => {
            let input = match command {
                UsersCommand::Add {
                    password_env: Some(var),
                    ..
                } => PasswordInput::Env(var.clone()),
                _ if std::io::stdin().is_terminal() => PasswordInput::Terminal,
                _ => PasswordInput::Stdin,
            };
            let report = users_cli::run(&cli.database, command, |name| {
                users_cli::read_password_from(&input, name)
            })
            .await
            .with_context(|| format!("user database {}", users_cli::shown(&cli.database)))?;
            print!("{}", report.stdout);
            eprint!("{}", report.stderr);
            Ok(())
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on SIGINT or SIGTERM so the server can drain and exit cleanly.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
