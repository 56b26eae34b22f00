//! `devstack` binary: makes sure Redis is installed, starts the stack, prints
//! how to use it, and stops everything on SIGINT/SIGTERM. It holds every
//! gateway program too (`devstack serve <program> …`, [`devstack::serve`]),
//! and runs them from itself unless `--bin-dir` names their own binaries, so
//! `cargo run --release -p devstack` compiles the tree once.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use devstack::args::Cli;
use devstack::{Stack, StackError, prereq, serve};
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let program = args.next();
    let mut rest = args.peekable();
    if rest.peek().is_some_and(|a| a == serve::SUBCOMMAND) {
        rest.next();
        return match serve::main(rest) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::parse_from(program.into_iter().chain(rest));
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(devstack_main(cli)),
        Err(e) => {
            eprintln!("devstack: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn devstack_main(cli: Cli) -> ExitCode {
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
    for arg in &cli.data_plane_args {
        builder = builder.data_plane_arg(arg.clone());
    }
    if let Some(db) = &cli.database {
        builder = builder.database(std::path::absolute(db)?);
    }
    match &cli.bin_dir {
        Some(dir) => builder = builder.bin_dir(dir.clone()),
        None => builder = builder.multi_call(std::env::current_exe()?),
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
            "{e}\nhint: build them (`cargo build --release --bins`) or leave out --bin-dir: devstack runs every program from its own binary"
        ),
        other => other.into(),
    }
}
