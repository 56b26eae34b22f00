//! The public limiter: shared budgets in Redis when it answers in time, the
//! replica-local limiter when it does not.
//!
//! Per decision: a known recent denial is answered from the "denied until"
//! cache; otherwise, unless the breaker is open, one Lua script runs in Redis
//! under a deadline of a few milliseconds — one run for all the concurrent
//! requests of a key ([`crate::merge`]). A timeout or error makes this one
//! decision local and counts towards the breaker. While the breaker is open no
//! request waits on Redis; a background task pings it every `breaker_open_for`
//! and closes the breaker when it answers, so shared limiting resumes by itself.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use crate::algorithm::Outcome;
use crate::breaker::Breaker;
use crate::deadline::{Elapsed, within_deadline};
use crate::deny_cache::DenyCache;
use crate::headers::{Decision, Source};
use crate::lease::{LeaseSettings, Leases, RunAnswer};
use crate::local::LocalLimiter;
use crate::merge::{Batch, Lead, Merger, Role, Turn};
use crate::policy::Policy;
use crate::redis::RedisStore;
use crate::stacked::MAX_STACKED;
use crate::stats::{Stats, StatsSnapshot};

/// Tuning of [`RateLimiter`]. Every default is written down here, in [`Default`].
#[derive(Debug, Clone)]
pub struct RateLimiterOptions {
    /// Longest a request waits for Redis before deciding locally. Default 5 ms:
    /// a loopback or same-zone round trip takes well under 1 ms. A request
    /// merged with others of its key ([`crate::merge`]) waits for the run in
    /// flight and then its own, and a run with followers may outlive its
    /// leader's deadline by one more of these (so its followers still get
    /// Redis's verdicts after a stall): at most four times this, on a Redis
    /// stall only.
    pub decision_timeout: Duration,
    /// Consecutive Redis failures or timeouts that open the breaker. Default 3.
    pub breaker_failure_threshold: u32,
    /// ... and how long that streak of failures must have lasted. Default 50 ms:
    /// a momentary CPU stall that makes every in-flight decision miss its
    /// deadline at once must not make the replica local for a whole second.
    pub breaker_min_failure_span: Duration,
    /// While open, how often Redis is probed (so also the longest the breaker
    /// stays open after Redis is back). Default 1 s.
    pub breaker_open_for: Duration,
    /// Bound on one probe (a `PING`, possibly including a reconnect). Default 500 ms.
    pub probe_timeout: Duration,
    /// Bound on one TCP connect to Redis. Default 500 ms.
    pub connect_timeout: Duration,
    /// Most budgets the local limiter tracks. Default 100 000.
    pub local_max_keys: usize,
    /// Most keys the "denied until" cache remembers; 0 disables it. Default 100 000.
    pub deny_cache_max_keys: usize,
    /// Most tokens a replica leases from a busy key's shared budget ahead of
    /// demand, to decide that key's next requests without Redis
    /// ([`crate::lease`]); 0 disables leasing (every decision asks Redis).
    /// Default 1,000.
    pub lease_max_tokens: u32,
    /// A lease is sized by the key's demand over this period and lives at
    /// most this long. Default 100 ms.
    pub lease_period: Duration,
    /// Most keys holding a lease. Default 100 000.
    pub lease_max_keys: usize,
}

impl Default for RateLimiterOptions {
    fn default() -> Self {
        Self {
            decision_timeout: Duration::from_millis(5),
            breaker_failure_threshold: 3,
            breaker_min_failure_span: Duration::from_millis(50),
            breaker_open_for: Duration::from_secs(1),
            probe_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            local_max_keys: 100_000,
            deny_cache_max_keys: 100_000,
            lease_max_tokens: 1_000,
            lease_period: Duration::from_millis(100),
            lease_max_keys: 100_000,
        }
    }
}

/// Why a limiter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RateLimitError {
    /// The Redis URL given to [`RateLimiter::new`] is refused (the message
    /// shows it redacted, with the reason).
    #[error("invalid rate-limit Redis URL {0}")]
    InvalidRedisUrl(#[source] gateway_redis::RedisUrlError),
    /// The Redis client cannot be set up (the message never holds the password).
    #[error("rate-limit Redis: {0}")]
    Redis(#[source] gateway_redis::RedisTargetError),
    /// [`RateLimiter::new`] was called outside a Tokio runtime.
    #[error("the rate limiter must be created inside a Tokio runtime (it spawns its Redis prober)")]
    NoRuntime,
}

/// Decides whether requests fit their policy's budget. One per process:
/// share it behind an `Arc`. Dropping it stops its background prober.
pub struct RateLimiter {
    inner: Arc<Inner>,
    prober: Option<JoinHandle<()>>,
}

struct Inner {
    options: RateLimiterOptions,
    shared: Option<Shared>,
    local: LocalLimiter,
    stats: Stats,
    /// Monotonic clock of local decisions, offset to wall-clock milliseconds
    /// so local fixed windows line up (roughly) with Redis's.
    started: Instant,
    started_epoch_ms: u64,
}

struct Shared {
    store: RedisStore,
    breaker: Arc<Breaker>,
    deny_cache: Option<DenyCache>,
    leases: Leases,
    merger: Merger,
}

impl RateLimiter {
    /// Builds a limiter. With `redis_url` (any URL `gateway_redis::RedisUrl`
    /// accepts: one Redis, Sentinel or Cluster, password allowed), budgets are
    /// shared through it; without, every decision is local (one replica, or
    /// tests). For TLS with a custom CA, use [`RateLimiter::with_target`].
    ///
    /// Never waits on Redis: the connection is opened in the background and
    /// decisions are local until it is up. Must be called inside a Tokio
    /// runtime; the connection's I/O runs on that runtime.
    pub fn new(
        redis_url: Option<String>,
        options: RateLimiterOptions,
    ) -> Result<Self, RateLimitError> {
        let target = redis_url
            .map(|url| {
                let url = gateway_redis::RedisUrl::parse(&url)
                    .map_err(RateLimitError::InvalidRedisUrl)?;
                gateway_redis::RedisTarget::new(url, None).map_err(RateLimitError::Redis)
            })
            .transpose()?;
        Self::with_target(target.as_ref(), options)
    }

    /// Like [`RateLimiter::new`], with a ready target (e.g. a `rediss://` one
    /// trusting a private CA, from `gateway-redis`).
    pub fn with_target(
        redis: Option<&gateway_redis::RedisTarget>,
        options: RateLimiterOptions,
    ) -> Result<Self, RateLimitError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RateLimitError::NoRuntime);
        }
        let connect = gateway_redis::ConnectOptions {
            connect_timeout: options.connect_timeout,
            // Bound on one command inside the client; decisions have their own, shorter deadline.
            response_timeout: options.probe_timeout.max(options.decision_timeout),
            // Reconnects are driven by our probes; the client itself should give
            // up fast instead of backing off for seconds. Two: a Cluster's
            // MOVED or ASK redirect is one retry.
            retries: 2,
            min_retry_delay: Duration::from_millis(20),
            max_retry_delay: Duration::from_millis(200),
        };
        let conn = redis
            .map(|target| target.connect(&connect))
            .transpose()
            .map_err(RateLimitError::Redis)?;
        let shared = match conn {
            None => None,
            Some(conn) => {
                let store = RedisStore::new(conn);
                Some(Shared {
                    store,
                    // Open until the first probe connects, so no request waits on the connect.
                    breaker: Arc::new(Breaker::new(
                        options.breaker_failure_threshold,
                        options.breaker_min_failure_span.as_millis() as u64,
                        true,
                    )),
                    deny_cache: (options.deny_cache_max_keys > 0)
                        .then(|| DenyCache::new(options.deny_cache_max_keys)),
                    leases: Leases::new(
                        LeaseSettings {
                            max_tokens: options.lease_max_tokens,
                            period: options.lease_period,
                        },
                        options.lease_max_keys,
                    ),
                    merger: Merger::default(),
                })
            }
        };
        let started_epoch_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let inner = Arc::new(Inner {
            local: LocalLimiter::new(options.local_max_keys),
            options,
            shared,
            stats: Stats::default(),
            started: Instant::now(),
            started_epoch_ms,
        });
        let prober = inner.shared.as_ref().map(|shared| {
            inner.stats.breaker_opened_quietly();
            tokio::spawn(probe_loop(
                Arc::downgrade(&inner),
                Arc::clone(&shared.breaker),
            ))
        });
        Ok(Self { inner, prober })
    }

    /// Decides one request of `subject` (a user id or client IP; any bytes)
    /// under `policy`.
    ///
    /// Always returns within about `decision_timeout`; never fails: when Redis
    /// cannot decide, the local limiter does ([`Source::Local`]).
    pub async fn check(&self, policy: &Policy, subject: impl AsRef<[u8]>) -> Decision {
        self.check_one(policy, subject.as_ref()).await
    }

    /// Decides one request under every limit of `limits` (policy, subject) at
    /// once, all or nothing: it is admitted only if every limit admits it, and
    /// only then does it spend from each, so a request refused by one limit
    /// burns no other budget. With Redis this is one run of `stacked.lua`
    /// (concurrent requests of one key set are merged like single ones); the
    /// local fallback applies the same rule.
    ///
    /// Returns the index of the limit that describes the verdict (see
    /// [`crate::stacked::shaping`]: the most restrictive one when admitted, the
    /// refusing one with the longest wait when refused) and the decision under
    /// it. Same deadline and fallback as [`RateLimiter::check`].
    ///
    /// # Panics
    /// If `limits` is empty, holds more than [`MAX_STACKED`] entries, or names
    /// one policy twice.
    pub async fn check_all(&self, limits: &[(&Policy, &[u8])]) -> (usize, Decision) {
        assert!(
            (1..=MAX_STACKED).contains(&limits.len()),
            "1 to {MAX_STACKED} limits"
        );
        debug_assert!(
            limits
                .iter()
                .enumerate()
                .all(|(i, (p, _))| limits[..i].iter().all(|(q, _)| q.name() != p.name())),
            "stacked policies must be distinct"
        );
        match limits {
            [(policy, subject)] => (0, self.check_one(policy, subject).await),
            _ => self.check_stacked(limits).await,
        }
    }

    /// One limit: the hot path, kept apart from the stacked one so that its
    /// future stays as small (and as fast to set up) as it was.
    async fn check_one(&self, policy: &Policy, subject: &[u8]) -> Decision {
        let inner = &*self.inner;
        let Some(shared) = &inner.shared else {
            return inner.local_one(policy, subject);
        };
        let now = inner.now_ms();
        // Tokens Redis already admitted for this replica: no round trip. They
        // were spent from the shared budget when leased, so they stay good
        // after Redis has refused others (the denied-until cache) or gone away.
        if let Some(outcome) = shared.leases.take(policy, subject, now) {
            inner.stats.leased();
            inner.stats.decision(Source::Shared, true);
            return Decision::from_outcome(policy, outcome, Source::Shared);
        }
        if let Some(cache) = &shared.deny_cache
            && let Some(outcome) = cache.get(policy, subject, now)
        {
            inner.stats.deny_cache_hit();
            inner.stats.decision(Source::Shared, false);
            return Decision::from_outcome(policy, outcome, Source::Shared);
        }
        if shared.breaker.is_open() {
            inner.stats.fallback();
            return inner.local_one(policy, subject);
        }
        let key = policy.redis_key(subject);
        let lead = match shared.merger.join(&key) {
            Role::Lead(lead) => lead,
            Role::Alone => shared.merger.lead_alone(key),
            // Queued behind the run in flight, then decided by the next one: up to two runs.
            Role::Queued(queued) => match queued.wait().await {
                Some(Turn::Decided(outcome, _)) => {
                    inner.stats.merged();
                    inner.stats.decision(Source::Shared, outcome.allowed);
                    return Decision::from_outcome(policy, outcome, Source::Shared);
                }
                Some(Turn::Lead(followers)) => shared.merger.lead(key, followers),
                // The run this request waited for failed (and was counted by its leader).
                Some(Turn::Failed) => {
                    inner.stats.fallback();
                    return inner.local_one(policy, subject);
                }
                None => {
                    inner.stats.redis_timeout();
                    inner.stats.fallback();
                    return inner.local_one(policy, subject);
                }
            },
        };
        // A batch's run must outlive its leader's deadline: its followers have
        // later deadlines of their own. So a run with followers is an owned
        // future (boxed: batches only, a lone request's run stays on the stack);
        // when the leader gives up on it, it goes on in a task of its own.
        //
        // A busy key asks for a lease on top of its batch ([`crate::lease`]).
        // If the leader gives up on the run, the tokens it leased are lost (the
        // shared budget errs towards refusing).
        let timeout = inner.options.decision_timeout;
        let sent_ms = inner.now_ms();
        let extra = shared.leases.extra(policy, subject, sent_ms);
        let result = if lead.requests() > 1 {
            run_owned(&self.inner, Call::One(policy.clone(), extra), lead, timeout).await
        } else {
            within_deadline(timeout, run_batch(inner, Call::One(policy, extra), lead)).await
        };
        if let Ok(Ok((batch, _))) = &result {
            let answer = RunAnswer {
                requests: batch.requests,
                leased: batch.leased,
                remaining: batch.remaining - u64::from(batch.leased),
                reset_after_ms: batch.reset_after_ms,
            };
            inner.stats.lease_taken(batch.leased);
            shared
                .leases
                .record(policy, subject, answer, sent_ms, inner.now_ms());
        }
        inner.settle(shared, &[(policy, subject)], result).1
    }

    /// Stacked limits (two or more): one run of `stacked.lua` over every key.
    async fn check_stacked(&self, limits: &[(&Policy, &[u8])]) -> (usize, Decision) {
        let inner = &*self.inner;
        let Some(shared) = &inner.shared else {
            return inner.local(limits);
        };
        if let Some(cache) = &shared.deny_cache {
            // A limit Redis refused moments ago still refuses: no round trip.
            let now = inner.now_ms();
            let mut known: Option<(usize, Outcome)> = None;
            for (i, (policy, subject)) in limits.iter().enumerate() {
                if let Some(o) = cache.get(policy, subject, now)
                    && known.is_none_or(|(_, k)| o.retry_after_ms > k.retry_after_ms)
                {
                    known = Some((i, o));
                }
            }
            if let Some((i, outcome)) = known {
                inner.stats.deny_cache_hit();
                inner.stats.decision(Source::Shared, false);
                return (
                    i,
                    Decision::from_outcome(limits[i].0, outcome, Source::Shared),
                );
            }
        }
        if shared.breaker.is_open() {
            inner.stats.fallback();
            return inner.local(limits);
        }
        // Every key, length-prefixed (the "rl*" prefix keeps it apart from any
        // single key), so that concurrent requests of one key set merge.
        let keys: Vec<Vec<u8>> = limits.iter().map(|(p, s)| p.redis_key(s)).collect();
        let mut key = b"rl*".to_vec();
        for k in &keys {
            key.extend_from_slice(&(k.len() as u32).to_be_bytes());
            key.extend_from_slice(k);
        }
        let lead = match shared.merger.join(&key) {
            Role::Lead(lead) => lead,
            Role::Alone => shared.merger.lead_alone(key),
            // Queued behind the run in flight, then decided by the next one: up to two runs.
            Role::Queued(queued) => match queued.wait().await {
                Some(Turn::Decided(outcome, i)) => {
                    inner.stats.merged();
                    inner.stats.decision(Source::Shared, outcome.allowed);
                    return (
                        i,
                        Decision::from_outcome(limits[i].0, outcome, Source::Shared),
                    );
                }
                Some(Turn::Lead(followers)) => shared.merger.lead(key, followers),
                // The run this request waited for failed (and was counted by its leader).
                Some(Turn::Failed) => {
                    inner.stats.fallback();
                    return inner.local(limits);
                }
                None => {
                    inner.stats.redis_timeout();
                    inner.stats.fallback();
                    return inner.local(limits);
                }
            },
        };
        let policies = limits.iter().map(|(p, _)| (*p).clone()).collect();
        let call = Call::Stacked(policies, keys);
        let result = run_owned(&self.inner, call, lead, inner.options.decision_timeout).await;
        inner.settle(shared, limits, result)
    }

    /// True when decisions currently go to Redis (configured, connected, breaker closed).
    pub fn is_shared(&self) -> bool {
        self.inner
            .shared
            .as_ref()
            .is_some_and(|s| !s.breaker.is_open())
    }

    /// A copy of the counters, for `/metrics`.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// The options in force.
    pub fn options(&self) -> &RateLimiterOptions {
        &self.inner.options
    }
}

impl Drop for RateLimiter {
    fn drop(&mut self) {
        if let Some(prober) = self.prober.take() {
            prober.abort();
        }
    }
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("redis", &self.inner.shared.is_some())
            .field("shared", &self.is_shared())
            .field("options", &self.inner.options)
            .finish()
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.started_epoch_ms + self.started.elapsed().as_millis() as u64
    }

    fn local_one(&self, policy: &Policy, subject: &[u8]) -> Decision {
        let outcome = self.local.check_at(policy, subject, self.now_ms());
        self.stats.decision(Source::Local, outcome.allowed);
        Decision::from_outcome(policy, outcome, Source::Local)
    }

    fn local(&self, limits: &[(&Policy, &[u8])]) -> (usize, Decision) {
        let now = self.now_ms();
        let (i, outcome) = match limits {
            [(policy, subject)] => (0, self.local.check_at(policy, subject, now)),
            _ => self.local.check_all_at(limits, now),
        };
        self.stats.decision(Source::Local, outcome.allowed);
        (
            i,
            Decision::from_outcome(limits[i].0, outcome, Source::Local),
        )
    }

    /// The verdict of a run this request led (or waited for in vain).
    fn settle(
        &self,
        shared: &Shared,
        limits: &[(&Policy, &[u8])],
        result: RunResult,
    ) -> (usize, Decision) {
        match result {
            Ok(Ok((batch, (i, outcome)))) => {
                if batch.admitted < batch.requests
                    && let Some(cache) = &shared.deny_cache
                {
                    // The refusing limit is spent until then, for this key (set) and any other.
                    let (d, denied) = batch.verdict(batch.requests - 1);
                    let (policy, subject) = limits[d];
                    cache.insert(policy, subject, &denied, self.now_ms());
                }
                self.stats.decision(Source::Shared, outcome.allowed);
                (
                    i,
                    Decision::from_outcome(limits[i].0, outcome, Source::Shared),
                )
            }
            // The run failed (and counted it): every request of the batch decides locally.
            Ok(Err(RunFailed)) => {
                self.stats.fallback();
                self.local(limits)
            }
            // This request's deadline passed. A lone run is dropped (cancelled);
            // a batch's run goes on for the followers and, when it ends, records
            // its success or failure with the breaker like any other.
            Err(_elapsed) => {
                self.stats.redis_timeout();
                self.trip(shared);
                self.stats.fallback();
                self.local(limits)
            }
        }
    }

    fn trip(&self, shared: &Shared) {
        if shared.breaker.record_failure(self.now_ms()) {
            self.stats.breaker_opened();
            tracing::warn!(
                retry_every = ?self.options.breaker_open_for,
                "rate-limit Redis unavailable; limits are replica-local until it answers again"
            );
        }
    }

    /// One probe: `PING`, twice if needed, since the first attempt on a dead
    /// connection only starts the reconnect. `Err` says why Redis did not
    /// answer (refused credentials, an untrusted certificate, a timeout…);
    /// the redis crate's messages never contain the URL or its password.
    async fn probe(&self, shared: &Shared) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..2 {
            match timeout(self.options.probe_timeout, shared.store.ping()).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(error)) => last = error.to_string(),
                Err(_) => last = format!("no answer within {:?}", self.options.probe_timeout),
            }
        }
        Err(last)
    }
}

/// The run of one batch failed (counted, and its followers told, by [`run_batch`]).
#[derive(Debug)]
struct RunFailed;

/// A run's verdict within the leader's deadline: the batch and the leader's
/// own (limit, outcome), the run's failure, or the deadline passing.
type RunResult = Result<Result<(Batch, (usize, Outcome)), RunFailed>, Elapsed>;

/// What a run asks Redis.
enum Call<P> {
    /// One limit (its key is the lead's), and the tokens to lease beyond the batch.
    One(P, u32),
    /// Stacked limits and their keys.
    Stacked(Vec<Policy>, Vec<Vec<u8>>),
}

/// Runs a batch's script as an owned future within the leader's deadline;
/// if the deadline passes, the run goes on in a task of its own, for the
/// followers, for at most one more `timeout`: then it is dropped, and its
/// [`Lead`]'s `Drop` tells the followers to decide locally and hands the key
/// on. That bound is what lets followers wait without a timer of their own
/// (one timer per batch instead of one per request: a follower's tokio timer
/// woke the I/O driver through its eventfd on most full-route requests,
/// BENCHMARKS.md).
async fn run_owned(
    inner: &Arc<Inner>,
    call: Call<Policy>,
    lead: Lead,
    timeout: Duration,
) -> RunResult {
    let followers = lead.requests() > 1;
    let mut run = Box::pin(run_batch(Arc::clone(inner), call, lead));
    let result = within_deadline(timeout, &mut run).await;
    if result.is_err() && followers {
        // Like every decision deadline, tolerant of the wake-up order after a stall.
        tokio::spawn(async move {
            let _ = within_deadline(timeout, run).await;
        });
    }
    result
}

/// One script run deciding `lead`'s batch: tells the followers their verdicts
/// (or, on failure, to decide locally), hands the key on, and keeps the
/// breaker and counters honest. Returns the batch and the leader's own verdict.
///
/// Generic over how it holds the limiter and the policy so that a lone
/// request borrows them (no allocation) while a batch's run owns them
/// (`Arc<Inner>`, a `Policy` clone) and can go on without its leader.
async fn run_batch<I, P>(
    inner: I,
    call: Call<P>,
    lead: Lead,
) -> Result<(Batch, (usize, Outcome)), RunFailed>
where
    I: std::ops::Deref<Target = Inner>,
    P: std::borrow::Borrow<Policy>,
{
    let Some(shared) = &inner.shared else {
        return Err(RunFailed);
    };
    // Measured to the answer or the error; a run abandoned at a lone
    // request's deadline is dropped unmeasured (counted as a timeout instead).
    let sent = Instant::now();
    let answer = match &call {
        Call::One(policy, extra) => {
            shared
                .store
                .decide(policy.borrow(), lead.key(), lead.requests(), *extra)
                .await
        }
        // Boxed: the single-limit run's future stays as small as it was.
        Call::Stacked(policies, keys) => {
            Box::pin(shared.store.decide_stacked(policies, keys, lead.requests())).await
        }
    };
    inner.stats.redis_duration(sent.elapsed());
    match answer {
        Ok(batch) => {
            shared.breaker.record_success();
            let verdict = lead.decided(&batch);
            Ok((batch, verdict))
        }
        Err(error) => {
            drop(lead);
            inner.stats.redis_error();
            tracing::debug!(%error, "rate-limit Redis call failed; deciding locally");
            inner.trip(shared);
            Err(RunFailed)
        }
    }
}

/// Background task: while the breaker is open, probe Redis every
/// `breaker_open_for` and close the breaker when it answers.
///
/// Why a probe failed is logged once per outage, and again only when the
/// reason changes: a wrong password (`WRONGPASS`) or an untrusted certificate
/// must be visible to an operator, without one line per second.
async fn probe_loop(inner: Weak<Inner>, breaker: Arc<Breaker>) {
    let mut logged: Option<String> = None;
    loop {
        if !breaker.is_open() {
            breaker.opened().await;
            continue;
        }
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let Some(shared) = strong.shared.as_ref() else {
            return;
        };
        let error = match strong.probe(shared).await {
            Ok(()) => {
                breaker.close();
                strong.stats.breaker_closed();
                tracing::info!("rate-limit Redis reachable; shared limits resumed");
                logged = None;
                continue;
            }
            Err(error) => error,
        };
        if logged.as_deref() != Some(error.as_str()) {
            tracing::warn!(
                %error,
                retry_every = ?strong.options.breaker_open_for,
                "rate-limit Redis does not answer; limits are replica-local until it does"
            );
            logged = Some(error);
        }
        strong.stats.probe_failed();
        let wait = strong.options.breaker_open_for;
        // Do not keep the limiter alive while sleeping.
        drop(strong);
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;

    #[tokio::test]
    async fn without_redis_every_decision_is_local_and_no_fallback_is_counted() {
        let limiter = RateLimiter::new(None, RateLimiterOptions::default()).unwrap();
        let p = Policy::new("api", Algorithm::TokenBucket, 2, 60).unwrap();
        let a = limiter.check(&p, "alice").await;
        let b = limiter.check(&p, "alice").await;
        let c = limiter.check(&p, "alice").await;
        assert!(a.allowed && b.allowed && !c.allowed);
        assert_eq!(c.source, Source::Local);
        assert_eq!(c.retry_after, Some(Duration::from_secs(30)));
        assert!(!limiter.is_shared());
        let stats = limiter.stats();
        assert_eq!((stats.allowed_local, stats.denied_local), (2, 1));
        assert_eq!(stats.fallbacks, 0);
        assert!(!stats.breaker_open);
    }

    #[tokio::test(start_paused = true)]
    async fn local_decisions_follow_tokio_time() {
        let limiter = RateLimiter::new(None, RateLimiterOptions::default()).unwrap();
        let p = Policy::new("api", Algorithm::TokenBucket, 1, 10).unwrap();
        assert!(limiter.check(&p, "u").await.allowed);
        let denied = limiter.check(&p, "u").await;
        assert!(!denied.allowed);
        tokio::time::advance(denied.retry_after.unwrap()).await;
        assert!(limiter.check(&p, "u").await.allowed);
    }

    #[test]
    fn outside_a_runtime_construction_fails_clearly() {
        let err = RateLimiter::new(None, RateLimiterOptions::default()).unwrap_err();
        assert!(matches!(err, RateLimitError::NoRuntime));
        assert!(err.to_string().contains("Tokio runtime"));
    }

    #[tokio::test]
    async fn a_bad_url_is_refused() {
        let err = RateLimiter::new(Some("http://nope".into()), RateLimiterOptions::default())
            .unwrap_err();
        assert!(matches!(err, RateLimitError::InvalidRedisUrl(_)), "{err}");
    }

    /// A Redis that answers everything except scripts, which it never answers:
    /// a stall in the middle of decisions. Returns its URL and the count of
    /// scripts it was sent.
    async fn stalling_redis() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let scripts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = scripts.clone();
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut read = BufReader::new(read);
                    let mut line = String::new();
                    loop {
                        // One RESP array of bulk strings: "*N", then N × ("$len", bytes).
                        line.clear();
                        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let n: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
                        let mut words = Vec::with_capacity(n);
                        for _ in 0..n {
                            line.clear();
                            read.read_line(&mut line).await.unwrap();
                            let len: usize = line.trim_start_matches('$').trim().parse().unwrap();
                            let mut word = vec![0; len + 2];
                            read.read_exact(&mut word).await.unwrap();
                            word.truncate(len);
                            words.push(String::from_utf8_lossy(&word).to_uppercase());
                        }
                        let reply: &[u8] = match words.first().map(String::as_str) {
                            Some("EVALSHA" | "EVAL") => {
                                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                continue;
                            }
                            Some("PING") => b"+PONG\r\n",
                            _ => b"+OK\r\n",
                        };
                        if write.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, scripts)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn merged_requests_are_answered_when_redis_stalls_mid_run() {
        let options = RateLimiterOptions {
            decision_timeout: Duration::from_millis(50),
            // The Redis client's own response timeout follows this: far above
            // the runs' bound, so only that bound can answer the requests in time.
            probe_timeout: Duration::from_secs(10),
            ..RateLimiterOptions::default()
        };
        let (url, scripts) = stalling_redis().await;
        let limiter = Arc::new(RateLimiter::new(Some(url), options).unwrap());
        let p = Policy::new("api", Algorithm::TokenBucket, 1000, 60).unwrap();
        let connected = std::time::Instant::now() + Duration::from_secs(10);
        while !limiter.is_shared() {
            assert!(
                std::time::Instant::now() < connected,
                "never connected to the fake Redis"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Concurrent requests of one key: one leads, the rest queue behind its run
        // and then form the next batch. Neither run is ever answered; queued
        // requests have no timer of their own, so only the runs' own bounds
        // (two decision deadlines each) get them an answer.
        let started = std::time::Instant::now();
        let requests: Vec<_> = (0..16)
            .map(|_| {
                let limiter = limiter.clone();
                let p = p.clone();
                tokio::spawn(async move { limiter.check(&p, "alice").await })
            })
            .collect();
        let all =
            tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(requests))
                .await
                .expect("every merged request is answered while Redis stalls");
        for d in all {
            let d = d.unwrap();
            assert!(d.allowed);
            assert_eq!(d.source, Source::Local);
        }
        let stats = limiter.stats();
        assert_eq!(stats.fallbacks, 16, "{stats:?}");
        assert!(stats.merged == 0, "no verdict came from Redis: {stats:?}");
        // The first request's run, then one run for the batch queued behind it.
        let runs = scripts.load(std::sync::atomic::Ordering::SeqCst);
        assert!(runs >= 2, "{runs} script runs reached Redis");
        // Nothing is left waiting on the key: the next request is answered too.
        let next = tokio::time::timeout(Duration::from_secs(20), limiter.check(&p, "alice"))
            .await
            .expect("the key is not left taken");
        assert_eq!(next.source, Source::Local);
        // Bounded by the runs (four deadlines at most), not by luck: generous for CI.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_unreachable_redis_means_fast_local_decisions_and_counted_fallbacks() {
        // A port nobody listens on: bind, learn the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let limiter = RateLimiter::new(
            Some(format!("redis://127.0.0.1:{port}")),
            RateLimiterOptions::default(),
        )
        .unwrap();
        let p = Policy::new("api", Algorithm::TokenBucket, 3, 3600).unwrap();
        let mut admitted = 0;
        for _ in 0..10 {
            let started = std::time::Instant::now();
            let d = limiter.check(&p, "alice").await;
            assert!(started.elapsed() < Duration::from_millis(50));
            assert_eq!(d.source, Source::Local);
            admitted += usize::from(d.allowed);
        }
        assert_eq!(admitted, 3, "the local limiter still enforces the policy");
        let stats = limiter.stats();
        assert_eq!(stats.fallbacks, 10);
        assert!(stats.breaker_open);
        assert!(!limiter.is_shared());
    }
}
