//! What can go wrong while starting or driving a stack.

use std::path::PathBuf;
use std::time::Duration;

/// Every devstack failure, with enough context to act on it.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// A gateway binary is not built.
    #[error(
        "binary `{name}` not found (looked in: {searched}); build it with \
         `cargo build --bins --workspace` or point GATEWAY_BIN_DIR at the directory holding it"
    )]
    BinaryNotFound {
        /// The binary's name.
        name: String,
        /// The directories searched, comma-separated.
        searched: String,
    },
    /// A required tool is not on PATH.
    #[error("`{tool}` is not on PATH; install it with: {install}")]
    ToolMissing {
        /// The tool.
        tool: String,
        /// The exact command that installs it.
        install: String,
    },
    /// A process could not be spawned.
    #[error("cannot start {name} ({program}): {source}")]
    Spawn {
        /// Process name.
        name: String,
        /// Program path.
        program: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A process exited while devstack was waiting for it.
    #[error("{name} exited early ({status}); log {log}:\n{tail}")]
    EarlyExit {
        /// Process name.
        name: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// A condition did not hold before the deadline.
    #[error("timed out after {waited:?} waiting for {what}: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long devstack waited.
        waited: Duration,
        /// The last observation (error or state).
        last: String,
    },
    /// An auxiliary command (user seeding, package install) failed.
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status.
        status: String,
        /// What it printed.
        output: String,
    },
    /// A fixed port is taken.
    #[error(
        "port {port} (for {what}) is already in use; stop what uses it or run with --json for free ports"
    )]
    PortInUse {
        /// The port.
        port: u16,
        /// Which listener wanted it.
        what: String,
    },
    /// No process of that name in this stack.
    #[error("no process named {0:?} in this stack")]
    UnknownProcess(String),
    /// `start_process` on a process that runs.
    #[error("{0} is already running")]
    AlreadyRunning(String),
    /// Builder options that cannot work together.
    #[error("invalid stack options: {0}")]
    Options(String),
    /// The demo configuration template is broken.
    #[error("demo configuration: {0}")]
    DemoConfig(String),
    /// A gRPC call to the control plane failed.
    #[error("control plane call {call} failed: {status}")]
    Grpc {
        /// The RPC.
        call: &'static str,
        /// The status it returned.
        status: Box<tonic::Status>,
    },
    /// A file-system or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What devstack was doing.
        context: String,
        /// Cause.
        source: std::io::Error,
    },
}

impl StackError {
    /// Wraps an I/O error with what devstack was doing.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StackError {
        let context = context.into();
        move |source| StackError::Io { context, source }
    }
}
