//! Turns a pushed (or cached) snapshot into a [`Compiled`] configuration.
//!
//! Runs off the request path. The snapshot is validated with the same
//! `gateway_proto::validate_config` the control plane uses, which hands back
//! the configuration typed and defaulted (`gateway_proto::spec`: methods,
//! networks, timeouts, rate limits, retry policies, balancing, discovery,
//! health checks, instance authorities); compiling builds the request path's
//! objects from those and parses nothing again. Anything that fails here is
//! NACKed and the previous snapshot stays in service.
//!
//! Upstreams with DNS discovery take their instances from the [`Members`]
//! given to [`compile_with_members`]; a new member set is compiled the same
//! way as a new configuration (see [`crate::upstream::dns`]).

use std::collections::HashMap;
use std::sync::Arc;

use std::hash::{Hash as _, Hasher as _};

use gateway_proto::spec::{RouteSpec, UpstreamSpec};
use gateway_proto::v1::ConfigSnapshot;
use gateway_proto::validate::CertificateSpec;
use gateway_proto::validate::{
    validate_api_keys, validate_certificates, validate_client_certificates, validate_jwt_issuers,
};
use gateway_proto::{ValidationError, validate_config};
use gateway_transport::pool::{InstanceTls, Protocol};
use gateway_transport::upstream_io::{UpstreamTls, UpstreamTlsError};

use super::certificates::Certificates;
use super::{Compiled, RouteEntry, RoutePolicies, Target};
use crate::upstream::{InstanceKey, InstanceState, UpstreamEntry};
use gateway_transport::pool::PoolSettings;

use crate::composition::aggregate::{Aggregate, Part};
use crate::composition::coalesce::{CoalesceLimits, Coalescer};
use crate::composition::mirror::Mirror;
use crate::composition::response_cache::RouteCacheEntry;
use crate::metrics::{PartMetrics, RouteMetrics};
use crate::policy::api_key::{ApiKeyCompileError, ApiKeys};
use crate::policy::cors::{CorsError, CorsPolicy};
use crate::policy::ip_rules::IpRules;
use crate::policy::jwt::JwtIssuers;
use crate::policy::matching::RequestMatch;
use crate::policy::mtls::MtlsAllow;
use crate::policy::ratelimit::{RateLimitCompileError, RouteLimit};
use crate::policy::router::{Router, RouterError};
use crate::policy::signature::Signer;
use crate::policy::transform::{HeaderTransform, TransformError};
use crate::upstream::balancer::{HashOn, Policy, Weights};
use crate::upstream::dns::{self, Members};
use crate::upstream::health::HealthSettings;
use crate::upstream::outlier;
use crate::upstream::retry::{RetryBudget, RetryPolicy};
use crate::upstream::split::Split;

/// Why a snapshot cannot be used. The `Display` text is the NACK's `error_detail`.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The shared validation refused it.
    #[error("invalid configuration: {0}")]
    Invalid(#[from] ValidationError),
    /// A route split whose weights are all 0 or whose sticky header is not a
    /// header name (validation refuses both).
    #[error("route {route:?}: split needs a weight above 0 and a valid split_hash_header")]
    SplitWeights {
        /// Route name.
        route: String,
    },
    /// A route naming an upstream that is not in the snapshot.
    #[error("route {route:?}: upstream {upstream:?} does not exist")]
    UnknownUpstream {
        /// Route name.
        route: String,
        /// The missing upstream.
        upstream: String,
    },
    /// A header transform naming an invalid header or value (validation
    /// refuses it first; kept so compiling never panics).
    #[error("route {route:?}: {field}: {source}")]
    Transform {
        /// Route name.
        route: String,
        /// `request_headers` or `response_headers`.
        field: &'static str,
        /// Why.
        #[source]
        source: TransformError,
    },
    /// CORS settings the HTTP library does not accept (validation refuses
    /// them first; kept so compiling never panics).
    #[error("route {route:?}: cors: {source}")]
    Cors {
        /// Route name.
        route: String,
        /// Why.
        #[source]
        source: CorsError,
    },
    /// A rate limit that cannot be enforced (validation refuses it first;
    /// kept so a limit is never silently off).
    #[error("route {route:?}: {source}")]
    RateLimit {
        /// Route name.
        route: String,
        /// Why.
        #[source]
        source: RateLimitCompileError,
    },
    /// An API key that cannot be used (validation refuses it first).
    #[error(transparent)]
    ApiKey(#[from] ApiKeyCompileError),
    /// A JWT issuer whose verifier cannot be built (validation refuses
    /// most such settings first; an https:// JWKS without usable system CA
    /// certificates is found here).
    #[error("jwt issuer: {0}")]
    JwtIssuer(#[from] gateway_jwt::JwtConfigError),
    /// An upstream's TLS client cannot be built (a CA rustls refuses, no
    /// system CA certificates, a client certificate that is not in the snapshot).
    #[error("upstream {upstream:?}: {source}")]
    UpstreamTls {
        /// Upstream name.
        upstream: String,
        /// Why.
        #[source]
        source: UpstreamTlsError,
    },
    /// The router refused a route.
    #[error("route {route:?}: {source}")]
    Router {
        /// Route name.
        route: String,
        /// Why.
        #[source]
        source: RouterError,
    },
}

/// Compiles `snapshot`, reusing the pools, breakers, health state and counters
/// of every instance and route that `previous` already had. Upstreams with
/// DNS discovery get no instances: use [`compile_with_members`] for those.
pub fn compile(
    snapshot: &ConfigSnapshot,
    previous: &Compiled,
    pool: PoolSettings,
) -> Result<Compiled, CompileError> {
    compile_with_members(snapshot, previous, pool, &Members::default())
}

/// [`compile`], with the instances of discovering upstreams taken from
/// `members` (an upstream missing there has none yet). A member keeps its
/// state while its address stays: its key is derived from the address.
pub fn compile_with_members(
    snapshot: &ConfigSnapshot,
    previous: &Compiled,
    pool: PoolSettings,
    members: &Members,
) -> Result<Compiled, CompileError> {
    let spec = validate_config(&snapshot.routes, &snapshot.upstreams)?;
    validate_api_keys(&snapshot.api_keys)?;
    // TLS certificates (chain, key, SNI hosts), for the HTTPS listener and
    // as upstreams' client certificates.
    let certificate_specs = validate_certificates(&snapshot.certificates)?;
    validate_client_certificates(&snapshot.upstreams, &snapshot.certificates)?;
    let certificates = Certificates::new(&certificate_specs);
    let client_keys: HashMap<&str, &CertificateSpec<'_>> = certificate_specs
        .iter()
        .map(|c| (c.proto.name.as_str(), c))
        .collect();
    let api_keys = ApiKeys::compile(&snapshot.api_keys)?;
    validate_jwt_issuers(&snapshot.jwt_issuers, &snapshot.routes)?;
    let jwt_issuers = JwtIssuers::compile(
        &snapshot.jwt_issuers,
        snapshot
            .routes
            .iter()
            .flat_map(|r| r.jwt_issuers.iter().map(String::as_str)),
        &previous.jwt_issuers,
    )?;

    let old_instances: HashMap<&InstanceKey, &Arc<InstanceState>> = previous
        .upstreams
        .iter()
        .flat_map(|u| u.instances.iter().map(|i| (&i.key, i)))
        .collect();
    let old_route_metrics: HashMap<&str, &Arc<RouteMetrics>> = previous
        .router
        .routes()
        .iter()
        .map(|r| (&*r.name, &r.metrics))
        .collect();
    let old_part_metrics: HashMap<(&str, &str), &Arc<PartMetrics>> = previous
        .router
        .routes()
        .iter()
        .filter_map(|r| match &r.target {
            Target::Aggregate(a) => Some((r, a)),
            Target::Upstream(_) | Target::Split(_) => None,
        })
        .flat_map(|(r, a)| {
            a.parts()
                .iter()
                .map(|p| ((&*r.name, p.name()), p.metrics()))
        })
        .collect();

    let old_budgets: HashMap<&str, &Arc<RetryBudget>> = previous
        .upstreams
        .iter()
        .map(|u| (&*u.name, &u.retry))
        .collect();
    let mut upstreams: Vec<Arc<UpstreamEntry>> = spec
        .upstreams
        .iter()
        .map(|u| {
            let entry = compile_upstream(u, &old_instances, pool, members, &client_keys)?;
            Ok(Arc::new(match old_budgets.get(u.proto.name.as_str()) {
                Some(b) => entry.with_retry_budget(Arc::clone(b)),
                None => entry,
            }))
        })
        .collect::<Result<_, CompileError>>()?;
    upstreams.sort_by(|a, b| a.name.cmp(&b.name));
    let by_name: HashMap<&str, &Arc<UpstreamEntry>> =
        upstreams.iter().map(|u| (&*u.name, u)).collect();

    let mut router = Router::new();
    for spec in &spec.routes {
        let r = spec.proto;
        let upstream = |name: &str| {
            by_name
                .get(name)
                .map(|u| Arc::clone(u))
                .ok_or_else(|| CompileError::UnknownUpstream {
                    route: r.name.clone(),
                    upstream: name.to_owned(),
                })
        };
        let target = match &r.aggregate {
            None if !r.split.is_empty() => Target::Split(Arc::new(compile_split(r, upstream)?)),
            None => Target::Upstream(upstream(&r.upstream)?),
            Some(_) => Target::Aggregate(Arc::new(compile_aggregate(
                spec,
                upstream,
                &old_part_metrics,
            )?)),
        };
        let entry = RouteEntry {
            name: r.name.as_str().into(),
            prefix: r.path_prefix.as_str().into(),
            https_only: r.https_only,
            rewrite: (!r.rewrite_prefix.is_empty()).then(|| r.rewrite_prefix.as_str().into()),
            policies: compile_policies(spec)?,
            auth: spec.auth,
            jwt: jwt_issuers.route(&r.jwt_issuers),
            rate_limits: spec
                .rate_limits
                .iter()
                .map(RouteLimit::compile)
                .collect::<Result<_, _>>()
                .map_err(|source| CompileError::RateLimit {
                    route: r.name.clone(),
                    source,
                })?,
            timeout: spec.timeout,
            target,
            coalesce: r
                .coalesce
                .then(|| Arc::new(Coalescer::new(CoalesceLimits::default()))),
            cache: r
                .cache
                .as_ref()
                .map(|c| RouteCacheEntry::compile(&r.name, spec.auth, c)),
            retry: spec.retry.as_ref().map(RetryPolicy::from_spec),
            mirror: match &r.mirror {
                Some(m) => Some(Mirror {
                    upstream: upstream(&m.upstream)?,
                    percent: m.percent,
                    include_body: m.include_body,
                    // Validated header names.
                    deny: m
                        .deny_headers
                        .iter()
                        .filter_map(|n| http::HeaderName::from_bytes(n.as_bytes()).ok())
                        .collect(),
                }),
                None => None,
            },
            websocket: spec.websocket_idle,
            metrics: old_route_metrics
                .get(r.name.as_str())
                .map_or_else(Default::default, |m| Arc::clone(m)),
        };
        let conditions = r.r#match.as_ref().map(|m| Arc::new(RequestMatch::new(m)));
        router
            .insert_matching(&r.hosts, &r.path_prefix, &spec.methods, conditions, entry)
            .map_err(|source| CompileError::Router {
                route: r.name.clone(),
                source,
            })?;
    }

    Ok(Compiled {
        version: snapshot.version,
        hash: snapshot.hash.clone(),
        loaded: true,
        router,
        upstreams,
        api_keys,
        certificates,
        jwt_issuers,
    })
}

/// The split of route `r` over its upstreams (validated: they exist, some
/// weight is above 0).
fn compile_split(
    r: &gateway_proto::v1::Route,
    upstream: impl Fn(&str) -> Result<Arc<UpstreamEntry>, CompileError>,
) -> Result<Split, CompileError> {
    let sides = r
        .split
        .iter()
        .map(|side| Ok((upstream(&side.upstream)?, side.weight)))
        .collect::<Result<Vec<_>, CompileError>>()?;
    let sticky = match gateway_proto::v1::HashOn::try_from(r.split_hash_on) {
        Ok(gateway_proto::v1::HashOn::User) => Some(HashOn::User),
        Ok(gateway_proto::v1::HashOn::Ip) => Some(HashOn::Ip),
        Ok(gateway_proto::v1::HashOn::Header) => Some(HashOn::Header(
            http::HeaderName::from_bytes(r.split_hash_header.to_ascii_lowercase().as_bytes())
                .map_err(|_| CompileError::SplitWeights {
                    route: r.name.clone(),
                })?,
        )),
        Ok(gateway_proto::v1::HashOn::Unspecified) | Err(_) => None,
    };
    Split::new(sides, sticky, r.split_fail_closed).ok_or_else(|| CompileError::SplitWeights {
        route: r.name.clone(),
    })
}

/// The parts of aggregate route `r`, keeping the counters of parts the
/// previous snapshot had under the same route and part names.
fn compile_aggregate(
    spec: &RouteSpec<'_>,
    upstream: impl Fn(&str) -> Result<Arc<UpstreamEntry>, CompileError>,
    old_metrics: &HashMap<(&str, &str), &Arc<PartMetrics>>,
) -> Result<Aggregate, CompileError> {
    let r = spec.proto;
    let parts = r.aggregate.iter().flat_map(|a| &a.parts);
    let parts = parts
        .zip(&spec.part_timeouts)
        .map(|(p, &timeout)| {
            let metrics = old_metrics
                .get(&(r.name.as_str(), p.name.as_str()))
                .map_or_else(Default::default, |m| Arc::clone(m));
            Ok(Part::new(
                &p.name,
                upstream(&p.upstream)?,
                &p.path,
                p.required,
                timeout,
                metrics,
            ))
        })
        .collect::<Result<Vec<_>, CompileError>>()?;
    Ok(Aggregate::new(parts))
}

/// An upstream's TLS client (`None`: cleartext) and the identity of its
/// settings, which instances keep their pools under: a change of CA, server
/// name or client certificate makes new connections.
fn upstream_tls(
    spec: &UpstreamSpec<'_>,
    client_keys: &HashMap<&str, &CertificateSpec<'_>>,
) -> Result<Option<(Arc<UpstreamTls>, u64)>, CompileError> {
    let Some(tls) = &spec.tls else {
        return Ok(None);
    };
    let fail = |source| CompileError::UpstreamTls {
        upstream: spec.proto.name.clone(),
        source,
    };
    let client = match tls.client_certificate {
        Some(name) => Some(*client_keys.get(name).ok_or_else(|| {
            fail(UpstreamTlsError::Rustls(rustls::Error::General(format!(
                "tls.client_certificate {name:?} is not in the snapshot"
            ))))
        })?),
        None => None,
    };
    let built = UpstreamTls::new(
        tls.ca.as_deref(),
        tls.server_name,
        client.map(|c| &*c.certified_key),
        protocol_of(spec),
    )
    .map_err(fail)?;
    let mut identity = std::hash::DefaultHasher::new();
    (
        &tls.ca,
        tls.server_name,
        client.map(|c| &c.sha256_fingerprint),
    )
        .hash(&mut identity);
    Ok(Some((Arc::new(built), identity.finish())))
}

/// The HTTP version `spec`'s instances are spoken to with.
fn protocol_of(spec: &UpstreamSpec<'_>) -> Protocol {
    if spec.http2 {
        Protocol::Http2
    } else {
        Protocol::Http1
    }
}

/// An instance of an upstream, as compiling finds it.
struct Listed {
    id: Arc<str>,
    url: Arc<str>,
    /// What to connect to.
    authority: String,
    /// The TLS server name unless the upstream sets one.
    host: Arc<str>,
}

fn compile_upstream(
    spec: &UpstreamSpec<'_>,
    old: &HashMap<&InstanceKey, &Arc<InstanceState>>,
    pool: PoolSettings,
    members: &Members,
    client_keys: &HashMap<&str, &CertificateSpec<'_>>,
) -> Result<UpstreamEntry, CompileError> {
    let u = spec.proto;
    let name: Arc<str> = u.name.as_str().into();
    let target = spec.discovery.as_ref().map(dns::Target::from_spec);
    let tls = upstream_tls(spec, client_keys)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Every instance: listed, or one per discovered address (id
    // "ADDRESS:port", url "http(s)://ADDRESS:port", host the DNS name).
    let listed: Vec<Listed> = match (&target, &spec.discovery) {
        (Some(_), Some(discovery)) => members
            .addrs(&u.name)
            .iter()
            .map(|addr| {
                let id = addr.to_string();
                Listed {
                    url: format!("{scheme}://{id}").into(),
                    id: id.as_str().into(),
                    authority: id,
                    host: discovery.dns_name.into(),
                }
            })
            .collect(),
        _ => spec
            .instances
            .iter()
            .map(|i| Listed {
                id: i.id.into(),
                url: i.url.into(),
                authority: i.authority.to_owned(),
                host: i.host.into(),
            })
            .collect(),
    };
    let mut instances = Vec::with_capacity(listed.len());
    for Listed {
        id,
        url,
        authority,
        host,
    } in listed
    {
        let key = InstanceKey {
            upstream: name.clone(),
            id,
            url,
            tls: tls.as_ref().map(|(_, identity)| *identity),
            protocol: protocol_of(spec),
        };
        let state = match old.get(&key) {
            Some(s) => Arc::clone(s),
            None => {
                let tls = tls.as_ref().map(|(client, _)| InstanceTls {
                    client: client.clone(),
                    host,
                });
                Arc::new(InstanceState::new(key, &authority, pool, tls))
            }
        };
        instances.push(state);
    }
    let health = spec.health_check.as_ref().map(HealthSettings::from_spec);
    let entry = UpstreamEntry::new(name, instances, spec.breaker, health)
        .with_policy(Policy::from_spec(&spec.balancing))
        .with_signer(Signer::new(&u.identity_signing_secret, &u.name))
        .with_outlier(
            u.outlier_detection
                .as_ref()
                .map(|o| outlier::Outlier::new(outlier::OutlierSettings::from_proto(o))),
        );
    // Discovered members have weight 1.
    let entry = match target {
        Some(_) => entry,
        None => {
            let weights: Vec<u32> = spec.instances.iter().map(|i| i.weight).collect();
            entry.with_weights(Weights::new(&weights))
        }
    };
    Ok(match target {
        Some(t) => entry.with_discovery(t),
        None => entry,
    })
}

/// Parses a route's policies once, off the request path.
fn compile_policies(spec: &RouteSpec<'_>) -> Result<RoutePolicies, CompileError> {
    let r = spec.proto;
    let ip_rules = IpRules::new(&spec.ip_allow, &spec.ip_deny);
    let transform = |field, t| {
        HeaderTransform::compile(t).map_err(|source| CompileError::Transform {
            route: r.name.clone(),
            field,
            source,
        })
    };
    Ok(RoutePolicies {
        ip_rules,
        request_headers: transform("request_headers", r.request_headers.as_ref())?,
        response_headers: transform("response_headers", r.response_headers.as_ref())?,
        cors: CorsPolicy::compile(r.cors.as_ref()).map_err(|source| CompileError::Cors {
            route: r.name.clone(),
            source,
        })?,
        mtls_allow: MtlsAllow::compile(&r.mtls_allow),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::{CircuitBreaker, Instance, Route, Upstream};
    use http::Method;
    use std::time::Duration;

    fn snapshot(version: u64, instances: &[(&str, &str)]) -> ConfigSnapshot {
        ConfigSnapshot {
            version,
            hash: format!("h{version}"),
            routes: vec![Route {
                name: "orders".into(),
                path_prefix: "/api/orders".into(),
                upstream: "orders".into(),
                rewrite_prefix: "/orders".into(),
                ..Default::default()
            }],
            upstreams: vec![Upstream {
                name: "orders".into(),
                instances: instances
                    .iter()
                    .map(|(id, url)| Instance {
                        id: id.to_string(),
                        url: url.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn compiles_and_applies_defaults() {
        let c = compile(
            &snapshot(3, &[("o1", "http://127.0.0.1:1")]),
            &Compiled::default(),
            PoolSettings::default(),
        )
        .unwrap();
        assert_eq!((c.version, c.hash.as_str(), c.loaded), (3, "h3", true));
        let r = c.router.find(None, &Method::GET, "/api/orders/1").unwrap();
        assert_eq!(&*r.name, "orders");
        assert_eq!(
            r.timeout,
            Duration::from_millis(gateway_proto::defaults::ROUTE_TIMEOUT_MS.into())
        );
        assert_eq!(r.rewrite.as_deref(), Some("/orders"));
        assert!(r.coalesce.is_none());
        let Target::Upstream(u) = &r.target else {
            panic!("a proxied route");
        };
        assert_eq!(
            u.breaker,
            crate::upstream::breaker::BreakerSettings::default()
        );
        assert!(u.health.is_none());
        assert_eq!(u.instances[0].pool.authority(), "127.0.0.1:1");
    }

    #[test]
    fn instances_keep_state_only_while_name_id_and_url_stay() {
        let v1 = compile(
            &snapshot(
                1,
                &[("o1", "http://127.0.0.1:1"), ("o2", "http://127.0.0.1:2")],
            ),
            &Compiled::default(),
            PoolSettings::default(),
        )
        .unwrap();
        let mut s2 = snapshot(
            2,
            &[("o1", "http://127.0.0.1:1"), ("o2", "http://127.0.0.1:3")],
        );
        s2.upstreams[0].circuit_breaker = Some(CircuitBreaker {
            failure_threshold: 2,
            reset_timeout_ms: 500,
            half_open_max_requests: 3,
            ..Default::default()
        });
        let v2 = compile(&s2, &v1, PoolSettings::default()).unwrap();
        let (a, b) = (&v1.upstreams[0], &v2.upstreams[0]);
        assert!(Arc::ptr_eq(&a.instances[0], &b.instances[0]), "o1 kept");
        assert!(
            !Arc::ptr_eq(&a.instances[1], &b.instances[1]),
            "o2 moved: new state"
        );
        assert_eq!(b.breaker.failure_threshold, 2);
        let (ra, rb) = (&v1.router.routes()[0], &v2.router.routes()[0]);
        assert!(Arc::ptr_eq(&ra.metrics, &rb.metrics), "route counters kept");
    }

    fn with_overview(version: u64, orders_timeout_ms: u32) -> ConfigSnapshot {
        use gateway_proto::v1::{Aggregate as AggregateProto, AggregatePart};
        let mut s = snapshot(version, &[("o1", "http://127.0.0.1:1")]);
        s.routes[0].coalesce = true;
        s.routes.push(Route {
            name: "overview".into(),
            path_prefix: "/api/overview".into(),
            timeout_ms: 700,
            aggregate: Some(AggregateProto {
                parts: vec![
                    AggregatePart {
                        name: "user".into(),
                        upstream: "orders".into(),
                        path: "/users/{rest}".into(),
                        required: true,
                        timeout_ms: 0,
                    },
                    AggregatePart {
                        name: "orders".into(),
                        upstream: "orders".into(),
                        path: "/orders/{rest}".into(),
                        required: false,
                        timeout_ms: orders_timeout_ms,
                    },
                ],
            }),
            ..Default::default()
        });
        s
    }

    #[test]
    fn aggregate_routes_compile_their_parts_and_answer_get_only() {
        let c = compile(
            &with_overview(1, 250),
            &Compiled::default(),
            PoolSettings::default(),
        )
        .unwrap();
        assert!(
            c.router
                .find(None, &Method::POST, "/api/overview/7")
                .is_none()
        );
        let r = c
            .router
            .find(None, &Method::GET, "/api/overview/7")
            .unwrap();
        let Target::Aggregate(agg) = &r.target else {
            panic!("an aggregate route");
        };
        let parts: Vec<_> = agg
            .parts()
            .iter()
            .map(|p| (p.name(), p.required(), p.timeout()))
            .collect();
        assert_eq!(
            parts,
            [
                ("user", true, Duration::from_millis(700)),
                ("orders", false, Duration::from_millis(250)),
            ],
            "in order; timeout 0 is the route's"
        );
        assert!(r.coalesce.is_none());
        let orders = c.router.find(None, &Method::GET, "/api/orders/7").unwrap();
        assert!(orders.coalesce.is_some(), "coalesce: true");
    }

    #[test]
    fn part_counters_survive_a_new_version_while_their_names_stay() {
        use crate::metrics::PartOutcome;
        let v1 = compile(
            &with_overview(1, 250),
            &Compiled::default(),
            PoolSettings::default(),
        )
        .unwrap();
        let parts = |c: &Compiled| {
            let r = c.router.find(None, &Method::GET, "/api/overview").unwrap();
            match &r.target {
                Target::Aggregate(a) => a.parts().iter().map(|p| p.metrics().clone()).collect(),
                Target::Upstream(_) | Target::Split(_) => Vec::new(),
            }
        };
        parts(&v1)[1].record(PartOutcome::Timeout);
        let v2 = compile(&with_overview(2, 300), &v1, PoolSettings::default()).unwrap();
        assert_eq!(parts(&v2)[1].count(PartOutcome::Timeout), 1);
        assert!(Arc::ptr_eq(&parts(&v1)[0], &parts(&v2)[0]));
    }

    #[test]
    fn discovered_members_are_instances_and_keep_state_by_address() {
        use gateway_proto::v1::{DnsDiscovery, LbPolicy};
        let mut s = snapshot(1, &[]);
        s.upstreams[0].discovery = Some(DnsDiscovery {
            dns_name: "orders".into(),
            port: 7002,
            refresh_ms: 0,
        });
        s.upstreams[0].lb_policy = LbPolicy::LeastRequest as i32;
        let target = dns::Target::from_proto(s.upstreams[0].discovery.as_ref().unwrap());
        assert_eq!(target.refresh, Duration::from_millis(5000), "the default");
        let members = |addrs: &[&str]| {
            let mut m = Members::default();
            let addrs = addrs.iter().map(|a| a.parse().unwrap()).collect();
            m.insert("orders", target.clone(), addrs);
            m
        };
        let pool = PoolSettings::default();
        let v1 = compile_with_members(
            &s,
            &Compiled::default(),
            pool,
            &members(&["10.0.0.1:7002", "[fd00::2]:7002"]),
        )
        .unwrap();
        let u = &v1.upstreams[0];
        assert_eq!(u.policy, Policy::LeastRequest);
        assert_eq!(u.discovery.as_ref(), Some(&target));
        let ids: Vec<_> = u.instances.iter().map(|i| &*i.id).collect();
        assert_eq!(ids, ["10.0.0.1:7002", "[fd00::2]:7002"]);
        assert_eq!(&*u.instances[1].key.url, "http://[fd00::2]:7002");

        let v2 = compile_with_members(
            &s,
            &v1,
            pool,
            &members(&["10.0.0.3:7002", "[fd00::2]:7002"]),
        )
        .unwrap();
        let w = &v2.upstreams[0];
        assert!(Arc::ptr_eq(&u.instances[1], &w.instances[1]), "stayer kept");
        assert_eq!(&*w.instances[0].id, "10.0.0.3:7002");

        // Without members (plain `compile`): no instances yet.
        let bare = compile(&s, &v2, pool).unwrap();
        assert!(bare.upstreams[0].instances.is_empty());
    }

    #[test]
    fn invalid_snapshots_are_refused_with_the_reason() {
        let mut s = snapshot(1, &[("o1", "http://127.0.0.1:1")]);
        s.routes[0].upstream = "missing".into();
        let e = compile(&s, &Compiled::default(), PoolSettings::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("upstream \"missing\" does not exist"),
            "{e}"
        );
        let s = snapshot(1, &[("o1", "ftp://x:1")]);
        let e = compile(&s, &Compiled::default(), PoolSettings::default()).unwrap_err();
        assert!(e.to_string().contains("url"), "{e}");
    }
}
