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
use redis::{Client, ErrorKind, RedisError, RedisResult, Script};

use crate::merge::Batch;
use crate::policy::{Algorithm, Policy};
use crate::stacked::{self, LimitOutcome, MAX_STACKED};

/// The token-bucket script (see the file for the arithmetic).
pub const TOKEN_BUCKET_LUA: &str = include_str!("token_bucket.lua");
/// The fixed-window script.
pub const FIXED_WINDOW_LUA: &str = include_str!("fixed_window.lua");
/// The stacked-limits script (N budgets, all or nothing; also a lone sliding window).
pub const STACKED_LUA: &str = include_str!("stacked.lua");

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
    stacked: Script,
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
            stacked: Script::new(STACKED_LUA),
        })
    }

    /// Decides `requests` concurrent requests of the budget `key` under
    /// `policy` in one atomic script run (see [`crate::merge`]), asking for
    /// `extra` tokens more for this replica's lease ([`crate::lease`]; a
    /// sliding window ignores it).
    pub(crate) async fn decide(
        &self,
        policy: &Policy,
        key: &[u8],
        requests: u32,
        extra: u32,
    ) -> RedisResult<Batch> {
        let script = match policy.algorithm() {
            Algorithm::TokenBucket => &self.token_bucket,
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::SlidingWindow => {
                return self
                    .decide_stacked(std::slice::from_ref(policy), &[key], requests)
                    .await;
            }
        };
        // Cloning the manager clones an Arc: every decision shares the one connection.
        let mut conn = self.conn.clone();
        let cost = requests.saturating_add(extra);
        let (admitted, remaining, reset_after_ms, retry_after_ms): (i64, i64, i64, i64) = script
            .key(key)
            .arg(policy.limit())
            .arg(policy.window_ms())
            .arg(cost)
            .invoke_async(&mut conn)
            .await?;
        Ok(Batch::leasing(
            requests,
            u32::try_from(admitted.clamp(0, i64::from(cost))).unwrap_or(0),
            clamp(remaining),
            clamp(reset_after_ms),
            clamp(retry_after_ms),
        ))
    }

    /// Decides `requests` concurrent requests under every limit at once (all
    /// or nothing) in one run of `stacked.lua`: `policies[i]` counts on
    /// `keys[i]`. At most [`MAX_STACKED`] limits.
    pub(crate) async fn decide_stacked<K: AsRef<[u8]>>(
        &self,
        policies: &[Policy],
        keys: &[K],
        requests: u32,
    ) -> RedisResult<Batch> {
        let n = policies.len().min(keys.len()).min(MAX_STACKED);
        let mut invocation = self.stacked.prepare_invoke();
        for key in &keys[..n] {
            invocation.key(key.as_ref());
        }
        invocation.arg(requests);
        for policy in &policies[..n] {
            let code: u8 = match policy.algorithm() {
                Algorithm::TokenBucket => 0,
                Algorithm::FixedWindow => 1,
                Algorithm::SlidingWindow => 2,
            };
            invocation
                .arg(code)
                .arg(policy.limit())
                .arg(policy.window_ms());
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
        if reply.len() != 1 + 3 * n {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "stacked.lua answered an unexpected number of values",
            )));
        }
        let mut out = [LimitOutcome::default(); MAX_STACKED];
        for (i, o) in out[..n].iter_mut().enumerate() {
            *o = LimitOutcome {
                remaining: clamp(reply[1 + 3 * i]),
                reset_after_ms: clamp(reply[2 + 3 * i]),
                retry_after_ms: clamp(reply[3 + 3 * i]),
            };
        }
        let (allow, deny) = stacked::shaping(&out[..n]);
        Ok(Batch {
            requests,
            admitted: u32::try_from(reply[0].clamp(0, i64::from(requests))).unwrap_or(0),
            allow_limit: allow,
            remaining: out[allow].remaining,
            reset_after_ms: out[allow].reset_after_ms,
            deny_limit: deny,
            deny_reset_after_ms: out[deny].reset_after_ms,
            retry_after_ms: out[deny].retry_after_ms,
            leased: 0,
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
