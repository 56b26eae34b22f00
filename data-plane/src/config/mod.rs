//! The compiled configuration: one immutable [`Compiled`] snapshot holding the
//! router, the upstreams with their instances (pools, breakers, health state),
//! published through one `ArcSwap` in [`ConfigStore`].
//!
//! A request loads the snapshot once and uses it to the end, so it never sees
//! half of one version and half of another. State that must outlive versions
//! (connection pools, breaker and health state, counters) lives in
//! [`InstanceState`](crate::upstream::InstanceState) / [`RouteMetrics`] behind `Arc`s that
//! [`compile`](compile::compile) carries over from the previous snapshot.

pub mod certificates;
pub mod compile;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use gateway_proto::spec::Auth;

use crate::composition::aggregate::Aggregate;
use crate::composition::coalesce::Coalescer;
use crate::composition::mirror::Mirror;
use crate::composition::response_cache::RouteCacheEntry;
use crate::metrics::RouteMetrics;
use crate::policy::api_key::ApiKeys;
use crate::policy::cors::CorsPolicy;
use crate::policy::ip_rules::IpRules;
use crate::policy::mtls::MtlsAllow;
use crate::policy::ratelimit::RouteLimit;
use crate::policy::router::Router;
use crate::policy::transform::HeaderTransform;
use crate::upstream::UpstreamEntry;
use crate::upstream::proxy::RouteView;
use crate::upstream::retry::RetryPolicy;
use crate::upstream::split::Split;

use crate::policy::jwt::{JwtIssuers, RouteJwt};
pub use certificates::{Certificates, SniResolver};
pub use compile::{CompileError, compile, compile_with_members};

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
    /// The certificates the HTTPS listener offers, by SNI host.
    pub certificates: Certificates,
    /// One token verifier per JWT issuer that a route names.
    pub jwt_issuers: JwtIssuers,
}

/// A route as the request path needs it.
#[derive(Debug)]
pub struct RouteEntry {
    /// Route name (metrics label).
    pub name: Arc<str>,
    /// The matched prefix.
    pub prefix: Box<str>,
    /// Served over HTTPS only (`https_only`).
    pub https_only: bool,
    /// Replacement for the prefix, if any.
    pub rewrite: Option<Box<str>>,
    /// Route policies (IP rules, header transforms, CORS), applied by their pipeline stages.
    pub policies: RoutePolicies,
    /// Authentication the route requires.
    pub auth: Auth,
    /// The verifier of an `AUTH_JWT` route's `jwt_issuers` (`None`: the
    /// data plane's flag-configured issuer).
    pub jwt: Option<Arc<RouteJwt>>,
    /// Every rate limit of the route (`rate_limit` first, then
    /// `rate_limits`), applied together after authentication.
    pub rate_limits: Box<[RouteLimit]>,
    /// Time allowed until the upstream's response head.
    pub timeout: Duration,
    /// Where the traffic goes.
    pub target: Target,
    /// Shares identical concurrent GET/HEAD upstream calls (`Route.coalesce`).
    pub coalesce: Option<Arc<Coalescer>>,
    /// Caches GET answers (`Route.cache`; `None`: every request goes upstream).
    pub cache: Option<RouteCacheEntry>,
    /// Copies sampled requests to a shadow upstream (`Route.mirror`).
    pub mirror: Option<Mirror>,
    /// Retries on other instances (`Route.retry`; `None`: the default once-rules).
    pub retry: Option<RetryPolicy>,
    /// WebSocket upgrades allowed, with this tunnel idle timeout (`Route.websocket`;
    /// `None`: upgrade requests are refused).
    pub websocket: Option<Duration>,
    /// Counters, carried over while the route keeps its name.
    pub metrics: Arc<RouteMetrics>,
}

impl RouteEntry {
    /// What forwarding, coalescing and WebSocket tunnels need of this route
    /// (the signer of its one upstream; none for a split or an aggregate:
    /// see [`RouteEntry::view_to`]).
    pub fn view(&self) -> RouteView<'_> {
        match &self.target {
            Target::Upstream(u) => self.view_to(u),
            Target::Aggregate(_) | Target::Split(_) => RouteView {
                signer: None,
                ..self.view_to_parts()
            },
        }
    }

    /// [`RouteEntry::view`] for a request going to `upstream` (signed with its secret).
    pub fn view_to<'a>(&'a self, upstream: &'a UpstreamEntry) -> RouteView<'a> {
        RouteView {
            signer: upstream.signer.as_ref(),
            ..self.view_to_parts()
        }
    }

    fn view_to_parts(&self) -> RouteView<'_> {
        RouteView {
            prefix: &self.prefix,
            rewrite: self.rewrite.as_deref(),
            signer: None,
            timeout: self.timeout,
            retry: self.retry.as_ref(),
            websocket: self.websocket,
            metrics: &self.metrics,
        }
    }
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
    /// The client certificates an `AUTH_MTLS` route admits (`None`: any verified one).
    pub mtls_allow: Option<MtlsAllow>,
}

/// What a route sends its traffic to.
#[derive(Debug)]
pub enum Target {
    /// Proxied to one upstream.
    Upstream(Arc<UpstreamEntry>),
    /// Fanned out to the parts of an aggregation (`Route.aggregate`).
    Aggregate(Arc<Aggregate>),
    /// Split over several upstreams by weight (`Route.split`).
    Split(Arc<Split>),
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
