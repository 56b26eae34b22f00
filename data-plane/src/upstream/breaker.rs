//! Per-instance circuit breaker (docs/data-plane.md, "Balance → breaker").
//!
//! ```text
//!   CLOSED --failure_threshold consecutive failures--> OPEN
//!   OPEN   --reset_timeout elapsed, next request-----> HALF_OPEN (admits ≤ half_open_max probes)
//!   HALF_OPEN --a probe succeeds--> CLOSED      HALF_OPEN --a probe fails--> OPEN (timer restarts)
//! ```
//!
//! A failure is a connect error, a reset, a timeout, or a 5xx answer where the
//! upstream's `count_5xx` says so. An upstream's share of instances out of
//! rotation is capped (`max_open_percent`): [`Permit::failure_capped`] opens
//! only when its caller's cap allows, and otherwise stays CLOSED. While OPEN the
//! breaker refuses without any network call. Probe slots are handed out as a
//! [`Permit`]; a permit dropped without an outcome (the request was cancelled or
//! hung until the client gave up) returns its slot, so a lost probe can never
//! wedge the breaker half-open.
//!
//! The CLOSED path (every request of a healthy instance) is two atomic loads and
//! no lock; the mutex is taken only on transitions and while not CLOSED.
//! Time comes from `tokio::time::Instant`, so tests drive it with `tokio::time::pause`.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Breaker settings of an upstream (per instance state, shared settings):
/// the typed configuration's, defaults included (5 failures, 10 s, 1 probe
/// for an upstream without `circuit_breaker`).
pub use gateway_proto::spec::BreakerSpec as BreakerSettings;

/// The three breaker states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Traffic flows; consecutive failures are counted.
    Closed,
    /// Traffic is refused until the reset timeout has passed.
    Open,
    /// A limited number of probes decide whether to close or reopen.
    HalfOpen,
}

impl BreakerState {
    /// Lower-case name for JSON and metrics: `closed`, `open`, `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Self::Closed => 0,
            Self::Open => 1,
            Self::HalfOpen => 2,
        }
    }
}

/// A state change, returned so the caller can log and count it with names attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// CLOSED or HALF_OPEN → OPEN.
    Opened,
    /// HALF_OPEN → CLOSED.
    Closed,
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    /// When the breaker last opened.
    opened_at: Instant,
    /// Probe permits out while half-open.
    probes: u32,
    /// Bumped on every transition, so outcomes of permits from an earlier
    /// period (e.g. a probe that outlived its half-open period) are ignored.
    epoch: u64,
}

/// The breaker of one upstream instance. Its state survives config changes;
/// the settings are passed in by the current snapshot.
#[derive(Debug)]
pub struct Breaker {
    /// Mirror of `inner.state` for the lock-free CLOSED fast path.
    state: AtomicU8,
    /// Consecutive failures while CLOSED.
    failures: AtomicU32,
    inner: Mutex<Inner>,
}

impl Default for Breaker {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Admitted while CLOSED.
    Normal,
    /// A half-open probe of the given epoch.
    Probe(u64),
}

/// Admission of one request through a breaker. Report the outcome with
/// [`Permit::success`] or [`Permit::failure`]; dropping it reports nothing and
/// gives a probe slot back.
#[derive(Debug)]
#[must_use = "report the outcome, or drop the permit to release it"]
pub struct Permit<'a> {
    breaker: &'a Breaker,
    settings: &'a BreakerSettings,
    kind: Kind,
    done: bool,
}

impl Breaker {
    /// A new breaker, CLOSED.
    pub fn new() -> Self {
        Self {
            state: AtomicU8::new(BreakerState::Closed.to_u8()),
            failures: AtomicU32::new(0),
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                opened_at: Instant::now(),
                probes: 0,
                epoch: 0,
            }),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves a consistent state (plain fields).
        self.inner.lock()
    }

    fn set(&self, inner: &mut Inner, state: BreakerState) {
        inner.state = state;
        inner.epoch += 1;
        inner.probes = 0;
        self.state.store(state.to_u8(), Ordering::Release);
    }

    /// Asks to send one request. `None` means the breaker refuses (OPEN, or
    /// HALF_OPEN with every probe slot taken).
    pub fn try_acquire<'a>(&'a self, settings: &'a BreakerSettings) -> Option<Permit<'a>> {
        let permit = |kind| Permit {
            breaker: self,
            settings,
            kind,
            done: false,
        };
        if self.state.load(Ordering::Acquire) == BreakerState::Closed.to_u8() {
            return Some(permit(Kind::Normal));
        }
        let mut inner = self.lock();
        match inner.state {
            BreakerState::Closed => Some(permit(Kind::Normal)),
            BreakerState::Open => {
                if Instant::now() < inner.opened_at + settings.reset_timeout {
                    return None;
                }
                self.set(&mut inner, BreakerState::HalfOpen);
                inner.probes = 1;
                Some(permit(Kind::Probe(inner.epoch)))
            }
            BreakerState::HalfOpen => {
                if inner.probes >= settings.half_open_max_requests {
                    return None;
                }
                inner.probes += 1;
                Some(permit(Kind::Probe(inner.epoch)))
            }
        }
    }

    /// Whether [`Breaker::try_acquire`] would admit a request now, taking
    /// nothing: CLOSED, OPEN past its reset timeout, or HALF_OPEN with a
    /// probe slot free.
    pub fn would_admit(&self, settings: &BreakerSettings) -> bool {
        if self.state.load(Ordering::Acquire) == BreakerState::Closed.to_u8() {
            return true;
        }
        let inner = self.lock();
        match inner.state {
            BreakerState::Closed => true,
            BreakerState::Open => Instant::now() >= inner.opened_at + settings.reset_timeout,
            BreakerState::HalfOpen => inner.probes < settings.half_open_max_requests,
        }
    }

    /// The state as seen now. An OPEN breaker whose timeout has passed still
    /// reports OPEN until a request arrives to probe it.
    pub fn state(&self) -> BreakerState {
        self.lock().state
    }

    /// Consecutive failures counted while CLOSED.
    pub fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    /// While OPEN: time until probes are admitted (zero once due). Otherwise `None`.
    pub fn until_probe(&self, settings: &BreakerSettings) -> Option<Duration> {
        let inner = self.lock();
        (inner.state == BreakerState::Open).then(|| {
            (inner.opened_at + settings.reset_timeout).saturating_duration_since(Instant::now())
        })
    }

    fn on_success(&self, kind: Kind) -> Option<Transition> {
        match kind {
            Kind::Normal => {
                // Avoid a write (and cache-line traffic) when there is nothing to reset.
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
                None
            }
            Kind::Probe(epoch) => {
                let mut inner = self.lock();
                if inner.epoch != epoch || inner.state != BreakerState::HalfOpen {
                    return None;
                }
                self.failures.store(0, Ordering::Relaxed);
                self.set(&mut inner, BreakerState::Closed);
                Some(Transition::Closed)
            }
        }
    }

    /// Whether the breaker is CLOSED (one atomic load).
    pub fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) == BreakerState::Closed.to_u8()
    }

    fn on_failure<G>(
        &self,
        kind: Kind,
        settings: &BreakerSettings,
        may_open: impl FnOnce() -> Option<G>,
    ) -> Option<Transition> {
        match kind {
            Kind::Normal => {
                let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n < settings.failure_threshold {
                    return None;
                }
                let mut inner = self.lock();
                if inner.state != BreakerState::Closed {
                    return None;
                }
                // Held until the state is OPEN, so the next one to count sees it.
                let _cap = may_open()?;
                inner.opened_at = Instant::now();
                self.set(&mut inner, BreakerState::Open);
                Some(Transition::Opened)
            }
            Kind::Probe(epoch) => {
                let mut inner = self.lock();
                if inner.epoch != epoch || inner.state != BreakerState::HalfOpen {
                    return None;
                }
                inner.opened_at = Instant::now();
                self.set(&mut inner, BreakerState::Open);
                Some(Transition::Opened)
            }
        }
    }

    fn release(&self, kind: Kind) {
        if let Kind::Probe(epoch) = kind {
            let mut inner = self.lock();
            if inner.epoch == epoch && inner.probes > 0 {
                inner.probes -= 1;
            }
        }
    }
}

impl Permit<'_> {
    /// The request succeeded (any answer below 500).
    pub fn success(mut self) -> Option<Transition> {
        self.done = true;
        self.breaker.on_success(self.kind)
    }

    /// The request failed (connect error, reset, timeout, or a counted 5xx).
    pub fn failure(self) -> Option<Transition> {
        self.failure_capped(|| Some(()))
    }

    /// [`Permit::failure`], where a CLOSED breaker reaching its threshold opens
    /// only if `may_open()` gives a guard (asked under the breaker's lock, only
    /// then; the guard is held until the breaker is OPEN): the upstream's cap on
    /// instances out of rotation. A half-open probe that fails reopens
    /// regardless: its instance was out already.
    pub fn failure_capped<G>(mut self, may_open: impl FnOnce() -> Option<G>) -> Option<Transition> {
        self.done = true;
        self.breaker.on_failure(self.kind, self.settings, may_open)
    }

    /// True when this permit is a half-open probe.
    pub fn is_probe(&self) -> bool {
        matches!(self.kind, Kind::Probe(_))
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.release(self.kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            failure_threshold: 3,
            reset_timeout: Duration::from_millis(1000),
            half_open_max_requests: 2,
            count_5xx: true,
            max_open_percent: 100,
        }
    }

    fn fail(b: &Breaker, s: &BreakerSettings) -> Option<Transition> {
        b.try_acquire(s).expect("admitted").failure()
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_only() {
        let (b, s) = (Breaker::new(), settings());
        assert_eq!(fail(&b, &s), None);
        assert_eq!(fail(&b, &s), None);
        // A success in between resets the count.
        assert_eq!(b.try_acquire(&s).unwrap().success(), None);
        assert_eq!(b.consecutive_failures(), 0);
        assert_eq!(fail(&b, &s), None);
        assert_eq!(fail(&b, &s), None);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(fail(&b, &s), Some(Transition::Opened));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.try_acquire(&s).is_none(), "open refuses");
        assert_eq!(b.until_probe(&s), Some(Duration::from_millis(1000)));
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_after_reset_timeout_and_probe_success_closes() {
        let (b, s) = (Breaker::new(), settings());
        for _ in 0..3 {
            let _ = fail(&b, &s);
        }
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(b.try_acquire(&s).is_none());
        assert_eq!(b.until_probe(&s), Some(Duration::from_millis(1)));
        tokio::time::advance(Duration::from_millis(1)).await;
        let p1 = b.try_acquire(&s).expect("first probe");
        assert!(p1.is_probe());
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let p2 = b.try_acquire(&s).expect("second probe");
        assert!(
            b.try_acquire(&s).is_none(),
            "only half_open_max_requests probes"
        );
        assert_eq!(p1.success(), Some(Transition::Closed));
        assert_eq!(b.state(), BreakerState::Closed);
        // The other probe's late outcome belongs to a finished period: ignored.
        assert_eq!(p2.failure(), None);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.try_acquire(&s).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn probe_failure_reopens_and_restarts_the_timer() {
        let (b, s) = (Breaker::new(), settings());
        for _ in 0..3 {
            let _ = fail(&b, &s);
        }
        tokio::time::advance(Duration::from_millis(1500)).await;
        let probe = b.try_acquire(&s).unwrap();
        assert_eq!(probe.failure(), Some(Transition::Opened));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.try_acquire(&s).is_none());
        assert_eq!(b.until_probe(&s), Some(Duration::from_millis(1000)));
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert!(b.try_acquire(&s).unwrap().is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_probe_returns_its_permit() {
        let s = BreakerSettings {
            half_open_max_requests: 1,
            ..settings()
        };
        let b = Breaker::new();
        for _ in 0..3 {
            let _ = fail(&b, &s);
        }
        tokio::time::advance(Duration::from_millis(1000)).await;
        let probe = b.try_acquire(&s).expect("probe");
        assert!(b.try_acquire(&s).is_none(), "the single slot is taken");
        drop(probe);
        let again = b.try_acquire(&s).expect("slot returned by drop");
        assert!(again.is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_probe_future_returns_its_permit() {
        let s = BreakerSettings {
            half_open_max_requests: 1,
            ..settings()
        };
        let b = std::sync::Arc::new(Breaker::new());
        for _ in 0..3 {
            let _ = fail(&b, &s);
        }
        tokio::time::advance(Duration::from_millis(1000)).await;
        // A probe request that hangs and is cancelled by a timeout.
        let hung = {
            let b = b.clone();
            async move {
                let _permit = b.try_acquire(&s).expect("probe");
                std::future::pending::<()>().await;
            }
        };
        let timed_out = tokio::time::timeout(Duration::from_secs(5), hung).await;
        assert!(timed_out.is_err());
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let p = b
            .try_acquire(&s)
            .expect("the cancelled probe gave its slot back");
        assert_eq!(p.success(), Some(Transition::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn stale_normal_outcomes_do_not_decide_half_open() {
        let (b, s) = (Breaker::new(), settings());
        let slow = b.try_acquire(&s).unwrap(); // admitted while closed
        for _ in 0..3 {
            let _ = fail(&b, &s);
        }
        tokio::time::advance(Duration::from_millis(1000)).await;
        let probe = b.try_acquire(&s).unwrap();
        // The old request finishing successfully must not close the breaker.
        assert_eq!(slow.success(), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        drop(probe);
    }
}
