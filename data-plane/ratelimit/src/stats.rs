//! Counters of the limiter, for the data plane's `/metrics`.
//!
//! Plain relaxed atomics: each is independent, and a scrape that sees one
//! counter a few increments ahead of another is fine.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::headers::Source;

/// Upper bounds (seconds) of the Redis round-trip histogram's buckets: a
/// healthy Redis answers in well under a millisecond on a LAN; the decision
/// deadline is milliseconds.
pub const REDIS_DURATION_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Live counters, updated on the request path.
#[derive(Debug, Default)]
pub struct Stats {
    allowed_shared: AtomicU64,
    denied_shared: AtomicU64,
    allowed_local: AtomicU64,
    denied_local: AtomicU64,
    deny_cache_hits: AtomicU64,
    merged: AtomicU64,
    leased: AtomicU64,
    lease_tokens: AtomicU64,
    redis_errors: AtomicU64,
    redis_timeouts: AtomicU64,
    fallbacks: AtomicU64,
    breaker_opened: AtomicU64,
    breaker_open: AtomicBool,
    probes_failed: AtomicU64,
    /// Per bucket, not cumulative (made cumulative when written).
    redis_duration_buckets: [AtomicU64; REDIS_DURATION_BUCKETS.len()],
    redis_duration_count: AtomicU64,
    redis_duration_sum_micros: AtomicU64,
}

impl Stats {
    pub(crate) fn decision(&self, source: Source, allowed: bool) {
        let counter = match (source, allowed) {
            (Source::Shared, true) => &self.allowed_shared,
            (Source::Shared, false) => &self.denied_shared,
            (Source::Local, true) => &self.allowed_local,
            (Source::Local, false) => &self.denied_local,
        };
        counter.fetch_add(1, Relaxed);
    }
    pub(crate) fn deny_cache_hit(&self) {
        self.deny_cache_hits.fetch_add(1, Relaxed);
    }
    pub(crate) fn merged(&self) {
        self.merged.fetch_add(1, Relaxed);
    }
    pub(crate) fn leased(&self) {
        self.leased.fetch_add(1, Relaxed);
    }
    pub(crate) fn lease_taken(&self, tokens: u32) {
        self.lease_tokens.fetch_add(u64::from(tokens), Relaxed);
    }
    pub(crate) fn redis_error(&self) {
        self.redis_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn redis_timeout(&self) {
        self.redis_timeouts.fetch_add(1, Relaxed);
    }
    pub(crate) fn fallback(&self) {
        self.fallbacks.fetch_add(1, Relaxed);
    }
    pub(crate) fn breaker_opened(&self) {
        self.breaker_opened.fetch_add(1, Relaxed);
        self.breaker_open.store(true, Relaxed);
    }
    /// The breaker starts open (until Redis first answers) without counting an opening.
    pub(crate) fn breaker_opened_quietly(&self) {
        self.breaker_open.store(true, Relaxed);
    }
    pub(crate) fn breaker_closed(&self) {
        self.breaker_open.store(false, Relaxed);
    }
    pub(crate) fn probe_failed(&self) {
        self.probes_failed.fetch_add(1, Relaxed);
    }
    /// One script run (or failed command) took `took`, from sending it to its answer.
    pub(crate) fn redis_duration(&self, took: Duration) {
        let secs = took.as_secs_f64();
        if let Some(i) = REDIS_DURATION_BUCKETS.iter().position(|b| secs <= *b) {
            self.redis_duration_buckets[i].fetch_add(1, Relaxed);
        }
        self.redis_duration_count.fetch_add(1, Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.redis_duration_sum_micros.fetch_add(micros, Relaxed);
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            allowed_shared: self.allowed_shared.load(Relaxed),
            denied_shared: self.denied_shared.load(Relaxed),
            allowed_local: self.allowed_local.load(Relaxed),
            denied_local: self.denied_local.load(Relaxed),
            deny_cache_hits: self.deny_cache_hits.load(Relaxed),
            merged: self.merged.load(Relaxed),
            leased: self.leased.load(Relaxed),
            lease_tokens: self.lease_tokens.load(Relaxed),
            redis_errors: self.redis_errors.load(Relaxed),
            redis_timeouts: self.redis_timeouts.load(Relaxed),
            fallbacks: self.fallbacks.load(Relaxed),
            breaker_opened: self.breaker_opened.load(Relaxed),
            breaker_open: self.breaker_open.load(Relaxed),
            probes_failed: self.probes_failed.load(Relaxed),
            redis_duration_buckets: std::array::from_fn(|i| {
                self.redis_duration_buckets[i].load(Relaxed)
            }),
            redis_duration_count: self.redis_duration_count.load(Relaxed),
            redis_duration_sum_micros: self.redis_duration_sum_micros.load(Relaxed),
        }
    }
}

/// A point-in-time copy of the limiter's counters (all monotonic except `breaker_open`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Admitted by the shared (Redis) budget.
    pub allowed_shared: u64,
    /// Denied by the shared budget, including denials answered from the "denied until" cache.
    pub denied_shared: u64,
    /// Admitted by the local limiter.
    pub allowed_local: u64,
    /// Denied by the local limiter.
    pub denied_local: u64,
    /// Denials answered from the "denied until" cache without asking Redis.
    pub deny_cache_hits: u64,
    /// Shared decisions answered by another request's Redis call (concurrent
    /// requests of one key merged into one script run).
    pub merged: u64,
    /// Shared decisions answered from a lease: tokens this replica took from
    /// the shared budget ahead of demand ([`crate::lease`]), no Redis call.
    pub leased: u64,
    /// Tokens taken as leases (admitted by Redis beyond the requests of their runs).
    pub lease_tokens: u64,
    /// Redis commands that failed (connection refused or lost, server error).
    pub redis_errors: u64,
    /// Decisions for which Redis did not answer within the decision deadline.
    pub redis_timeouts: u64,
    /// Decisions made locally although Redis is configured (error, timeout, or breaker open).
    pub fallbacks: u64,
    /// Times the Redis breaker opened.
    pub breaker_opened: u64,
    /// Whether the Redis breaker is open now (decisions are local until a probe succeeds).
    pub breaker_open: bool,
    /// Probes that found Redis still unreachable.
    pub probes_failed: u64,
    /// Redis round trips per [`REDIS_DURATION_BUCKETS`] bucket (not cumulative).
    pub redis_duration_buckets: [u64; REDIS_DURATION_BUCKETS.len()],
    /// Redis round trips measured.
    pub redis_duration_count: u64,
    /// Their total time, in microseconds.
    pub redis_duration_sum_micros: u64,
}

impl StatsSnapshot {
    /// Every decision counted.
    pub fn decisions(&self) -> u64 {
        self.allowed_shared + self.denied_shared + self.allowed_local + self.denied_local
    }

    /// Appends the counters in the Prometheus text format. Metric names:
    ///
    /// | name | type | labels |
    /// |---|---|---|
    /// | `gateway_ratelimit_decisions_total` | counter | `source` = `redis`\|`local`, `result` = `allowed`\|`denied` |
    /// | `gateway_ratelimit_deny_cache_hits_total` | counter | |
    /// | `gateway_ratelimit_merged_decisions_total` | counter | |
    /// | `gateway_ratelimit_leased_decisions_total` | counter | |
    /// | `gateway_ratelimit_lease_tokens_total` | counter | |
    /// | `gateway_ratelimit_redis_errors_total` | counter | |
    /// | `gateway_ratelimit_redis_timeouts_total` | counter | |
    /// | `gateway_ratelimit_fallbacks_total` | counter | |
    /// | `gateway_ratelimit_breaker_opened_total` | counter | |
    /// | `gateway_ratelimit_breaker_open` | gauge (0/1) | |
    /// | `gateway_ratelimit_probe_failures_total` | counter | |
    /// | `gateway_ratelimit_redis_duration_seconds` | histogram | `le` |
    pub fn write_prometheus(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP gateway_ratelimit_decisions_total Rate-limit decisions by who decided and the verdict.\n\
             # TYPE gateway_ratelimit_decisions_total counter"
        );
        for (source, result, value) in [
            ("redis", "allowed", self.allowed_shared),
            ("redis", "denied", self.denied_shared),
            ("local", "allowed", self.allowed_local),
            ("local", "denied", self.denied_local),
        ] {
            let _ = writeln!(
                out,
                "gateway_ratelimit_decisions_total{{source=\"{source}\",result=\"{result}\"}} {value}"
            );
        }
        for (name, kind, help, value) in [
            (
                "gateway_ratelimit_deny_cache_hits_total",
                "counter",
                "Denials answered from the local denied-until cache without asking Redis.",
                self.deny_cache_hits,
            ),
            (
                "gateway_ratelimit_merged_decisions_total",
                "counter",
                "Shared rate-limit decisions answered by another concurrent request's Redis call (same key).",
                self.merged,
            ),
            (
                "gateway_ratelimit_leased_decisions_total",
                "counter",
                "Shared rate-limit decisions answered from tokens leased from Redis ahead of demand (no Redis call).",
                self.leased,
            ),
            (
                "gateway_ratelimit_lease_tokens_total",
                "counter",
                "Tokens leased from the shared Redis budgets ahead of demand.",
                self.lease_tokens,
            ),
            (
                "gateway_ratelimit_redis_errors_total",
                "counter",
                "Rate-limit Redis commands that failed.",
                self.redis_errors,
            ),
            (
                "gateway_ratelimit_redis_timeouts_total",
                "counter",
                "Rate-limit decisions for which Redis missed the deadline.",
                self.redis_timeouts,
            ),
            (
                "gateway_ratelimit_fallbacks_total",
                "counter",
                "Rate-limit decisions made by the replica-local limiter because Redis was unavailable.",
                self.fallbacks,
            ),
            (
                "gateway_ratelimit_breaker_opened_total",
                "counter",
                "Times the rate-limit Redis breaker opened.",
                self.breaker_opened,
            ),
            (
                "gateway_ratelimit_breaker_open",
                "gauge",
                "1 while the rate-limit Redis breaker is open (limits are replica-local).",
                u64::from(self.breaker_open),
            ),
            (
                "gateway_ratelimit_probe_failures_total",
                "counter",
                "Probes that found the rate-limit Redis still unreachable.",
                self.probes_failed,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        let name = "gateway_ratelimit_redis_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Rate-limit Redis round trips (one script run, from sending it to its answer or error).\n\
             # TYPE {name} histogram"
        );
        let mut cumulative = 0;
        for (bound, n) in REDIS_DURATION_BUCKETS
            .iter()
            .zip(self.redis_duration_buckets)
        {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.redis_duration_count;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.redis_duration_sum_micros as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_show_up_in_the_prometheus_text() {
        let stats = Stats::default();
        stats.decision(Source::Shared, true);
        stats.decision(Source::Shared, true);
        stats.decision(Source::Local, false);
        stats.fallback();
        stats.breaker_opened();
        stats.leased();
        stats.lease_taken(7);
        let snap = stats.snapshot();
        assert_eq!(snap.decisions(), 3);
        assert!(snap.breaker_open);
        let mut text = String::new();
        snap.write_prometheus(&mut text);
        assert!(text.contains(
            "gateway_ratelimit_decisions_total{source=\"redis\",result=\"allowed\"} 2\n"
        ));
        assert!(
            text.contains(
                "gateway_ratelimit_decisions_total{source=\"local\",result=\"denied\"} 1\n"
            )
        );
        assert!(text.contains("\ngateway_ratelimit_fallbacks_total 1\n"));
        assert!(text.contains("\ngateway_ratelimit_leased_decisions_total 1\n"));
        assert!(text.contains("\ngateway_ratelimit_lease_tokens_total 7\n"));
        assert!(text.contains("\ngateway_ratelimit_breaker_open 1\n"));
        stats.breaker_closed();
        assert!(!stats.snapshot().breaker_open);
    }

    #[test]
    fn redis_round_trips_make_a_cumulative_histogram() {
        let stats = Stats::default();
        stats.redis_duration(Duration::from_micros(300));
        stats.redis_duration(Duration::from_micros(800));
        stats.redis_duration(Duration::from_millis(30));
        stats.redis_duration(Duration::from_secs(3));
        let mut text = String::new();
        stats.snapshot().write_prometheus(&mut text);
        for line in [
            "# TYPE gateway_ratelimit_redis_duration_seconds histogram",
            "gateway_ratelimit_redis_duration_seconds_bucket{le=\"0.00025\"} 0",
            "gateway_ratelimit_redis_duration_seconds_bucket{le=\"0.0005\"} 1",
            "gateway_ratelimit_redis_duration_seconds_bucket{le=\"0.001\"} 2",
            "gateway_ratelimit_redis_duration_seconds_bucket{le=\"0.05\"} 3",
            "gateway_ratelimit_redis_duration_seconds_bucket{le=\"1\"} 3",
            "gateway_ratelimit_redis_duration_seconds_bucket{le=\"+Inf\"} 4",
            "gateway_ratelimit_redis_duration_seconds_count 4",
            "gateway_ratelimit_redis_duration_seconds_sum 3.0311",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
