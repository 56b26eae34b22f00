//! Command-line flags; every flag can also be set from an environment variable.

use crate::database::Database;
use clap::builder::BoolishValueParser;
use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `control-plane` flags.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "control-plane",
    version,
    about = "Gateway control plane: stores routes and upstreams in SQLite, serves the admin gRPC API \
             and streams versioned configuration to data planes"
)]
pub struct Args {
    /// gRPC listen address (AdminService, ConfigDiscoveryService, health, reflection). Port 0 picks a free port.
    #[arg(long, env = "CONTROL_PLANE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Where versions are stored: `sqlite://PATH` or a plain file path (one control plane;
    /// created with its schema if missing), or
    /// `postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=verify-full&sslrootcert=CA.pem`, which
    /// several control planes share (each streams every commit to its own data planes; the
    /// data-plane registry lives there too). The schema is created or migrated on start.
    /// verify-full checks the server's certificate against CA.pem and the host name; a host
    /// other than loopback needs an explicit sslmode (weaker modes warn).
    #[arg(
        long,
        env = "CONTROL_PLANE_DATABASE",
        default_value = "control-plane.db"
    )]
    pub database: Database,

    /// JSON file in the ApplyConfigRequest shape, committed only when the database has no version yet.
    /// It is validated on every start: a bad seed file stops the control plane.
    #[arg(long, env = "CONTROL_PLANE_SEED")]
    pub seed: Option<PathBuf>,

    /// Optional address of a Prometheus text endpoint (GET /metrics).
    #[arg(long, env = "CONTROL_PLANE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Optional address of the web console (HTTP; HTTPS with --tls-cert and --tls-key, without
    /// asking browsers for a client certificate). Sign-in takes an admin or viewer token of
    /// --auth-tokens-file, which it requires. Port 0 picks a free port.
    #[arg(long, env = "CONTROL_PLANE_CONSOLE_LISTEN")]
    pub console_listen: Option<SocketAddr>,

    /// Serve the web console over plain HTTP on a non-loopback --console-listen (without
    /// --tls-cert): only behind a proxy that terminates TLS on the same host or pod. Without
    /// it such a console is refused at start, since its sign-in tokens and session cookies
    /// would cross the network in clear.
    #[arg(long, env = "CONTROL_PLANE_CONSOLE_ALLOW_CLEARTEXT", value_parser = BoolishValueParser::new())]
    pub console_allow_cleartext: bool,

    /// Log line format on stderr. The level is set with RUST_LOG (default info).
    #[arg(
        long,
        env = "CONTROL_PLANE_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// File of `NAME ROLE TOKEN` lines (roles admin, viewer, data-plane; TOKEN may be
    /// `sha256:<hex>`). With it every AdminService and ConfigDiscoveryService call needs
    /// `authorization: Bearer TOKEN`; without it only a loopback --listen is accepted.
    #[arg(long, env = "CONTROL_PLANE_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,

    /// Most connections open at once on each listener (gRPC, console, metrics); past it a new
    /// connection is closed at once.
    #[arg(long, env = "CONTROL_PLANE_MAX_CONNECTIONS", default_value_t = gateway_listener::DEFAULT_MAX_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,

    /// Time a new connection on any listener has to send its first 24 bytes (an HTTP/2
    /// preface, a TLS ClientHello, an HTTP/1.1 request line), in milliseconds; then it is closed.
    #[arg(long, env = "CONTROL_PLANE_FIRST_BYTES_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub first_bytes_timeout_ms: u64,

    /// A connection on any listener from which no byte arrives for this long (milliseconds) is
    /// closed. Data planes send a health report every 5 s and answer HTTP/2 keep-alive pings,
    /// so their config streams stay.
    #[arg(long, env = "CONTROL_PLANE_IDLE_TIMEOUT_MS", default_value_t = 300_000,
          value_parser = clap::value_parser!(u64).range(1_000..=86_400_000))]
    pub idle_timeout_ms: u64,

    /// Start without --auth-tokens-file, accepting every call unauthenticated as an admin
    /// (`--insecure` is the old spelling). Without it (and without --client-ca) a control plane
    /// with no tokens refuses to start, on loopback too: any local process could rewrite every
    /// route. Even then an unauthenticated config stream never receives private keys or signing
    /// secrets.
    #[arg(long, alias = "insecure", env = "CONTROL_PLANE_INSECURE_OPEN", value_parser = BoolishValueParser::new())]
    pub insecure_open: bool,

    /// Stream configurations holding private keys or signing secrets over cleartext gRPC to
    /// data planes on non-loopback addresses. Without it such a stream is ended with
    /// FAILED_PRECONDITION: serve gRPC over TLS (--tls-cert, --tls-key) instead.
    #[arg(long, env = "CONTROL_PLANE_ALLOW_CLEARTEXT_SECRETS", value_parser = BoolishValueParser::new())]
    pub allow_cleartext_secrets: bool,

    /// PEM certificate chain: serve gRPC over TLS (needs --tls-key).
    #[arg(
        long,
        env = "CONTROL_PLANE_TLS_CERT",
        requires = "tls_key",
        conflicts_with = "tls_generate_dir"
    )]
    pub tls_cert: Option<PathBuf>,

    /// Serve gRPC over TLS with a certificate made on the first start and kept in this
    /// directory (server.pem, server-key.pem mode 0600): a private CA signs it for
    /// --tls-generate-name and its key is dropped at once. Data planes trust the CA certificate
    /// (--tls-generate-ca) as their --control-plane-ca. For a deployment without a PKI of its own.
    #[arg(long, env = "CONTROL_PLANE_TLS_GENERATE_DIR")]
    pub tls_generate_dir: Option<PathBuf>,

    /// Where --tls-generate-dir writes the CA certificate (default DIR/ca.pem), e.g. a volume the
    /// data planes mount read-only.
    #[arg(
        long,
        env = "CONTROL_PLANE_TLS_GENERATE_CA",
        requires = "tls_generate_dir"
    )]
    pub tls_generate_ca: Option<PathBuf>,

    /// The host names and IP addresses the generated certificate is for (comma-separated or
    /// repeated): the host data planes dial in --control-plane. A kept certificate lacking one
    /// is made again.
    #[arg(
        long = "tls-generate-name",
        env = "CONTROL_PLANE_TLS_GENERATE_NAMES",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1",
        requires = "tls_generate_dir"
    )]
    pub tls_generate_names: Vec<String>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "CONTROL_PLANE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle: require a client certificate signed by it on every connection. A
    /// verified client certificate without a token is authenticated as role data-plane.
    #[arg(long, env = "CONTROL_PLANE_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,

    /// File holding the 32-byte key that encrypts certificates' private keys in the database
    /// (AES-256-GCM): 64 hex digits (`openssl rand -hex 32 > FILE`) or 32 raw bytes; keep it
    /// mode 0600, apart from the database. Without it certificates cannot be stored; once keys
    /// are stored, the control plane starts only with this same key.
    #[arg(long, env = "CONTROL_PLANE_SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<PathBuf>,
}

impl Args {
    /// The defences of every listener, from the flags.
    pub fn listener_limits(&self) -> gateway_listener::Limits {
        gateway_listener::Limits::from_flags(
            self.max_connections,
            self.first_bytes_timeout_ms,
            self.idle_timeout_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let a = Args::try_parse_from(["control-plane"]).unwrap();
        assert_eq!(a.listen, "127.0.0.1:50051".parse().unwrap());
        assert_eq!(a.database, Database::sqlite("control-plane.db"));
        assert_eq!(a.seed, None);
        assert_eq!(a.log_format, LogFormat::Text);
        assert_eq!(a.auth_tokens_file, None);
        assert!(!a.insecure_open);
        assert!(!a.allow_cleartext_secrets);
        assert_eq!(a.secrets_key_file, None);
        assert_eq!(a.console_listen, None);
    }

    #[test]
    fn flags_parse() {
        let a = Args::try_parse_from([
            "control-plane",
            "--listen",
            "127.0.0.1:0",
            "--database",
            "/tmp/x.db",
            "--seed",
            "seed.json",
            "--metrics-listen",
            "127.0.0.1:9100",
            "--log-format",
            "json",
            "--console-listen",
            "127.0.0.1:8800",
        ])
        .unwrap();
        assert_eq!(a.console_listen.unwrap().port(), 8800);
        assert_eq!(a.listen.port(), 0);
        assert_eq!(a.database, Database::sqlite("/tmp/x.db"));
        assert_eq!(a.seed, Some(PathBuf::from("seed.json")));
        assert_eq!(a.metrics_listen.unwrap().port(), 9100);
        assert_eq!(a.log_format, LogFormat::Json);
        assert!(Args::try_parse_from(["control-plane", "--listen", "nope"]).is_err());
        let a = Args::try_parse_from([
            "control-plane",
            "--database",
            "postgres://gw:pw@127.0.0.1:5432/gateway",
        ])
        .unwrap();
        assert!(a.database.is_shared());
        let e = Args::try_parse_from(["control-plane", "--database", "mysql://x@y/z"]).unwrap_err();
        assert!(e.to_string().contains("unsupported scheme"), "{e}");
        assert!(Args::try_parse_from(["control-plane", "--tls-cert", "c.pem"]).is_err());
        assert!(Args::try_parse_from(["control-plane", "--client-ca", "ca.pem"]).is_err());
        let a = Args::try_parse_from([
            "control-plane",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--client-ca",
            "ca.pem",
        ])
        .unwrap();
        assert_eq!(a.client_ca, Some(PathBuf::from("ca.pem")));
        let a =
            Args::try_parse_from(["control-plane", "--secrets-key-file", "/etc/gw/secrets.key"])
                .unwrap();
        assert_eq!(
            a.secrets_key_file,
            Some(PathBuf::from("/etc/gw/secrets.key"))
        );
    }
}
