//! Command line and environment settings (`clap` with `env`; every flag has a
//! `DP_*` variable). Defaults are written down here and nowhere else.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::pipeline::Limits;
use crate::pool::PoolSettings;
use crate::sanitize::Cidr;
use crate::server::HttpSettings;

/// Default proxy listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default ops listen address.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9901";
/// Default control plane URL.
pub const DEFAULT_CONTROL_PLANE: &str = "http://127.0.0.1:50051";

/// The gateway data plane: a reverse proxy configured by the control plane.
#[derive(Debug, Clone, Parser)]
#[command(name = "data-plane", version, about)]
pub struct Args {
    /// Proxy listener (HTTP/1.1 and h2c).
    #[arg(long, env = "DP_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// Ops listener: /healthz, /readyz, /metrics, /health/*, /config.
    #[arg(long, env = "DP_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,

    /// Control plane gRPC URL.
    #[arg(long, env = "DP_CONTROL_PLANE", default_value = DEFAULT_CONTROL_PLANE)]
    pub control_plane: String,

    /// Node id announced to the control plane (default: hostname-pid).
    #[arg(long, env = "DP_NODE_ID")]
    pub node_id: Option<String>,

    /// Directory for the cached last accepted configuration. Without it the data
    /// plane cannot start while the control plane is down.
    #[arg(long, env = "DP_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// JWKS URL of the auth service, for AUTH_JWT routes.
    #[arg(long, env = "DP_JWKS_URL")]
    pub jwks_url: Option<String>,

    /// Required `iss` of access tokens.
    #[arg(long, env = "DP_JWT_ISSUER", default_value = "gateway-auth")]
    pub jwt_issuer: String,

    /// Required `aud` of access tokens.
    #[arg(long, env = "DP_JWT_AUDIENCE", default_value = "gateway")]
    pub jwt_audience: String,

    /// Redis holding the shared rate-limit budgets.
    #[arg(long, env = "DP_REDIS_URL")]
    pub redis_url: Option<String>,

    /// Longest a rate-limit decision waits for Redis before the replica-local
    /// limiter decides, in milliseconds.
    #[arg(long, env = "DP_RATELIMIT_TIMEOUT_MS", default_value_t = 5)]
    pub ratelimit_timeout_ms: u64,

    /// Proxies (CIDRs, comma-separated) whose X-Forwarded-For is believed when
    /// finding the client address.
    #[arg(long, env = "DP_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<Cidr>,

    /// Largest request head (request line + headers) in bytes; larger gets 431.
    #[arg(long, env = "DP_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,

    /// Largest request body in bytes; larger gets 413.
    #[arg(long, env = "DP_MAX_BODY_BYTES", default_value_t = 10 * 1024 * 1024)]
    pub max_body_bytes: u64,

    /// Time a client gets to send a complete request head, in milliseconds.
    #[arg(long, env = "DP_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,

    /// Time in-flight requests get to finish on SIGTERM/SIGINT, in milliseconds.
    #[arg(long, env = "DP_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// Idle keep-alive connections kept per upstream instance.
    #[arg(long, env = "DP_UPSTREAM_MAX_IDLE", default_value_t = 128)]
    pub upstream_max_idle: usize,

    /// Log line format on stderr.
    #[arg(long, env = "DP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A setting that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A value outside its range.
    #[error("--{flag}: {reason}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// Why.
        reason: &'static str,
    },
}

impl Args {
    /// Checks values clap cannot check.
    pub fn validate(&self) -> Result<(), ArgsError> {
        let invalid = |flag, reason| Err(ArgsError::Invalid { flag, reason });
        if self.max_header_bytes < 1024 {
            return invalid("max-header-bytes", "must be at least 1024");
        }
        if self.header_read_timeout_ms == 0 {
            return invalid("header-read-timeout-ms", "must be greater than 0");
        }
        if !self.control_plane.starts_with("http://") && !self.control_plane.starts_with("https://")
        {
            return invalid("control-plane", "must be an http:// or https:// URL");
        }
        if self.ratelimit_timeout_ms == 0 {
            return invalid("ratelimit-timeout-ms", "must be greater than 0");
        }
        if self.node_id.as_deref().is_some_and(str::is_empty) {
            return invalid("node-id", "must not be empty");
        }
        Ok(())
    }

    /// The node id: `--node-id`, or `hostname-pid`.
    pub fn node_id(&self) -> String {
        self.node_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()))
    }

    /// Request size limits.
    pub fn limits(&self) -> Limits {
        Limits {
            max_header_bytes: self.max_header_bytes,
            max_body_bytes: self.max_body_bytes,
        }
    }

    /// Listener settings.
    pub fn http(&self) -> HttpSettings {
        HttpSettings {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            max_header_bytes: self.max_header_bytes,
            shutdown_grace: Duration::from_millis(self.shutdown_timeout_ms),
        }
    }

    /// Token verifier settings, when `--jwks-url` is set.
    pub fn jwt(&self) -> Option<gateway_jwt::JwtConfig> {
        self.jwks_url.as_ref().map(|url| gateway_jwt::JwtConfig {
            jwks_url: url.clone(),
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
            ..gateway_jwt::JwtConfig::default()
        })
    }

    /// Rate limiter settings.
    pub fn ratelimit(&self) -> gateway_ratelimit::RateLimiterOptions {
        gateway_ratelimit::RateLimiterOptions {
            decision_timeout: Duration::from_millis(self.ratelimit_timeout_ms),
            ..gateway_ratelimit::RateLimiterOptions::default()
        }
    }

    /// Upstream connection pool settings.
    pub fn pool(&self) -> PoolSettings {
        PoolSettings {
            max_idle: self.upstream_max_idle,
            ..PoolSettings::default()
        }
    }
}

/// This machine's host name (`HOSTNAME`, then the kernel's, then `localhost`).
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_lists() {
        let a = Args::try_parse_from([
            "data-plane",
            "--trusted-proxies",
            "10.0.0.0/8,127.0.0.1",
            "--node-id",
            "dp-1",
        ])
        .unwrap();
        assert_eq!(a.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(a.admin_listen.to_string(), DEFAULT_ADMIN_LISTEN);
        assert_eq!(a.max_header_bytes, 16384);
        assert_eq!(a.max_body_bytes, 10_485_760);
        assert_eq!(a.jwt_issuer, "gateway-auth");
        assert_eq!(a.jwt_audience, "gateway");
        assert_eq!(a.trusted_proxies.len(), 2);
        assert_eq!(a.ratelimit().decision_timeout, Duration::from_millis(5));
        assert!(a.jwt().is_none());
        assert_eq!(a.node_id(), "dp-1");
        a.validate().unwrap();
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Args::try_parse_from(["data-plane", "--trusted-proxies", "nope"]).is_err());
        let a = Args::try_parse_from(["data-plane", "--control-plane", "127.0.0.1:1"]).unwrap();
        assert!(
            a.validate()
                .unwrap_err()
                .to_string()
                .contains("--control-plane")
        );
        let node = Args::try_parse_from(["data-plane"]).unwrap().node_id();
        assert!(
            node.ends_with(&format!("-{}", std::process::id())),
            "{node}"
        );
    }
}
