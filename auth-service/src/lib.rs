//! Auth service: logins against users in SQLite or Postgres (Argon2id), Ed25519 access JWTs
//! published as JWKS with automatic key rotation, and opaque refresh tokens in Redis that rotate
//! on every use and burn their whole family when a consumed one is replayed
//! (docs/auth-service.md). With Postgres several auth services share the users and the signing
//! keys, so each signs with the current key and publishes the same JWKS.
//!
//! Modules, one concern each: [`args`] (CLI), [`users`], [`users_cli`] (the `users`
//! subcommands), [`keys`] (signing keys and rotation), [`shared_keys`] (the keys in Postgres,
//! rotated once for every replica), [`tokens`] (access JWTs), [`refresh`]
//! (refresh families), [`throttle`] (failed-login limits), [`client_addr`] (whose address a
//! login is counted against), [`service`] (the flows), [`http`] (the API), [`problem`]
//! (error → HTTP mapping). Time comes from the workspace's injectable clock (`gateway_clock`).

pub mod args;
pub mod cli;
pub mod client_addr;
pub mod http;
pub mod keys;
pub mod problem;
pub mod refresh;
pub mod service;
pub mod shared_keys;
pub mod throttle;
pub mod tokens;
pub mod users;
pub mod users_cli;

#[cfg(test)]
pub(crate) mod testutil;

use parking_lot::RwLock;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gateway_redis::{ConnectOptions, RedisConnection, RedisTarget, RedisTargetError};
use tokio::net::TcpListener;

use crate::args::ServerConfig;
use crate::keys::KeyRing;
use crate::refresh::RefreshStore;
use crate::service::AuthService;
use crate::shared_keys::SharedKeys;
use crate::throttle::LoginThrottle;
use crate::tokens::TokenIssuer;
use crate::users::UserStore;
use gateway_clock::{Clock, SystemClock};

/// Startup failure.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The user database could not be opened.
    #[error(transparent)]
    Users(#[from] users::UserError),
    /// Keys could not be loaded or created.
    #[error(transparent)]
    Keys(#[from] keys::KeyError),
    /// The Redis client cannot be set up (the message never holds the URL's password).
    #[error("redis: {0}")]
    Redis(#[from] gateway_redis::RedisTargetError),
    /// Binding or serving failed.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
}

/// The process's one Redis connection: connects lazily (the service starts even while Redis
/// is down and answers 503 on token endpoints) and fails requests fast when Redis is slow.
/// One Redis, Sentinel (following failovers) or Cluster, plain or TLS, with or without a
/// password: the target carries it all.
pub fn redis_connection(target: &RedisTarget) -> Result<RedisConnection, RedisTargetError> {
    target.connect(&ConnectOptions {
        connect_timeout: Duration::from_secs(1),
        response_timeout: Duration::from_secs(2),
        retries: 2,
        min_retry_delay: Duration::from_millis(50),
        max_retry_delay: Duration::from_millis(500),
    })
}

/// One `PING` at start-up, so a wrong password, an untrusted certificate or an unreachable
/// Redis is reported at once with its reason (the URL only redacted), not at the first login.
async fn check_redis(mut conn: RedisConnection, target: RedisTarget) {
    let ping = redis::cmd("PING");
    match tokio::time::timeout(
        Duration::from_secs(5),
        ping.query_async::<String>(&mut conn),
    )
    .await
    {
        Ok(Ok(_)) => tracing::info!(redis = %target, "redis reachable"),
        Ok(Err(error)) => tracing::warn!(
            redis = %target, %error,
            "redis refused or failed: login, refresh and logout answer 503 until it works"
        ),
        Err(_) => tracing::warn!(
            redis = %target,
            "redis did not answer within 5 s: login, refresh and logout answer 503 until it does"
        ),
    }
}

/// Binds `config.listen` and runs the service until `shutdown` resolves.
pub async fn run(config: ServerConfig, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| RunError::Listen {
            addr: config.listen.to_string(),
            source,
        })?;
    run_with_listener(listener, config, shutdown).await
}

/// Runs the service on an already bound listener until `shutdown` resolves.
pub async fn run_with_listener(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let users = UserStore::connect(&config.database).await?;
    // With Postgres the keys are the database's, shared by every replica; else the key directory's.
    let shared = match (users.postgres_pool(), &config.keys_secret_file) {
        (Some(pool), Some(file)) => Some(SharedKeys::new(pool, file, config.rotation)?),
        _ => None,
    };
    let ring = match &shared {
        Some(shared) => shared.maintain(clock.unix_secs()).await?.0,
        None => KeyRing::load_or_init(&config.key_dir, config.rotation, clock.unix_secs())?,
    };
    tracing::info!(
        keys = ring.len(),
        signing_kid = %ring.signing_key(clock.unix_secs()).kid(),
        rotation_interval_secs = config.rotation.interval,
        publish_lead_secs = config.rotation.publish_lead,
        "signing keys loaded"
    );
    let keys = Arc::new(RwLock::new(ring));
    let conn = redis_connection(&config.redis)?;
    tokio::spawn(check_redis(conn.clone(), config.redis.clone()));
    let refresh = RefreshStore::new(conn.clone());
    let throttle = LoginThrottle::new(conn, config.throttle);
    tracing::info!(
        user_failures = config.throttle.user_failures,
        ip_failures = config.throttle.ip_failures,
        name_failures = config.throttle.name_failures,
        slowdown_ms = config.throttle.slowdown.as_millis() as u64,
        window_secs = config.throttle.window.as_secs(),
        trusted_proxies = %config.trusted_proxies,
        "failed-login throttle (0: no limit)"
    );
    let issuer = TokenIssuer {
        issuer: config.issuer.clone(),
        audience: config.audience.clone(),
    };
    let service = Arc::new(AuthService::new(
        users,
        keys.clone(),
        issuer,
        refresh,
        throttle,
        clock.clone(),
    ));
    let addr = listener.local_addr().map_err(|source| RunError::Listen {
        addr: config.listen.to_string(),
        source,
    })?;
    tracing::info!(%addr, "auth-service listening");
    let rotation = match shared {
        Some(shared) => tokio::spawn(follow_shared_keys(keys, shared, clock)),
        None => tokio::spawn(rotate_keys(keys, clock)),
    };
    let served = http::serve(
        gateway_listener::Listener::new(listener, config.listener_limits, "http"),
        service,
        config.trusted_proxies.clone(),
        config.tracer.clone(),
        shutdown,
    )
    .await;
    rotation.abort();
    served.map_err(|source| RunError::Listen {
        addr: addr.to_string(),
        source,
    })
}

/// Longest wait between two reads of the shared keys: a replica that missed
/// a rotation (Postgres was down) catches up within this.
const SHARED_KEYS_REFRESH: Duration = Duration::from_secs(60);

/// With shared keys: applies the schedule in the database (once for every
/// replica) whenever this replica's copy says it has work, and at least every
/// [`SHARED_KEYS_REFRESH`], then signs with what the database holds.
async fn follow_shared_keys(keys: Arc<RwLock<KeyRing>>, shared: SharedKeys, clock: Arc<dyn Clock>) {
    loop {
        let now = clock.unix_secs();
        let next = keys.read().next_maintenance(now);
        let wait = Duration::from_secs(next.saturating_sub(now)).min(SHARED_KEYS_REFRESH);
        tokio::time::sleep(wait).await;
        match shared.maintain(clock.unix_secs()).await {
            Ok((ring, m)) => {
                if let Some((kid, activates_at)) = m.generated {
                    tracing::info!(%kid, activates_at, "new signing key published for every replica; it signs from activates_at");
                }
                for kid in m.deleted {
                    tracing::info!(%kid, "retired key removed: every token it signed has expired");
                }
                *keys.write() = ring;
            }
            Err(e) => {
                tracing::warn!(error = %e, "shared signing keys not read; signing with the ones held, retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Applies the rotation schedule whenever it has work to do.
async fn rotate_keys(keys: Arc<RwLock<KeyRing>>, clock: Arc<dyn Clock>) {
    loop {
        let now = clock.unix_secs();
        let next = keys.read().next_maintenance(now);
        let wait = Duration::from_secs(next.saturating_sub(now)).min(Duration::from_secs(60));
        tokio::time::sleep(wait).await;
        let now = clock.unix_secs();
        let result = keys.write().maintain(now);
        match result {
            Ok(m) => {
                if let Some((kid, activates_at)) = m.generated {
                    tracing::info!(%kid, activates_at, "new signing key published; it signs from activates_at");
                }
                for kid in m.deleted {
                    tracing::info!(%kid, "retired key removed: every token it signed has expired");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "key rotation failed; retrying");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}
