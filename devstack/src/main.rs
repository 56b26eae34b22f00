//! `devstack` binary: builds the workspace when run through `cargo run`,
//! makes sure Redis is installed, starts the stack, prints how to use it,
//! and stops everything on SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;
use devstack::args::Cli;
use devstack::{Stack, StackError, prereq};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DEVSTACK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("devstack=info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();

    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devstack: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if !cli.no_build {
        build_workspace_under_cargo_run()?;
    }
    prereq::ensure_redis()?;

    let mut builder = Stack::new()
        .data_planes(usize::from(cli.data_planes))
        .fixed_ports(!cli.json)
        .keep_temp_dir(cli.keep_temp)
        .tls(cli.tls)
        .redis_password(cli.redis_password)
        .redis_tls(cli.redis_tls)
        .startup_timeout(Duration::from_secs(cli.startup_timeout_secs));
    if let Some(url) = &cli.otlp_endpoint {
        builder = builder.otlp_endpoint(url.clone());
    }
    if let Some(db) = &cli.database {
        builder = builder.database(std::path::absolute(db)?);
    }
    if let Some(dir) = &cli.bin_dir {
        builder = builder.bin_dir(dir.clone());
    }

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stack = tokio::select! {
        started = builder.start() => started.map_err(explain)?,
        // Dropping the half-started stack kills what it started.
        _ = term.recv() => return Ok(()),
        _ = int.recv() => return Ok(()),
    };

    let info = stack.info();
    if cli.json {
        println!("{}", info.to_json_line());
    } else {
        println!("{}", info.examples());
    }

    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => {
                for gone in stack.reap_exited() {
                    eprintln!(
                        "devstack: {} exited unexpectedly ({}); last lines of {}:\n{}",
                        gone.name, gone.status, gone.log.display(), gone.tail
                    );
                }
            }
        }
    }
    eprintln!("devstack: stopping every process");
    stack.shutdown().await;
    Ok(())
}

/// Adds the hint a person needs to the errors that have one.
fn explain(e: StackError) -> anyhow::Error {
    match e {
        StackError::BinaryNotFound { .. } => anyhow::anyhow!(
            "{e}\nhint: run it as `cargo run -p devstack` (or `cargo run --release -p devstack`), which builds every binary first"
        ),
        other => other.into(),
    }
}

/// Under `cargo run` (which sets `CARGO`), builds every binary of the
/// workspace with the same profile as this one, so a fresh clone works with
/// one command. Cargo's output goes to stderr: stdout is for `--json`.
fn build_workspace_under_cargo_run() -> anyhow::Result<()> {
    const SERVICES_AND_DEVSTACK: [&str; 5] = [
        "control-plane",
        "data-plane",
        "auth-service",
        "mock-service",
        "devstack",
    ];
    let Some(cargo) = std::env::var_os("CARGO") else {
        return Ok(());
    };
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let mut command = Command::new(cargo);
    // The five packages with binaries: devstack depends on the other four, so
    // this build resolves the features `cargo run -p devstack` resolved and
    // reuses everything it compiled (tests/tests/build_features.rs).
    command
        .args(["build", "--bins", "--manifest-path"])
        .arg(manifest_dir.join("Cargo.toml"));
    for package in SERVICES_AND_DEVSTACK {
        command.args(["-p", package]);
    }
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    command.stdout(std::io::stderr());
    eprintln!("devstack: building every binary of the workspace ({command:?})");
    let status = command.status()?;
    if !status.success() {
        anyhow::bail!("building the binaries failed ({status}): {command:?}");
    }
    Ok(())
}
