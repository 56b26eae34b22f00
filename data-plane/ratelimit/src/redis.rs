//! Shared budgets in Redis: one atomic Lua script per decision (or per batch
//! of merged concurrent decisions of one key, see [`crate::merge`]) over one
//! multiplexed connection per process.
//!
//! Scripts run with `EVALSHA`; [`redis::Script`] reloads a script with
//! `SCRIPT LOAD` and retries once when Redis answers `NOSCRIPT` (after a
//! restart or a `SCRIPT FLUSH`), so callers never see that error.
//! The connection is a [`ConnectionManager`]: a cheap-to-clone handle over one
//! pipelined TCP connection that reconnects in the background after an I/O
//! error. It is created lazily, so building the limiter never waits on Redis.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisResult, Script};

use crate::merge::Batch;
use crate::policy::{Algorithm, Policy};

/// The token-bucket script (see the file for the arithmetic).
pub const TOKEN_BUCKET_LUA: &str = include_str!("token_bucket.lua");
/// The fixed-window script.
pub const FIXED_WINDOW_LUA: &str = include_str!("fixed_window.lua");

/// Connection settings of the shared store.
#[derive(Debug, Clone)]
pub(crate) struct StoreOptions {
    /// Bound on one TCP connect attempt.
    pub(crate) connect_timeout: Duration,
    /// Bound on one command inside the client; decisions have their own, shorter deadline.
    pub(crate) response_timeout: Duration,
}

/// Budgets in Redis.
#[derive(Clone)]
pub(crate) struct RedisStore {
    conn: ConnectionManager,
    token_bucket: Script,
    fixed_window: Script,
}

impl RedisStore {
    /// Opens (lazily) the connection of `client` (plain or TLS, with or
    /// without a password: the client carries all of it). Must run inside a
    /// Tokio runtime.
    pub(crate) fn new(client: Client, options: &StoreOptions) -> RedisResult<Self> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            // Reconnects are driven by our probes (limiter.rs); the client
            // itself should give up fast instead of backing off for seconds.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self {
            conn,
            token_bucket: Script::new(TOKEN_BUCKET_LUA),
            fixed_window: Script::new(FIXED_WINDOW_LUA),
        })
    }

    /// Decides `requests` concurrent requests of the budget `key` under
    /// `policy` in one atomic script run (see [`crate::merge`]).
    pub(crate) async fn decide(
        &self,
        policy: &Policy,
        key: &[u8],
        requests: u32,
    ) -> RedisResult<Batch> {
        let script = match policy.algorithm() {
            Algorithm::TokenBucket => &self.token_bucket,
            Algorithm::FixedWindow => &self.fixed_window,
        };
        // Cloning the manager clones an Arc: every decision shares the one connection.
        let mut conn = self.conn.clone();
        let (admitted, remaining, reset_after_ms, retry_after_ms): (i64, i64, i64, i64) = script
            .key(key)
            .arg(policy.limit())
            .arg(policy.window_ms())
            .arg(requests)
            .invoke_async(&mut conn)
            .await?;
        Ok(Batch {
            requests,
            admitted: u32::try_from(admitted.clamp(0, i64::from(requests))).unwrap_or(0),
            remaining: clamp(remaining),
            reset_after_ms: clamp(reset_after_ms),
            retry_after_ms: clamp(retry_after_ms),
        })
    }

    /// `PING`: is Redis reachable again?
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }
}

fn clamp(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
