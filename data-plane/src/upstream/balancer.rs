//! Instance selection (docs/data-plane.md, "Balance → breaker"): the upstream's `lb_policy`.
//!
//! * **Round-robin** (default): the cursor advances once per request; from
//!   there the first available instance is chosen.
//! * **Least-request**: power of two random choices. Two distinct instances are
//!   drawn and the one with fewer requests in flight ([`InstanceState::in_flight`],
//!   an atomic counter held by a guard for the life of each request) is tried
//!   first, then the other. Cost: two random numbers and two atomic loads, no
//!   lock, no scan; unlike "pick the global minimum" it does not herd every
//!   replica onto the same instance.
//! * **Consistent hash**: rendezvous (highest random weight) hashing. Every
//!   instance gets the weight `mix(key ^ seed(instance id))`; the highest
//!   available one wins. Removing an instance moves only the keys it won,
//!   adding one takes only the keys it now wins (about 1/N each), and every
//!   replica maps a key the same way without sharing anything. The key is
//!   hashed once per request ([`Affinity`]). A request without the key (no
//!   verified user, no such header) is balanced round-robin.
//!
//! Instance weights (`Instance.weight`, [`Weights`]) make round-robin walk a
//! [`WeightLine`] instead of the list (three times the turns for weight 3,
//! interleaved), least-request draw its two candidates by weight and compare
//! in-flight counts per unit of weight, and rendezvous hashing use weighted
//! scores (`weight / -ln(u)`, so an instance wins keys in proportion to its
//! weight). Upstreams whose instances all have weight 1 take none of these
//! paths.
//!
//! "Available" is the same for all three: not excluded (the instance a retry
//! moves away from), healthy (active checks), not ejected as an outlier
//! ([`super::outlier`]), and admitted by its breaker. The
//! breaker is asked last, only for the candidate about to be chosen, so a
//! half-open probe slot is taken only by the instance that really gets the
//! request. A retry keeps the request's [`Affinity`], so a consistent-hash
//! retry goes to the key's next-ranked instance.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use gateway_proto::spec::{Balancing, HashKey};
use http::HeaderMap;
use http::header::HeaderName;
use rand::Rng as _;

use crate::upstream::breaker::Permit;
use crate::upstream::weights::WeightLine;
use crate::upstream::{InstanceState, UpstreamEntry};

/// The weights of an upstream's instances, when not all are 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights {
    /// Each instance's weight, in instance order.
    of: Box<[u32]>,
    /// The instances laid out by weight.
    line: WeightLine,
}

impl Weights {
    /// The weights of instances in order; `None` when all are 1 (or 0, the
    /// default), so equal instances take the unweighted paths.
    pub fn new(weights: &[u32]) -> Option<Self> {
        let weights: Box<[u32]> = weights.iter().map(|w| (*w).max(1)).collect();
        if weights.iter().all(|&w| w == 1) {
            return None;
        }
        Some(Self {
            line: WeightLine::new(weights.iter().copied())?,
            of: weights,
        })
    }

    /// The weight of instance `index`.
    pub fn of(&self, index: usize) -> u32 {
        self.of.get(index).copied().unwrap_or(1)
    }
}

/// How an upstream spreads requests (from `Upstream.lb_policy`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Policy {
    /// Next available instance in turn.
    #[default]
    RoundRobin,
    /// Power of two random choices on in-flight requests.
    LeastRequest,
    /// Rendezvous hashing of a request key.
    ConsistentHash(HashOn),
}

/// The request key a consistent-hash upstream hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashOn {
    /// The verified JWT subject.
    User,
    /// The client address (trusted-proxy rule of [`crate::policy::sanitize::client_ip`]).
    Ip,
    /// The value of this request header.
    Header(HeaderName),
}

impl Policy {
    /// From a validated upstream's balancing.
    pub fn from_spec(b: &Balancing) -> Self {
        match b {
            Balancing::RoundRobin => Self::RoundRobin,
            Balancing::LeastRequest => Self::LeastRequest,
            Balancing::ConsistentHash(HashKey::User) => Self::ConsistentHash(HashOn::User),
            Balancing::ConsistentHash(HashKey::Ip) => Self::ConsistentHash(HashOn::Ip),
            Balancing::ConsistentHash(HashKey::Header(h)) => {
                Self::ConsistentHash(HashOn::Header(h.clone()))
            }
        }
    }

    /// Lower-case name for JSON: `round_robin`, `least_request`, `consistent_hash`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::LeastRequest => "least_request",
            Self::ConsistentHash(_) => "consistent_hash",
        }
    }
}

impl HashOn {
    /// `user`, `ip`, or `header:<name>`, for JSON.
    pub fn describe(&self) -> String {
        match self {
            Self::User => "user".into(),
            Self::Ip => "ip".into(),
            Self::Header(h) => format!("header:{h}"),
        }
    }
}

/// A request's consistent-hash key, hashed once. Empty when the upstream does
/// not hash or the request has no key (then the request is balanced round-robin).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Affinity(Option<u64>);

impl Affinity {
    /// No key.
    pub const NONE: Self = Self(None);

    /// The key `bytes` (a user id, a header value, an address).
    pub fn of(bytes: &[u8]) -> Self {
        Self(Some(hash(bytes)))
    }

    /// The key's hash, if there is a key.
    pub fn value(self) -> Option<u64> {
        self.0
    }
}

/// The key `policy` hashes, taken from the request: the verified `user`, the
/// request `headers`, or the client address (computed only when needed).
/// An empty header value counts as no key.
pub fn affinity(
    policy: &Policy,
    user: Option<&[u8]>,
    headers: &HeaderMap,
    client: impl FnOnce() -> IpAddr,
) -> Affinity {
    let Policy::ConsistentHash(on) = policy else {
        return Affinity::NONE;
    };
    affinity_on(on, user, headers, client)
}

/// The key `on` names, taken from the request (see [`affinity`]); also the
/// key of a sticky route split.
pub fn affinity_on(
    on: &HashOn,
    user: Option<&[u8]>,
    headers: &HeaderMap,
    client: impl FnOnce() -> IpAddr,
) -> Affinity {
    match on {
        HashOn::User => user.map_or(Affinity::NONE, Affinity::of),
        HashOn::Ip => match client() {
            IpAddr::V4(v4) => Affinity::of(&v4.octets()),
            IpAddr::V6(v6) => Affinity::of(&v6.octets()),
        },
        HashOn::Header(name) => headers
            .get(name)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty())
            .map_or(Affinity::NONE, Affinity::of),
    }
}

/// The chosen instance and its breaker admission.
#[derive(Debug)]
pub struct Pick<'a> {
    /// Position in the upstream's instance list.
    pub index: usize,
    /// The instance.
    pub instance: &'a Arc<InstanceState>,
    /// Breaker admission; report the outcome through it.
    pub permit: Permit<'a>,
    /// The request's key, for a retry ([`pick`] again with `exclude`).
    pub key: Affinity,
}

/// Picks an available instance of `upstream` with its policy, skipping
/// `exclude` (the instance a retry moves away from). `None`: every instance is
/// unhealthy, breaker-open or excluded.
pub fn pick(upstream: &UpstreamEntry, key: Affinity, exclude: Option<usize>) -> Option<Pick<'_>> {
    pick_excluding(upstream, key, exclude.as_slice())
}

/// [`pick`], skipping every instance in `exclude` (those a request with a
/// route `retry` has already tried).
pub fn pick_excluding<'u>(
    upstream: &'u UpstreamEntry,
    key: Affinity,
    exclude: &[usize],
) -> Option<Pick<'u>> {
    if upstream.instances.is_empty() {
        return None;
    }
    let index = match (&upstream.policy, key.0) {
        (Policy::ConsistentHash(_), Some(hash)) => rendezvous(upstream, hash, exclude),
        (Policy::LeastRequest, _) => least_request(upstream, exclude),
        _ => round_robin(upstream, exclude),
    };
    index.map(|(index, permit)| Pick {
        index,
        instance: &upstream.instances[index],
        permit,
        key,
    })
}

/// Whether some instance of `upstream` would take a request now: healthy
/// and with a breaker that would admit it (nothing is taken: a route split
/// asks this before choosing the upstream).
pub fn any_available(upstream: &UpstreamEntry) -> bool {
    upstream
        .instances
        .iter()
        .enumerate()
        .any(|(i, inst)| eligible(upstream, i, &[]) && inst.breaker.would_admit(&upstream.breaker))
}

/// Healthy, not ejected as an outlier and not excluded: a candidate worth asking the breaker about.
fn eligible(upstream: &UpstreamEntry, index: usize, exclude: &[usize]) -> bool {
    let instance = &upstream.instances[index];
    !exclude.contains(&index) && instance.is_healthy() && !instance.outlier.is_ejected()
}

fn admit<'u>(
    upstream: &'u UpstreamEntry,
    index: usize,
    exclude: &[usize],
) -> Option<(usize, Permit<'u>)> {
    if !eligible(upstream, index, exclude) {
        return None;
    }
    let permit = upstream.instances[index]
        .breaker
        .try_acquire(&upstream.breaker)?;
    Some((index, permit))
}

fn round_robin<'u>(upstream: &'u UpstreamEntry, exclude: &[usize]) -> Option<(usize, Permit<'u>)> {
    let n = upstream.instances.len();
    let turn = upstream.cursor.fetch_add(1, Ordering::Relaxed);
    let start = match &upstream.weights {
        None => turn,
        Some(w) => w.line.step(turn as u64),
    };
    (0..n).find_map(|k| admit(upstream, (start + k) % n, exclude))
}

fn least_request<'u>(
    upstream: &'u UpstreamEntry,
    exclude: &[usize],
) -> Option<(usize, Permit<'u>)> {
    let n = upstream.instances.len();
    if n >= 2 {
        let mut rng = rand::rng();
        let (a, b) = match &upstream.weights {
            None => {
                let a = rng.random_range(0..n);
                (a, (a + rng.random_range(1..n)) % n)
            }
            Some(w) => {
                // Both drawn by weight; a repeat falls back to any other instance.
                let a = w.line.at(rng.random_range(0..w.line.total()));
                let b = w.line.at(rng.random_range(0..w.line.total()));
                (
                    a,
                    if b == a {
                        (a + rng.random_range(1..n)) % n
                    } else {
                        b
                    },
                )
            }
        };
        // In-flight requests per unit of weight: load(b)/w(b) < load(a)/w(a).
        let weight = |i: usize| upstream.weights.as_ref().map_or(1, |w| u64::from(w.of(i)));
        let load = |i: usize| upstream.instances[i].in_flight();
        let (first, second) = if load(b) * weight(a) < load(a) * weight(b) {
            (b, a)
        } else {
            (a, b)
        };
        if let Some(p) =
            admit(upstream, first, exclude).or_else(|| admit(upstream, second, exclude))
        {
            return Some(p);
        }
    }
    // One instance, or both draws unavailable: any available one will do.
    round_robin(upstream, exclude)
}

fn rendezvous<'u>(
    upstream: &'u UpstreamEntry,
    key: u64,
    exclude: &[usize],
) -> Option<(usize, Permit<'u>)> {
    // Walk the instances from the highest weight down, without sorting or
    // allocating: each round finds the best one ranked below the last refusal.
    let mut below: Option<(u64, usize)> = None;
    loop {
        let best = upstream
            .instances
            .iter()
            .enumerate()
            .filter(|(i, _)| eligible(upstream, *i, exclude))
            .map(|(i, inst)| (rank(upstream, key, i, inst.hash_seed), i))
            .filter(|w| below.is_none_or(|b| *w < b))
            .max()?;
        if let Some(permit) = upstream.instances[best.1]
            .breaker
            .try_acquire(&upstream.breaker)
        {
            return Some((best.1, permit));
        }
        below = Some(best);
    }
}

/// FNV-1a, then a finaliser: stable across builds and replicas (unlike
/// `DefaultHasher`), so every data plane maps a key to the same instance.
///
/// The workspace's one hash whose values must agree between processes; it is
/// written out here rather than taken from foldhash (the in-process hasher),
/// whose output may change with its version and would then move keys between
/// instances during a rolling upgrade.
fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// The 64-bit finaliser of MurmurHash3: every input bit affects every output bit.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// An instance's rendezvous seed, from its id (so a moved URL keeps its keys).
pub(crate) fn instance_seed(id: &str) -> u64 {
    hash(id.as_bytes())
}

fn weight(key: u64, seed: u64) -> u64 {
    mix(key ^ seed)
}

/// An instance's rendezvous score for `key`: the hash itself, or with
/// weights `w / -ln(u)` (u: the hash as a fraction in (0, 1)), which makes an
/// instance win keys in proportion to its weight. Positive floats order like
/// their bit patterns, so both are compared as `u64`.
fn rank(upstream: &UpstreamEntry, key: u64, index: usize, seed: u64) -> u64 {
    let h = weight(key, seed);
    match &upstream.weights {
        None => h,
        Some(w) => {
            let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (f64::from(w.of(index)) / -u.ln()).to_bits()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::InstanceKey;
    use crate::upstream::breaker::BreakerSettings;
    use gateway_transport::pool::PoolSettings;
    use std::collections::HashMap;
    use std::time::Duration;

    fn instance(id: &str) -> Arc<InstanceState> {
        let key = InstanceKey {
            upstream: "u".into(),
            id: id.into(),
            url: "http://127.0.0.1:1".into(),
            tls: None,
            protocol: gateway_transport::pool::Protocol::Http1,
        };
        Arc::new(InstanceState::new(
            key,
            "127.0.0.1:1",
            PoolSettings::default(),
            None,
        ))
    }

    fn entry(instances: Vec<Arc<InstanceState>>, policy: Policy) -> UpstreamEntry {
        let breaker = BreakerSettings {
            failure_threshold: 1,
            reset_timeout: Duration::from_secs(60),
            half_open_max_requests: 1,
            count_5xx: true,
            max_open_percent: 100,
        };
        UpstreamEntry::new("u", instances, breaker, None).with_policy(policy)
    }

    fn upstream(n: usize) -> UpstreamEntry {
        upstream_with(n, Policy::RoundRobin)
    }

    fn upstream_with(n: usize, policy: Policy) -> UpstreamEntry {
        entry((0..n).map(|i| instance(&format!("i{i}"))).collect(), policy)
    }

    fn ids(u: &UpstreamEntry, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                pick(u, Affinity::NONE, None).map_or("-".into(), |p| p.instance.id.to_string())
            })
            .collect()
    }

    fn hashed(n: usize) -> UpstreamEntry {
        upstream_with(n, Policy::ConsistentHash(HashOn::User))
    }

    /// Where each of `users` goes.
    fn owners(u: &UpstreamEntry, users: &[String]) -> HashMap<String, String> {
        users
            .iter()
            .map(|user| {
                let p = pick(u, Affinity::of(user.as_bytes()), None).unwrap();
                (user.clone(), p.instance.id.to_string())
            })
            .collect()
    }

    fn users(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("user-{i}")).collect()
    }

    #[test]
    fn round_robin_over_all_when_all_are_available() {
        let u = upstream(3);
        assert_eq!(ids(&u, 6), ["i0", "i1", "i2", "i0", "i1", "i2"]);
    }

    #[test]
    fn skips_unhealthy_instances() {
        let u = upstream(3);
        u.instances[1].set_healthy(false);
        let got = ids(&u, 6);
        assert!(!got.contains(&"i1".to_string()), "{got:?}");
        assert!(got.contains(&"i0".to_string()) && got.contains(&"i2".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn skips_breaker_open_instances() {
        let u = upstream(2);
        // failure_threshold 1: one failure opens i0's breaker.
        let first = pick(&u, Affinity::NONE, None).unwrap();
        assert_eq!(&*first.instance.id, "i0");
        let _ = first.permit.failure();
        assert_eq!(ids(&u, 4), ["i1", "i1", "i1", "i1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn none_when_nothing_is_available() {
        let u = upstream(2);
        u.instances[0].set_healthy(false);
        let p = pick(&u, Affinity::NONE, None).unwrap();
        let _ = p.permit.failure();
        assert!(pick(&u, Affinity::NONE, None).is_none());
        assert!(pick(&upstream(0), Affinity::NONE, None).is_none());
    }

    fn weighted(weights: &[u32], policy: Policy) -> UpstreamEntry {
        upstream_with(weights.len(), policy).with_weights(Weights::new(weights))
    }

    fn shares(u: &UpstreamEntry, picks: impl Iterator<Item = Option<usize>>) -> Vec<usize> {
        let mut c = vec![0; u.instances.len()];
        for i in picks.flatten() {
            c[i] += 1;
        }
        c
    }

    #[test]
    fn weights_of_one_take_the_unweighted_paths() {
        assert!(Weights::new(&[1, 1, 0]).is_none());
        assert!(Weights::new(&[1, 2]).is_some());
    }

    #[test]
    fn round_robin_follows_the_weights_interleaved() {
        let u = weighted(&[3, 1], Policy::RoundRobin);
        let c = shares(
            &u,
            (0..400).map(|_| pick(&u, Affinity::NONE, None).map(|p| p.index)),
        );
        assert_eq!(c, [300, 100]);
        // Never the light instance twice in a row.
        let order = ids(&u, 8);
        assert!(
            order.windows(2).all(|w| !(w[0] == "i1" && w[1] == "i1")),
            "{order:?}"
        );
    }

    #[test]
    fn least_request_draws_by_weight() {
        let u = weighted(&[4, 1], Policy::LeastRequest);
        let c = shares(
            &u,
            (0..5000).map(|_| pick(&u, Affinity::NONE, None).map(|p| p.index)),
        );
        // Both idle: the first draw wins ties, drawn 4:1 (0.8 ± a few %).
        let heavy = c[0] as f64 / 5000.0;
        assert!((0.74..0.86).contains(&heavy), "{c:?}");
    }

    #[test]
    fn consistent_hash_shares_keys_by_weight() {
        let u = weighted(&[1, 3], Policy::ConsistentHash(HashOn::User));
        let c = shares(
            &u,
            users(8000)
                .iter()
                .map(|user| pick(&u, Affinity::of(user.as_bytes()), None).map(|p| p.index)),
        );
        let heavy = c[1] as f64 / 8000.0;
        assert!((0.72..0.78).contains(&heavy), "{c:?}");
        // Still sticky.
        let again = owners(&u, &users(100));
        assert_eq!(again, owners(&u, &users(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn any_available_takes_no_permit() {
        let u = upstream(1);
        assert!(any_available(&u));
        let p = pick(&u, Affinity::NONE, None).unwrap();
        let _ = p.permit.failure();
        assert!(!any_available(&u));
        tokio::time::advance(Duration::from_secs(61)).await;
        // Due for a probe: available, and asking took nothing (the probe is still there to take).
        assert!(any_available(&u));
        assert!(any_available(&u));
        assert!(pick(&u, Affinity::NONE, None).is_some());
        u.instances[0].set_healthy(false);
        assert!(!any_available(&u));
    }

    #[test]
    fn exclude_moves_a_retry_elsewhere() {
        let u = upstream(2);
        for _ in 0..4 {
            assert_eq!(
                &*pick(&u, Affinity::NONE, Some(0)).unwrap().instance.id,
                "i1"
            );
        }
        let single = upstream(1);
        assert!(pick(&single, Affinity::NONE, Some(0)).is_none());
    }

    #[test]
    fn least_request_prefers_the_less_loaded_instance() {
        let u = upstream_with(2, Policy::LeastRequest);
        // i0 has 5 requests in flight, i1 none: with two instances both are
        // always drawn, so every pick must be i1.
        let busy: Vec<_> = (0..5).map(|_| u.instances[0].start_request()).collect();
        assert_eq!(ids(&u, 50), vec!["i1"; 50]);
        drop(busy);
        // Equal load: both get traffic.
        let got = ids(&u, 200);
        assert!(got.iter().any(|i| i == "i0") && got.iter().any(|i| i == "i1"));
    }

    #[test]
    fn least_request_spreads_to_the_least_loaded_among_many() {
        // Four instances, three of them loaded: the idle one wins every draw it
        // is part of, i.e. half the picks (2 of 4 drawn), far above 1/4.
        let u = upstream_with(4, Policy::LeastRequest);
        let _busy: Vec<_> = (0..3)
            .flat_map(|i| (0..3).map(move |_| i))
            .map(|i| u.instances[i].start_request())
            .collect();
        let got = ids(&u, 4000);
        let idle = got.iter().filter(|i| *i == "i3").count();
        assert!(
            (1700..=2300).contains(&idle),
            "idle instance got {idle} of 4000"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn least_request_skips_unhealthy_and_open_instances() {
        let u = upstream_with(3, Policy::LeastRequest);
        // The unhealthy one has the least load; it must still never be chosen.
        let _busy: Vec<_> = [1, 1, 2, 2]
            .iter()
            .map(|i| u.instances[*i].start_request())
            .collect();
        u.instances[0].set_healthy(false);
        let got = ids(&u, 100);
        assert!(!got.contains(&"i0".to_string()), "{got:?}");
        // Open i1's breaker (threshold 1): only i2 is left.
        let p = loop {
            let p = pick(&u, Affinity::NONE, None).unwrap();
            if &*p.instance.id == "i1" {
                break p;
            }
        };
        let _ = p.permit.failure();
        assert_eq!(ids(&u, 20), vec!["i2"; 20]);
        assert!(pick(&u, Affinity::NONE, Some(2)).is_none());
    }

    #[test]
    fn consistent_hash_maps_the_same_user_to_the_same_instance() {
        let u = hashed(5);
        let all = users(1000);
        let first = owners(&u, &all);
        assert_eq!(first, owners(&u, &all), "same user, same instance");
        // A fresh upstream entry (another replica, or a new snapshot) agrees.
        assert_eq!(first, owners(&hashed(5), &all));
        // And the keys are spread: every instance gets a fair share.
        let mut per: HashMap<&str, usize> = HashMap::new();
        for owner in first.values() {
            *per.entry(owner).or_default() += 1;
        }
        assert_eq!(per.len(), 5, "{per:?}");
        assert!(per.values().all(|n| (130..=270).contains(n)), "{per:?}");
    }

    #[test]
    fn removing_one_of_n_instances_remaps_only_its_users() {
        let all = users(1000);
        let n = 5;
        let before = owners(&hashed(n), &all);
        // Remove i2: the same ids minus one (state objects are irrelevant here).
        let kept: Vec<_> = (0..n)
            .filter(|i| *i != 2)
            .map(|i| instance(&format!("i{i}")))
            .collect();
        let after = owners(&entry(kept, Policy::ConsistentHash(HashOn::User)), &all);
        let moved: Vec<_> = all.iter().filter(|u| before[*u] != after[*u]).collect();
        assert!(
            moved.iter().all(|u| before[*u] == "i2"),
            "only i2's users may move"
        );
        let had_i2 = before.values().filter(|o| *o == "i2").count();
        assert_eq!(moved.len(), had_i2, "every user of i2 moves");
        // About 1/N of the keys.
        assert!((130..=270).contains(&moved.len()), "{} moved", moved.len());
        // Adding it back restores the original mapping exactly.
        assert_eq!(owners(&hashed(n), &all), before);
    }

    #[tokio::test(start_paused = true)]
    async fn consistent_hash_skips_unavailable_instances_and_comes_back() {
        let u = hashed(4);
        let all = users(200);
        let before = owners(&u, &all);
        let victim = before["user-0"].clone();
        let index = u.instances.iter().position(|i| *i.id == victim).unwrap();

        u.instances[index].set_healthy(false);
        let unhealthy = owners(&u, &all);
        for user in &all {
            if before[user] == victim {
                assert_ne!(unhealthy[user], victim);
            } else {
                assert_eq!(unhealthy[user], before[user], "{user} must not move");
            }
        }
        u.instances[index].set_healthy(true);
        assert_eq!(owners(&u, &all), before, "healthy again: keys return");

        // Breaker open (threshold 1): same effect as unhealthy.
        let p = pick(&u, Affinity::of(b"user-0"), None).unwrap();
        assert_eq!(*p.instance.id, *victim);
        let _ = p.permit.failure();
        assert_eq!(owners(&u, &all), unhealthy);
    }

    #[test]
    fn consistent_hash_retry_goes_to_the_next_ranked_instance() {
        let u = hashed(3);
        let key = Affinity::of(b"alice");
        let first = pick(&u, key, None).unwrap();
        assert_eq!(first.key, key);
        let retry = pick(&u, first.key, Some(first.index)).unwrap();
        assert_ne!(retry.index, first.index);
        // Deterministic: the same retry target every time.
        for _ in 0..10 {
            assert_eq!(pick(&u, key, Some(first.index)).unwrap().index, retry.index);
        }
    }

    #[test]
    fn a_request_without_the_key_is_balanced_round_robin() {
        let u = hashed(3);
        assert_eq!(ids(&u, 6), ["i0", "i1", "i2", "i0", "i1", "i2"]);
    }

    #[test]
    fn affinity_takes_the_key_the_policy_names() {
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", "acme".parse().unwrap());
        headers.insert("x-empty", "".parse().unwrap());
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let header = |name: &'static str| {
            Policy::ConsistentHash(HashOn::Header(HeaderName::from_static(name)))
        };
        let user = Policy::ConsistentHash(HashOn::User);
        assert_eq!(
            affinity(&user, Some(b"alice"), &headers, || ip),
            Affinity::of(b"alice")
        );
        assert_eq!(affinity(&user, None, &headers, || ip), Affinity::NONE);
        assert_eq!(
            affinity(&Policy::ConsistentHash(HashOn::Ip), None, &headers, || ip),
            Affinity::of(&[10, 1, 2, 3])
        );
        assert_eq!(
            affinity(&header("x-tenant"), None, &headers, || ip),
            Affinity::of(b"acme")
        );
        assert_eq!(
            affinity(&header("x-empty"), None, &headers, || ip),
            Affinity::NONE
        );
        assert_eq!(
            affinity(&header("x-other"), None, &headers, || ip),
            Affinity::NONE
        );
        let no_ip = || -> IpAddr { panic!("the address is computed only for HASH_ON_IP") };
        assert_eq!(
            affinity(&Policy::LeastRequest, Some(b"alice"), &headers, no_ip),
            Affinity::NONE
        );
    }

    #[test]
    fn policy_from_spec() {
        use gateway_proto::v1::{HashOn as ProtoHashOn, Instance, LbPolicy, Upstream};
        let u = |policy: LbPolicy, on: ProtoHashOn, header: &str| Upstream {
            name: "u".into(),
            instances: vec![Instance {
                id: "a".into(),
                url: "http://127.0.0.1:1".into(),
                ..Default::default()
            }],
            lb_policy: policy as i32,
            hash_on: on as i32,
            hash_header: header.into(),
            ..Default::default()
        };
        let policy = |u: Upstream| {
            let spec = gateway_proto::validate_config(&[], std::slice::from_ref(&u)).unwrap();
            Policy::from_spec(&spec.upstreams[0].balancing)
        };
        assert_eq!(
            policy(u(LbPolicy::RoundRobin, ProtoHashOn::Unspecified, "")),
            Policy::RoundRobin
        );
        assert_eq!(
            policy(u(LbPolicy::LeastRequest, ProtoHashOn::Unspecified, "")),
            Policy::LeastRequest
        );
        assert_eq!(
            policy(u(LbPolicy::ConsistentHash, ProtoHashOn::Header, "X-Tenant")),
            Policy::ConsistentHash(HashOn::Header(HeaderName::from_static("x-tenant")))
        );
        assert_eq!(
            policy(u(LbPolicy::ConsistentHash, ProtoHashOn::Ip, "")).as_str(),
            "consistent_hash"
        );
    }
}
