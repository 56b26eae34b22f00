//! Command-line flags and subcommands; every connection flag can also be set
//! from an environment variable.

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// `gatewayctl` flags.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "gatewayctl",
    version,
    about = "Declarative configuration for the gateway: dump it to a file, diff and apply files kept \
             in git, validate them offline, roll back, and see every data plane's version"
)]
pub struct Args {
    /// How to reach the control plane.
    #[command(flatten)]
    pub connection: Connection,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The control plane's address and credentials (unused by `validate`).
#[derive(Clone, Debug, ClapArgs)]
pub struct Connection {
    /// The control plane's gRPC URL: http://HOST:PORT, or https://HOST:PORT with --cacert.
    #[arg(
        long,
        global = true,
        env = "GATEWAY_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,

    /// File holding the bearer token (an admin token for diff, apply and rollback, since diff is
    /// the control plane's ApplyConfig dry run; a viewer token is enough for dump and status).
    /// The GATEWAY_TOKEN variable, when set, is used instead.
    #[arg(long, global = true, env = "GATEWAY_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// PEM CA bundle that signed the control plane's certificate (with an https:// --server).
    #[arg(long, global = true, env = "GATEWAY_CACERT")]
    pub cacert: Option<PathBuf>,

    /// PEM client certificate, for a control plane that requires one (needs --key).
    #[arg(long, global = true, env = "GATEWAY_CERT", requires = "key")]
    pub cert: Option<PathBuf>,

    /// PEM private key of --cert.
    #[arg(long, global = true, env = "GATEWAY_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
}

/// The subcommands.
#[derive(Clone, Debug, Subcommand)]
pub enum Command {
    /// Print the current configuration (or an old version) as a file `apply` takes back.
    Dump {
        /// An old version instead of the current one.
        #[arg(long)]
        version: Option<u64>,
        /// The file format.
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// Show what `apply` would change, resource by resource and field by field (a dry run on
    /// the control plane: it validates the file and commits nothing).
    Diff {
        /// The configuration file.
        #[command(flatten)]
        file: FileArg,
        /// Exit with status 1 when there are changes (0 when none), like `git diff --exit-code`.
        #[arg(long)]
        exit_code: bool,
    },
    /// Make the file the control plane's configuration, as one new version.
    Apply {
        /// The configuration file.
        #[command(flatten)]
        file: FileArg,
        /// Apply only if this is still the current version (compare-and-swap).
        #[arg(long)]
        expected_version: Option<u64>,
    },
    /// Commit a new version whose content is that of an old one.
    Rollback {
        /// The old version.
        version: u64,
        /// Roll back only if this is still the current version (compare-and-swap).
        #[arg(long)]
        expected_version: Option<u64>,
    },
    /// The current version and every data plane's state and version.
    Status,
    /// Check a file offline with the control plane's own validation; errors name their line.
    Validate {
        /// The configuration file.
        #[command(flatten)]
        file: FileArg,
    },
}

/// A configuration file argument.
#[derive(Clone, Debug, ClapArgs)]
pub struct FileArg {
    /// The configuration file, YAML or JSON, with the field names of the proto's JSON mapping;
    /// `${NAME}` in a string is replaced by the environment variable NAME. `-` reads stdin.
    #[arg(long = "file", short = 'f')]
    pub path: PathBuf,
}

/// A file format for `dump`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// YAML (block style).
    Yaml,
    /// JSON (the proto's JSON mapping).
    Json,
}
