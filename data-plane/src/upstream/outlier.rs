//! Outlier detection by failure rate (docs/data-plane.md, "Outlier detection"):
//! an upstream's `outlier_detection`, beside the consecutive-failure breaker.
//!
//! Every attempt of an upstream that has it is counted per instance (attempts
//! and failures, what the breaker counts as one) in a sliding window of ten
//! buckets of `window_ms / 10`. Each bucket is one `AtomicU64` packing the
//! bucket's epoch (24 bits), its attempts and its failures (20 bits each,
//! saturating), updated with one compare-and-swap: the request path takes no
//! lock. A success only counts. A failure also sums the ten buckets; when the
//! window holds at least `min_requests` attempts of which at least
//! `failure_rate_percent` failed, the instance is ejected, under the
//! upstream's ejection lock (taken only then), unless that would put more
//! than [`max_ejected`] of the upstream's instances out at once.
//!
//! An ejection lasts `ejection_ms × n` (n: the instance's ejection count,
//! this one included), capped at `max(ejection_ms, 300 s)` ([`MAX_EJECTION_MS`]);
//! n drops by one for every `ejection_ms` the instance then stays in service
//! without being ejected, so an instance that fails again soon is ejected for
//! longer and one that recovered starts over. Ejection clears the window: back
//! in service, the instance needs `min_requests` new attempts before it is
//! judged again. The balancer skips an ejected instance like one whose breaker
//! is open ([`OutlierState::is_ejected`]: one atomic load while not ejected).
//!
//! Time is milliseconds on the process's tokio clock ([`now_ms`]); the
//! arithmetic takes `now` as an argument so the tests drive it by hand.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use gateway_proto::v1::OutlierDetection;
use tokio::time::Instant;

use super::{InstanceState, UpstreamEntry};

/// Buckets of the sliding window.
pub const BUCKETS: u64 = 10;
/// Longest ejection, unless `ejection_ms` itself is longer (Envoy's default
/// `max_ejection_time`).
pub const MAX_EJECTION_MS: u64 = 300_000;

const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << 24) - 1;

/// An upstream's `outlier_detection`, compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierSettings {
    /// Failure rate (percent of attempts in the window) that ejects.
    pub failure_rate_percent: u64,
    /// Attempts in the window needed before the rate is judged.
    pub min_requests: u64,
    /// Length of one bucket (a tenth of the window), in ms.
    pub bucket_ms: u64,
    /// Base ejection time, in ms.
    pub ejection_ms: u64,
    /// Most instances ejected at once, percent of the upstream's.
    pub max_ejection_percent: u64,
}

impl OutlierSettings {
    /// From a validated `OutlierDetection`.
    pub fn from_proto(o: &OutlierDetection) -> Self {
        Self {
            failure_rate_percent: u64::from(o.failure_rate_percent),
            min_requests: u64::from(o.min_requests),
            bucket_ms: (u64::from(o.window_ms) / BUCKETS).max(1),
            ejection_ms: u64::from(o.ejection_ms).max(1),
            max_ejection_percent: u64::from(o.max_ejection_percent),
        }
    }

    /// The window's length, in ms.
    pub fn window_ms(&self) -> u64 {
        self.bucket_ms * BUCKETS
    }

    /// How long the `n`th ejection in a row lasts (n ≥ 1).
    pub fn ejection_for(&self, n: u32) -> u64 {
        self.ejection_ms
            .saturating_mul(u64::from(n.max(1)))
            .min(self.ejection_ms.max(MAX_EJECTION_MS))
    }
}

/// An upstream's outlier detection: its settings. (The lock that makes the
/// ejection cap exact is the upstream's, shared with its breakers.)
#[derive(Debug)]
pub struct Outlier {
    /// The settings.
    pub settings: OutlierSettings,
}

impl Outlier {
    /// Outlier detection with `settings`.
    pub fn new(settings: OutlierSettings) -> Self {
        Self { settings }
    }
}

/// Most instances of an upstream of `n` that may be ejected at once:
/// `n × percent / 100` rounded down, at least one, and never all of them
/// (so 0 for an upstream of one instance, 1 of 2 whatever the percent, 1 of 3 at 50 %).
pub fn max_ejected(n: usize, percent: u64) -> usize {
    if n <= 1 {
        return 0;
    }
    let by_percent = (n as u64 * percent / 100) as usize;
    by_percent.max(1).min(n - 1)
}

/// Milliseconds since the first call, on tokio's clock (paused in tests).
pub fn now_ms() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    Instant::now().saturating_duration_since(origin).as_millis() as u64
}

/// The outlier state of one instance; carried over between versions with the
/// rest of its [`InstanceState`]. Untouched on upstreams without outlier detection.
#[derive(Debug, Default)]
pub struct OutlierState {
    buckets: [AtomicU64; BUCKETS as usize],
    /// Ejected until this time (ms, [`now_ms`]); 0: in service.
    ejected_until: AtomicU64,
    /// Ejections in a row (decays while in service), the multiplier.
    streak: AtomicU32,
    /// When the last ejection ended (ms), for the streak's decay.
    last_end: AtomicU64,
    /// Ejections so far (the metric).
    ejections: AtomicU64,
}

fn pack(epoch: u64, attempts: u64, failures: u64) -> u64 {
    (epoch & EPOCH_MASK) << (2 * COUNT_BITS) | attempts << COUNT_BITS | failures
}

fn unpack(v: u64) -> (u64, u64, u64) {
    (
        v >> (2 * COUNT_BITS),
        (v >> COUNT_BITS) & COUNT_MAX,
        v & COUNT_MAX,
    )
}

impl OutlierState {
    /// Whether the balancer must skip the instance now. One atomic load while
    /// it is in service; the first look after an ejection ended puts it back.
    #[inline]
    pub fn is_ejected(&self) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && self.ejected_at(until, now_ms())
    }

    fn ejected_at(&self, until: u64, now: u64) -> bool {
        if now < until {
            return true;
        }
        // Ended: back in service (a racing new ejection wins the exchange).
        let _ = self
            .ejected_until
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    /// Whether the instance is ejected at `now` (ms).
    pub fn ejected_now(&self, now: u64) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && self.ejected_at(until, now)
    }

    /// Time left of the current ejection at `now`, in ms (`None`: in service).
    pub fn ejected_for(&self, now: u64) -> Option<u64> {
        let until = self.ejected_until.load(Ordering::Relaxed);
        (until > now).then(|| until - now)
    }

    /// Ejections so far.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Counts one attempt at `now`. Returns true when it failed and the
    /// window now passes the settings' threshold (time to try an ejection).
    pub fn count(&self, s: &OutlierSettings, now: u64, failed: bool) -> bool {
        let epoch = now / s.bucket_ms;
        let slot = &self.buckets[(epoch % BUCKETS) as usize];
        let tag = epoch & EPOCH_MASK;
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            let (t, attempts, failures) = unpack(cur);
            let (attempts, failures) = if t == tag {
                (attempts, failures)
            } else {
                (0, 0)
            };
            let next = pack(
                tag,
                (attempts + 1).min(COUNT_MAX),
                (failures + u64::from(failed)).min(COUNT_MAX),
            );
            match slot.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        if !failed {
            return false;
        }
        let (attempts, failures) = self.window(s, now);
        attempts >= s.min_requests && failures * 100 >= s.failure_rate_percent * attempts
    }

    /// Attempts and failures in the window ending at `now`.
    pub fn window(&self, s: &OutlierSettings, now: u64) -> (u64, u64) {
        let tag = (now / s.bucket_ms) & EPOCH_MASK;
        self.buckets
            .iter()
            .map(|b| unpack(b.load(Ordering::Relaxed)))
            .filter(|(t, _, _)| tag.wrapping_sub(*t) & EPOCH_MASK < BUCKETS)
            .fold((0, 0), |(a, f), (_, at, fa)| (a + at, f + fa))
    }

    /// Ejects the instance at `now` for its next ejection time; returns it (ms).
    /// The caller holds the upstream's ejection lock and checked the cap.
    fn eject(&self, s: &OutlierSettings, now: u64) -> u64 {
        // The streak decays by one per ejection_ms spent in service since the last ejection ended.
        let streak = self.streak.load(Ordering::Relaxed);
        let last_end = self.last_end.load(Ordering::Relaxed);
        let decay = now.saturating_sub(last_end) / s.ejection_ms;
        let streak = (u64::from(streak).saturating_sub(decay) + 1).min(u64::from(u32::MAX)) as u32;
        let duration = s.ejection_for(streak);
        self.streak.store(streak, Ordering::Relaxed);
        self.last_end.store(now + duration, Ordering::Relaxed);
        self.ejected_until.store(now + duration, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        duration
    }
}

/// Counts an attempt of `instance` (of `upstream`) that `failed` or not, and
/// ejects it when its failure rate passes the threshold and the cap allows.
/// Nothing at all for an upstream without outlier detection.
#[inline]
pub fn record(upstream: &UpstreamEntry, instance: &InstanceState, failed: bool) {
    let Some(o) = &upstream.outlier else {
        return;
    };
    let now = now_ms();
    if instance.outlier.count(&o.settings, now, failed)
        && let Some(ms) = try_eject(o, upstream, instance, now)
    {
        tracing::warn!(upstream = %upstream.name, instance = %instance.id, ejection_ms = ms, "outlier ejected");
    }
}

/// Ejects `instance` at `now` unless it is already out or the upstream's cap
/// is reached; returns the ejection time (ms).
pub fn try_eject(
    o: &Outlier,
    upstream: &UpstreamEntry,
    instance: &InstanceState,
    now: u64,
) -> Option<u64> {
    let _cap = upstream.taking_out.lock();
    if instance.outlier.ejected_now(now) {
        return None;
    }
    // Out of rotation by an ejection or by an open breaker: one cap for both.
    // An instance whose breaker holds it out already adds nothing by its ejection.
    let out = upstream.instances_out_at(now);
    if instance.breaker.is_closed()
        && out >= max_ejected(upstream.instances.len(), o.settings.max_ejection_percent)
    {
        return None;
    }
    Some(instance.outlier.eject(&o.settings, now))
}

#[cfg(test)]
mod tests;
