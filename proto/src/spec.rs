//! The typed, defaulted configuration that [`validate_config`](crate::validate_config)
//! returns: what both planes use instead of the raw messages wherever a field
//! needs parsing or a default. Parse, don't validate: a configuration that
//! validates comes back with its methods as `http::Method`s, its networks as
//! [`Cidr`]s, its timeouts as `Duration`s with the [`defaults`](crate::defaults)
//! applied, its rate limits with their algorithm and key as enums (a
//! `key_header` as a `HeaderName`), and its instances with the authority to
//! connect to. The data plane compiles these; nothing downstream parses again.
//!
//! The specs borrow the messages they came from (`proto`) for the fields that
//! need no parsing (names, prefixes, the policies with compilers of their own).

use std::time::Duration;

use http::Method;
use http::header::HeaderName;

use crate::cidr::Cidr;
use crate::defaults;
use crate::v1::{
    AuthMode, HashOn, LbPolicy, RateLimit, RateLimitAlgorithm, RateLimitKey, RetryOn, Route,
    Upstream, UpstreamProtocol,
};
use crate::validate::{parse_ca_pem, parse_instance_url, route_limits};

/// A validated TLS certificate (`validate_certificates`), typed.
pub use crate::validate::{CertificateSpec, KeyType};

/// A validated configuration, typed.
#[derive(Debug, Clone)]
pub struct ConfigSpec<'a> {
    /// The routes, in the order given.
    pub routes: Vec<RouteSpec<'a>>,
    /// The upstreams, in the order given.
    pub upstreams: Vec<UpstreamSpec<'a>>,
}

/// A validated route.
#[derive(Debug, Clone)]
pub struct RouteSpec<'a> {
    /// The message, for the fields that need no parsing.
    pub proto: &'a Route,
    /// The methods it answers (empty: every method); an aggregation route
    /// with none listed answers GET only.
    pub methods: Vec<Method>,
    /// How callers authenticate (`auth`).
    pub auth: Auth,
    /// Time allowed until the upstream's response head (`timeout_ms`, default
    /// [`defaults::ROUTE_TIMEOUT_MS`]).
    pub timeout: Duration,
    /// The tunnel idle timeout of a `websocket` route (`None`: upgrades refused).
    pub websocket_idle: Option<Duration>,
    /// Client networks admitted (`ip_allow`; empty: every one not denied).
    pub ip_allow: Vec<Cidr>,
    /// Client networks refused (`ip_deny`).
    pub ip_deny: Vec<Cidr>,
    /// Every rate limit, `rate_limit` first, then `rate_limits`.
    pub rate_limits: Vec<RateLimitSpec<'a>>,
    /// The timeout of each aggregation part, in part order (`timeout_ms`,
    /// default: the route's).
    pub part_timeouts: Vec<Duration>,
    /// Retries on other instances (`None`: the default once-rules).
    pub retry: Option<RetrySpec>,
}

/// A route's retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySpec {
    /// Additional tries after the first.
    pub attempts: u32,
    /// The failures retried.
    pub on: Vec<RetryOn>,
    /// Time to the response head allowed to each attempt (`None`: only the route timeout).
    pub per_try_timeout: Option<Duration>,
}

/// How a route's callers authenticate (`Route.auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Nobody is authenticated (`AUTH_NONE`, the default).
    None,
    /// A bearer access JWT (`AUTH_JWT`).
    Jwt,
    /// An API key (`AUTH_API_KEY`).
    ApiKey,
    /// A verified client certificate on the HTTPS listener (`AUTH_MTLS`).
    Mtls,
}

/// A validated rate limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitSpec<'a> {
    /// The budget name.
    pub policy: &'a str,
    /// How the budget is counted.
    pub algorithm: RateLimitAlgorithm,
    /// What it is counted per.
    pub key: LimitKey,
    /// Requests per window, or the bucket's capacity (greater than 0).
    pub limit: u32,
    /// The window, or the time to refill the whole bucket (1 to 86,400 s).
    pub window_seconds: u32,
}

/// What a rate limit is counted per (`RateLimit.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitKey {
    /// The verified subject (`KEY_USER`).
    User,
    /// The client address (`KEY_IP`).
    Ip,
    /// The name of the API key that authenticated the caller (`KEY_API_KEY`).
    ApiKey,
    /// The whole route (`KEY_ROUTE`).
    Route,
    /// The value of this header (`KEY_HEADER`, `key_header`), lowercase.
    Header(HeaderName),
}

/// A validated upstream.
#[derive(Debug, Clone)]
pub struct UpstreamSpec<'a> {
    /// The message, for the fields that need no parsing.
    pub proto: &'a Upstream,
    /// The listed instances (none for an upstream with `discovery`).
    pub instances: Vec<InstanceSpec<'a>>,
    /// The circuit breaker, defaulted ([`defaults`]).
    pub breaker: BreakerSpec,
    /// How requests are spread over the instances.
    pub balancing: Balancing,
    /// Where the instances come from when they are found in DNS.
    pub discovery: Option<DiscoverySpec<'a>>,
    /// Active health checking, if configured.
    pub health_check: Option<HealthCheckSpec<'a>>,
    /// TLS to the instances (https:// instances, or discovery with `tls`); `None`: cleartext.
    pub tls: Option<TlsSpec<'a>>,
    /// `protocol`: spoken over HTTP/2 instead of HTTP/1.1.
    pub http2: bool,
}

/// How an upstream's instances are spoken to over TLS (`tls`, defaulted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSpec<'a> {
    /// The CA certificates of `ca_pem`; `None`: the system's.
    pub ca: Option<Vec<rustls_pki_types::CertificateDer<'static>>>,
    /// `server_name`; `None`: each instance's host (discovery: the DNS name).
    pub server_name: Option<&'a str>,
    /// `client_certificate`: the certificate presented for mTLS.
    pub client_certificate: Option<&'a str>,
}

/// An upstream's balancing policy (`lb_policy`, `hash_on`, `hash_header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balancing {
    /// Each instance in turn.
    RoundRobin,
    /// The less busy of two instances picked at random.
    LeastRequest,
    /// Rendezvous hashing of a key, so a key keeps its instance.
    ConsistentHash(HashKey),
}

/// What consistent hashing keys on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The verified subject.
    User,
    /// The client address.
    Ip,
    /// The value of this request header (lowercase name).
    Header(HeaderName),
}

/// Instances found in DNS (`discovery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverySpec<'a> {
    /// The name resolved.
    pub dns_name: &'a str,
    /// The port of every address found.
    pub port: u16,
    /// How often the name is resolved again (`refresh_ms`, default
    /// [`defaults::DNS_REFRESH_MS`]).
    pub refresh: Duration,
}

/// Active health checks (`health_check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckSpec<'a> {
    /// The path requested.
    pub path: &'a str,
    /// Time between checks.
    pub interval: Duration,
    /// Time allowed for one check.
    pub timeout: Duration,
    /// Consecutive failures that make a healthy instance unhealthy (at least 1).
    pub unhealthy_threshold: u32,
    /// Consecutive successes that make an unhealthy instance healthy (at least 1).
    pub healthy_threshold: u32,
}

/// A listed instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSpec<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its URL, `http://host:port`.
    pub url: &'a str,
    /// What to connect to: `host:port` (`[v6]:port` for an IPv6 address).
    pub authority: &'a str,
    /// The URL's host (an IPv6 address without brackets): the TLS server name by default.
    pub host: &'a str,
    /// Relative capacity (`weight`, 0 given as 1).
    pub weight: u32,
}

/// An upstream's circuit breaker settings, defaulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSpec {
    /// Consecutive failures that open it.
    pub failure_threshold: u32,
    /// How long it stays open before admitting probes.
    pub reset_timeout: Duration,
    /// Probes admitted at once while half-open.
    pub half_open_max_requests: u32,
    /// Whether a 5xx answer is a failure (`count_5xx`).
    pub count_5xx: bool,
    /// Most instances out of rotation at once, in percent (`max_open_percent`, defaulted).
    pub max_open_percent: u32,
}

impl Default for BreakerSpec {
    fn default() -> Self {
        Self {
            failure_threshold: defaults::BREAKER_FAILURE_THRESHOLD,
            reset_timeout: ms(defaults::BREAKER_RESET_TIMEOUT_MS),
            half_open_max_requests: defaults::BREAKER_HALF_OPEN_MAX_REQUESTS,
            count_5xx: false,
            max_open_percent: defaults::BREAKER_MAX_OPEN_PERCENT,
        }
    }
}

fn ms(v: u32) -> Duration {
    Duration::from_millis(v.into())
}

/// Why a configuration that passed validation could not be typed: the
/// validation and the parsers here disagree, a bug. The message names the field.
pub(crate) type SpecError = String;

/// Types a configuration that passed validation.
pub(crate) fn build<'a>(
    routes: &'a [Route],
    upstreams: &'a [Upstream],
) -> Result<ConfigSpec<'a>, SpecError> {
    Ok(ConfigSpec {
        routes: routes.iter().map(route).collect::<Result<_, _>>()?,
        upstreams: upstreams.iter().map(upstream).collect::<Result<_, _>>()?,
    })
}

fn route(r: &Route) -> Result<RouteSpec<'_>, SpecError> {
    let who = || format!("route {:?}", r.name);
    let mut methods = r
        .methods
        .iter()
        .map(|m| {
            Method::from_bytes(m.as_bytes())
                .map_err(|_| format!("{}: method {m:?} is not a valid HTTP method", who()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if methods.is_empty() && r.aggregate.is_some() {
        methods.push(Method::GET);
    }
    let timeout = ms(match r.timeout_ms {
        0 => defaults::ROUTE_TIMEOUT_MS,
        t => t,
    });
    let cidrs = |field: &str, list: &[String]| {
        list.iter()
            .map(|s| {
                s.parse::<Cidr>()
                    .map_err(|e| format!("{}: {field}: {e}", who()))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let part_timeouts = r
        .aggregate
        .iter()
        .flat_map(|a| &a.parts)
        .map(|p| match p.timeout_ms {
            0 => timeout,
            t => ms(t),
        })
        .collect();
    let auth = match AuthMode::try_from(r.auth) {
        Ok(AuthMode::AuthNone) => Auth::None,
        Ok(AuthMode::AuthJwt) => Auth::Jwt,
        Ok(AuthMode::AuthApiKey) => Auth::ApiKey,
        Ok(AuthMode::AuthMtls) => Auth::Mtls,
        Err(_) => return Err(format!("{}: auth: unknown value {}", who(), r.auth)),
    };
    Ok(RouteSpec {
        proto: r,
        auth,
        methods,
        timeout,
        websocket_idle: r.websocket.then(|| {
            ms(match r.websocket_idle_timeout_ms {
                0 => defaults::WEBSOCKET_IDLE_TIMEOUT_MS,
                t => t,
            })
        }),
        ip_allow: cidrs("ip_allow", &r.ip_allow)?,
        ip_deny: cidrs("ip_deny", &r.ip_deny)?,
        rate_limits: route_limits(r)
            .map(|(field, rl)| rate_limit(rl).map_err(|e| format!("{}: {field}: {e}", who())))
            .collect::<Result<_, _>>()?,
        part_timeouts,
        retry: r
            .retry
            .as_ref()
            .map(|rt| {
                let on = rt
                    .on
                    .iter()
                    .map(|v| {
                        RetryOn::try_from(*v)
                            .map_err(|_| format!("{}: retry.on: unknown value {v}", who()))
                    })
                    .filter(|on| !matches!(on, Ok(RetryOn::Unspecified)))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok::<_, SpecError>(RetrySpec {
                    attempts: rt.attempts,
                    on,
                    per_try_timeout: (rt.per_try_timeout_ms > 0).then(|| ms(rt.per_try_timeout_ms)),
                })
            })
            .transpose()?,
    })
}

fn rate_limit(rl: &RateLimit) -> Result<RateLimitSpec<'_>, SpecError> {
    let algorithm = RateLimitAlgorithm::try_from(rl.algorithm)
        .map_err(|_| format!("algorithm: unknown value {}", rl.algorithm))?;
    let key = match RateLimitKey::try_from(rl.key) {
        Ok(RateLimitKey::KeyUser) => LimitKey::User,
        Ok(RateLimitKey::KeyIp) => LimitKey::Ip,
        Ok(RateLimitKey::KeyApiKey) => LimitKey::ApiKey,
        Ok(RateLimitKey::KeyRoute) => LimitKey::Route,
        Ok(RateLimitKey::KeyHeader) => LimitKey::Header(
            HeaderName::from_bytes(rl.key_header.to_ascii_lowercase().as_bytes())
                .map_err(|_| format!("key_header {:?} is not a header name", rl.key_header))?,
        ),
        Err(_) => return Err(format!("key: unknown value {}", rl.key)),
    };
    Ok(RateLimitSpec {
        policy: &rl.policy,
        algorithm,
        key,
        limit: rl.limit,
        window_seconds: rl.window_seconds,
    })
}

fn upstream<'a>(u: &'a Upstream) -> Result<UpstreamSpec<'a>, SpecError> {
    let instances: Vec<InstanceSpec<'a>> = u
        .instances
        .iter()
        .map(|i| {
            let parsed = parse_instance_url(&i.url)
                .map_err(|e| format!("upstream {:?}: instance {:?}: url {e}", u.name, i.id))?;
            Ok(InstanceSpec {
                id: &i.id,
                url: &i.url,
                authority: parsed.authority,
                host: parsed.host,
                weight: i.weight.max(1),
            })
        })
        .collect::<Result<_, SpecError>>()?;
    let breaker = u
        .circuit_breaker
        .as_ref()
        .map_or_else(BreakerSpec::default, |cb| BreakerSpec {
            failure_threshold: cb.failure_threshold,
            reset_timeout: ms(cb.reset_timeout_ms),
            half_open_max_requests: cb.half_open_max_requests,
            count_5xx: cb.count_5xx,
            max_open_percent: if cb.max_open_percent == 0 {
                defaults::BREAKER_MAX_OPEN_PERCENT
            } else {
                cb.max_open_percent
            },
        });
    let who = || format!("upstream {:?}", u.name);
    let balancing = match LbPolicy::try_from(u.lb_policy) {
        Ok(LbPolicy::RoundRobin) => Balancing::RoundRobin,
        Ok(LbPolicy::LeastRequest) => Balancing::LeastRequest,
        Ok(LbPolicy::ConsistentHash) => {
            Balancing::ConsistentHash(match HashOn::try_from(u.hash_on) {
                Ok(HashOn::User) => HashKey::User,
                Ok(HashOn::Ip) => HashKey::Ip,
                Ok(HashOn::Header) => HashKey::Header(
                    HeaderName::from_bytes(u.hash_header.to_ascii_lowercase().as_bytes()).map_err(
                        |_| {
                            format!(
                                "{}: hash_header {:?} is not a header name",
                                who(),
                                u.hash_header
                            )
                        },
                    )?,
                ),
                _ => return Err(format!("{}: consistent hashing needs hash_on", who())),
            })
        }
        Err(_) => {
            return Err(format!(
                "{}: lb_policy: unknown value {}",
                who(),
                u.lb_policy
            ));
        }
    };
    let discovery = u
        .discovery
        .as_ref()
        .map(|d| {
            Ok::<_, SpecError>(DiscoverySpec {
                dns_name: &d.dns_name,
                port: u16::try_from(d.port)
                    .map_err(|_| format!("{}: discovery.port {} is not a port", who(), d.port))?,
                refresh: ms(match d.refresh_ms {
                    0 => defaults::DNS_REFRESH_MS,
                    t => t,
                }),
            })
        })
        .transpose()?;
    let health_check = u.health_check.as_ref().map(|hc| HealthCheckSpec {
        path: &hc.path,
        interval: ms(hc.interval_ms),
        timeout: ms(hc.timeout_ms),
        unhealthy_threshold: hc.unhealthy_threshold.max(1),
        healthy_threshold: hc.healthy_threshold.max(1),
    });
    // TLS: https:// instances, or discovery with `tls` set.
    let over_tls = instances
        .first()
        .map_or(u.discovery.is_some() && u.tls.is_some(), |i| {
            i.url.starts_with("https://")
        });
    let tls = over_tls
        .then(|| {
            let settings = u.tls.as_ref();
            let ca = match settings
                .map(|t| t.ca_pem.as_str())
                .filter(|p| !p.is_empty())
            {
                Some(pem) => {
                    Some(parse_ca_pem(pem).map_err(|e| format!("{}: tls.ca_pem {e}", who()))?)
                }
                None => None,
            };
            let non_empty = |s: &'a str| (!s.is_empty()).then_some(s);
            Ok::<_, SpecError>(TlsSpec {
                ca,
                server_name: settings.and_then(|t| non_empty(&t.server_name)),
                client_certificate: settings.and_then(|t| non_empty(&t.client_certificate)),
            })
        })
        .transpose()?;
    let http2 = match UpstreamProtocol::try_from(u.protocol) {
        Ok(p) => p == UpstreamProtocol::Http2,
        Err(_) => {
            return Err(format!("{}: protocol: unknown value {}", who(), u.protocol));
        }
    };
    Ok(UpstreamSpec {
        proto: u,
        instances,
        breaker,
        balancing,
        discovery,
        health_check,
        tls,
        http2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Aggregate, AggregatePart, CircuitBreaker, Instance};

    #[test]
    fn a_valid_configuration_comes_back_typed_with_its_defaults() {
        let upstreams = vec![Upstream {
            name: "svc".into(),
            instances: vec![Instance {
                id: "a".into(),
                url: "http://[::1]:8080".into(),
                ..Default::default()
            }],
            ..Default::default()
        }];
        let routes = vec![
            Route {
                name: "api".into(),
                path_prefix: "/api".into(),
                upstream: "svc".into(),
                methods: vec!["GET".into(), "PURGE".into()],
                websocket: true,
                ip_allow: vec!["10.0.0.0/8".into()],
                rate_limit: Some(RateLimit {
                    policy: "p".into(),
                    key: RateLimitKey::KeyHeader as i32,
                    key_header: "X-Client".into(),
                    limit: 5,
                    window_seconds: 60,
                    ..Default::default()
                }),
                ..Default::default()
            },
            Route {
                name: "overview".into(),
                path_prefix: "/overview".into(),
                timeout_ms: 2_000,
                aggregate: Some(Aggregate {
                    parts: vec![
                        AggregatePart {
                            name: "a".into(),
                            upstream: "svc".into(),
                            path: "/a".into(),
                            ..Default::default()
                        },
                        AggregatePart {
                            name: "b".into(),
                            upstream: "svc".into(),
                            path: "/b".into(),
                            timeout_ms: 500,
                            ..Default::default()
                        },
                    ],
                }),
                ..Default::default()
            },
        ];
        let spec = crate::validate_config(&routes, &upstreams).unwrap();
        let api = &spec.routes[0];
        assert_eq!(
            api.methods,
            [Method::GET, Method::from_bytes(b"PURGE").unwrap()]
        );
        assert_eq!(api.timeout, Duration::from_secs(15));
        assert_eq!(api.auth, Auth::None, "the proto default");
        assert_eq!(api.websocket_idle, Some(Duration::from_secs(300)));
        assert_eq!(api.ip_allow, ["10.0.0.0/8".parse::<Cidr>().unwrap()]);
        assert_eq!(
            api.rate_limits[0].key,
            LimitKey::Header(HeaderName::from_static("x-client"))
        );
        assert_eq!(
            api.rate_limits[0].algorithm,
            RateLimitAlgorithm::TokenBucket
        );
        let overview = &spec.routes[1];
        assert_eq!(overview.methods, [Method::GET]);
        assert_eq!(overview.websocket_idle, None);
        assert_eq!(
            overview.part_timeouts,
            [Duration::from_secs(2), Duration::from_millis(500)]
        );
        let svc = &spec.upstreams[0];
        assert_eq!(svc.instances[0].authority, "[::1]:8080");
        assert_eq!(svc.breaker, BreakerSpec::default());
        assert_eq!(svc.breaker.reset_timeout, Duration::from_secs(10));

        assert_eq!(svc.balancing, Balancing::RoundRobin);
        assert_eq!(
            (svc.discovery.clone(), svc.health_check.clone()),
            (None, None)
        );
        assert_eq!(api.retry, None);

        let mut custom = upstreams.clone();
        custom[0].circuit_breaker = Some(CircuitBreaker {
            failure_threshold: 2,
            reset_timeout_ms: 1_500,
            half_open_max_requests: 3,
            count_5xx: true,
            max_open_percent: 0,
        });
        let spec = crate::validate_config(&routes, &custom).unwrap();
        assert_eq!(
            spec.upstreams[0].breaker,
            BreakerSpec {
                failure_threshold: 2,
                reset_timeout: Duration::from_millis(1_500),
                half_open_max_requests: 3,
                count_5xx: true,
                max_open_percent: 50,
            }
        );
    }

    #[test]
    fn balancing_discovery_health_and_retry_are_typed_and_defaulted() {
        use crate::v1::{DnsDiscovery, HashOn, HealthCheck, LbPolicy, Retry};
        let upstreams = vec![Upstream {
            name: "svc".into(),
            lb_policy: LbPolicy::ConsistentHash as i32,
            hash_on: HashOn::Header as i32,
            hash_header: "X-Tenant".into(),
            discovery: Some(DnsDiscovery {
                dns_name: "svc.internal".into(),
                port: 8080,
                refresh_ms: 0,
            }),
            health_check: Some(HealthCheck {
                path: "/healthz".into(),
                interval_ms: 1_000,
                timeout_ms: 200,
                unhealthy_threshold: 3,
                healthy_threshold: 2,
            }),
            ..Default::default()
        }];
        let routes = vec![Route {
            name: "api".into(),
            path_prefix: "/api".into(),
            upstream: "svc".into(),
            retry: Some(Retry {
                attempts: 2,
                on: vec![RetryOn::Status5xx as i32, RetryOn::Timeout as i32],
                per_try_timeout_ms: 300,
            }),
            ..Default::default()
        }];
        let spec = crate::validate_config(&routes, &upstreams).unwrap();
        let svc = &spec.upstreams[0];
        assert_eq!(
            svc.balancing,
            Balancing::ConsistentHash(HashKey::Header(HeaderName::from_static("x-tenant")))
        );
        let d = svc.discovery.as_ref().unwrap();
        assert_eq!((d.dns_name, d.port), ("svc.internal", 8080));
        assert_eq!(d.refresh, Duration::from_secs(5), "the default");
        let hc = svc.health_check.as_ref().unwrap();
        assert_eq!(
            (hc.interval, hc.timeout),
            (Duration::from_secs(1), Duration::from_millis(200))
        );
        assert_eq!(
            spec.routes[0].retry,
            Some(RetrySpec {
                attempts: 2,
                on: vec![RetryOn::Status5xx, RetryOn::Timeout],
                per_try_timeout: Some(Duration::from_millis(300)),
            })
        );
    }
}
