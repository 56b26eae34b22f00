//! The failed-login throttle, counted in Redis so every replica sees the same counts:
//!
//! * **per (user name, client address)** ([`ThrottleConfig::user_failures`]) and **per client
//!   address** ([`ThrottleConfig::ip_failures`]): past either limit the attempt is refused with
//!   429 before its password is checked. A name is never locked for everyone by someone else's
//!   wrong passwords (issue 41): only the address that failed on it is.
//! * **per user name, every address together** ([`ThrottleConfig::name_failures`]), the
//!   brute-force bound of one account: past it the name is slowed, not locked. At most one
//!   password check on it per [`ThrottleConfig::slowdown`] across every replica
//!   (`lua/login_slow.lua`); an attempt waits for its turn up to [`MAX_SLOWDOWN_WAIT`], else 429.
//!   So an attacker with any number of addresses gets at most `name_failures` guesses plus one
//!   per slot per window, and the owner's right password still gets in.
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
//! Keys: `auth:{login}:pair:<name>|<address>`, `auth:{login}:ip:<address>`,
//! `auth:{login}:user:<name>` and its slot `auth:{login}:slot:<name>`; IPv6 clients are counted
//! per /64 (`2001:db8:1:2::/64`), the block one subscriber usually gets. Names that could never
//! be a user (see [`crate::users::validate_username`]) get no per-name or per-pair counter (a
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
const SLOT_PREFIX: &str = "auth:{login}:slot:";
const PAIR_PREFIX: &str = "auth:{login}:pair:";
const IP_PREFIX: &str = "auth:{login}:ip:";

/// Longest an attempt on a slowed name waits for its turn before 429 (`Retry-After: 1`).
pub const MAX_SLOWDOWN_WAIT: Duration = Duration::from_secs(5);

/// The throttle's limits (`--login-user-failures`, `--login-ip-failures`,
/// `--login-name-failures`, `--login-slowdown-ms`, `--login-failure-window-secs`; defaults in
/// [`crate::args`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// Failures per (user name, client address) per window before 429; 0: no limit.
    pub user_failures: u32,
    /// Failures per user name from every address per window before the name is slowed; 0: never.
    pub name_failures: u32,
    /// While a name is slowed: one password check on it per this long.
    pub slowdown: Duration,
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
#[derive(Debug, Default)]
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
    slow: Script,
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
            slow: Script::new(include_str!("lua/login_slow.lua")),
        }
    }

    /// The limits.
    pub fn config(&self) -> ThrottleConfig {
        self.config
    }

    /// Counts a login attempt for `username` from `client`, or refuses it: the hard limits
    /// first (per pair, per address), then the name's bound, which may make the attempt wait
    /// for its turn. With every limit off, Redis is not asked.
    pub async fn admit(&self, username: &str, client: IpAddr) -> Result<Admission, ThrottleError> {
        let mut attempt = match self.admit_hard(username, client).await? {
            Admission::Admitted(attempt) => attempt,
            refused => return Ok(refused),
        };
        if self.config.name_failures == 0 || validate_username(username).is_err() {
            return Ok(Admission::Admitted(attempt));
        }
        let counter = format!("{USER_PREFIX}{username}");
        let slot = format!("{SLOT_PREFIX}{username}");
        let window = u64::try_from(self.config.window.as_millis()).unwrap_or(u64::MAX);
        let slowdown = u64::try_from(self.config.slowdown.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let give_up = tokio::time::Instant::now() + MAX_SLOWDOWN_WAIT;
        let mut warned = false;
        loop {
            let reply: Vec<i64> = self
                .slow
                .key(&counter)
                .key(&slot)
                .arg(window)
                .arg(self.config.name_failures)
                .arg(slowdown)
                .invoke_async(&mut self.conn.clone())
                .await?;
            match reply[..] {
                [1, _] => {
                    attempt.keys.push(counter);
                    return Ok(Admission::Admitted(attempt));
                }
                [0, wait_ms] => {
                    if !warned {
                        warned = true;
                        tracing::warn!(
                            user = username,
                            limit = self.config.name_failures,
                            slowdown_ms = slowdown,
                            "failed-login bound of a user name reached: its logins are slowed to one per slot"
                        );
                    }
                    let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1).max(1));
                    if tokio::time::Instant::now() + wait > give_up {
                        // Not a failure: give back the units counted on the pair and address.
                        self.not_a_failure(attempt).await?;
                        return Ok(Admission::Refused {
                            retry_after: Duration::from_secs(
                                wait.as_millis().div_ceil(1000).max(1) as u64,
                            ),
                        });
                    }
                    tokio::time::sleep(wait).await;
                }
                _ => return Err(ThrottleError::UnexpectedReply(reply)),
            }
        }
    }

    /// The hard limits: per (name, address) and per address.
    async fn admit_hard(&self, username: &str, client: IpAddr) -> Result<Admission, ThrottleError> {
        let mut keys = Vec::with_capacity(2);
        let mut limits = Vec::with_capacity(2);
        let address = counted_address(client);
        if self.config.user_failures > 0 && validate_username(username).is_ok() {
            keys.push(format!("{PAIR_PREFIX}{username}|{address}"));
            limits.push(self.config.user_failures);
        }
        if self.config.ip_failures > 0 {
            keys.push(format!("{IP_PREFIX}{address}"));
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
            name_failures: 0,
            slowdown: Duration::from_secs(1),
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
    async fn a_name_is_refused_from_an_address_after_its_limit_with_the_window_left() {
        let redis = start_redis().await;
        let t = LoginThrottle::new(connection_manager(&redis), config(3, 0, 60_000));
        for i in 0..3 {
            assert!(
                admitted(&t, "alice", "192.0.2.1").await.is_some(),
                "failure {i} is admitted"
            );
        }
        // Issue 41: the name is refused from that address only, never locked for everyone.
        assert!(admitted(&t, "alice", "198.51.100.1").await.is_some());
        match t.admit("alice", ip("192.0.2.1")).await.unwrap() {
            Admission::Refused { retry_after } => {
                assert!(
                    (Duration::from_secs(59)..=Duration::from_secs(60)).contains(&retry_after),
                    "{retry_after:?}"
                );
            }
            other => panic!("the 4th attempt on alice from one address must be refused: {other:?}"),
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

    /// Issue 41: past the name's bound its attempts are slowed to one per slot across replicas,
    /// never refused while their turn comes within the wait, and never locked.
    #[tokio::test(flavor = "multi_thread")]
    async fn past_the_names_bound_attempts_are_slowed_to_one_per_slot_not_refused() {
        let redis = start_redis().await;
        let mut cfg = config(0, 0, 60_000);
        cfg.name_failures = 2;
        cfg.slowdown = Duration::from_millis(400);
        let a = LoginThrottle::new(connection_manager(&redis), cfg);
        let b = LoginThrottle::new(connection_manager(&redis), cfg);
        // Under the bound: at once, from anywhere.
        admitted(&a, "frank", "192.0.2.1").await.unwrap();
        admitted(&b, "frank", "192.0.2.2").await.unwrap();
        // Past it: four concurrent attempts on two replicas each get a turn, one per slot.
        let started = tokio::time::Instant::now();
        let tries = (0..4).map(|i| {
            let t = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let r = t
                    .admit("frank", ip(&format!("198.51.100.{i}")))
                    .await
                    .unwrap();
                (matches!(r, Admission::Admitted(_)), started.elapsed())
            })
        });
        let mut times = Vec::new();
        for t in tries {
            let (ok, at) = t.await.unwrap();
            assert!(ok, "a slowed attempt is admitted in its turn");
            times.push(at);
        }
        times.sort_unstable();
        // The slots are Redis's: the 4th turn comes at least three slots after the first.
        assert!(
            times[3] >= Duration::from_millis(3 * 400),
            "one check per slot: {times:?}"
        );
        // Another name is not slowed (its counter is under the bound).
        admitted(&a, "grace", "192.0.2.1").await.unwrap();
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
