//! Command-line flags of the `devstack` binary (clap with `env`). The library
//! also reads `DEVSTACK_KEEP_TEMP` and `GATEWAY_BIN_DIR` itself (see
//! [`crate::builder`] and [`crate::binaries`]), so tests honour them too.

use std::path::PathBuf;

use clap::Parser;
use clap::builder::BoolishValueParser;

/// Runs the whole gateway system locally: Redis, control plane, auth
/// service, mock backends and N data planes, with the demo configuration.
#[derive(Debug, Parser)]
#[command(
    name = "devstack",
    version,
    about,
    after_help = "devstack serve <control-plane|data-plane|auth-service|mock-service> [ARGS...] runs one gateway program in this process, as its own binary would (the stack runs its programs that way unless --bin-dir names their binaries)."
)]
pub struct Cli {
    /// Number of data-plane replicas.
    #[arg(long, env = "DEVSTACK_DATA_PLANES", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub data_planes: u16,

    /// Use free ports and print one line of JSON describing the stack when it
    /// is ready (for scripts). Without it: fixed ports (gateway 8080…,
    /// control plane 50051, auth 4000, redis 6390, mocks 7001–7003) and
    /// paste-ready examples.
    #[arg(long, env = "DEVSTACK_JSON", value_parser = BoolishValueParser::new())]
    pub json: bool,

    /// OTLP endpoint passed to every process as OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long, env = "DEVSTACK_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Persistent control-plane database (default: a temporary one). A
    /// database that already holds a configuration keeps it; its instance
    /// URLs name the fixed ports, so use it without --json.
    #[arg(long, env = "DEVSTACK_DATABASE")]
    pub database: Option<PathBuf>,

    /// Directory holding the gateway binaries to run (default: none; devstack
    /// runs every program from its own binary, `devstack serve <program>`).
    #[arg(long, env = "GATEWAY_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,

    /// Keep the temporary directory (logs, databases, caches) on exit.
    #[arg(long, env = "DEVSTACK_KEEP_TEMP", value_parser = BoolishValueParser::new())]
    pub keep_temp: bool,

    /// Serve the control plane over TLS with a throwaway CA; data planes
    /// authenticate with a client certificate (mTLS). Adds "ca" to the JSON line.
    #[arg(long, env = "DEVSTACK_TLS", value_parser = BoolishValueParser::new())]
    pub tls: bool,

    /// Protect Redis with a random password (redis-server reads it from
    /// <stack dir>/redis/redis.conf; the services get it through the environment).
    /// The JSON line's "redis" shows the URL redacted.
    #[arg(long, env = "DEVSTACK_REDIS_PASSWORD", value_parser = BoolishValueParser::new())]
    pub redis_password: bool,

    /// Serve Redis over TLS only, with a throwaway CA (rediss:// and --redis-ca).
    #[arg(long, env = "DEVSTACK_REDIS_TLS", value_parser = BoolishValueParser::new())]
    pub redis_tls: bool,

    /// An extra flag for every data plane (repeatable; with its value:
    /// `--data-plane-arg=--tls-client-ca=/path/ca.pem`), e.g. to try
    /// AUTH_MTLS routes or another pool setting.
    #[arg(
        long = "data-plane-arg",
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    pub data_plane_args: Vec<String>,

    /// Seconds to wait for every process to become ready.
    #[arg(long, env = "DEVSTACK_STARTUP_TIMEOUT_SECS", default_value_t = 60)]
    pub startup_timeout_secs: u64,
}
