//! Upstream selection: where a request goes and how it gets there.
//!
//! [`UpstreamEntry`] is one upstream of a configuration version, with its
//! instances' long-lived [`InstanceState`] (pool, breaker, health, counters),
//! carried over between versions by [`InstanceKey`]. Around it, one concern a
//! file: [`balancer`] (round-robin, least-request, consistent hashing over
//! healthy instances whose breaker admits), [`breaker`], [`health`] (active
//! checks), [`outlier`] (ejection by failure rate), [`dns`] (members found in DNS), [`retry`] (route retry policies and
//! the per-upstream budget), [`attempt`] (one attempt: its span, in-flight
//! count, breaker report and counters) and [`proxy`] (forwarding, with retries).

pub mod attempt;
pub mod balancer;
pub mod breaker;
pub mod dns;
pub mod health;
pub mod outlier;
pub mod proxy;
pub mod retry;
pub mod split;
pub mod weights;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use gateway_transport::in_flight::{InFlight, InFlightCount};
use gateway_transport::pool::{InstanceTls, Pool, PoolSettings, Protocol};

use crate::metrics::InstanceMetrics;
use crate::policy::signature::Signer;
use balancer::{Policy, Weights};
use breaker::{Breaker, BreakerSettings};
use health::HealthSettings;
use retry::RetryBudget;

/// An upstream of one version: settings plus its instances' long-lived state.
///
/// With DNS discovery, `instances` are the members resolved when this snapshot
/// was compiled (sorted by address). A changed answer does not touch this
/// entry: it makes a whole new snapshot (see [`dns`]), so a request
/// sees one member list from start to end, and so do the ops views.
#[derive(Debug)]
pub struct UpstreamEntry {
    /// Upstream name.
    pub name: Arc<str>,
    /// Instances in configuration order (static), or by address (discovered).
    pub instances: Vec<Arc<InstanceState>>,
    /// How requests are spread over the instances.
    pub policy: Policy,
    /// Where the instances come from when they are discovered in DNS.
    pub discovery: Option<dns::Target>,
    /// Breaker settings (explicit or the defaults).
    pub breaker: BreakerSettings,
    /// Active health checking, if configured.
    pub health: Option<HealthSettings>,
    /// Signs the identity of every request forwarded to it (`identity_signing_secret`).
    pub signer: Option<Signer>,
    /// The instances' weights (`None`: all 1).
    pub weights: Option<Weights>,
    /// Round-robin cursor.
    pub(crate) cursor: AtomicUsize,
    /// Retry budget and retry counters, carried over while the name stays.
    pub retry: Arc<RetryBudget>,
    /// Outlier detection by failure rate (`outlier_detection`; `None`: off, nothing counted).
    pub outlier: Option<outlier::Outlier>,
    /// Held while an instance is taken out of rotation (a breaker opens, an
    /// outlier is ejected), so two at once cannot both pass the cap.
    pub(crate) taking_out: parking_lot::Mutex<()>,
}

impl UpstreamEntry {
    /// An upstream entry (used by `compile` and by tests).
    pub fn new(
        name: impl Into<Arc<str>>,
        instances: Vec<Arc<InstanceState>>,
        breaker: BreakerSettings,
        health: Option<HealthSettings>,
    ) -> Self {
        Self {
            name: name.into(),
            instances,
            policy: Policy::RoundRobin,
            discovery: None,
            breaker,
            health,
            signer: None,
            weights: None,
            cursor: AtomicUsize::new(0),
            retry: Arc::default(),
            outlier: None,
            taking_out: parking_lot::Mutex::new(()),
        }
    }

    /// Instances out of rotation now: breaker not CLOSED, or ejected as an outlier.
    pub fn instances_out(&self) -> usize {
        self.instances_out_at(outlier::now_ms())
    }

    /// [`UpstreamEntry::instances_out`] at `now` (ms, [`outlier::now_ms`]'s clock).
    pub fn instances_out_at(&self, now: u64) -> usize {
        self.instances
            .iter()
            .filter(|i| !i.breaker.is_closed() || i.outlier.ejected_now(now))
            .count()
    }

    /// Whether one more instance may be taken out by its breaker: fewer than
    /// [`max_out`] of `max_open_percent` are out now. `Some`: yes, and the
    /// upstream's lock, to hold until the breaker is OPEN, so that the next
    /// one to count sees it.
    pub fn may_take_out_one(&self) -> Option<parking_lot::MutexGuard<'_, ()>> {
        let guard = self.taking_out.lock();
        (self.instances_out() < max_out(self.instances.len(), self.breaker.max_open_percent))
            .then_some(guard)
    }
}

/// Most of `n` instances that breakers may hold out of rotation at once:
/// `percent` of them rounded down, at least one, and never all of two or more
/// (the rest keep their share: panic mode). One instance may always be out.
pub fn max_out(n: usize, percent: u32) -> usize {
    if n <= 1 {
        return n;
    }
    ((n as u64 * u64::from(percent) / 100) as usize)
        .max(1)
        .min(n - 1)
}

impl UpstreamEntry {
    /// The same entry with outlier detection.
    pub fn with_outlier(mut self, outlier: Option<outlier::Outlier>) -> Self {
        self.outlier = outlier;
        self
    }

    /// The same entry, sharing `budget` (the previous version's, for an
    /// upstream that keeps its name).
    pub fn with_retry_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.retry = budget;
        self
    }

    /// The same entry, signing identities with `signer`.
    pub fn with_signer(mut self, signer: Option<Signer>) -> Self {
        self.signer = signer;
        self
    }

    /// The same entry with balancing `policy` (the default is round-robin).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The same entry with instance weights (`None`: all 1).
    pub fn with_weights(mut self, weights: Option<Weights>) -> Self {
        self.weights = weights;
        self
    }

    /// The same entry, marked as discovered through `target`.
    pub fn with_discovery(mut self, target: dns::Target) -> Self {
        self.discovery = Some(target);
        self
    }
}

/// Identity of an instance across versions: an instance that keeps its
/// upstream name, id and url keeps its state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceKey {
    /// Upstream name.
    pub upstream: Arc<str>,
    /// Instance id.
    pub id: Arc<str>,
    /// Instance URL (`http://host:port`).
    pub url: Arc<str>,
    /// The identity of the upstream's TLS settings (`None`: cleartext): a
    /// change makes a new instance state, with new connections.
    pub tls: Option<u64>,
    /// The HTTP version it is spoken to with (a change: new connections).
    pub protocol: Protocol,
}

/// Everything about one upstream instance that outlives a configuration version.
#[derive(Debug)]
pub struct InstanceState {
    /// Identity.
    pub key: InstanceKey,
    /// Instance id (same as `key.id`).
    pub id: Arc<str>,
    /// Keep-alive connections to it.
    pub pool: Pool,
    /// Its circuit breaker.
    pub breaker: Breaker,
    /// Its failure-rate window and ejection ([`outlier`]; idle without `outlier_detection`).
    pub outlier: outlier::OutlierState,
    /// Result of active health checks; starts healthy so a new instance takes
    /// traffic at once (its breaker guards it until the first checks have run).
    healthy: AtomicBool,
    in_flight: Arc<InFlightCount>,
    /// Rendezvous-hashing seed, from the id (see [`crate::upstream::balancer`]).
    pub(crate) hash_seed: u64,
    /// Counters.
    pub metrics: InstanceMetrics,
}

impl InstanceState {
    /// State for an instance at `authority` (`host:port`).
    pub fn new(
        key: InstanceKey,
        authority: &str,
        pool: PoolSettings,
        tls: Option<InstanceTls>,
    ) -> Self {
        let protocol = key.protocol;
        Self {
            id: key.id.clone(),
            hash_seed: balancer::instance_seed(&key.id),
            key,
            pool: Pool::with_tls(authority, pool, tls, protocol),
            breaker: Breaker::new(),
            outlier: outlier::OutlierState::default(),
            healthy: AtomicBool::new(true),
            in_flight: Arc::default(),
            metrics: InstanceMetrics::default(),
        }
    }

    /// Whether active health checks consider it healthy.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Sets the health state; returns the previous one.
    pub fn set_healthy(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::Relaxed)
    }

    /// Requests in progress (until their response body ends).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.get()
    }

    /// Counts a request in progress until the guard drops.
    pub fn start_request(&self) -> InFlight {
        self.in_flight.start()
    }
}
