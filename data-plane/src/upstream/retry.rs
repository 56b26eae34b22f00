//! Route retries (`Route.retry`) and the per-upstream retry budget.
//!
//! A [`RetryPolicy`] is compiled once per snapshot from the route's `Retry`.
//! [`proxy::forward`](crate::upstream::proxy::forward) asks it whether a failed attempt
//! is worth another try ([`RetryPolicy::retries`]), and the upstream's
//! [`RetryBudget`] whether one more retry is affordable.
//!
//! The budget rule: retries sent to an upstream in the last
//! [`BUDGET_WINDOW`] (10 s, kept as ten one-second buckets, the current one
//! partly elapsed) may be at most [`BUDGET_PERCENT`] (20%) of the requests sent
//! to it in that window (first attempts of every route, retrying or not) plus
//! [`BUDGET_FLOOR`] (10). So a quiet upstream can still be retried a little,
//! and a failing busy one gets at most 1.2× its normal load however many
//! routes retry: retries cannot turn an outage into a storm. A retry the
//! budget refuses is not made; the failed answer stands and
//! `gateway_retry_budget_refusals_total{upstream}` counts it.
//!
//! Time is tokio's clock, so tests drive the window with `tokio::time::pause`.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gateway_proto::spec::RetrySpec;
use gateway_proto::v1::RetryOn;
use http::Method;
use tokio::time::Instant;

use gateway_transport::upstream_error::UpstreamError;
use gateway_transport::workers::Worker;

/// Length of the budget's sliding window.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(10);
/// Retries allowed per hundred requests sent, over the window.
pub const BUDGET_PERCENT: u64 = 20;
/// Retries allowed in the window whatever the traffic.
pub const BUDGET_FLOOR: u64 = 10;
/// Largest request body buffered so that a retrying route can send it again.
/// A larger body, or one of unknown length (chunked), is sent once (only a
/// connect failure, which leaves the body untouched, is retried then).
pub const MAX_REPLAY_BODY_BYTES: u64 = 64 * 1024;

/// Why an attempt is retried (label `reason` of `gateway_retries_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// The instance was not reached, or the connection broke before the response head.
    ConnectFailure,
    /// The instance answered 500, 502, 503 or 504.
    Status5xx,
    /// The attempt's `per_try_timeout_ms` passed.
    Timeout,
}

impl RetryReason {
    /// Every reason, in label order.
    pub const ALL: [Self; 3] = [Self::ConnectFailure, Self::Status5xx, Self::Timeout];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConnectFailure => "connect_failure",
            Self::Status5xx => "status_5xx",
            Self::Timeout => "timeout",
        }
    }

    /// The reason a failed attempt falls under: `TIMEOUT` when its time ran
    /// out, `CONNECT_FAILURE` for every other failure (not reached, or the
    /// connection broke before the response head).
    pub fn of(error: &UpstreamError) -> Self {
        if error.is_timeout() {
            Self::Timeout
        } else {
            Self::ConnectFailure
        }
    }
}

/// Whether a `STATUS_5XX` retry applies to `status`: 500, 502, 503 and 504.
/// Other 5xx (501 Not Implemented, 505, 507, …) would be the same on every
/// instance.
pub fn is_retryable_status(status: http::StatusCode) -> bool {
    matches!(status.as_u16(), 500 | 502 | 503 | 504)
}

/// Whether a request with `method` may be sent again after it reached an
/// instance: GET, HEAD, OPTIONS, PUT and DELETE (RFC 9110 idempotent methods,
/// TRACE excepted).
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    )
}

/// A route's compiled `retry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Additional tries after the first.
    pub attempts: u32,
    on: [bool; 3],
    /// Time to the response head allowed to each attempt (`None`: only the route timeout).
    pub per_try_timeout: Option<Duration>,
}

impl RetryPolicy {
    /// Compiles a validated route's `retry`.
    pub fn from_spec(r: &RetrySpec) -> Self {
        let mut on = [false; 3];
        for v in &r.on {
            match v {
                RetryOn::ConnectFailure => on[RetryReason::ConnectFailure as usize] = true,
                RetryOn::Status5xx => on[RetryReason::Status5xx as usize] = true,
                RetryOn::Timeout => on[RetryReason::Timeout as usize] = true,
                RetryOn::Unspecified => {}
            }
        }
        Self {
            attempts: r.attempts,
            on,
            per_try_timeout: r.per_try_timeout,
        }
    }

    /// Whether the policy retries failures of this kind.
    pub fn retries(&self, reason: RetryReason) -> bool {
        self.on[reason as usize]
    }

    /// The rule of a route with this policy, after `retries` retries: a
    /// failure it lists with tries left is retried on an instance not yet
    /// tried, charged to the budget, when the request can be sent again (it
    /// never reached the instance, or `replayable`: idempotent with its body
    /// kept); a request that never reached an instance keeps the default
    /// once-rule, unbudgeted, when the policy does not list its failure.
    pub fn decide(&self, failed: &Failed, replayable: bool, retries: u32) -> Verdict {
        let listed = self.retries(failed.reason) && retries < self.attempts;
        let once = !self.retries(failed.reason) && retries == 0 && failed.not_reached;
        if !(listed || once) || !(failed.not_reached || replayable) {
            return Verdict::Stands;
        }
        Verdict::Elsewhere { budgeted: listed }
    }
}

/// A failed attempt as the retry rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// What it falls under.
    pub reason: RetryReason,
    /// The request never reached the instance and came back intact.
    pub not_reached: bool,
    /// The request was sent (may have reached the instance) and came back
    /// because it had no body, so it can be replayed as it is.
    pub returned: bool,
    /// The connection had served earlier requests (a stale keep-alive
    /// connection rather than a broken instance).
    pub reused: bool,
}

impl Failed {
    /// The facts of `error`, whose request came back (`returned`) or not.
    pub fn of(error: &UpstreamError, returned: bool) -> Self {
        Self {
            reason: RetryReason::of(error),
            not_reached: returned && error.never_reached(),
            returned: returned && !error.never_reached(),
            reused: error.reused(),
        }
    }

    /// A retryable 5xx answer.
    pub fn status_5xx() -> Self {
        Self {
            reason: RetryReason::Status5xx,
            not_reached: false,
            returned: false,
            reused: false,
        }
    }
}

/// Whether and where a failed attempt is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No retry: the failure (or the 5xx answer) stands.
    Stands,
    /// On an instance not tried yet; first charged to the upstream's
    /// [`RetryBudget`] when `budgeted` (the retry is not made when it is spent).
    Elsewhere {
        /// Whether the retry budget must allow it.
        budgeted: bool,
    },
    /// On another instance, or on the same one when there is no other (a
    /// stale keep-alive connection was to blame). Never budgeted.
    ElsewhereOrSame,
}

/// The default once-rules of a route without `retry`, after `retries`
/// retries: at most one retry, not budgeted. A request that never reached the
/// instance goes to another one whatever its method; a bodiless GET, HEAD or
/// OPTIONS cut off before its response head is replayed, on the same instance
/// only when a reused connection was to blame and there is no other.
pub fn default_rule(failed: &Failed, method: &Method, retries: u32) -> Verdict {
    if retries > 0 {
        Verdict::Stands
    } else if failed.not_reached {
        Verdict::Elsewhere { budgeted: false }
    } else if failed.returned && matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        if failed.reused {
            Verdict::ElsewhereOrSame
        } else {
            Verdict::Elsewhere { budgeted: false }
        }
    } else {
        Verdict::Stands
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    /// Seconds since the budget's start this bucket counts (`u64::MAX`: never used).
    second: u64,
    requests: u64,
    retries: u64,
}

/// How many sets of buckets a budget keeps: one per proxy worker
/// (its [`Worker`] index, modulo this). Every first attempt counts
/// itself, and with one set the workers took one lock on every request, its
/// cache line moving between their cores; a retry (rare) sums all the sets.
const STRIPES: usize = 4;

/// Ten one-second buckets in a cache line pair of their own; the lock is held
/// only to count, never across an `.await`.
#[derive(Debug)]
#[repr(align(128))]
struct Stripe(Mutex<[Bucket; 10]>);

/// The retry budget of one upstream, plus its retry counters. Carried over
/// while the upstream keeps its name, like instance state.
#[derive(Debug)]
pub struct RetryBudget {
    start: Instant,
    stripes: [Stripe; STRIPES],
    retries: [AtomicU64; 3],
    refused: AtomicU64,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

const BUCKETS: u64 = 10;

impl RetryBudget {
    /// An empty budget (only the floor available).
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            stripes: std::array::from_fn(|_| {
                Stripe(Mutex::new(
                    [Bucket {
                        second: u64::MAX,
                        ..Bucket::default()
                    }; BUCKETS as usize],
                ))
            }),
            retries: Default::default(),
            refused: AtomicU64::new(0),
        }
    }

    fn now_second(&self) -> u64 {
        self.second_of(Instant::now())
    }

    fn second_of(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_secs()
    }

    /// `worker`'s buckets.
    fn local(&self, worker: Worker) -> &Mutex<[Bucket; 10]> {
        &self.stripes[worker % STRIPES].0
    }

    /// Counts one request sent to the upstream (a first attempt) at `now`
    /// (the caller's clock reading, so the hot path reads the clock once)
    /// by `worker`.
    pub fn record_request(&self, now: Instant, worker: Worker) {
        self.record_in(self.local(worker), now);
    }

    fn record_in(&self, buckets: &Mutex<[Bucket; 10]>, now: Instant) {
        let now = self.second_of(now);
        let mut b = buckets.lock();
        current(&mut b, now).requests += 1;
    }

    /// Spends one retry if the budget allows it; counts the retry (by
    /// `reason`) or the refusal. Workers deciding at the same moment may
    /// together spend one retry more each than the budget has left.
    pub fn try_retry(&self, reason: RetryReason, worker: Worker) -> bool {
        let now = self.now_second();
        let (mut requests, mut retries) = (0, 0);
        for stripe in &self.stripes {
            let b = stripe.0.lock();
            for k in b
                .iter()
                .filter(|k| k.second != u64::MAX && k.second + BUCKETS > now)
            {
                requests += k.requests;
                retries += k.retries;
            }
        }
        let allowed = retries < allowance(requests);
        if allowed {
            let mut b = self.local(worker).lock();
            current(&mut b, now).retries += 1;
        }
        if allowed {
            self.retries[reason as usize].fetch_add(1, Ordering::Relaxed);
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        allowed
    }

    /// Retries made for `reason`.
    pub fn retries(&self, reason: RetryReason) -> u64 {
        self.retries[reason as usize].load(Ordering::Relaxed)
    }

    /// Retries the budget refused.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Retries allowed in a window that saw `requests` requests.
fn allowance(requests: u64) -> u64 {
    requests * BUDGET_PERCENT / 100 + BUDGET_FLOOR
}

/// The bucket of second `now`, emptied first if it still holds an older second.
fn current(b: &mut [Bucket; 10], now: u64) -> &mut Bucket {
    let k = &mut b[(now % BUCKETS) as usize];
    if k.second != now {
        *k = Bucket {
            second: now,
            ..Bucket::default()
        };
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_transport::workers::OFF_WORKER;

    #[test]
    fn the_default_rules_retry_once_what_never_reached_and_bodiless_safe_reads() {
        use gateway_transport::upstream_error::Failure;
        let refused = UpstreamError::not_sent(Failure::Closed);
        let cut = UpstreamError::sent(Failure::Closed);
        let stale = UpstreamError::sent(Failure::Closed).on_reused(true);
        let elsewhere = Verdict::Elsewhere { budgeted: false };
        // Never reached: any method, once.
        assert_eq!(
            default_rule(&Failed::of(&refused, true), &Method::POST, 0),
            elsewhere
        );
        assert_eq!(
            default_rule(&Failed::of(&refused, true), &Method::POST, 1),
            Verdict::Stands
        );
        // Not handed back (its body was read): nothing to send.
        assert_eq!(
            default_rule(&Failed::of(&refused, false), &Method::GET, 0),
            Verdict::Stands
        );
        // Cut off after it was sent: only a bodiless GET/HEAD/OPTIONS, and the
        // same instance only after a stale keep-alive connection.
        assert_eq!(
            default_rule(&Failed::of(&cut, true), &Method::GET, 0),
            elsewhere
        );
        assert_eq!(
            default_rule(&Failed::of(&cut, true), &Method::DELETE, 0),
            Verdict::Stands
        );
        assert_eq!(
            default_rule(&Failed::of(&stale, true), &Method::HEAD, 0),
            Verdict::ElsewhereOrSame
        );
        let timeout = UpstreamError::timeout(Duration::from_secs(1));
        assert_eq!(
            default_rule(&Failed::of(&timeout, false), &Method::GET, 0),
            Verdict::Stands
        );
        assert_eq!(
            default_rule(&Failed::status_5xx(), &Method::GET, 0),
            Verdict::Stands
        );
    }

    #[test]
    fn a_policy_retries_what_it_lists_while_tries_are_left_and_the_request_can_be_resent() {
        use gateway_transport::upstream_error::Failure;
        let p = policy(&[RetryOn::Status5xx, RetryOn::Timeout], 0);
        let budgeted = Verdict::Elsewhere { budgeted: true };
        assert_eq!(p.decide(&Failed::status_5xx(), true, 0), budgeted);
        assert_eq!(p.decide(&Failed::status_5xx(), true, 2), Verdict::Stands);
        // Sent and not replayable (not idempotent, or its body not kept).
        assert_eq!(p.decide(&Failed::status_5xx(), false, 0), Verdict::Stands);
        let timeout = Failed::of(&UpstreamError::timeout(Duration::from_secs(1)), false);
        assert_eq!(p.decide(&timeout, true, 1), budgeted);
        // CONNECT_FAILURE not listed: a request that never reached an
        // instance still gets the default once-rule, unbudgeted.
        let refused = Failed::of(&UpstreamError::not_sent(Failure::Closed), true);
        assert_eq!(
            p.decide(&refused, false, 0),
            Verdict::Elsewhere { budgeted: false }
        );
        assert_eq!(p.decide(&refused, false, 1), Verdict::Stands);
        let broken = Failed::of(&UpstreamError::sent(Failure::Closed), false);
        assert_eq!(p.decide(&broken, true, 0), Verdict::Stands);
    }

    fn policy(on: &[RetryOn], per_try: u32) -> RetryPolicy {
        RetryPolicy::from_spec(&RetrySpec {
            attempts: 2,
            on: on.to_vec(),
            per_try_timeout: (per_try > 0).then(|| Duration::from_millis(per_try.into())),
        })
    }

    #[test]
    fn policy_compiles_conditions_and_timeout() {
        let p = policy(&[RetryOn::Status5xx, RetryOn::Timeout], 250);
        assert_eq!(p.attempts, 2);
        assert!(p.retries(RetryReason::Status5xx));
        assert!(p.retries(RetryReason::Timeout));
        assert!(!p.retries(RetryReason::ConnectFailure));
        assert_eq!(p.per_try_timeout, Some(Duration::from_millis(250)));
        assert_eq!(policy(&[RetryOn::ConnectFailure], 0).per_try_timeout, None);
    }

    #[test]
    fn retryable_statuses_and_methods() {
        for s in [500, 502, 503, 504] {
            assert!(
                is_retryable_status(http::StatusCode::from_u16(s).unwrap()),
                "{s}"
            );
        }
        for s in [200, 404, 429, 501, 505, 507] {
            assert!(
                !is_retryable_status(http::StatusCode::from_u16(s).unwrap()),
                "{s}"
            );
        }
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(is_idempotent(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::TRACE, Method::CONNECT] {
            assert!(!is_idempotent(&m), "{m}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_upstream_gets_the_floor_only() {
        let b = RetryBudget::new();
        for _ in 0..BUDGET_FLOOR {
            assert!(b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        }
        assert!(!b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        assert_eq!(b.retries(RetryReason::Status5xx), BUDGET_FLOOR);
        assert_eq!(b.refused(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_a_fifth_of_requests_plus_the_floor() {
        let b = RetryBudget::new();
        for _ in 0..100 {
            b.record_request(Instant::now(), OFF_WORKER);
        }
        // 100 / 5 + 10 = 30 retries, the 31st is refused.
        for i in 0..30 {
            assert!(
                b.try_retry(RetryReason::ConnectFailure, OFF_WORKER),
                "retry {i}"
            );
        }
        assert!(!b.try_retry(RetryReason::Timeout, OFF_WORKER));
        // Four more requests are not yet a fifth of one more retry; five are.
        for _ in 0..4 {
            b.record_request(Instant::now(), OFF_WORKER);
        }
        assert!(!b.try_retry(RetryReason::Timeout, OFF_WORKER));
        b.record_request(Instant::now(), OFF_WORKER);
        assert!(b.try_retry(RetryReason::Timeout, OFF_WORKER));
        assert_eq!(b.retries(RetryReason::ConnectFailure), 30);
        assert_eq!(b.retries(RetryReason::Timeout), 1);
        assert_eq!(b.refused(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_slides_by_whole_seconds() {
        let b = RetryBudget::new();
        for _ in 0..BUDGET_FLOOR {
            assert!(b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        }
        assert!(!b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        // Nine seconds later the spent retries are still in the window.
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(!b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        // At ten seconds the first second's bucket has left the window.
        tokio::time::advance(Duration::from_millis(1)).await;
        for _ in 0..BUDGET_FLOOR {
            assert!(b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        }
        assert!(!b.try_retry(RetryReason::Status5xx, OFF_WORKER));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_older_than_the_window_stop_paying_for_retries() {
        let b = RetryBudget::new();
        for _ in 0..50 {
            b.record_request(Instant::now(), OFF_WORKER);
        }
        tokio::time::advance(BUDGET_WINDOW).await;
        // The 50 requests are gone: the floor is all there is.
        for _ in 0..BUDGET_FLOOR {
            assert!(b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        }
        assert!(!b.try_retry(RetryReason::Status5xx, OFF_WORKER));
        // A bucket reused for a later second starts empty.
        tokio::time::advance(Duration::from_secs(3)).await;
        b.record_request(Instant::now(), OFF_WORKER);
        let buckets = b.local(OFF_WORKER).lock();
        let now = buckets.iter().find(|k| k.second == 13).unwrap();
        assert_eq!((now.requests, now.retries), (1, 0));
    }

    #[test]
    fn every_workers_requests_pay_for_retries() {
        let b = RetryBudget::new();
        // 100 requests counted by four different workers: 20 % of them plus the floor.
        for i in 0..100 {
            b.record_in(&b.stripes[i % STRIPES].0, Instant::now());
        }
        for i in 0..(100 * BUDGET_PERCENT / 100 + BUDGET_FLOOR) {
            assert!(b.try_retry(RetryReason::Status5xx, OFF_WORKER), "retry {i}");
        }
        assert!(!b.try_retry(RetryReason::Status5xx, OFF_WORKER));
    }
}
