//! A bounded, sharded map from `(policy, subject)` to a small value.
//!
//! Used by the local fallback limiter and the "denied until" cache. Each shard
//! is a `parking_lot::Mutex` held only for a hash lookup and a few arithmetic
//! operations, never across an `.await`. Lookups do not allocate: the map is
//! keyed by a keyed SipHash of the pair (so clients cannot aim collisions at
//! one bucket), and each slot keeps the full pair to confirm a hit.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;

use crate::stacked::MAX_STACKED;

/// What a caller wants done with the slot it inspected.
pub(crate) enum Write<V> {
    /// Leave the map as it is.
    Keep,
    /// Store this value for the key.
    Set(V),
    /// Forget the key.
    Remove,
}

struct Slot<V> {
    policy: Arc<str>,
    subject: Box<[u8]>,
    value: V,
}

/// The keys are already keyed SipHash outputs; the map re-hashes them with
/// foldhash (the workspace's one fast hasher, one multiply for a `u64`).
type Shard<V> = HashMap<u64, Slot<V>, foldhash::fast::FixedState>;

/// See the module documentation.
pub(crate) struct ShardedMap<V> {
    hasher: RandomState,
    shards: Box<[Mutex<Shard<V>>]>,
    per_shard_cap: usize,
}

impl<V> ShardedMap<V> {
    /// A map holding at most about `max_keys` keys over `shards` shards (rounded up to a power of two).
    pub(crate) fn new(max_keys: usize, shards: usize) -> Self {
        let shards = shards.max(1).next_power_of_two();
        let per_shard_cap = max_keys.div_ceil(shards).max(1);
        Self {
            hasher: RandomState::new(),
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard_cap,
        }
    }

    fn hash(&self, policy: &str, subject: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(policy.as_bytes());
        h.write_u8(0xff); // not valid UTF-8, so no (policy, subject) split is ambiguous
        h.write(subject);
        h.finish()
    }

    fn index(&self, hash: u64) -> usize {
        // Middle bits: hashbrown uses the low bits for the bucket and the top 7 as a tag.
        (hash >> 40) as usize & (self.shards.len() - 1)
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard<V>> {
        // A panic while holding the lock cannot leave a slot half-written (each
        // write is one insert or remove), so the shard stays usable after one.
        self.shards[index].lock()
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard<V>> {
        self.lock(self.index(hash))
    }

    /// Looks up `(policy, subject)`, lets `f` decide, and applies its [`Write`].
    ///
    /// `is_stale` tells which entries may be dropped when a full shard needs room.
    #[inline]
    pub(crate) fn update<R>(
        &self,
        policy: &Arc<str>,
        subject: &[u8],
        f: impl FnOnce(Option<&V>) -> (R, Write<V>),
        is_stale: impl Fn(&V) -> bool,
    ) -> R {
        let hash = self.hash(policy, subject);
        let mut shard = self.shard(hash);
        let current = shard
            .get(&hash)
            .filter(|slot| *slot.policy == **policy && *slot.subject == *subject);
        let (result, write) = f(current.map(|slot| &slot.value));
        match write {
            Write::Keep => {}
            Write::Remove => {
                if current.is_some() {
                    shard.remove(&hash);
                }
            }
            Write::Set(value) => {
                set(
                    &mut shard,
                    self.per_shard_cap,
                    hash,
                    policy,
                    subject,
                    value,
                    &is_stale,
                );
            }
        }
        result
    }

    /// Like [`ShardedMap::update`] for several keys at once, atomically: every
    /// shard involved is locked (in ascending order, so two callers cannot
    /// deadlock) while `f` reads the current values (copies, `None` for a
    /// missing key) and changes them in place. When `f` returns `true`, every
    /// value left `Some` is stored. Keys must be distinct; at most
    /// [`MAX_STACKED`] of them.
    pub(crate) fn update_many<R>(
        &self,
        keys: &[(&Arc<str>, &[u8])],
        f: impl FnOnce(&mut [Option<V>]) -> (R, bool),
        is_stale: impl Fn(&V) -> bool,
    ) -> R
    where
        V: Copy,
    {
        let n = keys.len();
        assert!(n <= MAX_STACKED, "at most {MAX_STACKED} keys");
        let mut hashes = [0u64; MAX_STACKED];
        let mut shard_of = [0usize; MAX_STACKED];
        for (i, (policy, subject)) in keys.iter().enumerate() {
            hashes[i] = self.hash(policy, subject);
            shard_of[i] = self.index(hashes[i]);
        }
        let mut order = shard_of;
        order[..n].sort_unstable();
        let mut guards: [Option<MutexGuard<'_, Shard<V>>>; MAX_STACKED] = Default::default();
        let mut locked = 0;
        for i in 0..n {
            if i == 0 || order[i] != order[i - 1] {
                order[locked] = order[i];
                guards[locked] = Some(self.lock(order[i]));
                locked += 1;
            }
        }
        let guard_of = |shard: usize| {
            order[..locked]
                .binary_search(&shard)
                .expect("every shard involved is locked")
        };
        let mut values = [None; MAX_STACKED];
        for (i, (policy, subject)) in keys.iter().enumerate() {
            let shard = guards[guard_of(shard_of[i])].as_ref().expect("locked");
            values[i] = shard
                .get(&hashes[i])
                .filter(|slot| *slot.policy == ***policy && *slot.subject == **subject)
                .map(|slot| slot.value);
        }
        let (result, write) = f(&mut values[..n]);
        if write {
            for (i, (policy, subject)) in keys.iter().enumerate() {
                if let Some(value) = values[i] {
                    let shard = guards[guard_of(shard_of[i])].as_mut().expect("locked");
                    set(
                        shard,
                        self.per_shard_cap,
                        hashes[i],
                        policy,
                        subject,
                        value,
                        &is_stale,
                    );
                }
            }
        }
        result
    }

    /// Number of keys held (sums every shard; for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

/// Stores `value` for `(policy, subject)` (hashed to `hash`) in `shard`,
/// making room first if the shard is full.
#[inline]
fn set<V>(
    shard: &mut Shard<V>,
    cap: usize,
    hash: u64,
    policy: &Arc<str>,
    subject: &[u8],
    value: V,
    is_stale: &impl Fn(&V) -> bool,
) {
    if let Some(slot) = shard.get_mut(&hash)
        && *slot.policy == **policy
        && *slot.subject == *subject
    {
        slot.value = value;
        return;
    }
    if shard.len() >= cap && !shard.contains_key(&hash) {
        make_room(shard, cap, is_stale);
    }
    shard.insert(
        hash,
        Slot {
            policy: Arc::clone(policy),
            subject: subject.into(),
            value,
        },
    );
}

/// Drops stale entries; if that frees too little, drops an arbitrary eighth of
/// the shard so the O(n) sweep is paid at most once per `cap / 8` inserts.
fn make_room<V>(shard: &mut Shard<V>, cap: usize, is_stale: &impl Fn(&V) -> bool) {
    shard.retain(|_, slot| !is_stale(&slot.value));
    // Leave room for this insert and for cap/8 more before the next sweep.
    let keep = (cap - cap / 8).saturating_sub(1);
    if shard.len() > keep {
        let excess = shard.len() - keep;
        let victims: Vec<u64> = shard.keys().take(excess).copied().collect();
        for key in victims {
            shard.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bump(map: &ShardedMap<u32>, policy: &Arc<str>, subject: &str) -> u32 {
        map.update(
            policy,
            subject.as_bytes(),
            |v| {
                let n = v.copied().unwrap_or(0) + 1;
                (n, Write::Set(n))
            },
            |_| false,
        )
    }

    #[test]
    fn keys_are_distinct_per_policy_and_subject() {
        let map = ShardedMap::new(100, 4);
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        assert_eq!(bump(&map, &a, "x"), 1);
        assert_eq!(bump(&map, &a, "x"), 2);
        assert_eq!(bump(&map, &b, "x"), 1);
        assert_eq!(bump(&map, &a, "y"), 1);
        assert_eq!(map.len(), 3);
        map.update(&a, b"x", |_| ((), Write::Remove), |_| false);
        assert_eq!(map.len(), 2);
        assert_eq!(bump(&map, &a, "x"), 1);
    }

    #[test]
    fn the_map_stays_bounded_and_prefers_dropping_stale_entries() {
        let map: ShardedMap<u32> = ShardedMap::new(64, 1);
        let p: Arc<str> = Arc::from("p");
        // Fill with stale (0) entries, then keep inserting live ones.
        for i in 0..64 {
            map.update(
                &p,
                format!("stale-{i}").as_bytes(),
                |_| ((), Write::Set(0)),
                |v| *v == 0,
            );
        }
        for i in 0..1_000 {
            map.update(
                &p,
                format!("live-{i}").as_bytes(),
                |_| ((), Write::Set(1)),
                |v| *v == 0,
            );
            assert!(map.len() <= 64, "bounded at {}", map.len());
        }
        // The newest key is always present right after its insert.
        assert_eq!(
            map.update(&p, b"live-999", |v| (v.copied(), Write::Keep), |_| false),
            Some(1)
        );
    }

    #[test]
    fn update_many_reads_and_writes_several_keys_at_once() {
        let map: ShardedMap<u32> = ShardedMap::new(100, 4);
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        assert_eq!(bump(&map, &a, "x"), 1);
        let keys: [(&Arc<str>, &[u8]); 3] = [(&a, b"x"), (&b, b"x"), (&a, b"y")];
        let seen = map.update_many(
            &keys,
            |values| {
                let seen: Vec<_> = values.to_vec();
                for v in values.iter_mut() {
                    *v = Some(v.unwrap_or(0) + 10);
                }
                (seen, true)
            },
            |_| false,
        );
        assert_eq!(seen, vec![Some(1), None, None]);
        // Not written back: nothing changes.
        map.update_many(&keys, |v| (v.fill(Some(0)), false), |_| false);
        assert_eq!(bump(&map, &a, "x"), 12);
        assert_eq!(bump(&map, &b, "x"), 11);
        assert_eq!(bump(&map, &a, "y"), 11);
        assert_eq!(map.len(), 3);
    }
}
