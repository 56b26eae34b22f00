//! Verified-token cache: skips the ~40 µs signature check for tokens seen before.
//!
//! * Keyed by a **keyed** hash of the token's signature segment (SipHash with a random
//!   per-process key), so nobody can precompute colliding tokens; the **full token** is stored
//!   and compared on every hit, so even a collision can only cause a miss, never a wrong
//!   identity. Only verified tokens are ever inserted.
//! * `exp` is checked on every hit: an entry is never returned at or after `exp`.
//! * Bounded: sharded maps with a fixed capacity each; when a shard is full, expired entries are
//!   purged first (only when one can have expired), then an arbitrary entry is evicted.
//! * Each entry remembers its `kid`, so entries signed by a key that disappeared from the JWKS
//!   can be dropped at once.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use crate::Identity;

const SHARDS: usize = 16;

struct Entry {
    token: Box<str>,
    kid: Arc<str>,
    identity: Arc<Identity>,
}

#[derive(Default)]
struct Shard {
    /// Keyed by an already keyed hash, re-hashed with foldhash (the workspace's
    /// one fast hasher, one multiply for a `u64`).
    map: HashMap<u64, Entry, foldhash::fast::FixedState>,
    /// Earliest `exp` in the shard: purging before then finds nothing.
    min_exp: u64,
}

/// Bounded cache of verified tokens. `S` is the keyed hasher (random per process by default).
pub(crate) struct TokenCache<S = RandomState> {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: S,
}

impl TokenCache<RandomState> {
    /// A cache holding at most about `capacity` tokens; 0 disables caching.
    pub(crate) fn new(capacity: usize) -> Self {
        Self::with_hasher(capacity, RandomState::new())
    }
}

impl<S: BuildHasher> TokenCache<S> {
    pub(crate) fn with_hasher(capacity: usize, hasher: S) -> Self {
        let per_shard = capacity.div_ceil(SHARDS);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard,
            hasher,
        }
    }

    fn locate(&self, token: &str) -> (u64, &Mutex<Shard>) {
        // Only the signature segment is hashed: it is unique per token (Ed25519 signatures are
        // deterministic per message) and ~7x shorter than the whole token. Tokens sharing a
        // signature merely share a slot; the full-token comparison keeps lookups exact.
        let signature = token.rsplit_once('.').map_or(token, |(_, s)| s);
        let h = self.hasher.hash_one(signature);
        // High bits pick the shard; the map uses the whole hash.
        (h, &self.shards[(h >> 60) as usize % SHARDS])
    }

    /// The identity of `token` if it was verified before and `now < exp`.
    pub(crate) fn get(&self, token: &str, now: u64) -> Option<Arc<Identity>> {
        if self.per_shard == 0 {
            return None;
        }
        let (h, shard) = self.locate(token);
        let mut shard = shard.lock();
        let entry = shard.map.get(&h)?;
        if &*entry.token != token {
            return None;
        }
        if now >= entry.identity.exp {
            shard.map.remove(&h);
            return None;
        }
        Some(entry.identity.clone())
    }

    /// Remembers a verified token until its `exp`.
    pub(crate) fn insert(&self, token: &str, kid: Arc<str>, identity: Arc<Identity>, now: u64) {
        if self.per_shard == 0 || now >= identity.exp {
            return;
        }
        let (h, shard) = self.locate(token);
        let mut shard = shard.lock();
        if shard.map.len() >= self.per_shard && !shard.map.contains_key(&h) {
            if now >= shard.min_exp {
                shard.map.retain(|_, e| now < e.identity.exp);
                shard.min_exp = shard
                    .map
                    .values()
                    .map(|e| e.identity.exp)
                    .min()
                    .unwrap_or(u64::MAX);
            }
            if shard.map.len() >= self.per_shard {
                // Arbitrary victim: iteration order of keyed hashes is effectively random.
                if let Some(victim) = shard.map.keys().next().copied() {
                    shard.map.remove(&victim);
                }
            }
        }
        let exp = identity.exp;
        if shard.map.is_empty() {
            shard.min_exp = exp;
        } else {
            shard.min_exp = shard.min_exp.min(exp);
        }
        shard.map.insert(
            h,
            Entry {
                token: token.into(),
                kid,
                identity,
            },
        );
    }

    /// Drops every entry whose signing key is no longer published.
    pub(crate) fn retain_kids(&self, keep: impl Fn(&str) -> bool) {
        for shard in self.shards.iter() {
            shard.lock().map.retain(|_, e| keep(&e.kid));
        }
    }

    /// Number of cached tokens.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hasher;

    fn identity(sub: &str, exp: u64) -> Arc<Identity> {
        Arc::new(Identity::new(sub.into(), "user".into(), exp).unwrap())
    }

    /// Every token hashes to the same value: a worst-case collision.
    #[derive(Clone)]
    struct Colliding;
    struct Zero;
    impl Hasher for Zero {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {}
    }
    impl BuildHasher for Colliding {
        type Hasher = Zero;
        fn build_hasher(&self) -> Zero {
            Zero
        }
    }

    #[test]
    fn a_hash_collision_is_a_miss_never_someone_elses_identity() {
        let cache = TokenCache::with_hasher(100, Colliding);
        cache.insert("token-a", "k".into(), identity("alice", 100), 0);
        assert_eq!(cache.get("token-a", 1).unwrap().sub, "alice");
        assert!(
            cache.get("token-b", 1).is_none(),
            "colliding token must not get alice's identity"
        );
        cache.insert("token-b", "k".into(), identity("mallory", 100), 0);
        assert_eq!(cache.get("token-b", 1).unwrap().sub, "mallory");
        assert!(cache.get("token-a", 1).is_none());
    }

    #[test]
    fn tokens_sharing_a_signature_segment_are_told_apart() {
        let cache = TokenCache::new(100);
        cache.insert("h.alice.sig", "k".into(), identity("alice", 100), 0);
        assert!(cache.get("h.mallory.sig", 1).is_none());
        assert_eq!(cache.get("h.alice.sig", 1).unwrap().sub, "alice");
    }

    #[test]
    fn entries_are_never_returned_at_or_after_exp() {
        let cache = TokenCache::new(100);
        cache.insert("t", "k".into(), identity("alice", 50), 10);
        assert!(cache.get("t", 49).is_some());
        assert!(cache.get("t", 50).is_none());
        assert_eq!(cache.len(), 0, "expired entry is dropped on access");
        cache.insert("late", "k".into(), identity("alice", 50), 50);
        assert_eq!(cache.len(), 0, "an already expired token is not cached");
    }

    #[test]
    fn capacity_is_bounded_and_expired_entries_go_first() {
        let cache = TokenCache::new(64);
        for i in 0..1000 {
            cache.insert(&format!("t{i}"), "k".into(), identity("u", 1000), 0);
        }
        assert!(cache.len() <= 64, "{}", cache.len());
        assert!(cache.len() >= 48, "shards should fill up: {}", cache.len());

        // Short-lived entries are purged before live ones are evicted.
        let cache = TokenCache::new(16);
        for i in 0..200 {
            cache.insert(&format!("old{i}"), "k".into(), identity("u", 10), 0);
        }
        for i in 0..200 {
            cache.insert(&format!("new{i}"), "k".into(), identity("u", 1000), 20);
        }
        assert!(cache.len() <= 16);
        let live = (0..200)
            .filter(|i| cache.get(&format!("new{i}"), 20).is_some())
            .count();
        assert_eq!(live, cache.len());
    }

    #[test]
    fn zero_capacity_disables_the_cache() {
        let cache = TokenCache::new(0);
        cache.insert("t", "k".into(), identity("alice", 50), 0);
        assert!(cache.get("t", 1).is_none());
    }

    #[test]
    fn retain_kids_drops_tokens_of_removed_keys() {
        let cache = TokenCache::new(100);
        cache.insert("a", "k1".into(), identity("alice", 50), 0);
        cache.insert("b", "k2".into(), identity("bob", 50), 0);
        cache.retain_kids(|kid| kid == "k2");
        assert!(cache.get("a", 1).is_none());
        assert!(cache.get("b", 1).is_some());
    }
}
