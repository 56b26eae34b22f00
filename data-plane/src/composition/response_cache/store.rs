//! The replica's stored answers: one byte budget (`--cache-max-bytes`) for
//! every cached route, least recently used answers evicted first.
//!
//! Every proxy worker (one thread each) reads and writes the same store, so it
//! is split into shards, each a `parking_lot::Mutex` over a `LinkedHashMap`
//! kept in use order; a lookup locks one shard for one map operation. A key is
//! hashed once: its hash's high bits choose the shard, and the shard's map
//! (hashing with the same seeds) finds it by that hash. Each shard gets an
//! equal part of the budget: up to [`MAX_SHARDS`] shards of at least
//! [`MIN_SHARD_BYTES`] each (a small budget is one shard: exact LRU).
//!
//! A key (route, Host, path, query, listed headers, identity) holds up to
//! [`MAX_VARIANTS`] answers, one per combination of the values of the request
//! fields the answer's own `Vary` names.

use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use gateway_transport::body::ResponseBody;
use gateway_transport::response::{Fields, Response};
use hashlink::LinkedHashMap;
use hashlink::linked_hash_map::RawEntryMut;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, StatusCode};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::metrics::ResponseCacheMetrics;

/// Most shards.
pub const MAX_SHARDS: usize = 16;
/// Smallest budget of a shard: 4 MiB.
pub const MIN_SHARD_BYTES: u64 = 4 << 20;
/// Most answers kept per key (variants by the answer's `Vary`).
pub const MAX_VARIANTS: usize = 8;
/// What an entry costs besides its key, path, fields and body (the map slot,
/// the `Arc`s, the variant list), so a flood of tiny answers is bounded too.
const ENTRY_OVERHEAD: usize = 256;

/// One stored answer. Immutable: a revalidation stores a new one.
#[derive(Debug)]
pub struct Stored {
    /// Status.
    pub status: StatusCode,
    /// The upstream's header fields as they came.
    pub fields: Fields,
    /// The whole body.
    pub body: Bytes,
    /// When it was stored (or last revalidated).
    pub stored_at: Instant,
    /// Its `Age` when it was stored.
    pub initial_age: Duration,
    /// How long it is fresh, counted in age.
    pub lifetime: Duration,
    /// Its `ETag`, the validator of a revalidation.
    pub etag: Option<HeaderValue>,
    /// The request's values of the fields the answer's `Vary` names, in order.
    pub vary_values: Box<[Option<HeaderValue>]>,
}

impl Stored {
    /// Its age at `now`.
    pub fn age(&self, now: Instant) -> Duration {
        self.initial_age + now.saturating_duration_since(self.stored_at)
    }

    /// Whether it is fresh at `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        self.age(now) < self.lifetime
    }

    /// A copy for one caller (fields and body shared, not copied).
    pub fn response(&self) -> Response<ResponseBody> {
        Response::from_parts(
            self.status,
            self.fields.clone(),
            ResponseBody::full(self.body.clone()),
        )
    }

    /// Bytes it costs in the budget (besides its key).
    fn cost(&self) -> usize {
        let fields: usize = self.fields.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
        self.body.len() + fields + ENTRY_OVERHEAD
    }
}

/// The answers of one key.
#[derive(Debug)]
struct Record {
    /// The route (for purges).
    route: Arc<str>,
    /// The request path (for purges by prefix).
    path: Box<str>,
    /// The request fields the answers' `Vary` names (the last stored answer's).
    vary: Box<[HeaderName]>,
    /// One answer per combination of their values, oldest first.
    variants: Vec<Arc<Stored>>,
    /// What the record costs in the budget.
    bytes: usize,
}

/// The seeded hasher of keys: the store's and every shard map's.
type KeyHasher = foldhash::fast::RandomState;

#[derive(Debug)]
struct Shard {
    /// In use order: least recently used first.
    map: LinkedHashMap<Bytes, Record, KeyHasher>,
    bytes: u64,
}

/// The replica's response cache.
#[derive(Debug)]
pub struct ResponseCache {
    shards: Box<[Mutex<Shard>]>,
    shard_budget: u64,
    hasher: KeyHasher,
    metrics: Arc<ResponseCacheMetrics>,
}

/// Where a new answer goes: its key, route and path, and the request fields
/// its `Vary` names.
#[derive(Debug)]
pub struct Slot<'a> {
    /// The key.
    pub key: &'a Bytes,
    /// The route.
    pub route: &'a Arc<str>,
    /// The request path.
    pub path: &'a str,
    /// The fields the answer's `Vary` names.
    pub vary: Box<[HeaderName]>,
}

impl ResponseCache {
    /// A store of at most `max_bytes`, counting in `metrics`.
    pub fn new(max_bytes: u64, metrics: Arc<ResponseCacheMetrics>) -> Self {
        let shards = (max_bytes / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS as u64) as usize;
        metrics.capacity_bytes.store(max_bytes, Ordering::Relaxed);
        let hasher = KeyHasher::default();
        Self {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        map: LinkedHashMap::with_hasher(hasher.clone()),
                        bytes: 0,
                    })
                })
                .collect(),
            shard_budget: max_bytes / shards as u64,
            hasher,
            metrics,
        }
    }

    /// Its counters.
    pub fn metrics(&self) -> &ResponseCacheMetrics {
        &self.metrics
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        self.shard_of(self.hasher.hash_one(key))
    }

    /// The shard of a key hashed to `hash`: by its high bits, as the shard's
    /// map places keys by the low ones.
    fn shard_of(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[(hash >> 48) as usize % self.shards.len()]
    }

    /// The answer stored under `key` for a request with `headers`, fresh or
    /// not; marks the key used.
    pub fn get(&self, key: &[u8], headers: &HeaderMap) -> Option<Arc<Stored>> {
        // `[u8]` and `Bytes` hash alike: one hash finds the shard and the entry.
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard_of(hash).lock();
        // The most recently used key (a hot one, under load) is read without
        // relinking: nothing in the shard is written but its lock.
        let most_recent = shard.map.back().is_some_and(|(k, _)| k[..] == *key);
        let record = if most_recent {
            shard.map.back()?.1
        } else {
            match shard.map.raw_entry_mut().from_key_hashed_nocheck(hash, key) {
                RawEntryMut::Occupied(mut entry) => {
                    entry.to_back();
                    &*entry.into_mut()
                }
                RawEntryMut::Vacant(_) => return None,
            }
        };
        let values = vary_values(&record.vary, headers);
        record
            .variants
            .iter()
            .find(|s| s.vary_values == values)
            .cloned()
    }

    /// Stores `stored` (replacing the answer of the same variant), then evicts
    /// least recently used keys while the shard is over its budget. An answer
    /// larger than a shard's budget is not stored.
    pub fn put(&self, slot: Slot<'_>, stored: Stored) {
        let cost = stored.cost();
        let key_cost = slot.key.len() + slot.path.len();
        if (cost + key_cost) as u64 > self.shard_budget {
            self.metrics.not_stored.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let stored = Arc::new(stored);
        let mut evicted = 0u64;
        let mut freed = 0u64;
        let added;
        let entries_added: i64;
        {
            let mut guard = self.shard(slot.key).lock();
            let shard = &mut *guard;
            let before;
            match shard.map.to_back(slot.key) {
                Some(record) => {
                    before = record.bytes;
                    if record.vary != slot.vary {
                        record.vary = slot.vary;
                        record.variants.clear();
                        record.bytes = key_cost;
                    }
                    if let Some(i) = record
                        .variants
                        .iter()
                        .position(|s| s.vary_values == stored.vary_values)
                    {
                        record.bytes -= record.variants.remove(i).cost();
                    } else if record.variants.len() >= MAX_VARIANTS {
                        record.bytes -= record.variants.remove(0).cost();
                    }
                    record.bytes += cost;
                    record.variants.push(stored);
                    added = record.bytes as i64 - before as i64;
                    entries_added = 0;
                }
                None => {
                    let record = Record {
                        route: Arc::clone(slot.route),
                        path: slot.path.into(),
                        vary: slot.vary,
                        variants: vec![stored],
                        bytes: key_cost + cost,
                    };
                    added = record.bytes as i64;
                    entries_added = 1;
                    shard.map.insert(slot.key.clone(), record);
                }
            }
            shard.bytes = shard.bytes.saturating_add_signed(added);
            while shard.bytes > self.shard_budget {
                let Some((_, old)) = shard.map.pop_front() else {
                    break;
                };
                shard.bytes -= old.bytes as u64;
                freed += old.bytes as u64;
                evicted += 1;
            }
        }
        let m = &self.metrics;
        m.stores.fetch_add(1, Ordering::Relaxed);
        m.evictions.fetch_add(evicted, Ordering::Relaxed);
        m.entries
            .fetch_add((entries_added - evicted as i64) as u64, Ordering::Relaxed);
        m.bytes
            .fetch_add((added - freed as i64) as u64, Ordering::Relaxed);
    }

    /// Drops every answer of `route` whose path starts with `path_prefix`
    /// (empty: all of the route's). Returns how many keys went.
    pub fn purge(&self, route: &str, path_prefix: &str) -> u64 {
        let mut removed = 0u64;
        let mut freed = 0u64;
        for shard in &self.shards {
            let mut guard = shard.lock();
            let shard = &mut *guard;
            let mut shard_freed = 0u64;
            shard.map.retain(|_, r| {
                let hit = &*r.route == route && r.path.starts_with(path_prefix);
                if hit {
                    removed += 1;
                    shard_freed += r.bytes as u64;
                }
                !hit
            });
            shard.bytes -= shard_freed;
            freed += shard_freed;
        }
        let m = &self.metrics;
        m.purged.fetch_add(removed, Ordering::Relaxed);
        m.entries.fetch_sub(removed, Ordering::Relaxed);
        m.bytes.fetch_sub(freed, Ordering::Relaxed);
        removed
    }
}

/// The values of `names` in `headers` (the first of each), in order.
pub fn vary_values(names: &[HeaderName], headers: &HeaderMap) -> Box<[Option<HeaderValue>]> {
    names.iter().map(|n| headers.get(n).cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(body: usize, vary_values: Box<[Option<HeaderValue>]>) -> Stored {
        Stored {
            status: StatusCode::OK,
            fields: Fields::default(),
            body: Bytes::from(vec![b'x'; body]),
            stored_at: Instant::now(),
            initial_age: Duration::ZERO,
            lifetime: Duration::from_secs(60),
            etag: None,
            vary_values,
        }
    }

    fn put(cache: &ResponseCache, key: &str, body: usize) {
        let route: Arc<str> = "r".into();
        let key = Bytes::copy_from_slice(key.as_bytes());
        let slot = Slot {
            key: &key,
            route: &route,
            path: "/a",
            vary: Box::new([]),
        };
        cache.put(slot, stored(body, Box::new([])));
    }

    fn has(cache: &ResponseCache, key: &str) -> bool {
        let key = Bytes::copy_from_slice(key.as_bytes());
        cache.get(&key, &HeaderMap::new()).is_some()
    }

    #[test]
    fn least_recently_used_keys_go_first_and_bytes_are_counted() {
        let metrics = Arc::new(ResponseCacheMetrics::default());
        // One shard of 4000 bytes: three answers of ~1300 bytes fit, a fourth evicts.
        let cache = ResponseCache::new(4000, metrics.clone());
        put(&cache, "a", 1000);
        put(&cache, "b", 1000);
        put(&cache, "c", 1000);
        assert!(has(&cache, "a"), "a used: b is now the oldest");
        put(&cache, "d", 1000);
        assert!(!has(&cache, "b"));
        assert!(has(&cache, "a") && has(&cache, "c") && has(&cache, "d"));
        assert_eq!(metrics.evictions.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.entries.load(Ordering::Relaxed), 3);
        let bytes = metrics.bytes.load(Ordering::Relaxed);
        assert!((3 * 1000..=4000).contains(&bytes), "{bytes}");
        put(&cache, "big", 5000);
        assert!(!has(&cache, "big"), "larger than the budget: not stored");
        assert_eq!(cache.purge("r", "/"), 3);
        assert_eq!(metrics.bytes.load(Ordering::Relaxed), 0);
        assert_eq!(metrics.entries.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn variants_of_one_key_are_kept_apart() {
        let cache = ResponseCache::new(1 << 20, Arc::default());
        let key = Bytes::from_static(b"k");
        let route: Arc<str> = "r".into();
        let lang = HeaderName::from_static("accept-language");
        for l in ["en", "fr"] {
            let slot = Slot {
                key: &key,
                route: &route,
                path: "/a",
                vary: Box::new([lang.clone()]),
            };
            cache.put(
                slot,
                stored(1, Box::new([Some(HeaderValue::from_static(l))])),
            );
        }
        let mut h = HeaderMap::new();
        h.insert(&lang, HeaderValue::from_static("fr"));
        assert!(cache.get(&key, &h).is_some());
        h.insert(&lang, HeaderValue::from_static("de"));
        assert!(cache.get(&key, &h).is_none());
        assert_eq!(cache.purge("other", ""), 0);
        assert_eq!(cache.purge("r", "/b"), 0);
        assert_eq!(cache.purge("r", ""), 1);
    }

    #[test]
    fn keys_are_found_by_the_hash_that_chose_their_shard() {
        // 16 shards: the lookup's one hash must agree with each shard map's own.
        let cache = ResponseCache::new(64 << 20, Arc::default());
        let keys: Vec<String> = (0..2000).map(|i| format!("key-{i}")).collect();
        for k in &keys {
            put(&cache, k, 10);
        }
        assert!(keys.iter().all(|k| has(&cache, k)));
        assert!(!has(&cache, "key-2000"));
        let used = cache
            .shards
            .iter()
            .filter(|s| !s.lock().map.is_empty())
            .count();
        assert_eq!(used, MAX_SHARDS, "keys spread over every shard");
    }

    #[test]
    fn big_budgets_are_sharded() {
        let cache = ResponseCache::new(64 << 20, Arc::default());
        assert_eq!(cache.shards.len(), MAX_SHARDS);
        assert_eq!(cache.shard_budget, 4 << 20);
        let cache = ResponseCache::new(10 << 20, Arc::default());
        assert_eq!(cache.shards.len(), 2);
    }
}
