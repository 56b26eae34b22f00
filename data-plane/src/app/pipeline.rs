//! The request pipeline, assembled in one place, top to bottom (docs/data-plane.md):
//! sanitise → route (with matchers) → IP rules → WebSocket admission → CORS preflight →
//! authenticate (JWT or API key) → rate-limit → request headers → [aggregate |
//! split →] [websocket | mirror → cache → coalesce →] balance → breaker → proxy (signing the identity for
//! upstreams with a secret), then
//! response headers and CORS response headers.
//!
//! [`Pipeline::run`] is the whole request path; each stage is one line with the
//! reason it sits where it does. [`Pipeline::handle`] wraps it with what every
//! request gets whatever happens: the route's response header transforms (on an
//! upstream answer), the error mapping, `X-Request-Id`, metrics,
//! the SERVER span (`traceresponse` on every response) and the access-log line.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gateway_proto::spec::Auth;
use gateway_proto::validate::MAX_RATE_LIMITS;
use gateway_telemetry::propagation::TRACERESPONSE;
use gateway_telemetry::{AccessLog, ClientSpans, ServerSpan, Tracer, access_log, attr};
use gateway_transport::body::{ClientBody, RequestBody, ResponseBody};
use gateway_transport::response::Response;
use gateway_transport::server::Scheme;
use gateway_transport::tee::Tee;
use gateway_transport::workers::Worker;
use http::Request;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http_body::Body as _;
use tokio::time::Instant;

use crate::composition::aggregate;
use crate::composition::coalesce::{self, Coalesced};
use crate::composition::mirror::{self, Mirror};
use crate::composition::response_cache::{self, Cached, ResponseCache};
use crate::composition::websocket;
use crate::config::{Compiled, ConfigStore, RouteEntry, Target};
use crate::error::ProxyError;
use crate::metrics::{Metrics, PolicyRefusal};
use crate::policy::api_key::X_API_KEY;
use crate::policy::cors::{Cors, preflight_method};
use crate::policy::hooks::{AuthError, Authenticator, Identity, LimitBy, LimitKey, RateLimiter};
use crate::policy::matching::MatchInput;
use crate::policy::normalize::normalize_path;
use crate::policy::router::host_of;
use crate::policy::sanitize::{
    Cidr, Strip, X_API_KEY_NAME, X_REQUEST_ID, X_USER_ID, X_USER_ROLE, client_ip,
    ensure_request_id, remove_hop_by_hop, set_forwarded,
};
use crate::policy::{grpc, https, mtls};
use crate::upstream::UpstreamEntry;
use crate::upstream::attempt::Trace;
use crate::upstream::balancer::{self, Affinity};
use crate::upstream::proxy::{self, upstream_request};

/// Request limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted request header block (431 above).
    pub max_header_bytes: usize,
    /// Largest accepted request body (413 above).
    pub max_body_bytes: u64,
    /// Longest wait for the next bytes of a request body (408 after).
    pub body_read_timeout: Duration,
    /// Cap on a route's WebSocket idle timeout.
    pub max_websocket_idle: Duration,
    /// Most open WebSocket tunnels in the replica (503 past it).
    pub max_websocket_tunnels: usize,
}

impl Default for Limits {
    /// The flags' defaults (`args.rs`), with the tunnel cap of a 1024-descriptor process.
    fn default() -> Self {
        Self {
            max_header_bytes: 16 * 1024,
            max_body_bytes: 10 * 1024 * 1024,
            body_read_timeout: Duration::from_secs(30),
            max_websocket_idle: Duration::from_secs(3600),
            max_websocket_tunnels: 384,
        }
    }
}

/// Everything the request path needs, shared by every connection of a worker.
#[derive(Clone)]
pub struct Pipeline {
    /// The current configuration.
    pub config: Arc<ConfigStore>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Size limits.
    pub limits: Limits,
    /// Proxies whose `X-Forwarded-For` is believed when finding the client address.
    pub trusted_proxies: Arc<[Cidr]>,
    /// Verifies callers of `AUTH_JWT` routes; `None`: those routes answer 401.
    pub authenticator: Option<Arc<dyn Authenticator>>,
    /// Enforces route rate limits; `None`: limits are not enforced
    /// ([`crate::app::DataPlane::start`] always provides one).
    pub rate_limiter: Option<Arc<dyn RateLimiter>>,
    /// Request spans (a disabled tracer still propagates trace context).
    pub tracer: Tracer,
    /// Most mirrored copies in flight in the replica (`--mirror-max-in-flight`).
    pub mirror_max_in_flight: u64,
    /// The proxy worker this pipeline serves ([`Pipeline::for_listener`]);
    /// [`gateway_transport::workers::OFF_WORKER`] for one made off the workers.
    pub worker: Worker,
    /// The listener this pipeline serves: `X-Forwarded-Proto`, and what a
    /// route that requires HTTPS does ([`Pipeline::for_listener`]).
    pub scheme: Scheme,
    /// The port in the redirects of `https_only` routes (443: none).
    pub https_port: u16,
    /// The replica's stored answers for routes with `cache` (`None`:
    /// `--cache-max-bytes 0`, every request goes upstream).
    pub response_cache: Option<Arc<ResponseCache>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("limits", &self.limits)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("authenticator", &self.authenticator.is_some())
            .field("rate_limiter", &self.rate_limiter.is_some())
            .finish()
    }
}

/// What [`Pipeline::run`] learnt that [`Pipeline::handle`] reports.
#[derive(Default)]
struct Seen<'c> {
    request_id: Option<HeaderValue>,
    route: Option<&'c RouteEntry>,
    /// Fields a stage wants on the response (the rate limiter's budget report).
    response_headers: Option<http::HeaderMap>,
    /// The instance that answered (the last attempt), for the access log.
    upstream: Option<&'c str>,
    /// The `Access-Control-Allow-Origin` value of a request from an origin the route's CORS allows.
    cors_origin: Option<HeaderValue>,
    /// The gateway answered a CORS preflight itself: no upstream response to transform or decorate.
    preflight: bool,
    /// The request is a gRPC call: the gateway's own errors are answered as gRPC statuses.
    grpc: bool,
}

impl Pipeline {
    /// This pipeline, for the listener of `scheme` on the proxy worker
    /// `worker` (everything else is shared).
    pub fn for_listener(&self, worker: Worker, scheme: Scheme) -> Self {
        Self {
            worker,
            scheme,
            ..self.clone()
        }
    }

    /// Answers one request. Never fails: every error becomes a problem response.
    pub async fn handle(
        &self,
        req: Box<Request<ClientBody>>,
        peer: SocketAddr,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let method = req.method().clone();
        // The caller's trace context (strictly parsed; invalid: a new trace).
        let incoming = gateway_telemetry::extract(req.headers());
        let mut span =
            self.tracer
                .server_span(incoming.parent.as_ref(), req.method(), req.uri().path());
        let cfg = self.config.load();
        // gRPC runs over HTTP/2 only: an HTTP/1.1 request costs no header lookup here.
        let mut seen = Seen {
            grpc: req.version() == http::Version::HTTP_2 && grpc::is_call(req.headers()),
            ..Seen::default()
        };
        // Pinned where it is made (here and for `proxy::forward` below): awaiting the
        // call directly copied the whole ~4 KB future into this one's state first.
        let ran = {
            let run = std::pin::pin!(self.run(
                &cfg,
                req,
                peer,
                &mut seen,
                &mut span,
                incoming.tracestate.as_ref(),
            ));
            run.await
        };
        let mut resp = match ran {
            // Response headers: the route's transforms on the upstream's answer (never the gateway's own errors), before the gateway's own headers below so those cannot be changed.
            Ok(mut resp) => {
                if let Some(route) = seen.route.filter(|_| !seen.preflight)
                    && !route.policies.response_headers.is_empty()
                {
                    route
                        .policies
                        .response_headers
                        .apply(resp.fields_mut().map_mut());
                }
                resp
            }
            Err(e) => {
                span.set_status_error(e.kind());
                if seen.grpc {
                    crate::error::grpc::response(&e)
                } else {
                    e.into_response()
                }
            }
        };
        if let Some(id) = seen.request_id {
            resp.fields_mut().insert(X_REQUEST_ID.clone(), id);
        }
        if let Some(extra) = seen.response_headers {
            resp.fields_mut().extend(extra);
        }
        // CORS: `Vary: Origin` on every response of a CORS route, the Access-Control-* headers when the origin is allowed (errors included, so scripts can read them).
        if let Some(cors) = seen.route.and_then(|r| r.policies.cors.as_ref())
            && !seen.preflight
        {
            cors.decorate(resp.fields_mut().map_mut(), seen.cors_origin.as_ref());
        }
        let status = resp.status();
        let latency = started.elapsed();
        let metrics = seen.route.map_or(&self.metrics.unmatched, |r| &*r.metrics);
        metrics.record(&method, status, latency);
        span.set_status_code(status.as_u16());
        resp.fields_mut()
            .insert(TRACERESPONSE, span.context().to_header_value());
        access_log(&AccessLog {
            method: method.as_str(),
            route: seen.route.map(|r| &*r.name),
            status: status.as_u16(),
            upstream: seen.upstream,
            // Time to the response head; a streamed body's length is known only when exact.
            latency,
            bytes: resp.body().size_hint().exact().unwrap_or(0),
            trace: span.context(),
        });
        span.end();
        resp
    }

    /// The pipeline proper.
    async fn run<'c>(
        &self,
        cfg: &'c Compiled,
        req: Box<Request<ClientBody>>,
        peer: SocketAddr,
        seen: &mut Seen<'c>,
        span: &mut ServerSpan,
        tracestate: Option<&HeaderValue>,
    ) -> Result<Response<ResponseBody>, ProxyError> {
        let (mut parts, body) = (*req).into_parts();
        let uri = parts.uri.clone();
        // Noted before sanitising removes the Upgrade / Connection pair.
        let upgrade = websocket::is_upgrade(&parts);

        // Sanitise, before anything reads the request: hop-by-hop and client-forged identity headers go,
        // oversized requests stop here, the path gets its one canonical form for routing and forwarding.
        let path = self.sanitise(&mut parts, &uri, peer, seen)?;

        // Route: host + longest whole-segment prefix + method (a CORS preflight's: the one it asks about); every later stage depends on the route.
        let route = route(cfg, &parts, &path)?;
        seen.route = Some(route);
        span.set_route(&route.name);

        // IP rules: right after routing (the route holds the lists), before authentication, so a refused address costs nothing.
        self.check_ip(route, &parts, peer)?;

        // HTTPS only: a cleartext request is redirected (GET, HEAD) or refused, before authentication reads its credentials.
        if route.https_only {
            match https::verdict(&parts, &uri, self.https_port) {
                https::Verdict::Served => {}
                https::Verdict::Redirect(location) => {
                    return Err(ProxyError::HttpsRedirect(location));
                }
                https::Verdict::Refused => return Err(ProxyError::HttpsRequired),
            }
        }

        // WebSocket: an upgrade needs a `websocket` route and a well-formed handshake (400 otherwise), before authentication spends anything.
        if upgrade {
            websocket::admit(route.view(), &parts, self.limits.max_websocket_tunnels)?;
        }

        // CORS: a preflight is answered here, before authentication (it carries no credentials), rate limiting and the upstream.
        if let Some(answer) = cors_preflight(route, &parts, seen)? {
            return Ok(answer);
        }

        // Authenticate: after routing (the route says whether a token or API key is needed), before rate limiting (KEY_USER counts per subject).
        let identity = self.authenticate(cfg, route, &mut parts).await?;

        // Rate-limit: before any upstream work, so refused requests cost the upstream nothing.
        let limited = self
            .rate_limit(route, identity.as_ref(), &parts, peer)
            .await;
        if !route.rate_limits.is_empty() {
            let decision = if limited.is_ok() { "allowed" } else { "denied" };
            span.set_attribute(attr::RATE_LIMIT_DECISION, decision);
        }
        seen.response_headers = limited?;

        // Request headers: the route's set/add/remove, after authentication set the identity (validation keeps transforms off it) and before balancing and forwarding read the headers.
        route.policies.request_headers.apply(&mut parts.headers);

        // Aggregate: an aggregation route fans out to its parts in parallel (each balanced, breaker-guarded, pooled) instead of proxying.
        let upstream = match &route.target {
            Target::Aggregate(agg) => {
                let client = client_ip(&parts.headers, peer.ip(), &self.trusted_proxies);
                let user = identity.as_ref().map(|id| id.subject.as_bytes());
                let balance = aggregate::Balance { user, client };
                return aggregate::respond(
                    agg,
                    &route.prefix,
                    &parts,
                    &path,
                    balance,
                    span,
                    tracestate,
                    self.worker,
                )
                .await;
            }
            Target::Upstream(upstream) => upstream,
            // Split: the side by weight (sticky: by the caller's key); a side with no available instance hands its share on.
            Target::Split(split) => {
                let key = match split.sticky() {
                    None => Affinity::NONE,
                    Some(on) => balancer::affinity_on(
                        on,
                        identity.as_ref().map(|id| id.subject.as_bytes()),
                        &parts.headers,
                        || client_ip(&parts.headers, peer.ip(), &self.trusted_proxies),
                    ),
                };
                let choice = split.choose(key);
                if choice.failed_over {
                    route
                        .metrics
                        .split_failovers
                        .fetch_add(1, Ordering::Relaxed);
                }
                choice.upstream
            }
        };

        // Coalesce: on a `coalesce` route identical concurrent GET/HEADs share one upstream call; after rate limiting, so every caller pays.
        let grpc_call = seen.grpc;
        let trace = Trace {
            span,
            tracestate,
            served_by: &mut seen.upstream,
        };
        let key = self.balance_key(upstream, identity.as_ref(), &parts, peer);

        // WebSocket: the admitted handshake goes to one instance on a connection of its own; a 101 becomes a byte tunnel.
        if upgrade {
            let pick = balancer::pick(upstream, key, None).ok_or(ProxyError::NoInstance)?;
            let max_idle = self.limits.max_websocket_idle;
            let view = route.view_to(upstream);
            return websocket::forward(view, upstream, pick, parts, &path, trace, max_idle).await;
        }
        // Mirror: a sampled copy of the request as forwarded (identity included) to the shadow upstream, in a task of its own; before coalescing so shared calls are copied too.
        let tee = match &route.mirror {
            Some(m) if m.sampled() => self.mirror(m, route, &parts, &path, &body, trace.span),
            _ => None,
        };
        // Cache: a fresh stored answer is served here; misses of one key share one upstream call (routes with `cache` only).
        let (parts, body, trace) = match (&route.cache, &self.response_cache) {
            (Some(cache), Some(store)) => {
                let to = response_cache::Upstream {
                    route: route.view_to(upstream),
                    upstream,
                    affinity: key,
                    worker: self.worker,
                };
                // Boxed: its state (the flight, the stored answer) stays out of this future, so routes without a cache do not carry it.
                let stage = Box::pin(response_cache::stage(
                    cache, store, to, parts, body, &path, trace,
                ));
                match stage.await {
                    Cached::Answered(answer) => return answer,
                    Cached::Bypass(parts, body, trace) => (parts, body, trace),
                }
            }
            _ => (parts, body, trace),
        };
        let (parts, body, trace) = match &route.coalesce {
            None => (parts, body, trace),
            Some(c) => {
                match coalesce::stage(
                    c,
                    route.view_to(upstream),
                    upstream,
                    parts,
                    body,
                    &path,
                    key,
                    trace,
                    self.worker,
                )
                .await
                {
                    Coalesced::Answered(answer) => return answer,
                    Coalesced::Alone(parts, body, trace) => (parts, body, trace),
                }
            }
        };

        // Balance → breaker: the upstream's policy (consistent hash: `key`) over healthy instances whose breaker admits; none → 503 without a network call.
        let pick = balancer::pick(upstream, key, None).ok_or(ProxyError::NoInstance)?;

        // Proxy: stream to the instance within the route timeout; retry elsewhere per the route's `retry` (or the default once-rules).
        // Each attempt is a CLIENT span whose context replaces any traceparent the client sent.
        let mut body = RequestBody::new(
            body,
            self.limits.max_body_bytes,
            self.limits.body_read_timeout,
        );
        if let Some(tee) = tee {
            body = body.with_tee(tee);
        }
        let req = upstream_request(parts, &route.view_to(upstream), &path, body)?;
        // gRPC: the caller's `grpc-timeout` shortens the route timeout (the upstream gets the header too).
        let timeout = match grpc_call.then(|| grpc::timeout(req.headers())).flatten() {
            Some(t) => t.min(route.timeout),
            None => route.timeout,
        };
        let forward = std::pin::pin!(proxy::forward(
            upstream,
            pick,
            req,
            timeout,
            route.retry.as_ref(),
            trace,
            self.worker,
        ));
        forward.await
    }

    /// The mirror stage: starts the copy of a sampled request; returns the tee
    /// to attach to the primary's body when the copy waits for that body.
    fn mirror(
        &self,
        mirror: &Mirror,
        route: &RouteEntry,
        parts: &Parts,
        path: &str,
        body: &ClientBody,
        span: &dyn ClientSpans,
    ) -> Option<Tee> {
        let copy = mirror::MirrorRequest {
            mirror,
            route: route.view(),
            parts,
            path,
            span: span.parent(),
            metrics: &self.metrics,
            max_in_flight: self.mirror_max_in_flight,
            worker: self.worker,
        };
        mirror::start(copy, body.is_end_stream(), body.size_hint().exact())
    }

    /// The sanitise stage. Returns the normalised path.
    fn sanitise<'u>(
        &self,
        parts: &mut Parts,
        uri: &'u http::Uri,
        peer: SocketAddr,
        seen: &mut Seen<'_>,
    ) -> Result<Cow<'u, str>, ProxyError> {
        // Before the hop-by-hop fields go: hyper drops a `Content-Length` sent
        // beside `Transfer-Encoding` itself, but an HTTP/2 request may still carry both.
        if parts.headers.contains_key(header::TRANSFER_ENCODING)
            && parts.headers.contains_key(header::CONTENT_LENGTH)
        {
            return Err(ProxyError::BadRequest(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        let trusted_peer = self.trusted_proxies.iter().any(|c| c.contains(peer.ip()));
        let header_bytes = remove_hop_by_hop(&mut parts.headers, Strip::Request { trusted_peer });
        self.check_limits(parts, header_bytes)?;
        seen.request_id = Some(ensure_request_id(&mut parts.headers));
        set_forwarded(
            &mut parts.headers,
            parts.uri.authority(),
            peer.ip(),
            trusted_peer,
            self.scheme,
        );
        Ok(normalize_path(uri.path())?)
    }

    fn check_limits(&self, parts: &Parts, header_bytes: usize) -> Result<(), ProxyError> {
        let head = header_bytes + parts.uri.path_and_query().map_or(0, |p| p.as_str().len());
        if head > self.limits.max_header_bytes {
            return Err(ProxyError::HeadersTooLarge {
                limit: self.limits.max_header_bytes,
            });
        }
        let mut lengths = parts.headers.get_all(header::CONTENT_LENGTH).iter();
        if let Some(len) = lengths.next() {
            if lengths.next().is_some() {
                return Err(ProxyError::BadRequest("more than one Content-Length"));
            }
            let len: u64 = len
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or(ProxyError::BadRequest("invalid Content-Length"))?;
            if len > self.limits.max_body_bytes {
                return Err(ProxyError::BodyTooLarge {
                    limit: self.limits.max_body_bytes,
                });
            }
        }
        Ok(())
    }

    /// The IP-rules stage: the real client address (trusted-proxy rule) against the route's lists.
    fn check_ip(
        &self,
        route: &RouteEntry,
        parts: &Parts,
        peer: SocketAddr,
    ) -> Result<(), ProxyError> {
        let Some(rules) = &route.policies.ip_rules else {
            return Ok(());
        };
        if rules.admits(client_ip(&parts.headers, peer.ip(), &self.trusted_proxies)) {
            return Ok(());
        }
        route.metrics.policy.refused(PolicyRefusal::Ip);
        Err(ProxyError::IpDenied)
    }

    async fn authenticate(
        &self,
        cfg: &Compiled,
        route: &RouteEntry,
        parts: &mut Parts,
    ) -> Result<Option<Identity>, ProxyError> {
        match route.auth {
            Auth::Jwt => {}
            Auth::ApiKey => return authenticate_api_key(cfg, route, parts).map(Some),
            Auth::Mtls => {
                let identity = mtls::identity(parts, route.policies.mtls_allow.as_ref())?;
                set_identity(&mut parts.headers, &identity);
                return Ok(Some(identity));
            }
            Auth::None => return Ok(None),
        }
        let identity = match &route.jwt {
            Some(issuers) => issuers.authenticate(parts).await?,
            None => {
                let verifier = self
                    .authenticator
                    .as_ref()
                    .ok_or(ProxyError::Unauthorized(AuthError::NotConfigured))?;
                verifier.authenticate(parts).await?
            }
        };
        // The token has done its job; upstreams get the verified identity instead.
        parts.headers.remove(header::AUTHORIZATION);
        set_identity(&mut parts.headers, &identity);
        Ok(Some(identity))
    }

    /// The request's key for a consistent-hash upstream (after authentication:
    /// `HASH_ON_USER` hashes the verified subject).
    fn balance_key(
        &self,
        upstream: &UpstreamEntry,
        identity: Option<&Identity>,
        parts: &Parts,
        peer: SocketAddr,
    ) -> Affinity {
        balancer::affinity(
            &upstream.policy,
            identity.map(|id| id.subject.as_bytes()),
            &parts.headers,
            || client_ip(&parts.headers, peer.ip(), &self.trusted_proxies),
        )
    }

    async fn rate_limit(
        &self,
        route: &RouteEntry,
        identity: Option<&Identity>,
        parts: &Parts,
        peer: SocketAddr,
    ) -> Result<Option<http::HeaderMap>, ProxyError> {
        let Some(limiter) = &self.rate_limiter else {
            return Ok(None);
        };
        // Validation allows at most MAX_RATE_LIMITS per route.
        let limits = &route.rate_limits[..route.rate_limits.len().min(MAX_RATE_LIMITS)];
        if limits.is_empty() {
            return Ok(None);
        }
        // Each limit's key, on the stack; the client address is found once, if needed.
        let mut client = None;
        let mut keys = [LimitKey::Route(""); MAX_RATE_LIMITS];
        for (slot, limit) in keys.iter_mut().zip(limits) {
            *slot = match (&limit.by, identity) {
                (LimitBy::User, Some(id)) => LimitKey::User(id.subject.as_bytes()),
                (
                    LimitBy::ApiKey,
                    Some(Identity {
                        api_key: Some(name),
                        ..
                    }),
                ) => LimitKey::ApiKey(name.as_bytes()),
                (LimitBy::Route, _) => LimitKey::Route(&route.name),
                (LimitBy::Header(name), _) => LimitKey::Header(
                    parts
                        .headers
                        .get(name)
                        .map_or(&b""[..], HeaderValue::as_bytes),
                ),
                // KEY_IP, or (never, validation sees to it) an identity key without an identity.
                _ => LimitKey::Ip(*client.get_or_insert_with(|| {
                    client_ip(&parts.headers, peer.ip(), &self.trusted_proxies)
                })),
            };
        }
        limiter
            .check(limits, &keys[..limits.len()])
            .await
            .map_err(ProxyError::RateLimited)
    }
}

/// The verified identity as the upstream sees it: `X-User-Id` and `X-User-Role`.
fn set_identity(headers: &mut http::HeaderMap, identity: &Identity) {
    headers.insert(X_USER_ID.clone(), identity.subject.clone());
    headers.insert(X_USER_ROLE.clone(), identity.role.clone());
}

/// The API-key variant of the authenticate stage: the snapshot's key table
/// (no I/O), the key itself dropped, the key's identity forwarded.
fn authenticate_api_key(
    cfg: &Compiled,
    route: &RouteEntry,
    parts: &mut Parts,
) -> Result<Identity, ProxyError> {
    let identity = cfg.api_keys.verify(&parts.headers).map_err(|e| {
        route.metrics.policy.refused(e.refusal());
        ProxyError::ApiKey(e)
    })?;
    parts.headers.remove(&X_API_KEY);
    set_identity(&mut parts.headers, identity);
    if let Some(name) = &identity.api_key {
        parts.headers.insert(X_API_KEY_NAME.clone(), name.clone());
    }
    Ok(identity.clone())
}

/// The CORS stage: answers (or refuses) a preflight on a CORS route; for
/// other requests notes the allowed origin in `seen`.
fn cors_preflight(
    route: &RouteEntry,
    parts: &Parts,
    seen: &mut Seen<'_>,
) -> Result<Option<Response<ResponseBody>>, ProxyError> {
    let Some(cors) = &route.policies.cors else {
        return Ok(None);
    };
    match cors.check(&parts.method, &parts.headers) {
        Cors::Actual(origin) => {
            seen.cors_origin = origin;
            Ok(None)
        }
        Cors::Preflight(answer) => {
            seen.preflight = true;
            Ok(Some(answer))
        }
        Cors::Refused => {
            route.metrics.policy.refused(PolicyRefusal::Cors);
            Err(ProxyError::CorsRefused)
        }
    }
}

/// Finds the route for a sanitised request.
fn route<'c>(cfg: &'c Compiled, parts: &Parts, path: &str) -> Result<&'c RouteEntry, ProxyError> {
    if !cfg.loaded {
        return Err(ProxyError::NotReady);
    }
    let mut hosts = parts.headers.get_all(header::HOST).iter();
    let host: Option<Cow<'_, str>> = match hosts.next() {
        Some(h) => {
            if hosts.next().is_some() {
                return Err(ProxyError::BadRequest("more than one Host"));
            }
            let h = h
                .to_str()
                .map_err(|_| ProxyError::BadRequest("the Host header is not ASCII"))?;
            // An absolute-form target names the host too; two different answers
            // to "which host" are refused rather than routed by one and read by another.
            if let Some(authority) = parts.uri.authority()
                && !authority.as_str().eq_ignore_ascii_case(h)
            {
                return Err(ProxyError::BadRequest(
                    "the request target's authority differs from Host",
                ));
            }
            Some(host_of(h))
        }
        None => parts.uri.authority().map(|a| host_of(a.as_str())),
    };
    // A CORS preflight goes to the route of the method it asks about (whose
    // `methods` need not list OPTIONS), when that route handles CORS.
    let input = MatchInput {
        headers: &parts.headers,
        query: parts.uri.query(),
    };
    if let Some(asked) = preflight_method(&parts.method, &parts.headers)
        && let Some(r) = cfg
            .router
            .find_matching(host.as_deref(), &asked, path, &input)
        && r.policies.cors.is_some()
    {
        return Ok(r);
    }
    cfg.router
        .find_matching(host.as_deref(), &parts.method, path, &input)
        .ok_or(ProxyError::NoRoute)
}
