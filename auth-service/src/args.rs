//! Command line and environment settings (`clap` with `env`), validated into [`ServerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use gateway_database::Database;
use gateway_proto::cidr::Cidr;
use gateway_redis::{RedisTarget, RedisTargetError, RedisUrl, RedisUrlParser};

use crate::client_addr::TrustedProxies;
use crate::keys::RotationPolicy;
use crate::throttle::ThrottleConfig;

/// Default listen address of the HTTP API.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4000";
/// Default key rotation interval: one day.
pub const DEFAULT_ROTATION_SECS: u64 = 86_400;
/// Default lead time between publishing a new key in JWKS and signing with it.
pub const DEFAULT_PUBLISH_LEAD_SECS: u64 = 120;
/// Default failed logins per user name per window before 429.
pub const DEFAULT_LOGIN_USER_FAILURES: u32 = 10;
/// Default failed logins per client address per window before 429 (higher than per name: many
/// users can share one address behind a NAT).
pub const DEFAULT_LOGIN_IP_FAILURES: u32 = 100;
/// Default of `--login-name-failures`.
pub const DEFAULT_LOGIN_NAME_FAILURES: u32 = 100;
/// Default of `--login-slowdown-ms`.
pub const DEFAULT_LOGIN_SLOWDOWN_MS: u64 = 1000;
/// Default failed-login window: 15 minutes.
pub const DEFAULT_LOGIN_FAILURE_WINDOW_SECS: u64 = 900;
/// Longest failed-login window accepted: one day.
pub const MAX_LOGIN_FAILURE_WINDOW_SECS: u64 = 86_400;

/// Issues access JWTs (Ed25519, published as JWKS) and rotating refresh tokens.
#[derive(Debug, Parser)]
#[command(name = "auth-service", version, about)]
pub struct Cli {
    /// Address the HTTP API listens on.
    #[arg(long, env = "AUTH_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// Where the users live: `sqlite://PATH` or a plain file path (created if missing), or
    /// `postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=verify-full&sslrootcert=CA.pem`, which
    /// several auth services share; with Postgres the signing keys and their rotation schedule
    /// live there too (see --keys-secret-file). verify-full checks the server's certificate
    /// against CA.pem and the host name; a host other than loopback needs an explicit sslmode
    /// (weaker modes warn).
    #[arg(long, env = "AUTH_DATABASE", default_value = "auth.db")]
    pub database: Database,

    /// Redis holding refresh-token families (only SHA-256 hashes of tokens are stored):
    /// `redis://[[user]:password@]host:port[/db]`, Sentinel
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME`, Cluster
    /// `redis+cluster://[user:password@]host:port[,host:port…]`; `rediss…` of each for TLS.
    /// Printed only redacted (`redis://:***@host:port`); prefer the environment variable to the flag for a
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

    /// Directory where Ed25519 signing keys are persisted (PKCS#8 PEM + JSON metadata), with
    /// a SQLite --database. With Postgres the keys are in the database and this is not used.
    #[arg(long, env = "AUTH_KEY_DIR", default_value = "auth-keys")]
    pub key_dir: PathBuf,

    /// With a postgres:// --database (required there, refused otherwise): file holding the
    /// 32-byte key that encrypts the signing keys' private halves in the database (AES-256-GCM):
    /// 64 hex digits (`openssl rand -hex 32 > FILE`) or 32 raw bytes, mode 0600. Every auth
    /// service of the database needs the same file.
    #[arg(long, env = "AUTH_KEYS_SECRET_FILE")]
    pub keys_secret_file: Option<PathBuf>,

    /// How often a new signing key takes over (seconds).
    #[arg(long, env = "AUTH_KEY_ROTATION_INTERVAL_SECS", default_value_t = DEFAULT_ROTATION_SECS)]
    pub key_rotation_interval_secs: u64,

    /// How long a new key is published in JWKS before it signs (seconds). Capped at half the
    /// rotation interval; the JWKS `Cache-Control: max-age` never exceeds it.
    #[arg(long, env = "AUTH_KEY_PUBLISH_LEAD_SECS", default_value_t = DEFAULT_PUBLISH_LEAD_SECS)]
    pub key_publish_lead_secs: u64,

    /// Proxies (CIDRs, comma-separated) whose `X-Forwarded-For` is believed when finding a
    /// login's client address: the right-most entry that is not a trusted proxy. From any other
    /// peer the header is ignored and the peer's address counts. Default: none (the peer).
    #[arg(long, env = "AUTH_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<Cidr>,

    /// Failed logins on one user name from one client address (IPv6: per /64) within
    /// `--login-failure-window-secs` after which that address gets 429 for that name until the
    /// window ends (counted in Redis, shared by replicas); other addresses may still log in as
    /// that user. 0: no limit.
    #[arg(long, env = "AUTH_LOGIN_USER_FAILURES", default_value_t = DEFAULT_LOGIN_USER_FAILURES)]
    pub login_user_failures: u32,

    /// Failed logins on one user name from every address together within
    /// `--login-failure-window-secs` after which that name is slowed, never locked: one password
    /// check on it per `--login-slowdown-ms` across replicas (an attempt waits up to 5 s for its
    /// turn, else 429). The brute-force bound of one account. 0: no bound.
    #[arg(long, env = "AUTH_LOGIN_NAME_FAILURES", default_value_t = DEFAULT_LOGIN_NAME_FAILURES)]
    pub login_name_failures: u32,

    /// While a user name is slowed (`--login-name-failures`): one password check on it per this
    /// many milliseconds (1 to 60000).
    #[arg(long, env = "AUTH_LOGIN_SLOWDOWN_MS", default_value_t = DEFAULT_LOGIN_SLOWDOWN_MS,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub login_slowdown_ms: u64,

    /// Failed logins per client address (IPv6: per /64) within `--login-failure-window-secs`
    /// after which that address gets 429 until the window ends. 0: no limit.
    #[arg(long, env = "AUTH_LOGIN_IP_FAILURES", default_value_t = DEFAULT_LOGIN_IP_FAILURES)]
    pub login_ip_failures: u32,

    /// The failed-login window (seconds), from a counter's first failure.
    #[arg(long, env = "AUTH_LOGIN_FAILURE_WINDOW_SECS", default_value_t = DEFAULT_LOGIN_FAILURE_WINDOW_SECS)]
    pub login_failure_window_secs: u64,

    /// Most connections open at once; past it a new connection is closed at once.
    #[arg(long, env = "AUTH_MAX_CONNECTIONS", default_value_t = gateway_listener::DEFAULT_MAX_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,

    /// Time a new connection has to send its first 24 bytes (a request line, a TLS
    /// ClientHello), in milliseconds; then it is closed.
    #[arg(long, env = "AUTH_FIRST_BYTES_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub first_bytes_timeout_ms: u64,

    /// A connection from which no byte arrives for this long (milliseconds) is closed.
    #[arg(long, env = "AUTH_IDLE_TIMEOUT_MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1_000..=86_400_000))]
    pub idle_timeout_ms: u64,

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
    /// Manage users in the --database.
    Users {
        /// What to do.
        #[command(subcommand)]
        command: UsersCommand,
    },
}

/// `users …` subcommands. They work on the `--database` directly, also while a server
/// uses it (SQLite in WAL mode, or Postgres; the server reads users at every login).
#[derive(Debug, Subcommand)]
pub enum UsersCommand {
    /// Add a user. The password is asked for twice without echo when stdin is a terminal,
    /// otherwise read from stdin (all of it, one trailing newline stripped), or taken from the
    /// environment variable named by `--password-env`. There is deliberately no flag that takes
    /// the password itself: a command line lands in shell history and `ps`.
    Add {
        /// Login name (1–64 of A–Z a–z 0–9 . _ @ -).
        name: String,
        /// Role forwarded to backends as X-User-Role (1–32 of a–z 0–9 _ -, starting with a
        /// letter; e.g. `user`, `admin`).
        #[arg(long)]
        role: String,
        /// Replace the password and role if the user already exists.
        #[arg(long)]
        replace: bool,
        /// Read the password from this environment variable instead of stdin (for automation
        /// that injects secrets as variables; the variable is visible to the process's own
        /// user in /proc/PID/environ while it runs).
        #[arg(long, value_name = "VARIABLE")]
        password_env: Option<String>,
    },
    /// List the users: one `NAME ROLE` line each, ordered by name.
    List,
    /// Delete a user. Access tokens already issued stay valid until they expire (15 min);
    /// the user's next refresh is refused and revokes its family.
    Delete {
        /// Login name.
        name: String,
    },
}

/// Validated settings of the HTTP server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// The users' database (and, with Postgres, the signing keys').
    pub database: Database,
    /// Redis holding refresh tokens (its `Debug` and `Display` are redacted).
    pub redis: RedisTarget,
    /// Token issuer.
    pub issuer: String,
    /// Token audience.
    pub audience: String,
    /// Key directory (SQLite).
    pub key_dir: PathBuf,
    /// The key file that seals signing keys in a Postgres database.
    pub keys_secret_file: Option<PathBuf>,
    /// Key rotation schedule.
    pub rotation: RotationPolicy,
    /// Peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: TrustedProxies,
    /// The failed-login throttle's limits.
    pub throttle: ThrottleConfig,
    /// The listener's defences: connection cap, first-bytes deadline, idle limit.
    pub listener_limits: gateway_listener::Limits,
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
    /// The failed-login window is 0 or longer than a day.
    #[error("--login-failure-window-secs must be 1 to {MAX_LOGIN_FAILURE_WINDOW_SECS} (got {0})")]
    LoginWindow(u64),
    /// Postgres without --keys-secret-file, or the file without Postgres.
    #[error(
        "--keys-secret-file goes with a postgres:// --database, and is required there: the \
         signing keys then live in the database, their private keys encrypted with it (with \
         SQLite they stay in --key-dir)"
    )]
    KeysSecretFile,
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
        if !(1..=MAX_LOGIN_FAILURE_WINDOW_SECS).contains(&self.login_failure_window_secs) {
            return Err(ArgsError::LoginWindow(self.login_failure_window_secs));
        }
        if self.database.is_shared() != self.keys_secret_file.is_some() {
            return Err(ArgsError::KeysSecretFile);
        }
        let redis = RedisTarget::new(self.redis_url.clone(), self.redis_ca.as_deref())?;
        Ok(ServerConfig {
            listen: self.listen,
            database: self.database.clone(),
            redis,
            issuer: self.issuer.clone(),
            audience: self.audience.clone(),
            key_dir: self.key_dir.clone(),
            keys_secret_file: self.keys_secret_file.clone(),
            rotation: RotationPolicy::new(
                Duration::from_secs(self.key_rotation_interval_secs),
                Duration::from_secs(self.key_publish_lead_secs),
            ),
            trusted_proxies: TrustedProxies::new(self.trusted_proxies.clone()),
            throttle: ThrottleConfig {
                user_failures: self.login_user_failures,
                ip_failures: self.login_ip_failures,
                name_failures: self.login_name_failures,
                slowdown: Duration::from_millis(self.login_slowdown_ms),
                window: Duration::from_secs(self.login_failure_window_secs),
            },
            tracer: gateway_telemetry::Tracer::disabled(),
            listener_limits: gateway_listener::Limits::from_flags(
                self.max_connections,
                self.first_bytes_timeout_ms,
                self.idle_timeout_ms,
            ),
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
        assert_eq!(cfg.database, Database::sqlite("auth.db"));
    }

    #[test]
    fn postgres_needs_the_keys_secret_file_and_sqlite_refuses_it() {
        let pg = "postgres://auth:pw@127.0.0.1:5432/gateway";
        let cli = Cli::try_parse_from(["auth-service", "--database", pg]).unwrap();
        let e = cli.server_config().unwrap_err().to_string();
        assert!(e.contains("--keys-secret-file"), "{e}");
        let cli = Cli::try_parse_from([
            "auth-service",
            "--database",
            pg,
            "--keys-secret-file",
            "/etc/gw/auth-keys.secret",
        ])
        .unwrap();
        let cfg = cli.server_config().unwrap();
        assert!(cfg.database.is_shared());
        assert!(!format!("{cfg:?}").contains(":pw@"), "{cfg:?}");
        let cli = Cli::try_parse_from(["auth-service", "--keys-secret-file", "/etc/gw/k"]).unwrap();
        assert!(cli.server_config().is_err());
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
                        password_env,
                    },
            }) => {
                assert_eq!(
                    (name.as_str(), role.as_str(), replace, password_env),
                    ("alice", "user", false, None)
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
    fn throttle_flags_have_defaults_and_are_checked() {
        let cfg = Cli::try_parse_from(["auth-service"])
            .unwrap()
            .server_config()
            .unwrap();
        assert_eq!(
            cfg.throttle,
            ThrottleConfig {
                user_failures: DEFAULT_LOGIN_USER_FAILURES,
                ip_failures: DEFAULT_LOGIN_IP_FAILURES,
                name_failures: DEFAULT_LOGIN_NAME_FAILURES,
                slowdown: Duration::from_millis(DEFAULT_LOGIN_SLOWDOWN_MS),
                window: Duration::from_secs(DEFAULT_LOGIN_FAILURE_WINDOW_SECS),
            }
        );
        let cli = Cli::try_parse_from([
            "auth-service",
            "--login-user-failures",
            "0",
            "--login-ip-failures",
            "7",
            "--login-failure-window-secs",
            "60",
            "--trusted-proxies",
            "10.213.82.0/24,10.213.80.8/29",
        ])
        .unwrap();
        let cfg = cli.server_config().unwrap();
        assert_eq!(
            (cfg.throttle.user_failures, cfg.throttle.ip_failures),
            (0, 7)
        );
        let peer: std::net::IpAddr = "10.213.82.9".parse().unwrap();
        let mut h = http::HeaderMap::new();
        h.insert("x-forwarded-for", "192.0.2.1".parse().unwrap());
        assert_eq!(
            cfg.trusted_proxies.client_ip(&h, peer),
            "192.0.2.1".parse::<std::net::IpAddr>().unwrap()
        );
        for window in ["0", "86401"] {
            let cli = Cli::try_parse_from(["auth-service", "--login-failure-window-secs", window])
                .unwrap();
            let err = cli.server_config().unwrap_err().to_string();
            assert!(
                err.contains("--login-failure-window-secs must be 1 to 86400"),
                "{err}"
            );
        }
        let err = Cli::try_parse_from(["auth-service", "--trusted-proxies", "10.0.0.0/33"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--trusted-proxies") && err.contains("10.0.0.0/33"),
            "{err}"
        );
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
