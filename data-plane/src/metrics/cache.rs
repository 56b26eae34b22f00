//! Response cache counters (`Route.cache`, `--cache-max-bytes`): answers
//! served from the cache, fetched, revalidated, stored, evicted and purged, and
//! the bytes held. One set per replica; [`write_response_cache`] is their
//! Prometheus text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::header;

/// The replica's response cache counters.
#[derive(Debug, Default)]
pub struct ResponseCacheMetrics {
    /// Requests answered from a fresh stored answer (`X-Cache: HIT`).
    pub hits: AtomicU64,
    /// Requests answered by the upstream (`X-Cache: MISS`).
    pub misses: AtomicU64,
    /// Requests answered from a stale stored answer the upstream confirmed with 304 (`X-Cache: STALE`).
    pub stale: AtomicU64,
    /// Answers stored.
    pub stores: AtomicU64,
    /// Answers not stored because they were larger than a shard's budget.
    pub not_stored: AtomicU64,
    /// Keys evicted to stay within the budget.
    pub evictions: AtomicU64,
    /// Keys dropped by purges (`PurgeCache`).
    pub purged: AtomicU64,
    /// Bytes held now (bodies, fields, keys and bookkeeping).
    pub bytes: AtomicU64,
    /// Keys held now.
    pub entries: AtomicU64,
    /// The budget (`--cache-max-bytes`).
    pub capacity_bytes: AtomicU64,
}

/// Prometheus text for the response cache.
pub fn write_response_cache(out: &mut String, m: &ResponseCacheMetrics) {
    let families: [(&str, &str, &str, &AtomicU64); 9] = [
        (
            "gateway_cache_hits_total",
            "counter",
            "Requests of cached routes answered from a fresh stored answer (X-Cache: HIT).",
            &m.hits,
        ),
        (
            "gateway_cache_misses_total",
            "counter",
            "Requests of cached routes answered by the upstream (X-Cache: MISS).",
            &m.misses,
        ),
        (
            "gateway_cache_stale_total",
            "counter",
            "Requests of cached routes answered from a stale stored answer after the upstream confirmed it with 304 (X-Cache: STALE).",
            &m.stale,
        ),
        (
            "gateway_cache_stores_total",
            "counter",
            "Answers stored in the response cache.",
            &m.stores,
        ),
        (
            "gateway_cache_evictions_total",
            "counter",
            "Cached keys evicted (least recently used first) to stay within --cache-max-bytes.",
            &m.evictions,
        ),
        (
            "gateway_cache_purged_total",
            "counter",
            "Cached keys dropped by PurgeCache.",
            &m.purged,
        ),
        (
            "gateway_cache_bytes",
            "gauge",
            "Bytes the response cache holds now.",
            &m.bytes,
        ),
        (
            "gateway_cache_entries",
            "gauge",
            "Keys the response cache holds now.",
            &m.entries,
        ),
        (
            "gateway_cache_max_bytes",
            "gauge",
            "The response cache's budget (--cache-max-bytes).",
            &m.capacity_bytes,
        ),
    ];
    for (name, kind, help, value) in families {
        header(out, name, kind, help);
        let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
    }
}
