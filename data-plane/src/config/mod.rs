//! The compiled configuration: one immutable [`Compiled`] snapshot holding the
//! router, the upstreams with their instances (pools, breakers, health state),
//! published through one `ArcSwap` in [`ConfigStore`].
//!
//! A request loads the snapshot once and uses it to the end, so it never sees
//! half of one version and half of another. State that must outlive versions
//! (connection pools, breaker and health state, counters) lives in
//! [`InstanceState`] / [`RouteMetrics`] behind `Arc`s that
//! [`compile`](compile::compile) carries over from the previous snapshot.

pub mod compile;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_proto::v1::{AuthMode, RateLimit};
use gateway_transport::in_flight::{InFlight, InFlightCount};
use gateway_transport::pool::{Pool, PoolSettings};

use crate::aggregate::Aggregate;
use crate::api_key::ApiKeys;
use crate::balancer::Policy;
use crate::breaker::{Breaker, BreakerSettings};
use crate::coalesce::Coalescer;
use crate::cors::CorsPolicy;
use crate::dns;
use crate::health::HealthSettings;
use crate::ip_rules::IpRules;
use crate::metrics::{InstanceMetrics, RouteMetrics};
use crate::retry::{RetryBudget, RetryPolicy};
use crate::router::Router;
use crate::signature::Signer;
use crate::transform::HeaderTransform;

pub use compile::{CompileError, compile, compile_with_members};

/// Upstream response timeout of a route with `timeout_ms` 0.
pub const DEFAULT_ROUTE_TIMEOUT: Duration =
    Duration::from_millis(gateway_proto::defaults::ROUTE_TIMEOUT_MS as u64);

/// One immutable configuration version, ready for the request path.
#[derive(Debug, Default)]
pub struct Compiled {
    /// Version number (0 before anything is loaded).
    pub version: u64,
    /// Content hash as given by the control plane.
    pub hash: String,
    /// False only for the empty placeholder used before the first load.
    pub loaded: bool,
    /// Routes by host, prefix and method.
    pub router: Router<RouteEntry>,
    /// Upstreams sorted by name.
    pub upstreams: Vec<Arc<UpstreamEntry>>,
    /// The API keys `AUTH_API_KEY` routes accept, by hash.
    pub api_keys: ApiKeys,
}

/// A route as the request path needs it.
#[derive(Debug)]
pub struct RouteEntry {
    /// Route name (metrics label).
    pub name: Arc<str>,
    /// The matched prefix.
    pub prefix: Box<str>,
    /// Replacement for the prefix, if any.
    pub rewrite: Option<Box<str>>,
    /// Route policies (IP rules, header transforms, CORS), applied by their pipeline stages.
    pub policies: RoutePolicies,
    /// Authentication the route requires.
    pub auth: AuthMode,
    /// Every rate limit of the route (`rate_limit` first, then
    /// `rate_limits`), applied together after authentication.
    pub rate_limits: Box<[RateLimit]>,
    /// Time allowed until the upstream's response head.
    pub timeout: Duration,
    /// Where the traffic goes.
    pub target: Target,
    /// Shares identical concurrent GET/HEAD upstream calls (`Route.coalesce`).
    pub coalesce: Option<Arc<Coalescer>>,
    /// Retries on other instances (`Route.retry`; `None`: the default once-rules).
    pub retry: Option<RetryPolicy>,
    /// WebSocket upgrades allowed, with this tunnel idle timeout (`Route.websocket`;
    /// `None`: upgrade requests are refused).
    pub websocket: Option<Duration>,
    /// Counters, carried over while the route keeps its name.
    pub metrics: Arc<RouteMetrics>,
}

/// A route's policies (`Route` fields 10 to 29), each compiled once per
/// snapshot. The default is no policy at all.
#[derive(Debug, Default)]
pub struct RoutePolicies {
    /// Client networks admitted / refused (`None`: everyone, no lookup).
    pub ip_rules: Option<IpRules>,
    /// Changes to the request headers before forwarding.
    pub request_headers: HeaderTransform,
    /// Changes to the upstream's response headers.
    pub response_headers: HeaderTransform,
    /// Cross-origin settings (`None`: no CORS handling, preflights are proxied).
    pub cors: Option<CorsPolicy>,
}

/// What a route sends its traffic to.
#[derive(Debug)]
pub enum Target {
    /// Proxied to one upstream.
    Upstream(Arc<UpstreamEntry>),
    /// Fanned out to the parts of an aggregation (`Route.aggregate`).
    Aggregate(Arc<Aggregate>),
}

/// An upstream of one version: settings plus its instances' long-lived state.
///
/// With DNS discovery, `instances` are the members resolved when this snapshot
/// was compiled (sorted by address). A changed answer does not touch this
/// entry: it makes a whole new snapshot (see [`crate::dns`]), so a request
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
    /// Round-robin cursor.
    pub(crate) cursor: AtomicUsize,
    /// Retry budget and retry counters, carried over while the name stays.
    pub retry: Arc<RetryBudget>,
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
            cursor: AtomicUsize::new(0),
            retry: Arc::default(),
        }
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
    /// Result of active health checks; starts healthy so a new instance takes
    /// traffic at once (its breaker guards it until the first checks have run).
    healthy: AtomicBool,
    in_flight: Arc<InFlightCount>,
    /// Rendezvous-hashing seed, from the id (see [`crate::balancer`]).
    pub(crate) hash_seed: u64,
    /// Counters.
    pub metrics: InstanceMetrics,
}

impl InstanceState {
    /// State for an instance at `authority` (`host:port`).
    pub fn new(key: InstanceKey, authority: &str, pool: PoolSettings) -> Self {
        Self {
            id: key.id.clone(),
            hash_seed: crate::balancer::instance_seed(&key.id),
            key,
            pool: Pool::new(authority, pool),
            breaker: Breaker::new(),
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

/// Holds the current snapshot. The only place a configuration is published.
#[derive(Debug)]
pub struct ConfigStore {
    current: ArcSwap<Compiled>,
}

impl Default for ConfigStore {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigStore {
    /// A store holding the empty, not-loaded placeholder.
    pub fn new() -> Self {
        Self {
            current: ArcSwap::from_pointee(Compiled::default()),
        }
    }

    /// The current snapshot. Hold the `Arc` for the whole request.
    pub fn load(&self) -> Arc<Compiled> {
        self.current.load_full()
    }

    /// Publishes a new snapshot atomically; returns the previous one.
    pub fn publish(&self, next: Arc<Compiled>) -> Arc<Compiled> {
        self.current.swap(next)
    }

    /// Whether a configuration has been loaded.
    pub fn is_loaded(&self) -> bool {
        self.current.load().loaded
    }
}
