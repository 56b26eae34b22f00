//! Command line and environment settings (`clap` with `env`), validated into [`ServerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use gateway_redis::{RedisTarget, RedisTargetError, RedisUrl, RedisUrlParser};

use crate::keys::RotationPolicy;

/// Default listen address of the HTTP API.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4000";
/// Default key rotation interval: one day.
pub const DEFAULT_ROTATION_SECS: u64 = 86_400;
/// Default lead time between publishing a new key in JWKS and signing with it.
pub const DEFAULT_PUBLISH_LEAD_SECS: u64 = 120;

/// Issues access JWTs (Ed25519, published as JWKS) and rotating refresh tokens.
#[derive(Debug, Parser)]
#[command(name = "auth-service", version, about)]
pub struct Cli {
    /// Address the HTTP API listens on.
    #[arg(long, env = "AUTH_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// SQLite database file holding the users (created if missing).
    #[arg(long, env = "AUTH_DATABASE", default_value = "auth.db")]
    pub database: PathBuf,

    /// Redis holding refresh-token families (only SHA-256 hashes of tokens are stored):
    /// `redis://[[user]:password@]host:port[/db]`, or `rediss://…` for TLS. Printed only
    /// redacted (`redis://:***@host:port`); prefer the environment variable to the flag for a
    /// URL with a password (a command line is visible in `ps`).
    #[arg(
        long,
        env = "AUTH_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        value_parser = RedisUrlParser,
        hide_env_values = true
    )]
    pub redis_url: RedisUrl,

    /// PEM CA certificate(s) a `rediss://` Redis's certificate must chain to (default: the
    /// system's roots).
    #[arg(long, env = "AUTH_REDIS_CA")]
    pub redis_ca: Option<PathBuf>,

    /// `iss` claim of issued access tokens.
    #[arg(long, env = "AUTH_ISSUER", default_value = "gateway-auth")]
    pub issuer: String,

    /// `aud` claim of issued access tokens.
    #[arg(long, env = "AUTH_AUDIENCE", default_value = "gateway")]
    pub audience: String,

    /// Directory where Ed25519 signing keys are persisted (PKCS#8 PEM + JSON metadata).
    #[arg(long, env = "AUTH_KEY_DIR", default_value = "auth-keys")]
    pub key_dir: PathBuf,

    /// How often a new signing key takes over (seconds).
    #[arg(long, env = "AUTH_KEY_ROTATION_INTERVAL_SECS", default_value_t = DEFAULT_ROTATION_SECS)]
    pub key_rotation_interval_secs: u64,

    /// How long a new key is published in JWKS before it signs (seconds). Capped at half the
    /// rotation interval; the JWKS `Cache-Control: max-age` never exceeds it.
    #[arg(long, env = "AUTH_KEY_PUBLISH_LEAD_SECS", default_value_t = DEFAULT_PUBLISH_LEAD_SECS)]
    pub key_publish_lead_secs: u64,

    /// Log line format on stderr.
    #[arg(long, env = "AUTH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Administrative subcommand; without one the HTTP server runs.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Administrative subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage users in the SQLite database.
    Users {
        /// What to do.
        #[command(subcommand)]
        command: UsersCommand,
    },
}

/// `users …` subcommands.
#[derive(Debug, Subcommand)]
pub enum UsersCommand {
    /// Add a user; the password is read from stdin (one trailing newline is stripped).
    Add {
        /// Login name (1–64 of A–Z a–z 0–9 . _ @ -).
        name: String,
        /// Role forwarded to backends as X-User-Role (e.g. `user`, `admin`).
        #[arg(long)]
        role: String,
        /// Replace the password and role if the user already exists.
        #[arg(long)]
        replace: bool,
    },
}

/// Validated settings of the HTTP server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// SQLite path.
    pub database: PathBuf,
    /// Redis holding refresh tokens (its `Debug` and `Display` are redacted).
    pub redis: RedisTarget,
    /// Token issuer.
    pub issuer: String,
    /// Token audience.
    pub audience: String,
    /// Key directory.
    pub key_dir: PathBuf,
    /// Key rotation schedule.
    pub rotation: RotationPolicy,
    /// Request spans (continuing the caller's trace); exported by OTLP when configured.
    pub tracer: gateway_telemetry::Tracer,
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The rotation interval is too short to publish a key ahead of use.
    #[error("--key-rotation-interval-secs must be at least 2 (got {0})")]
    RotationTooShort(u64),
    /// Issuer or audience is empty.
    #[error("--{0} must not be empty")]
    Empty(&'static str),
    /// The Redis settings cannot be used (`--redis-ca` without TLS, an unreadable CA file).
    #[error(transparent)]
    Redis(#[from] RedisTargetError),
}

impl Cli {
    /// Validates the server flags.
    pub fn server_config(&self) -> Result<ServerConfig, ArgsError> {
        if self.key_rotation_interval_secs < 2 {
            return Err(ArgsError::RotationTooShort(self.key_rotation_interval_secs));
        }
        if self.issuer.is_empty() {
            return Err(ArgsError::Empty("issuer"));
        }
        if self.audience.is_empty() {
            return Err(ArgsError::Empty("audience"));
        }
        let redis = RedisTarget::new(self.redis_url.clone(), self.redis_ca.as_deref())?;
        Ok(ServerConfig {
            listen: self.listen,
            database: self.database.clone(),
            redis,
            issuer: self.issuer.clone(),
            audience: self.audience.clone(),
            key_dir: self.key_dir.clone(),
            rotation: RotationPolicy::new(
                Duration::from_secs(self.key_rotation_interval_secs),
                Duration::from_secs(self.key_publish_lead_secs),
            ),
            tracer: gateway_telemetry::Tracer::disabled(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_flags_parse() {
        let cli = Cli::try_parse_from([
            "auth-service",
            "--listen",
            "127.0.0.1:4000",
            "--database",
            "auth.db",
            "--redis-url",
            "redis://127.0.0.1:6379",
            "--issuer",
            "gateway-auth",
            "--audience",
            "gateway",
            "--key-dir",
            "/tmp/k",
            "--key-rotation-interval-secs",
            "86400",
        ])
        .unwrap();
        let cfg = cli.server_config().unwrap();
        assert_eq!(cfg.rotation.interval, 86_400);
        assert_eq!(cfg.rotation.publish_lead, DEFAULT_PUBLISH_LEAD_SECS);
    }

    #[test]
    fn users_add_subcommand_parses() {
        let cli = Cli::try_parse_from([
            "auth-service",
            "--database",
            "x.db",
            "users",
            "add",
            "alice",
            "--role",
            "user",
        ])
        .unwrap();
        match cli.command {
            Some(Command::Users {
                command:
                    UsersCommand::Add {
                        name,
                        role,
                        replace,
                    },
            }) => {
                assert_eq!(
                    (name.as_str(), role.as_str(), replace),
                    ("alice", "user", false)
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        let cli =
            Cli::try_parse_from(["auth-service", "--key-rotation-interval-secs", "1"]).unwrap();
        assert!(
            cli.server_config()
                .unwrap_err()
                .to_string()
                .contains("at least 2")
        );
        let err = Cli::try_parse_from(["auth-service", "--redis-url", "http://:pw-77@x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--redis-url"), "{err}");
        assert!(err.contains("http://:***@x"), "{err}");
        assert!(!err.contains("pw-77"), "{err}");
        let cli = Cli::try_parse_from([
            "auth-service",
            "--redis-url",
            "redis://:pw-77@x:6379",
            "--redis-ca",
            "/nonexistent/ca.pem",
        ])
        .unwrap();
        let err = cli.server_config().unwrap_err().to_string();
        assert!(
            err.contains("--redis-ca") && err.contains("rediss://"),
            "{err}"
        );
        assert!(!err.contains("pw-77"), "{err}");
        let cli = Cli::try_parse_from([
            "auth-service",
            "--redis-url",
            "rediss://:pw-77@x:6380",
            "--redis-ca",
            "/nonexistent/ca.pem",
        ])
        .unwrap();
        let err = cli.server_config().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn the_redis_password_is_never_shown() {
        let cli = Cli::try_parse_from([
            "auth-service",
            "--redis-url",
            "redis://app:pw-77@cache:6379/2",
        ])
        .unwrap();
        let cfg = cli.server_config().unwrap();
        assert_eq!(cfg.redis.url().expose(), "redis://app:pw-77@cache:6379/2");
        let shown = format!("{cli:?} {cfg:?} {}", cfg.redis);
        assert!(!shown.contains("pw-77"), "{shown}");
        assert!(shown.contains("redis://***:***@cache:6379/2"), "{shown}");
    }
}
