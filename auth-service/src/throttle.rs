//! The failed-login throttle: per user name and per client address, counted in Redis so every
//! replica sees the same counts.
//!
//! * **Counted before the password is checked.** `lua/login_attempt.lua` refuses an attempt
//!   whose counters are at their limits and otherwise counts it, in one script run, so N
//!   concurrent guesses cannot all slip past a check that each updates only after its Argon2
//!   verification. An attempt that turns out not to be a failure gives its one unit back
//!   (`lua/login_succeeded.lua`); earlier failures stay, so a success never resets a counter.
//! * **Fixed window** from a counter's first failure ([`ThrottleConfig::window`]). A refused
//!   attempt is not counted, so hammering a blocked name does not extend its block, and the
//!   429's `Retry-After` is exact: when the window ends.
//! * **Refused before any work**: a throttled attempt costs one script run, no Argon2 hash.
//! * **Redis down**: the login fails with 503 (it could not finish anyway: the refresh family
//!   needs Redis too), so the throttle never fails open.
//!
//! Keys: `auth:login:user:<name>` and `auth:login:ip:<address>`; IPv6 clients are counted per
//! /64 (`auth:login:ip:2001:db8:1:2::/64`), the block one subscriber usually gets. Names that
//! could never be a user (see [`crate::users::validate_username`]) get no per-name counter (a
//! login with one can never succeed) but count against their address like any other.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use gateway_redis::RedisConnection;
use redis::Script;

use crate::users::validate_username;

// One hash tag for every counter: an attempt counts on its name and its address in one
// script, which on Redis Cluster must stay in one slot. Failed logins are few; one slot
// (one master) holds them all.
const USER_PREFIX: &str = "auth:{login}:user:";
const IP_PREFIX: &str = "auth:{login}:ip:";

/// The throttle's limits (`--login-user-failures`, `--login-ip-failures`,
/// `--login-failure-window-secs`; defaults in [`crate::args`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// Failures per user name per window before 429; 0: no limit.
    pub user_failures: u32,
    /// Failures per client address (IPv6: /64) per window before 429; 0: no limit.
    pub ip_failures: u32,
    /// How long a counter lives from its first failure.
    pub window: Duration,
}

/// Redis failed or answered something unexpected.
#[derive(Debug, thiserror::Error)]
pub enum ThrottleError {
    /// Redis command failed (down, timeout, authentication, ...).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The script returned a shape this code does not know.
    #[error("unexpected reply from the login throttle script: {0:?}")]
    UnexpectedReply(Vec<i64>),
}

/// What the throttle says about a login attempt.
#[derive(Debug)]
pub enum Admission {
    /// Go ahead; report the outcome with [`LoginThrottle::not_a_failure`] unless it failed.
    Admitted(Attempt),
    /// A counter is at its limit: 429 until `retry_after` has passed.
    Refused {
        /// Until the longest blocking window ends (whole seconds, rounded up, at least 1).
        retry_after: Duration,
    },
}

/// An admitted attempt: the counters it was counted on.
#[derive(Debug)]
pub struct Attempt {
    keys: Vec<String>,
}

/// The failed-login counters in Redis.
#[derive(Clone)]
pub struct LoginThrottle {
    conn: RedisConnection,
    config: ThrottleConfig,
    attempt: Script,
    succeeded: Script,
}

impl std::fmt::Debug for LoginThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginThrottle")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The address a client is counted as: itself (IPv4, IPv4-mapped IPv6 as IPv4) or its /64.
fn counted_address(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let net = u128::from(v6) & (u128::MAX << 64);
                format!("{}/64", Ipv6Addr::from(net))
            }
        },
    }
}

impl LoginThrottle {
    /// Counters on the process's Redis connection.
    pub fn new(conn: RedisConnection, config: ThrottleConfig) -> Self {
        Self {
            conn,
            config,
            attempt: Script::new(include_str!("lua/login_attempt.lua")),
            succeeded: Script::new(include_str!("lua/login_succeeded.lua")),
        }
    }

    /// The limits.
    pub fn config(&self) -> ThrottleConfig {
        self.config
    }

    /// Counts a login attempt for `username` from `client`, or refuses it. With both limits
    /// off, Redis is not asked.
    pub async fn admit(&self, username: &str, client: IpAddr) -> Result<Admission, ThrottleError> {
        let mut keys = Vec::with_capacity(2);
        let mut limits = Vec::with_capacity(2);
        if self.config.user_failures > 0 && validate_username(username).is_ok() {
            keys.push(format!("{USER_PREFIX}{username}"));
            limits.push(self.config.user_failures);
        }
        if self.config.ip_failures > 0 {
            keys.push(format!("{IP_PREFIX}{}", counted_address(client)));
            limits.push(self.config.ip_failures);
        }
        if keys.is_empty() {
            return Ok(Admission::Admitted(Attempt { keys }));
        }
        let mut invocation = self.attempt.prepare_invoke();
        for key in &keys {
            invocation.key(key);
        }
        invocation.arg(u64::try_from(self.config.window.as_millis()).unwrap_or(u64::MAX));
        for limit in &limits {
            invocation.arg(limit);
        }
        let reply: Vec<i64> = invocation.invoke_async(&mut self.conn.clone()).await?;
        match reply[..] {
            [0, wait_ms] => Ok(Admission::Refused {
                retry_after: Duration::from_secs(
                    u64::try_from(wait_ms).unwrap_or(0).div_ceil(1000).max(1),
                ),
            }),
            [1, filled] => {
                for (i, key) in keys.iter().enumerate() {
                    if filled & (1 << i) != 0 {
                        // Once per counter and window: the moment it starts refusing.
                        tracing::warn!(
                            counter = %key,
                            limit = limits[i],
                            window_secs = self.config.window.as_secs(),
                            "failed-login limit reached: further logins refused with 429 until the window ends"
                        );
                    }
                }
                Ok(Admission::Admitted(Attempt { keys }))
            }
            _ => Err(ThrottleError::UnexpectedReply(reply)),
        }
    }

    /// Gives back the unit `attempt` was counted with: it was not a failed login (right
    /// password, or the user database failed). Earlier failures stay counted.
    pub async fn not_a_failure(&self, attempt: Attempt) -> Result<(), ThrottleError> {
        if attempt.keys.is_empty() {
            return Ok(());
        }
        let mut invocation = self.succeeded.prepare_invoke();
        for key in &attempt.keys {
            invocation.key(key);
        }
        let _: i64 = invocation.invoke_async(&mut self.conn.clone()).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{connection_manager, start_redis};

    fn config(user: u32, ip: u32, window_ms: u64) -> ThrottleConfig {
        ThrottleConfig {
            user_failures: user,
            ip_failures: ip,
            window: Duration::from_millis(window_ms),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    async fn admitted(t: &LoginThrottle, user: &str, client: &str) -> Option<Attempt> {
        match t.admit(user, ip(client)).await.unwrap() {
            Admission::Admitted(a) => Some(a),
            Admission::Refused { .. } => None,
        }
    }

    #[test]
    fn ipv6_clients_are_counted_per_64() {
        assert_eq!(counted_address(ip("192.0.2.7")), "192.0.2.7");
        assert_eq!(counted_address(ip("::ffff:192.0.2.7")), "192.0.2.7");
        assert_eq!(
            counted_address(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            counted_address(ip("2001:db8:1:2::1")),
            counted_address(ip("2001:db8:1:2:ffff::9"))
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_name_is_refused_after_its_limit_with_the_window_left() {
        let redis = start_redis().await;
        let t = LoginThrottle::new(connection_manager(&redis), config(3, 0, 60_000));
        for i in 0..3 {
            assert!(
                admitted(&t, "alice", &format!("192.0.2.{i}"))
                    .await
                    .is_some(),
                "failure {i} is admitted"
            );
        }
        match t.admit("alice", ip("198.51.100.1")).await.unwrap() {
            Admission::Refused { retry_after } => {
                assert!(
                    (Duration::from_secs(59)..=Duration::from_secs(60)).contains(&retry_after),
                    "{retry_after:?}"
                );
            }
            other => panic!("the 4th attempt on alice must be refused: {other:?}"),
        }
        // Another name is not affected; names that cannot exist are never counted per name.
        assert!(admitted(&t, "bob", "192.0.2.1").await.is_some());
        for _ in 0..5 {
            assert!(admitted(&t, "not a name", "192.0.2.1").await.is_some());
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_success_gives_back_only_its_own_unit() {
        let redis = start_redis().await;
        let t = LoginThrottle::new(connection_manager(&redis), config(0, 3, 60_000));
        // failure, failure, success, failure: three failures, so the next is refused.
        admitted(&t, "u1", "192.0.2.9").await.unwrap();
        admitted(&t, "u2", "192.0.2.9").await.unwrap();
        let ok = admitted(&t, "mallory", "192.0.2.9").await.unwrap();
        t.not_a_failure(ok).await.unwrap();
        admitted(&t, "u3", "192.0.2.9").await.unwrap();
        assert!(
            admitted(&t, "u4", "192.0.2.9").await.is_none(),
            "a success between failures must not reset the address's counter"
        );
        // A different address is counted apart.
        assert!(admitted(&t, "u4", "192.0.2.10").await.is_some());
    }

    /// Two replicas share one Redis: their counts add up, and concurrent attempts never pass
    /// the limit together.
    #[tokio::test(flavor = "multi_thread")]
    async fn replicas_share_counters_and_concurrent_attempts_cannot_overshoot() {
        let redis = start_redis().await;
        let a = LoginThrottle::new(connection_manager(&redis), config(5, 0, 60_000));
        let b = LoginThrottle::new(connection_manager(&redis), config(5, 0, 60_000));
        let tries = (0..40).map(|i| {
            let t = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { t.admit("carol", ip("192.0.2.1")).await.unwrap() })
        });
        let mut admitted = 0;
        for t in tries {
            if matches!(t.await.unwrap(), Admission::Admitted(_)) {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_window_ends_and_counting_starts_again() {
        let redis = start_redis().await;
        let t = LoginThrottle::new(connection_manager(&redis), config(1, 0, 300));
        admitted(&t, "dave", "192.0.2.1").await.unwrap();
        assert!(admitted(&t, "dave", "192.0.2.1").await.is_none());
        // Redis expires the counter on its own clock: wait for that, with a deadline.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while admitted(&t, "dave", "192.0.2.1").await.is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never admitted again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn limits_off_never_ask_redis_and_redis_down_is_an_error() {
        let mut redis = start_redis().await;
        let conn = connection_manager(&redis);
        redis.kill().await;
        let off = LoginThrottle::new(conn.clone(), config(0, 0, 1000));
        let attempt = admitted(&off, "erin", "192.0.2.1").await.unwrap();
        off.not_a_failure(attempt).await.unwrap();
        let on = LoginThrottle::new(conn, config(3, 3, 1000));
        assert!(matches!(
            on.admit("erin", ip("192.0.2.1")).await,
            Err(ThrottleError::Redis(_))
        ));
    }
}
