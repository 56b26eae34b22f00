//! The `gatewayctl` command: parses flags, runs one subcommand, and turns its
//! outcome into the exit status (0 done, 1 an error or `diff --exit-code`
//! changes, 2 a usage error).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use crate::args::{Args, Command};
use crate::commands::{self, Outcome};
use crate::connect;
use crate::error::CtlError;
use crate::file;

/// Runs `gatewayctl` with `args` (the program name first), printing to stdout
/// and errors to stderr.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = Args::parse_from(args);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    match runtime.block_on(run(args, &mut stdout)) {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Changes) => ExitCode::from(1),
        Err(e @ CtlError::Usage(_)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a command on `file` wrote to `buffer`, and its error, with every value
/// substituted into the file (`${GATEWAY_VAR_...}`) replaced by `<secret>`: no
/// output shows a secret, whatever a command prints.
fn shown(
    file: &file::ConfigFile,
    buffer: &[u8],
    result: Result<Outcome, CtlError>,
    out: &mut dyn std::io::Write,
) -> Result<Outcome, CtlError> {
    let doc = &file.document;
    let text = String::from_utf8_lossy(buffer);
    out.write_all(doc.redact(&text).as_bytes())
        .map_err(|e| CtlError::Read("standard output".into(), e))?;
    if doc.substituted.is_empty() {
        return result;
    }
    result.map_err(|e| match e {
        CtlError::Usage(m) => CtlError::Usage(doc.redact(&m)),
        other => CtlError::Invalid(vec![doc.redact(&other.to_string())]),
    })
}

/// Runs the subcommand of `args`, writing what it shows to `out`.
pub async fn run(args: Args, out: &mut dyn std::io::Write) -> Result<Outcome, CtlError> {
    // Every command but `validate` talks to the control plane.
    let connection = args.connection;
    let admin = || {
        let token = connect::token(
            std::env::var("GATEWAY_TOKEN").ok(),
            connection.token_file.as_deref(),
        )?;
        connect::admin(&connection, token)
    };
    match args.command {
        Command::Validate { file } => {
            let file = file::load(&file.path)?;
            let mut buffer = Vec::new();
            let result = commands::validate(&file, &mut buffer);
            shown(&file, &buffer, result, out)
        }
        Command::Dump { version, output } => {
            commands::dump(&mut admin()?, version, output, out).await
        }
        Command::Diff { file, exit_code } => {
            let file = file::load(&file.path)?;
            let mut buffer = Vec::new();
            let result = commands::diff(&mut admin()?, &file, exit_code, &mut buffer).await;
            shown(&file, &buffer, result, out)
        }
        Command::Apply {
            file,
            expected_version,
        } => {
            let file = file::load(&file.path)?;
            let mut buffer = Vec::new();
            let result = commands::apply(&mut admin()?, &file, expected_version, &mut buffer).await;
            shown(&file, &buffer, result, out)
        }
        Command::Rollback {
            version,
            expected_version,
        } => commands::rollback(&mut admin()?, version, expected_version, out).await,
        Command::Status => commands::status(&mut admin()?, out).await,
    }
}
