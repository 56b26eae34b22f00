//! `devstack` binary: builds the workspace when run through `cargo run`,
//! makes sure Redis is installed, starts the stack, prints how to use it,
//! and stops everything on SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::Parser;
use devstack::{Stack, StackError, prereq};
use tokio::signal::unix::{SignalKind, signal};

/// Runs the whole gateway system locally: Redis, control plane, auth
/// service, mock backends and N data planes, with the demo configuration.
#[derive(Debug, Parser)]
#[command(name = "devstack", version, about)]
struct Cli {
    /// Number of data-plane replicas.
    #[arg(long, env = "DEVSTACK_DATA_PLANES", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    data_planes: u16,

    /// Use free ports and print one line of JSON describing the stack when it
    /// is ready (for scripts). Without it: fixed ports (gateway 8080…,
    /// control plane 50051, auth 4000, redis 6390, mocks 7001–7003) and
    /// paste-ready examples.
    #[arg(long, env = "DEVSTACK_JSON")]
    json: bool,

    /// OTLP endpoint passed to every process as OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long, env = "DEVSTACK_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,

    /// Persistent control-plane database (default: a temporary one). A
    /// database that already holds a configuration keeps it; its instance
    /// URLs name the fixed ports, so use it without --json.
    #[arg(long, env = "DEVSTACK_DATABASE")]
    database: Option<PathBuf>,

    /// Directory holding the gateway binaries (default: next to devstack).
    #[arg(long, env = "GATEWAY_BIN_DIR")]
    bin_dir: Option<PathBuf>,

    /// Do not run `cargo build` first, even under `cargo run`.
    #[arg(long, env = "DEVSTACK_NO_BUILD")]
    no_build: bool,

    /// Keep the temporary directory (logs, databases, caches) on exit.
    #[arg(long, env = "DEVSTACK_KEEP_TEMP")]
    keep_temp: bool,

    /// Serve the control plane over TLS with a throwaway CA; data planes
    /// authenticate with a client certificate (mTLS). Adds "ca" to the JSON line.
    #[arg(long, env = "DEVSTACK_TLS")]
    tls: bool,

    /// Protect Redis with a random password (redis-server reads it from
    /// <stack dir>/redis/redis.conf; the services get it through the environment).
    /// The JSON line's "redis" shows the URL redacted.
    #[arg(long, env = "DEVSTACK_REDIS_PASSWORD")]
    redis_password: bool,

    /// Serve Redis over TLS only, with a throwaway CA (rediss:// and --redis-ca).
    #[arg(long, env = "DEVSTACK_REDIS_TLS")]
    redis_tls: bool,

    /// Seconds to wait for every process to become ready.
    #[arg(long, env = "DEVSTACK_STARTUP_TIMEOUT_SECS", default_value_t = 60)]
    startup_timeout_secs: u64,
}

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
    let Some(cargo) = std::env::var_os("CARGO") else {
        return Ok(());
    };
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let mut command = Command::new(cargo);
    command
        .args(["build", "--bins", "--workspace", "--manifest-path"])
        .arg(manifest_dir.join("Cargo.toml"));
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    command.stdout(std::io::stderr());
    eprintln!("devstack: building every binary of the workspace ({command:?})");
    let status = command.status()?;
    if !status.success() {
        anyhow::bail!("`cargo build --bins --workspace` failed ({status})");
    }
    Ok(())
}
