//! Forwarding to an upstream instance (DESIGN §4, "Proxy").
//!
//! Bodies stream both ways. The route timeout bounds the time to the response
//! head across every attempt (504 when it passes). Retries, at most one, always
//! on another instance when there is one:
//!
//! * the request never reached the first instance (connect refused or timed
//!   out, or a fresh connection died before the request was written): retried
//!   whatever its method, since the body is still untouched;
//! * the connection failed after the request was written but before a response
//!   head arrived, and the request is a bodiless GET/HEAD/OPTIONS: replayed,
//!   because repeating it cannot change anything (this is what keeps clients
//!   error-free when an instance dies under load).
//!
//! Breaker outcomes: connect failure, timeout, broken exchange and 5xx count as
//! failures; anything else is a success; a request that failed because of the
//! client (body too large, client went away) reports nothing.
//!
//! Tracing: every attempt is a CLIENT span under the request's SERVER span;
//! its context goes upstream as `traceparent` (replacing whatever the client
//! sent) with the caller's validated `tracestate`.

use std::error::Error as _;
use std::time::Duration;

use bytes::{BufMut as _, BytesMut};
use gateway_telemetry::{ClientSpans, inject};
use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{HeaderMap, Method, Request, Response, Version};
use http_body::Body as _;
use tokio::time::Instant;

use crate::balancer::{self, Pick};
use crate::body::{RequestBody, RequestBodyError, ResponseBody, UpstreamBody};
use crate::breaker::{Permit, Transition};
use crate::config::{InstanceState, RouteEntry, UpstreamEntry};
use crate::error::ProxyError;
use crate::metrics::UpstreamErrorKind;
use crate::pool::SendError;
use crate::router::rewrite_path;
use crate::sanitize::remove_hop_by_hop;

/// Builds the request sent upstream: origin-form URI with the normalised (and
/// rewritten) path and the original query, HTTP/1.1, and a `Host` header (an
/// HTTP/2 client sends `:authority` instead).
pub fn upstream_request(
    mut parts: http::request::Parts,
    route: &RouteEntry,
    path: &str,
    body: RequestBody,
) -> Result<Request<RequestBody>, ProxyError> {
    let query = parts.uri.query();
    let unchanged =
        route.rewrite.is_none() && parts.uri.scheme().is_none() && parts.uri.path() == path;
    if !unchanged {
        let rewritten;
        let path = match &route.rewrite {
            Some(rw) => {
                rewritten = rewrite_path(path, &route.prefix, rw);
                rewritten.as_str()
            }
            None => path,
        };
        let mut pq = BytesMut::with_capacity(path.len() + query.map_or(0, |q| q.len() + 1));
        pq.put_slice(path.as_bytes());
        if let Some(q) = query {
            pq.put_u8(b'?');
            pq.put_slice(q.as_bytes());
        }
        let pq = PathAndQuery::from_maybe_shared(pq.freeze())
            .map_err(|_| ProxyError::BadRequest("the rewritten path is not a valid URI"))?;
        if !parts.headers.contains_key(header::HOST)
            && let Some(a) = parts.uri.authority()
            && let Ok(v) = HeaderValue::from_str(a.as_str())
        {
            parts.headers.insert(header::HOST, v);
        }
        parts.uri = Uri::from(pq);
    } else if !parts.headers.contains_key(header::HOST) {
        if let Some(a) = parts.uri.authority()
            && let Ok(v) = HeaderValue::from_str(a.as_str())
        {
            parts.headers.insert(header::HOST, v);
        }
        parts.uri = Uri::from(
            parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
    }
    // hyper already sent the client its "100 Continue" when the body was first
    // read; the upstream gets the body without a second round of expectations.
    parts.headers.remove(header::EXPECT);
    parts.version = Version::HTTP_11;
    Ok(Request::from_parts(parts, body))
}

/// What is needed to send a bodiless request again.
struct Replay {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Replay {
    fn of(req: &Request<RequestBody>) -> Option<Self> {
        let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        (safe && req.body().is_end_stream()).then(|| Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers: req.headers().clone(),
        })
    }

    fn request(&self) -> Request<RequestBody> {
        let mut r = Request::new(RequestBody::empty());
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.headers_mut() = self.headers.clone();
        r
    }
}

fn report(upstream: &UpstreamEntry, instance: &InstanceState, t: Option<Transition>) {
    match t {
        Some(Transition::Opened) => {
            instance
                .metrics
                .breaker_opened
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(upstream = %upstream.name, instance = %instance.id, "circuit breaker opened");
        }
        Some(Transition::Closed) => {
            tracing::info!(upstream = %upstream.name, instance = %instance.id, "circuit breaker closed");
        }
        None => {}
    }
}

fn fail(
    upstream: &UpstreamEntry,
    instance: &InstanceState,
    permit: Permit<'_>,
    kind: UpstreamErrorKind,
) {
    instance.metrics.error(kind);
    report(upstream, instance, permit.failure());
}

/// The client-side cause of a failed exchange, if the failure was the request body's.
fn body_error(e: &hyper::Error) -> Option<&RequestBodyError> {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(b) = s.downcast_ref::<RequestBodyError>() {
            return Some(b);
        }
        source = s.source();
    }
    None
}

/// The request's trace, for the attempts' CLIENT spans.
pub struct Trace<'s, 'a> {
    /// Parent of every attempt's CLIENT span: the request's SERVER span, or a
    /// [`gateway_telemetry::SpanParent`] of it for calls in a task of their own.
    pub span: &'s dyn ClientSpans,
    /// The caller's validated `tracestate`, forwarded as is.
    pub tracestate: Option<&'s HeaderValue>,
    /// Set to the id of each instance tried; the last one answered (or failed).
    pub served_by: &'s mut Option<&'a str>,
}

/// Sends `req` to the instance in `first`, retrying once per the module rules.
/// Returns the upstream's response (hop-by-hop headers removed, body streaming).
pub async fn forward<'a>(
    upstream: &'a UpstreamEntry,
    first: Pick<'a>,
    req: Request<RequestBody>,
    timeout: Duration,
    trace: Trace<'_, 'a>,
) -> Result<Response<ResponseBody>, ProxyError> {
    let deadline = Instant::now() + timeout;
    let replay = Replay::of(&req);
    let mut req = req;
    let mut pick = first;
    let mut retried = false;
    loop {
        let Pick {
            index,
            instance,
            permit,
            key,
        } = pick;
        instance
            .metrics
            .attempts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if retried {
            instance
                .metrics
                .retries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        *trace.served_by = Some(&instance.id);
        let mut client = trace.span.client_span(req.method());
        client.set_upstream_instance(&instance.id);
        if retried {
            client.set_attribute(gateway_telemetry::attr::ATTEMPT, 2u32);
        }
        inject(req.headers_mut(), &client.context(), trace.tracestate);
        let in_flight = instance.start_request();
        let sent = tokio::time::timeout_at(deadline, instance.pool.send(req)).await;
        match &sent {
            Err(_) => client.set_status_error("timeout"),
            Ok(Ok((resp, _))) => client.set_status_code(resp.status().as_u16()),
            Ok(Err(SendError::Connect { .. } | SendError::NotSent { .. })) => {
                client.set_status_error("connect")
            }
            Ok(Err(SendError::Failed { .. })) => client.set_status_error("upstream"),
        }
        client.end();
        let next = match sent {
            Err(_elapsed) => {
                fail(upstream, instance, permit, UpstreamErrorKind::Timeout);
                return Err(ProxyError::Timeout(timeout));
            }
            Ok(Ok((resp, checkin))) => {
                if resp.status().is_server_error() {
                    fail(upstream, instance, permit, UpstreamErrorKind::Status5xx);
                } else {
                    report(upstream, instance, permit.success());
                }
                let (mut parts, body) = resp.into_parts();
                remove_hop_by_hop(&mut parts.headers, false);
                let body = UpstreamBody::new(body, checkin, in_flight);
                return Ok(Response::from_parts(parts, ResponseBody::Upstream(body)));
            }
            // Never reached the instance: the request is intact.
            Ok(Err(SendError::Connect { req: back, error })) => {
                fail(upstream, instance, permit, UpstreamErrorKind::Connect);
                tracing::debug!(upstream = %upstream.name, instance = %instance.id, error = %error, "connect failed");
                let retry = (!retried && !back.body().was_polled())
                    .then(|| balancer::pick(upstream, key, Some(index)))
                    .flatten();
                match retry {
                    Some(p) => (p, back),
                    None => return Err(ProxyError::Connect(error)),
                }
            }
            Ok(Err(SendError::NotSent { req: back, error })) => {
                fail(upstream, instance, permit, UpstreamErrorKind::Connect);
                let retry = (!retried && !back.body().was_polled())
                    .then(|| balancer::pick(upstream, key, Some(index)))
                    .flatten();
                match retry {
                    Some(p) => (p, back),
                    None => return Err(ProxyError::Upstream(error)),
                }
            }
            Ok(Err(SendError::Failed { error, reused })) => {
                match body_error(&error) {
                    Some(RequestBodyError::TooLarge { limit }) => {
                        return Err(ProxyError::BodyTooLarge { limit: *limit });
                    }
                    Some(RequestBodyError::Client(_)) => return Err(ProxyError::ClientBody(error)),
                    None => {}
                }
                fail(upstream, instance, permit, UpstreamErrorKind::Protocol);
                tracing::debug!(upstream = %upstream.name, instance = %instance.id, error = %error, "upstream exchange failed");
                // A stale keep-alive connection says little about the instance:
                // with no other instance, the replay may go to the same one.
                let retry = match &replay {
                    Some(r) if !retried => balancer::pick(upstream, key, Some(index))
                        .or_else(|| {
                            reused
                                .then(|| balancer::pick(upstream, key, None))
                                .flatten()
                        })
                        .map(|p| (p, r.request())),
                    _ => None,
                };
                match retry {
                    Some(next) => next,
                    None => return Err(ProxyError::Upstream(error)),
                }
            }
        };
        (pick, req) = next;
        retried = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::BreakerSettings;
    use crate::config::{DEFAULT_ROUTE_TIMEOUT, UpstreamEntry};
    use std::sync::Arc;

    fn route(prefix: &str, rewrite: Option<&str>) -> RouteEntry {
        RouteEntry {
            name: "r".into(),
            prefix: prefix.into(),
            rewrite: rewrite.map(Into::into),
            auth: gateway_proto::v1::AuthMode::AuthNone,
            rate_limits: Box::default(),
            timeout: DEFAULT_ROUTE_TIMEOUT,
            target: crate::config::Target::Upstream(Arc::new(UpstreamEntry::new(
                "u",
                vec![],
                BreakerSettings::default(),
                None,
            ))),
            coalesce: None,
            policies: Default::default(),
            metrics: Default::default(),
        }
    }

    fn build(
        uri: &str,
        host: Option<&str>,
        route: &RouteEntry,
        path: &str,
    ) -> Request<RequestBody> {
        let mut b = Request::get(uri).header("expect", "100-continue");
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        let (parts, ()) = b.body(()).unwrap().into_parts();
        upstream_request(parts, route, path, RequestBody::empty()).unwrap()
    }

    #[test]
    fn origin_form_with_rewrite_and_query() {
        let r = route("/api/orders", Some("/orders"));
        let req = build("/api/orders/7?a=1&b=%20", Some("gw"), &r, "/api/orders/7");
        assert_eq!(req.uri(), "/orders/7?a=1&b=%20");
        assert_eq!(req.headers()[header::HOST], "gw");
        assert_eq!(req.version(), Version::HTTP_11);
        assert!(!req.headers().contains_key(header::EXPECT));
    }

    #[test]
    fn normalised_path_is_what_is_forwarded() {
        let r = route("/api", None);
        let req = build("/api//x/./y?q", Some("gw"), &r, "/api/x/y");
        assert_eq!(req.uri(), "/api/x/y?q");
        // Unchanged canonical paths keep their URI as it came.
        let req = build("/api/x?q=1", Some("gw"), &r, "/api/x");
        assert_eq!(req.uri(), "/api/x?q=1");
    }

    #[test]
    fn absolute_form_becomes_origin_form_with_host() {
        let r = route("/", None);
        let req = build("http://example.test:8080/a/b?c", None, &r, "/a/b");
        assert_eq!(req.uri(), "/a/b?c");
        assert_eq!(req.headers()[header::HOST], "example.test:8080");
    }
}
