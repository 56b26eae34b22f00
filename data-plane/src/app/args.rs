//! Command line and environment settings (`clap` with `env`; every flag has a
//! `DP_*` variable). Defaults are written down here and nowhere else.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use gateway_redis::{RedisTarget, RedisTargetError, RedisUrl, RedisUrlParser};
use gateway_transport::pool::PoolSettings;
use gateway_transport::proxy_protocol::ProxyProtocol;
use gateway_transport::server::HttpSettings;

use crate::app::pipeline::Limits;
use crate::policy::sanitize::Cidr;

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

    /// HTTPS listener (TLS 1.2 and 1.3; HTTP/2 or HTTP/1.1 by ALPN), with the
    /// certificates the control plane pushes, chosen by SNI (the one named
    /// `default` when none matches). Off unless given.
    #[arg(long, env = "DP_TLS_LISTEN")]
    pub tls_listen: Option<SocketAddr>,

    /// The port `https_only` routes redirect cleartext GET and HEAD requests
    /// to (default: the --tls-listen port, else 443; 443 is left out of the
    /// URL). Set it when clients reach the HTTPS listener through another port.
    #[arg(long, env = "DP_HTTPS_REDIRECT_PORT")]
    pub https_redirect_port: Option<u16>,

    /// Time a client gets to complete its TLS handshake on the HTTPS listener,
    /// in milliseconds.
    #[arg(long, env = "DP_TLS_HANDSHAKE_TIMEOUT_MS", default_value_t = 10_000)]
    pub tls_handshake_timeout_ms: u64,

    /// PEM CA certificate(s) for client certificates on the HTTPS listener:
    /// every client is asked for one (optional); one that does not chain to
    /// these fails the handshake, and a verified one authenticates the caller
    /// on AUTH_MTLS routes. Without it, AUTH_MTLS routes refuse every request.
    #[arg(long, env = "DP_TLS_CLIENT_CA", requires = "tls_listen")]
    pub tls_client_ca: Option<PathBuf>,

    /// PEM certificate revocation list(s) (`X509 CRL` blocks) of --tls-client-ca's CAs: a
    /// client certificate they revoke fails the handshake. Read at start; restart to load a
    /// new list. A certificate whose issuer has no list in the file is not checked.
    #[arg(long, env = "DP_TLS_CLIENT_CRL", requires = "tls_client_ca")]
    pub tls_client_crl: Option<PathBuf>,

    /// Ops listener: /healthz, /readyz, /metrics, /health/*, /config.
    #[arg(long, env = "DP_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,

    /// Control plane gRPC URL, or several separated by commas (replicas of one control plane,
    /// all http:// or all https://): the config stream uses one and, when it breaks, reconnects
    /// to the next, with backoff and jitter. A host name with several addresses is tried
    /// address by address.
    #[arg(long, env = "DP_CONTROL_PLANE", default_value = DEFAULT_CONTROL_PLANE)]
    pub control_plane: String,

    /// Token sent as `authorization: Bearer TOKEN` on the config stream (role
    /// `data-plane` in the control plane's tokens file). Never logged.
    #[arg(long, env = "DP_CONTROL_PLANE_TOKEN", hide_env_values = true)]
    pub control_plane_token: Option<Secret>,

    /// PEM CA certificate(s) the control plane's TLS certificate must chain to
    /// (required for an https:// --control-plane).
    #[arg(long, env = "DP_CONTROL_PLANE_CA")]
    pub control_plane_ca: Option<PathBuf>,

    /// PEM client certificate presented to the control plane (mTLS; needs --tls-key).
    #[arg(long, env = "DP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "DP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Node id announced to the control plane (default: hostname-pid).
    #[arg(long, env = "DP_NODE_ID")]
    pub node_id: Option<String>,

    /// Directory for the cached last accepted configuration. Without it the data
    /// plane cannot start while the control plane is down.
    #[arg(long, env = "DP_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// JWKS URL of the auth service, for AUTH_JWT routes: `https://`, or
    /// `http://` on a private network only (the keys that decide who is
    /// authenticated would travel unauthenticated).
    #[arg(long, env = "DP_JWKS_URL")]
    pub jwks_url: Option<String>,

    /// PEM CA certificate(s) an `https://` JWKS server's certificate must
    /// chain to (default: the system's roots).
    #[arg(long, env = "DP_JWKS_CA")]
    pub jwks_ca: Option<PathBuf>,

    /// Required `iss` of access tokens.
    #[arg(long, env = "DP_JWT_ISSUER", default_value = "gateway-auth")]
    pub jwt_issuer: String,

    /// Required `aud` of access tokens.
    #[arg(long, env = "DP_JWT_AUDIENCE", default_value = "gateway")]
    pub jwt_audience: String,

    /// Redis holding the shared rate-limit budgets:
    /// `redis://[[user]:password@]host:port[/db]`, Sentinel
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME`, Cluster
    /// `redis+cluster://[user:password@]host:port[,host:port…]`; `rediss…` of each for TLS.
    /// Printed only redacted (`redis://:***@host:port`); prefer the environment
    /// variable to the flag for a URL with a password (a command line is
    /// visible in `ps`).
    #[arg(long, env = "DP_REDIS_URL", value_parser = RedisUrlParser, hide_env_values = true)]
    pub redis_url: Option<RedisUrl>,

    /// PEM CA certificate(s) a `rediss://` Redis's certificate must chain to
    /// (default: the system's roots).
    #[arg(long, env = "DP_REDIS_CA")]
    pub redis_ca: Option<PathBuf>,

    /// Longest a rate-limit decision waits for Redis before the replica-local
    /// limiter decides, in milliseconds.
    #[arg(long, env = "DP_RATELIMIT_TIMEOUT_MS", default_value_t = 5)]
    pub ratelimit_timeout_ms: u64,

    /// Most tokens the replica leases from a busy key's shared Redis budget
    /// ahead of demand, so that key's next requests are decided without a
    /// round trip (never over-admits; unspent leased tokens are lost to every
    /// replica until the budget refills). 0: every decision asks Redis.
    #[arg(long, env = "DP_RATELIMIT_LEASE_MAX_TOKENS", default_value_t = 1000)]
    pub ratelimit_lease_max_tokens: u32,

    /// Proxies (CIDRs, comma-separated) whose X-Forwarded-For is believed when
    /// finding the client address.
    #[arg(long, env = "DP_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<Cidr>,

    /// Connections from --trusted-proxies peers to the proxy and HTTPS
    /// listeners start with a PROXY protocol v2 header (HAProxy's
    /// `send-proxy-v2`), read within --header-read-timeout-ms: the client it
    /// names is the connection's peer from then on (its own forwarding
    /// headers are not believed), and a trusted peer's connection without one
    /// is closed. Other peers' connections are read as they are (a header
    /// from them is a 400 or a failed handshake). Needs --trusted-proxies.
    #[arg(long, env = "DP_PROXY_PROTOCOL", value_parser = clap::builder::BoolishValueParser::new())]
    pub proxy_protocol: bool,

    /// Largest request head (request line + headers) in bytes; larger gets 431.
    #[arg(long, env = "DP_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,

    /// Largest request body in bytes; larger gets 413.
    #[arg(long, env = "DP_MAX_BODY_BYTES", default_value_t = 10 * 1024 * 1024)]
    pub max_body_bytes: u64,

    /// Time a client gets to send a complete request head, in milliseconds.
    #[arg(long, env = "DP_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,

    /// Time a request body may go without a byte from the client, in
    /// milliseconds; then the request fails with 408 (and a body being
    /// buffered for a retrying route stops waiting).
    #[arg(long, env = "DP_BODY_READ_TIMEOUT_MS", default_value_t = 30_000)]
    pub body_read_timeout_ms: u64,

    /// Time a write to a client may wait for the client to take any byte, in
    /// milliseconds; then its connection is closed, so a client that never
    /// reads cannot hold an upstream connection. On HTTP/2 also the time an
    /// answer may wait for the client to give flow-control window back while
    /// no other answer on the connection moves.
    #[arg(long, env = "DP_WRITE_TIMEOUT_MS", default_value_t = 30_000)]
    pub write_timeout_ms: u64,

    /// An HTTP/2 connection with no request in flight for this long
    /// (milliseconds) is sent GOAWAY and closed.
    #[arg(long, env = "DP_H2_IDLE_TIMEOUT_MS", default_value_t = 60_000)]
    pub h2_idle_timeout_ms: u64,

    /// HTTP/2 keep-alive: a PING after this much silence (milliseconds); a
    /// client that does not answer within the same time is disconnected.
    #[arg(long, env = "DP_H2_KEEP_ALIVE_MS", default_value_t = 20_000)]
    pub h2_keep_alive_ms: u64,

    /// Most open client connections per replica (all workers together); past
    /// it a new connection is closed at once and counted in
    /// `gateway_connections_refused_total`. 0: three quarters of the
    /// process's open-file limit (`ulimit -n`), at most 100,000.
    #[arg(long, env = "DP_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,

    /// Most open WebSocket tunnels per replica; past it an upgrade is refused
    /// with 503. 0: half of --max-connections.
    #[arg(long, env = "DP_MAX_WEBSOCKET_TUNNELS", default_value_t = 0)]
    pub max_websocket_tunnels: usize,

    /// Most mirrored copies (routes with `mirror`) in flight per replica; past
    /// it a copy is dropped and counted as `shed` in
    /// `gateway_mirror_requests_total`, so a slow mirror never queues work
    /// without bound.
    #[arg(long, env = "DP_MIRROR_MAX_IN_FLIGHT", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub mirror_max_in_flight: u64,

    /// Longest idle time a WebSocket tunnel gets (milliseconds), whatever its
    /// route's `websocket_idle_timeout_ms` says.
    #[arg(long, env = "DP_MAX_WEBSOCKET_IDLE_MS", default_value_t = 3_600_000)]
    pub max_websocket_idle_ms: u64,

    /// Most bytes of cached answers (routes with `cache`) a replica keeps in
    /// memory, bodies and header fields together; past it the least recently
    /// used answers go. 0 turns response caching off (every request goes upstream).
    #[arg(long, env = "DP_CACHE_MAX_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub cache_max_bytes: u64,

    /// Time in-flight requests get to finish on SIGTERM/SIGINT, in milliseconds.
    #[arg(long, env = "DP_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,

    /// On SIGTERM/SIGINT, keep serving this long (milliseconds) with `/readyz`
    /// answering 503 before the listeners close, so a load balancer that
    /// health-checks `/readyz` stops sending new requests first. 0: close at once.
    #[arg(long, env = "DP_DRAIN_DELAY_MS", default_value_t = 0)]
    pub drain_delay_ms: u64,

    /// Idle keep-alive connections kept per upstream instance.
    #[arg(long, env = "DP_UPSTREAM_MAX_IDLE", default_value_t = 128)]
    pub upstream_max_idle: usize,

    /// Streams in flight on one HTTP/2 connection to an instance of an
    /// `HTTP2` upstream before another connection is opened (per worker).
    #[arg(long, env = "DP_UPSTREAM_H2_MAX_STREAMS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub upstream_h2_max_streams: u32,

    /// Proxy worker threads, each with its own runtime and listening socket
    /// (SO_REUSEPORT). 0: one per core the process may use.
    #[arg(long, env = "DP_WORKERS", default_value_t = 0)]
    pub workers: usize,

    /// Log line format on stderr.
    #[arg(long, env = "DP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// A secret string (a token): `Debug` and `Display` print `<redacted>`, so it
/// cannot leak through a logged `Args`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Secret {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            Err("must not be empty")
        } else {
            Ok(Secret(s.to_string()))
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
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
        if self.https_redirect_port == Some(0) {
            return invalid("https-redirect-port", "must be a port from 1 to 65535");
        }
        if self.tls_handshake_timeout_ms == 0 {
            return invalid("tls-handshake-timeout-ms", "must be greater than 0");
        }
        for (flag, ms) in [
            ("body-read-timeout-ms", self.body_read_timeout_ms),
            ("write-timeout-ms", self.write_timeout_ms),
            ("h2-idle-timeout-ms", self.h2_idle_timeout_ms),
            ("h2-keep-alive-ms", self.h2_keep_alive_ms),
            ("max-websocket-idle-ms", self.max_websocket_idle_ms),
        ] {
            if ms == 0 {
                return invalid(flag, "must be greater than 0");
            }
        }
        let endpoints = self.control_planes();
        if endpoints.iter().any(|u| u.is_empty()) {
            return invalid(
                "control-plane",
                "has an empty entry in its comma-separated list",
            );
        }
        if endpoints
            .iter()
            .any(|u| !u.starts_with("http://") && !u.starts_with("https://"))
        {
            return invalid("control-plane", "must be an http:// or https:// URL");
        }
        let https_count = endpoints
            .iter()
            .filter(|u| u.starts_with("https://"))
            .count();
        if https_count != 0 && https_count != endpoints.len() {
            return invalid(
                "control-plane",
                "mixes http:// and https:// URLs; every endpoint must use the same scheme",
            );
        }
        let mut seen = std::collections::HashSet::new();
        if endpoints.iter().any(|u| !seen.insert(*u)) {
            return invalid("control-plane", "lists the same URL twice");
        }
        if self.workers > 1024 {
            return invalid("workers", "must be at most 1024 (0 means one per core)");
        }
        if self.ratelimit_timeout_ms == 0 {
            return invalid("ratelimit-timeout-ms", "must be greater than 0");
        }
        if self.proxy_protocol && self.trusted_proxies.is_empty() {
            return invalid(
                "proxy-protocol",
                "needs --trusted-proxies: only those peers may send a PROXY header",
            );
        }
        let https = https_count != 0;
        if https && self.control_plane_ca.is_none() {
            return invalid(
                "control-plane-ca",
                "is required for an https:// control plane (the CA its certificate chains to)",
            );
        }
        if !https && (self.control_plane_ca.is_some() || self.tls_cert.is_some()) {
            return invalid(
                "control-plane",
                "must be an https:// URL when --control-plane-ca or --tls-cert is given",
            );
        }
        if self.node_id.as_deref().is_some_and(str::is_empty) {
            return invalid("node-id", "must not be empty");
        }
        if self.redis_ca.is_some() && !self.redis_url.as_ref().is_some_and(RedisUrl::is_tls) {
            return invalid("redis-ca", "needs a rediss:// (TLS) --redis-url");
        }
        if self.jwks_ca.is_some()
            && !self
                .jwks_url
                .as_deref()
                .is_some_and(|u| u.starts_with("https://"))
        {
            return invalid("jwks-ca", "needs an https:// --jwks-url");
        }
        Ok(())
    }

    /// The rate-limit Redis (`--redis-url`, `--redis-ca`), with the CA file
    /// read and checked; `None` without `--redis-url`.
    pub fn redis(&self) -> Result<Option<RedisTarget>, RedisTargetError> {
        self.redis_url
            .clone()
            .map(|url| RedisTarget::new(url, self.redis_ca.as_deref()))
            .transpose()
    }

    /// The control plane endpoints of `--control-plane`, in order.
    pub fn control_planes(&self) -> Vec<&str> {
        self.control_plane.split(',').map(str::trim).collect()
    }

    /// The node id: `--node-id`, or `hostname-pid`.
    pub fn node_id(&self) -> String {
        self.node_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()))
    }

    /// Request limits.
    pub fn limits(&self) -> Limits {
        Limits {
            max_header_bytes: self.max_header_bytes,
            max_body_bytes: self.max_body_bytes,
            body_read_timeout: Duration::from_millis(self.body_read_timeout_ms),
            max_websocket_idle: Duration::from_millis(self.max_websocket_idle_ms),
            max_websocket_tunnels: match self.max_websocket_tunnels {
                0 => (self.max_connections() / 2).max(1),
                n => n,
            },
        }
    }

    /// `--max-connections`, the automatic default worked out.
    pub fn max_connections(&self) -> usize {
        match self.max_connections {
            0 => gateway_transport::conn_limit::auto_max(gateway_transport::conn_limit::fd_limit()),
            n => n,
        }
    }

    /// Which peers' connections start with a PROXY v2 header (`--proxy-protocol`).
    pub fn proxy_protocol(&self) -> Option<ProxyProtocol> {
        if !self.proxy_protocol {
            return None;
        }
        let trusted = self.trusted_proxies.clone();
        Some(ProxyProtocol::new(move |ip| {
            trusted.iter().any(|c| c.contains(ip))
        }))
    }

    /// Listener settings.
    pub fn http(&self) -> HttpSettings {
        HttpSettings {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            write_timeout: Duration::from_millis(self.write_timeout_ms),
            h2_idle_timeout: Duration::from_millis(self.h2_idle_timeout_ms),
            h2_keep_alive: Duration::from_millis(self.h2_keep_alive_ms),
            max_header_bytes: self.max_header_bytes,
            shutdown_grace: Duration::from_millis(self.shutdown_timeout_ms),
            refusal: crate::error::refusal,
        }
    }

    /// Token verifier settings, when `--jwks-url` is set.
    pub fn jwt(&self) -> Option<gateway_jwt::JwtConfig> {
        self.jwks_url.as_ref().map(|url| gateway_jwt::JwtConfig {
            jwks_url: url.clone(),
            jwks_ca: self.jwks_ca.clone(),
            issuer: self.jwt_issuer.clone(),
            audiences: vec![self.jwt_audience.clone()],
            ..gateway_jwt::JwtConfig::default()
        })
    }

    /// Rate limiter settings.
    pub fn ratelimit(&self) -> gateway_ratelimit::RateLimiterOptions {
        gateway_ratelimit::RateLimiterOptions {
            decision_timeout: Duration::from_millis(self.ratelimit_timeout_ms),
            lease_max_tokens: self.ratelimit_lease_max_tokens,
            ..gateway_ratelimit::RateLimiterOptions::default()
        }
    }

    /// Upstream connection pool settings.
    pub fn pool(&self) -> PoolSettings {
        PoolSettings {
            max_idle: self.upstream_max_idle,
            // One idle list per worker, and one for the main runtime.
            slots: gateway_transport::workers::count(self.workers) + 1,
            h2_max_streams: self.upstream_h2_max_streams as usize,
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
        assert_eq!(a.ratelimit().lease_max_tokens, 1000);
        assert!(a.jwt().is_none());
        assert_eq!(a.node_id(), "dp-1");
        a.validate().unwrap();
    }

    #[test]
    fn the_token_is_redacted_in_debug_output() {
        let a = Args::try_parse_from([
            "data-plane",
            "--control-plane-token",
            "very-secret-token-42",
            "--control-plane",
            "https://127.0.0.1:50051",
            "--control-plane-ca",
            "ca.pem",
        ])
        .unwrap();
        a.validate().unwrap();
        assert_eq!(
            a.control_plane_token.as_ref().unwrap().expose(),
            "very-secret-token-42"
        );
        let debug = format!("{a:?} {a:#?}");
        assert!(!debug.contains("very-secret-token-42"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn the_redis_password_is_never_shown() {
        let a = Args::try_parse_from([
            "data-plane",
            "--redis-url",
            "rediss://:redis-secret-91@cache:6380/1",
        ])
        .unwrap();
        a.validate().unwrap();
        let target = a.redis().unwrap().unwrap();
        assert_eq!(
            target.url().expose(),
            "rediss://:redis-secret-91@cache:6380/1"
        );
        let shown = format!("{a:?} {target} {target:?}");
        assert!(!shown.contains("redis-secret-91"), "{shown}");
        assert!(shown.contains("rediss://:***@cache:6380/1"), "{shown}");
        // A refused URL is quoted redacted in clap's error.
        let err = Args::try_parse_from(["data-plane", "--redis-url", "redis://:redis-secret-91@"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--redis-url"), "{err}");
        assert!(!err.contains("redis-secret-91"), "{err}");
        // --redis-ca is for TLS only.
        let a = Args::try_parse_from([
            "data-plane",
            "--redis-url",
            "redis://:redis-secret-91@cache:6379",
            "--redis-ca",
            "ca.pem",
        ])
        .unwrap();
        let err = a.validate().unwrap_err().to_string();
        assert!(
            err.contains("--redis-ca") && err.contains("rediss://"),
            "{err}"
        );
        assert!(
            Args::try_parse_from(["data-plane", "--redis-ca", "ca.pem"])
                .unwrap()
                .validate()
                .is_err()
        );
    }

    #[test]
    fn the_jwks_ca_goes_with_an_https_jwks_url() {
        let a = Args::try_parse_from([
            "data-plane",
            "--jwks-url",
            "https://auth.internal/.well-known/jwks.json",
            "--jwks-ca",
            "/etc/gateway/auth-ca.pem",
        ])
        .unwrap();
        a.validate().unwrap();
        let jwt = a.jwt().unwrap();
        assert_eq!(
            jwt.jwks_ca.as_deref(),
            Some(std::path::Path::new("/etc/gateway/auth-ca.pem"))
        );
        for args in [
            &["data-plane", "--jwks-ca", "ca.pem"][..],
            &[
                "data-plane",
                "--jwks-url",
                "http://auth:4000/.well-known/jwks.json",
                "--jwks-ca",
                "ca.pem",
            ],
        ] {
            let err = Args::try_parse_from(args)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--jwks-ca") && err.contains("https://"),
                "{err}"
            );
        }
    }

    #[test]
    fn proxy_protocol_needs_trusted_proxies() {
        let a = Args::try_parse_from(["data-plane", "--proxy-protocol"]).unwrap();
        let err = a.validate().unwrap_err().to_string();
        assert!(
            err.contains("--proxy-protocol") && err.contains("--trusted-proxies"),
            "{err}"
        );
        assert!(a.proxy_protocol().is_some());
        let a = Args::try_parse_from([
            "data-plane",
            "--proxy-protocol",
            "--trusted-proxies=10.213.80.8/29",
        ])
        .unwrap();
        a.validate().unwrap();
        let pp = a.proxy_protocol().unwrap();
        assert!(pp.trusts("10.213.80.10".parse().unwrap()));
        assert!(!pp.trusts("10.213.80.1".parse().unwrap()));
        let off = Args::try_parse_from(["data-plane", "--trusted-proxies=10.0.0.0/8"]).unwrap();
        assert!(off.proxy_protocol().is_none());
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
        let a = Args::try_parse_from(["data-plane", "--control-plane", "https://cp:1"]).unwrap();
        assert!(
            a.validate()
                .unwrap_err()
                .to_string()
                .contains("--control-plane-ca")
        );
        let a = Args::try_parse_from(["data-plane", "--control-plane-ca", "ca.pem"]).unwrap();
        assert!(a.validate().unwrap_err().to_string().contains("https://"));
        assert!(Args::try_parse_from(["data-plane", "--tls-cert", "c.pem"]).is_err());
        assert!(Args::try_parse_from(["data-plane", "--control-plane-token", ""]).is_err());
        let node = Args::try_parse_from(["data-plane"]).unwrap().node_id();
        assert!(
            node.ends_with(&format!("-{}", std::process::id())),
            "{node}"
        );
    }

    #[test]
    fn several_control_plane_endpoints() {
        let parse = |v: &str| Args::try_parse_from(["data-plane", "--control-plane", v]).unwrap();
        let a = parse("http://cp-1:50051, http://cp-2:50051,http://cp-3:50051");
        a.validate().unwrap();
        assert_eq!(
            a.control_planes(),
            [
                "http://cp-1:50051",
                "http://cp-2:50051",
                "http://cp-3:50051"
            ]
        );
        for (bad, says) in [
            ("http://cp-1:1,", "empty entry"),
            ("http://cp-1:1,cp-2:1", "http:// or https://"),
            ("http://cp-1:1,https://cp-2:1", "same scheme"),
            ("http://cp-1:1,http://cp-1:1", "same URL twice"),
        ] {
            let e = parse(bad).validate().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
