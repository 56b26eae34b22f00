//! Command-line flags of the `mock-service` binary (clap with `env`). The
//! fault hooks read from the environment outside clap (`FAIL_RATE`,
//! `FAIL_STATUS`, `DELAY_MS`, `DRAIN_DELAY_MS`) are parsed by [`crate::config`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use clap::builder::BoolishValueParser;
use gateway_telemetry::LogFormat;

use crate::config::Service;

/// A demo backend (users or orders) with fault hooks.
#[derive(Debug, Parser)]
#[command(name = "mock-service", version)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "MOCK_LISTEN", default_value = "127.0.0.1:7001")]
    pub listen: SocketAddr,
    /// Which service to play: users or orders.
    #[arg(long, env = "MOCK_SERVICE", default_value = "users")]
    pub service: Service,
    /// Instance id, returned in X-Instance-Id and "instance" (default: SERVICE-PID).
    #[arg(long, env = "MOCK_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "MOCK_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// Require every request (but /health and /stats) to carry a valid
    /// X-Gateway-Signature made with this secret (the upstream's
    /// identity_signing_secret). Prefer the environment variable: a flag is
    /// visible in `ps`.
    #[arg(long, env = "MOCK_IDENTITY_SECRET", hide_env_values = true)]
    pub identity_secret: Option<String>,
    /// With --identity-secret: the name of the upstream this mock is behind, which a v3
    /// signature binds (default: the service, users or orders). A request signed for
    /// another upstream is refused.
    #[arg(long, env = "MOCK_IDENTITY_AUDIENCE")]
    pub identity_audience: Option<String>,
    /// With --identity-secret: accept mirror copies (X-Gateway-Mirror: 1), as a route's
    /// shadow upstream does. Without it a mirror copy is refused.
    #[arg(long, env = "MOCK_IDENTITY_SHADOW", value_parser = BoolishValueParser::new())]
    pub identity_shadow: bool,
    /// With --identity-secret: also accept v2 signatures (the previous release's, which
    /// bind no upstream), only while gateways are being upgraded.
    #[arg(long, env = "MOCK_IDENTITY_ACCEPT_V2", value_parser = BoolishValueParser::new())]
    pub identity_accept_v2: bool,
    /// PEM certificate chain: serve HTTPS (TLS 1.2 and 1.3, ALPN h2 and http/1.1) instead of
    /// cleartext HTTP/1.1 and h2c (needs --tls-key).
    #[arg(long, env = "MOCK_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "MOCK_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: with --tls-cert, require a client certificate signed by it (an upstream
    /// that wants mTLS).
    #[arg(long, env = "MOCK_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
}
