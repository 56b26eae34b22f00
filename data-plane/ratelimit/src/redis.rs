//! Shared budgets in Redis: one atomic Lua script per decision (or per batch
//! of merged concurrent decisions of one key, see [`crate::merge`]) over one
//! multiplexed connection per process.
//!
//! Scripts run with `EVALSHA`; [`redis::Script`] reloads a script with
//! `SCRIPT LOAD` and retries once when Redis answers `NOSCRIPT` (after a
//! restart or a `SCRIPT FLUSH`; on a Cluster the load goes to every master),
//! so callers never see that error. The connection is a
//! [`gateway_redis::RedisConnection`]: one Redis, the master Sentinel names,
//! or a Cluster, connected lazily, so building the limiter never waits on Redis.
//!
//! # Keys and slots (Redis Cluster)
//! A budget's key is `rl:{<subject>}:<policy>` ([`Policy::redis_key`]): the
//! subject is the hash tag, so on a Cluster every budget of one subject (one
//! user, one address, one route, one header value) lives in one slot, on one
//! master, whatever the policy.
//!
//! * A single limit's script touches its one key: it works on any slot.
//! * Stacked limits of one subject (say 10 per second and 1,000 per hour per
//!   user) share a slot: one `stacked.lua` run decides them all or nothing,
//!   exactly as on one Redis.
//! * Stacked limits of different subjects (per user and per address) hash to
//!   different slots, which no script can span (`CROSSSLOT`). The decision is
//!   then split ([`RedisStore::decide_stacked`]): the keys are grouped by slot
//!   and `stacked.lua` runs on each group in turn, in the order of the route's
//!   limits, each asked only for what the groups before it admitted; a group
//!   that admits nothing ends the decision. Each run is atomic, so **no limit
//!   ever admits more than it allows, and a request is admitted only when every
//!   group admitted it**: the decision never admits more than its tightest
//!   limit. What a group spent for requests a later group refused is given
//!   back at once (`refund.lua`). Between the spend and the refund (one round
//!   trip) those tokens are held, so a concurrent request may be refused that
//!   the all-or-nothing rule would have admitted; if the refund cannot be sent
//!   (Redis failed), the tokens stay spent until the budget refills. Both err
//!   towards refusing. A token bucket gets back its tokens less the refill
//!   since the spend, never more than the spend still weighs.
//!
//! On one Redis (or Sentinel's master) every run holds every key, as before.

use redis::cluster_routing::Slot;
use redis::{ErrorKind, RedisError, RedisResult, Script};

use gateway_redis::RedisConnection;

use crate::merge::Batch;
use crate::policy::{Algorithm, Policy};
use crate::stacked::{self, LimitOutcome, MAX_STACKED};

/// The token-bucket script (see the file for the arithmetic).
pub const TOKEN_BUCKET_LUA: &str = include_str!("token_bucket.lua");
/// The fixed-window script.
pub const FIXED_WINDOW_LUA: &str = include_str!("fixed_window.lua");
/// The stacked-limits script (N budgets, all or nothing; also a lone sliding window).
pub const STACKED_LUA: &str = include_str!("stacked.lua");
/// Gives back what one slot's part of a split stacked decision spent and did not use.
pub const REFUND_LUA: &str = include_str!("refund.lua");

/// Budgets in Redis.
#[derive(Clone)]
pub(crate) struct RedisStore {
    conn: RedisConnection,
    token_bucket: Script,
    fixed_window: Script,
    stacked: Script,
    refund: Script,
}

/// One `stacked.lua` run: requests admitted, each member limit's figures, Redis's time.
struct Run {
    admitted: u32,
    outcomes: [LimitOutcome; MAX_STACKED],
    now_ms: u64,
}

impl RedisStore {
    /// Budgets over `conn` (one Redis, Sentinel or Cluster; plain or TLS, with
    /// or without a password: the connection carries all of it).
    pub(crate) fn new(conn: RedisConnection) -> Self {
        Self {
            conn,
            token_bucket: Script::new(TOKEN_BUCKET_LUA),
            fixed_window: Script::new(FIXED_WINDOW_LUA),
            stacked: Script::new(STACKED_LUA),
            refund: Script::new(REFUND_LUA),
        }
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
    /// `keys[i]`. At most [`MAX_STACKED`] limits. On a Cluster, keys on
    /// different slots are decided group by group (see the module documentation).
    pub(crate) async fn decide_stacked<K: AsRef<[u8]>>(
        &self,
        policies: &[Policy],
        keys: &[K],
        requests: u32,
    ) -> RedisResult<Batch> {
        let n = policies.len().min(keys.len()).min(MAX_STACKED);
        let (policies, keys) = (&policies[..n], &keys[..n]);
        if self.conn.is_cluster() {
            let groups = slot_groups(keys);
            if groups.len() > 1 {
                return self.decide_split(policies, keys, &groups, requests).await;
            }
        }
        let all: Vec<usize> = (0..n).collect();
        let run = self.run_stacked(policies, keys, &all, requests).await?;
        Ok(stacked_batch(requests, run.admitted, &run.outcomes[..n]))
    }

    /// Stacked limits whose keys lie on several slots: one run per slot, each
    /// asked for what the ones before admitted, then the surplus given back.
    async fn decide_split<K: AsRef<[u8]>>(
        &self,
        policies: &[Policy],
        keys: &[K],
        groups: &[Vec<usize>],
        requests: u32,
    ) -> RedisResult<Batch> {
        let n = policies.len();
        // A limit never asked (a group before it admitted nothing) refused nothing.
        let mut out = [LimitOutcome::default(); MAX_STACKED];
        for (o, p) in out.iter_mut().zip(policies) {
            o.remaining = u64::from(p.limit());
        }
        let mut admitted = requests;
        let mut spent: Vec<(&[usize], u32, u64)> = Vec::with_capacity(groups.len());
        for group in groups {
            if admitted == 0 {
                break;
            }
            match self.run_stacked(policies, keys, group, admitted).await {
                Ok(run) => {
                    for (j, &i) in group.iter().enumerate() {
                        out[i] = run.outcomes[j];
                    }
                    if run.admitted > 0 {
                        spent.push((group, run.admitted, run.now_ms));
                    }
                    admitted = run.admitted;
                }
                Err(error) => {
                    // This decision goes local: nothing it spent may stay spent.
                    for (group, took, at) in spent {
                        self.give_back(policies, keys, group, took, at).await;
                    }
                    return Err(error);
                }
            }
        }
        for (group, took, at) in spent {
            let surplus = took - admitted;
            if surplus == 0 {
                continue;
            }
            self.give_back(policies, keys, group, surplus, at).await;
            for &i in group {
                out[i].remaining += u64::from(surplus);
                out[i].retry_after_ms = 0;
            }
        }
        Ok(stacked_batch(requests, admitted, &out[..n]))
    }

    /// One `stacked.lua` run over the limits `members` (indexes into
    /// `policies` and `keys`, every key on one slot).
    async fn run_stacked<K: AsRef<[u8]>>(
        &self,
        policies: &[Policy],
        keys: &[K],
        members: &[usize],
        requests: u32,
    ) -> RedisResult<Run> {
        let m = members.len();
        let mut invocation = self.stacked.prepare_invoke();
        for &i in members {
            invocation.key(keys[i].as_ref());
        }
        invocation.arg(requests);
        for &i in members {
            let policy = &policies[i];
            invocation
                .arg(code(policy.algorithm()))
                .arg(policy.limit())
                .arg(policy.window_ms());
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
        if reply.len() != 2 + 3 * m {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "stacked.lua answered an unexpected number of values",
            )));
        }
        let mut outcomes = [LimitOutcome::default(); MAX_STACKED];
        for (j, o) in outcomes[..m].iter_mut().enumerate() {
            *o = LimitOutcome {
                remaining: clamp(reply[1 + 3 * j]),
                reset_after_ms: clamp(reply[2 + 3 * j]),
                retry_after_ms: clamp(reply[3 + 3 * j]),
            };
        }
        Ok(Run {
            admitted: u32::try_from(reply[0].clamp(0, i64::from(requests))).unwrap_or(0),
            outcomes,
            now_ms: clamp(reply[1 + 3 * m]),
        })
    }

    /// `refund.lua`: gives `requests` back to the limits `members`, spent at
    /// `spent_at_ms` (Redis's time). A failure leaves them spent (errs towards
    /// refusing) and is only logged.
    async fn give_back<K: AsRef<[u8]>>(
        &self,
        policies: &[Policy],
        keys: &[K],
        members: &[usize],
        requests: u32,
        spent_at_ms: u64,
    ) {
        let mut invocation = self.refund.prepare_invoke();
        for &i in members {
            invocation.key(keys[i].as_ref());
        }
        invocation.arg(requests).arg(spent_at_ms);
        for &i in members {
            let policy = &policies[i];
            invocation
                .arg(code(policy.algorithm()))
                .arg(policy.limit())
                .arg(policy.window_ms());
        }
        let mut conn = self.conn.clone();
        if let Err(error) = invocation.invoke_async::<i64>(&mut conn).await {
            tracing::debug!(%error, requests, "rate-limit refund failed; those tokens stay spent");
        }
    }

    /// `PING`: is Redis reachable again? On a Cluster, `CLUSTER INFO` must
    /// also say `cluster_state:ok` (a master down means some slots answer
    /// nothing; until the cluster agrees it is whole again, decisions stay local).
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        if self.conn.is_cluster() {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return Err(RedisError::from((
                    ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
                    "cluster_state is not ok",
                )));
            }
            return Ok(());
        }
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }
}

/// The script's code of an algorithm.
fn code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::TokenBucket => 0,
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindow => 2,
    }
}

/// Indexes of `keys` grouped by Cluster slot, groups in the order of their first key.
fn slot_groups<K: AsRef<[u8]>>(keys: &[K]) -> Vec<Vec<usize>> {
    let mut slots: Vec<Slot> = Vec::with_capacity(keys.len());
    let mut groups: Vec<Vec<usize>> = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key.as_ref());
        match slots.iter().position(|s| *s == slot) {
            Some(g) => groups[g].push(i),
            None => {
                slots.push(slot);
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// The batch of a stacked decision: `admitted` of `requests`, with every limit's figures.
fn stacked_batch(requests: u32, admitted: u32, out: &[LimitOutcome]) -> Batch {
    let (allow, deny) = stacked::shaping(out);
    Batch {
        requests,
        admitted,
        allow_limit: allow,
        remaining: out[allow].remaining,
        reset_after_ms: out[allow].reset_after_ms,
        deny_limit: deny,
        deny_reset_after_ms: out[deny].reset_after_ms,
        retry_after_ms: out[deny].retry_after_ms,
        leased: 0,
    }
}

fn clamp(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
