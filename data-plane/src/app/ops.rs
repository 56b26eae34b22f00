//! The ops listener (separate port from the proxy): liveness, readiness,
//! metrics, and JSON views of breakers, balancing and the configuration.
//!
//! | path | answer |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 once a configuration is loaded; 503 before, and while shutting down |
//! | `GET /metrics` | Prometheus text |
//! | `GET /health/circuit-breakers` | per upstream and instance: state, consecutive failures, ms until the next probe |
//! | `GET /health/load-balancer` | per upstream: policy, DNS discovery state; per instance (discovered members included): healthy, breaker state, in-flight, available |
//! | `GET /config` | `{"version", "hash", "loaded", "control_plane_connected", "certificates"}` |

use std::sync::atomic::Ordering;

use gateway_transport::body::ResponseBody;
use gateway_transport::response::Response;
use http::header::{self, HeaderValue};
use http::{Method, Request, StatusCode};
use serde_json::{Value, json};

use crate::app::exposition::render;
use crate::app::runtime::Runtime;
use crate::config::Compiled;
use crate::upstream::balancer::Policy;
use crate::upstream::breaker::BreakerState;
use crate::upstream::dns::Members;

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<bytes::Bytes>,
) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(body));
    *r.status_mut() = status;
    r.fields_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.fields_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn json_response(status: StatusCode, v: &Value) -> Response<ResponseBody> {
    respond(
        status,
        "application/json",
        serde_json::to_vec(v).expect("JSON values serialise"),
    )
}

/// Answers one ops request. `extra_metrics` appends the plugged-in stages'
/// counters (rate limiter, token verifier, trace export) to `/metrics`.
pub fn handle<B>(
    rt: &Runtime,
    extra_metrics: &dyn Fn(&mut String),
    req: &Request<B>,
) -> Response<ResponseBody> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n",
        );
        r.fields_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let cfg = rt.config.load();
    match req.uri().path() {
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if rt.is_draining() {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "shutting down\n",
                )
            } else if cfg.loaded {
                respond(StatusCode::OK, "text/plain", "ready\n")
            } else {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "no configuration loaded\n",
                )
            }
        }
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            {
                let mut out = render(&rt.metrics, &cfg);
                extra_metrics(&mut out);
                out
            },
        ),
        "/health/circuit-breakers" => json_response(StatusCode::OK, &circuit_breakers(&cfg)),
        "/health/load-balancer" => json_response(
            StatusCode::OK,
            &load_balancer(&cfg, &rt.discovery.members()),
        ),
        "/config" => json_response(
            StatusCode::OK,
            &json!({
                "version": cfg.version,
                "hash": cfg.hash,
                "loaded": cfg.loaded,
                "control_plane_connected": rt.metrics.control_plane_connected.load(Ordering::Relaxed),
                "certificates": certificates(&cfg),
            }),
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// `[{"name", "sni_hosts", "not_after_unix", "expires_in_seconds", "sha256_fingerprint"}]`:
/// the certificates the HTTPS listener offers, by name.
fn certificates(cfg: &Compiled) -> serde_json::Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    cfg.certificates
        .info()
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "sni_hosts": c.sni_hosts,
                "not_after_unix": c.not_after,
                "expires_in_seconds": c.not_after.saturating_sub(now),
                "sha256_fingerprint": c.sha256_fingerprint,
            })
        })
        .collect()
}

/// `{"version", "upstreams": [{"name", "settings", "instances": [{"id", "url", "state", "consecutive_failures", "next_probe_in_ms"}]}]}`.
/// `next_probe_in_ms` is set only while OPEN (0 once a probe is due).
pub fn circuit_breakers(cfg: &Compiled) -> Value {
    let upstreams: Vec<Value> = cfg
        .upstreams
        .iter()
        .map(|u| {
            let instances: Vec<Value> = u
                .instances
                .iter()
                .map(|i| {
                    let state = i.breaker.state();
                    json!({
                        "id": &*i.id,
                        "url": &*i.key.url,
                        "state": state.as_str(),
                        "consecutive_failures": i.breaker.consecutive_failures(),
                        "next_probe_in_ms": i.breaker.until_probe(&u.breaker).map(|d| d.as_millis() as u64),
                    })
                })
                .collect();
            json!({
                "name": &*u.name,
                "settings": {
                    "failure_threshold": u.breaker.failure_threshold,
                    "reset_timeout_ms": u.breaker.reset_timeout.as_millis() as u64,
                    "half_open_max_requests": u.breaker.half_open_max_requests,
                    "count_5xx": u.breaker.count_5xx,
                    "max_open_percent": u.breaker.max_open_percent,
                },
                "instances": instances,
            })
        })
        .collect();
    json!({ "version": cfg.version, "upstreams": upstreams })
}

/// `{"version", "upstreams": [{"name", "policy", "hash_on", "health_checks", "discovery", "outlier_detection", "instances": [{"id", "url", "healthy", "breaker", "in_flight", "available", "idle_connections", "ejected_for_ms", "ejections"}]}]}`.
///
/// With `outlier_detection`, `ejected_for_ms` is the time left of the
/// instance's ejection (`null`: in service) and `ejections` its count; both
/// are `null` on upstreams without it.
///
/// `hash_on` (`user`, `ip`, `header:NAME`) is there for `consistent_hash` only.
/// `discovery` is `null` for listed instances, else `{"dns_name", "port",
/// "refresh_ms", "addresses", "last_error", "resolved_ms_ago"}` from `members`
/// (the last good answer, which `instances` shows once compiled in; `last_error`
/// is why the latest resolution failed, `null` when it worked).
pub fn load_balancer(cfg: &Compiled, members: &Members) -> Value {
    let now = crate::upstream::outlier::now_ms();
    let upstreams: Vec<Value> = cfg
        .upstreams
        .iter()
        .map(|u| {
            let instances: Vec<Value> = u
                .instances
                .iter()
                .map(|i| {
                    let breaker = i.breaker.state();
                    let admits = match breaker {
                        BreakerState::Closed => true,
                        BreakerState::Open => i
                            .breaker
                            .until_probe(&u.breaker)
                            .is_some_and(|d| d.is_zero()),
                        BreakerState::HalfOpen => true,
                    };
                    let ejected_for = u.outlier.as_ref().and_then(|_| i.outlier.ejected_for(now));
                    json!({
                        "id": &*i.id,
                        "url": &*i.key.url,
                        "healthy": i.is_healthy(),
                        "breaker": breaker.as_str(),
                        "in_flight": i.in_flight(),
                        "available": i.is_healthy() && admits && ejected_for.is_none(),
                        "idle_connections": i.pool.idle_count(),
                        "ejected_for_ms": ejected_for,
                        "ejections": u.outlier.as_ref().map(|_| i.outlier.ejections()),
                    })
                })
                .collect();
            let hash_on = match &u.policy {
                Policy::ConsistentHash(on) => Some(on.describe()),
                _ => None,
            };
            let discovery = u.discovery.as_ref().map(|t| {
                let m = members.get(&u.name);
                json!({
                    "dns_name": &*t.dns_name,
                    "port": t.port,
                    "refresh_ms": t.refresh.as_millis() as u64,
                    "addresses": m.map_or_else(Vec::new, |m| m.addrs.iter().map(ToString::to_string).collect()),
                    "last_error": m.and_then(|m| m.last_error.as_deref()),
                    "resolved_ms_ago": m.and_then(|m| m.resolved_at).map(|at| at.elapsed().as_millis() as u64),
                })
            });
            json!({
                "name": &*u.name,
                "policy": u.policy.as_str(),
                "hash_on": hash_on,
                "health_checks": u.health.is_some(),
                "discovery": discovery,
                "outlier_detection": u.outlier.is_some(),
                "instances": instances,
            })
        })
        .collect();
    json!({ "version": cfg.version, "upstreams": upstreams })
}
