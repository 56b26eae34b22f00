//! Aggregation routes (`Route.aggregate`, docs/data-plane.md "Aggregate"): one client
//! GET fans out to several upstream calls in parallel and the answer is a JSON
//! object keyed by part name holding each part's JSON body.
//!
//! Each part goes through the same machinery as a proxied request: its
//! upstream's balancer and breakers ([`balancer::pick`]), and
//! [`proxy::forward`] (pool, retry rules, a CLIENT span per attempt under the
//! request's SERVER span, `traceparent` injected). Parts carry the caller's
//! sanitised headers, so the verified `X-User-Id` / `X-User-Role`,
//! `X-Request-Id` and `X-Forwarded-*` reach every part and the bearer token
//! never does (the authenticate stage removed it).
//!
//! A part fails on: no available instance (breaker open or unhealthy: at once,
//! no network call), a connect error or broken exchange, its timeout (response
//! head *and* body), a non-2xx status, a body over [`MAX_PART_BODY`], a body that
//! is not JSON. A failed optional part is `null` and named in
//! `X-Partial-Failure`; a failed required part ends the request at once with
//! 502 problem+json naming it (the other parts are abandoned). The whole
//! request therefore takes at most the slowest part's timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use gateway_proto::validate::REST_PLACEHOLDER;
use gateway_telemetry::ServerSpan;
use gateway_transport::body::{RequestBody, ResponseBody};
use gateway_transport::response::Response;
use gateway_transport::workers::Worker;
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{HeaderMap, Request};
use http_body::Body as _;
use http_body_util::{BodyExt as _, Limited};
use tokio::time::Instant;

use crate::error::{PartFailure, ProxyError};
use crate::metrics::{PartMetrics, PartOutcome};
use crate::policy::matching;
use crate::policy::signature::SignedBody;
use crate::upstream::UpstreamEntry;
use crate::upstream::attempt::Trace;
use crate::upstream::balancer;
use crate::upstream::proxy;

/// Largest part body accepted, in bytes (1 MiB). A larger one fails the part.
pub const MAX_PART_BODY: usize = 1 << 20;

/// Response header listing the optional parts that failed, comma-separated, in configuration order.
pub const X_PARTIAL_FAILURE: HeaderName = HeaderName::from_static("x-partial-failure");

/// Request headers not sent to parts: the client's body framing (parts are
/// bodiless GETs), and what would make a 2xx answer something other than a
/// whole identity-encoded JSON document (compression, ranges, conditionals).
const DROPPED_HEADERS: [HeaderName; 10] = [
    header::CONTENT_LENGTH,
    header::CONTENT_TYPE,
    header::TRANSFER_ENCODING,
    header::EXPECT,
    header::ACCEPT_ENCODING,
    header::RANGE,
    header::IF_RANGE,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
];

/// A compiled aggregation: its parts in configuration order.
#[derive(Debug)]
pub struct Aggregate {
    parts: Box<[Part]>,
}

impl Aggregate {
    /// An aggregation of `parts` (the response object lists them in this order).
    pub fn new(parts: Vec<Part>) -> Self {
        Self {
            parts: parts.into(),
        }
    }

    /// The parts, in configuration order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }
}

/// One compiled part of an aggregation.
#[derive(Debug)]
pub struct Part {
    name: Arc<str>,
    upstream: Arc<UpstreamEntry>,
    path: PathTemplate,
    required: bool,
    timeout: Duration,
    metrics: Arc<PartMetrics>,
}

impl Part {
    /// A part named `name` requesting `path` (validated by
    /// `gateway_proto::validate::check_part_path`) from `upstream`.
    pub fn new(
        name: &str,
        upstream: Arc<UpstreamEntry>,
        path: &str,
        required: bool,
        timeout: Duration,
        metrics: Arc<PartMetrics>,
    ) -> Self {
        Self {
            name: name.into(),
            upstream,
            path: PathTemplate::parse(path),
            required,
            timeout,
            metrics,
        }
    }

    /// The part's name (its key in the response object).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its outcome counters.
    pub fn metrics(&self) -> &Arc<PartMetrics> {
        &self.metrics
    }

    /// Whether its failure fails the whole request.
    pub fn required(&self) -> bool {
        self.required
    }

    /// Time allowed for its response head and body.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// A part's path split around `{rest}`, and its fixed query.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PathTemplate {
    /// The path up to `{rest}` (or the whole path).
    before: Box<str>,
    /// The path after `{rest}`; `None` when there is no placeholder.
    after: Option<Box<str>>,
    /// The fixed query, without "?".
    query: Option<Box<str>>,
    /// The parameter names of the fixed query, decoded: a caller's
    /// parameter of one of these names is dropped, never appended after the
    /// fixed one (a backend reading the last value would take the caller's).
    fixed_names: Box<[Box<str>]>,
}

impl PathTemplate {
    fn parse(template: &str) -> Self {
        let (path, query) = match template.split_once('?') {
            Some((p, q)) => (p, (!q.is_empty()).then(|| q.into())),
            None => (template, None),
        };
        let (before, after) = match path.split_once(REST_PLACEHOLDER) {
            Some((b, a)) => (b.into(), Some(a.into())),
            None => (path.into(), None),
        };
        let fixed_names = query
            .as_deref()
            .map(|q| {
                query_names(q)
                    .map(|n| n.into_owned().into_boxed_str())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_boxed_slice();
        Self {
            before,
            after,
            query,
            fixed_names,
        }
    }

    /// The caller's query without the parameters the fixed query names (each
    /// `&`-separated parameter, or `;`-separated piece of one, whose decoded
    /// name is a fixed one goes); `None` when nothing is left.
    fn callers_query_kept<'q>(&self, caller_query: &'q str) -> Option<std::borrow::Cow<'q, str>> {
        if self.fixed_names.is_empty() {
            return Some(caller_query.into());
        }
        let fixed =
            |param: &str| query_names(param).any(|n| self.fixed_names.iter().any(|f| **f == *n));
        if !caller_query.split('&').any(fixed) {
            return Some(caller_query.into());
        }
        let kept: Vec<&str> = caller_query
            .split('&')
            .filter(|p| !p.is_empty() && !fixed(p))
            .collect();
        (!kept.is_empty()).then(|| kept.join("&").into())
    }

    /// The origin-form URI for one request: `{rest}` replaced, the caller's
    /// query appended after the fixed one. `None` if that is not a valid URI.
    fn uri(&self, rest: &str, caller_query: Option<&str>) -> Option<Uri> {
        let caller_query = caller_query
            .filter(|q| !q.is_empty())
            .and_then(|q| self.callers_query_kept(q));
        let caller_query = caller_query.as_deref();
        let len = self.before.len()
            + self.after.as_ref().map_or(0, |a| rest.len() + a.len())
            + self.query.as_ref().map_or(0, |q| q.len() + 1)
            + caller_query.map_or(0, |q| q.len() + 1);
        let mut s = BytesMut::with_capacity(len);
        s.put_slice(self.before.as_bytes());
        if let Some(after) = &self.after {
            s.put_slice(rest.as_bytes());
            s.put_slice(after.as_bytes());
        }
        let mut sep = b'?';
        for q in [self.query.as_deref(), caller_query].into_iter().flatten() {
            s.put_u8(sep);
            s.put_slice(q.as_bytes());
            sep = b'&';
        }
        PathAndQuery::from_maybe_shared(s.freeze())
            .ok()
            .map(Uri::from)
    }
}

/// The decoded names of a query's parameters (`&`- or `;`-separated), as a
/// backend reads them ([`matching::decode`]: `%XX` and `+` decoded).
fn query_names(query: &str) -> impl Iterator<Item = std::borrow::Cow<'_, str>> + '_ {
    query
        .split(['&', ';'])
        .filter(|p| !p.is_empty())
        .map(|p| matching::decode(p.split('=').next().unwrap_or(p)))
}

/// What a part's consistent-hash balancing may key on: the caller's verified
/// user and address (a header key is read from the part's request).
#[derive(Debug, Clone, Copy)]
pub struct Balance<'r> {
    /// The verified subject, on an authenticated route.
    pub user: Option<&'r [u8]>,
    /// The client address (trusted-proxy rule applied).
    pub client: std::net::IpAddr,
}

/// Answers an aggregation request: every part in parallel, then the JSON
/// object (or 502 naming the first required part that failed).
/// `parts` is the request head after authentication; `path` the normalised path;
/// `worker` the proxy worker serving it.
#[allow(clippy::too_many_arguments)]
pub async fn respond(
    agg: &Aggregate,
    prefix: &str,
    parts: &http::request::Parts,
    path: &str,
    balance: Balance<'_>,
    span: &ServerSpan,
    tracestate: Option<&HeaderValue>,
    worker: Worker,
) -> Result<Response<ResponseBody>, ProxyError> {
    let rest = path
        .strip_prefix(prefix)
        .unwrap_or_default()
        .trim_start_matches('/');
    let query = parts.uri.query();
    let headers = part_headers(&parts.headers);
    let now = crate::policy::signature::unix_now();
    let mut requests = Vec::with_capacity(agg.parts.len());
    for part in agg.parts.iter() {
        let uri = part.path.uri(rest, query).ok_or(ProxyError::BadRequest(
            "the request path or query cannot be used in an aggregate part's URI",
        ))?;
        let mut req = Box::new(Request::new(RequestBody::empty()));
        *req.headers_mut() = headers.clone();
        // Signed identity: each part's upstream signs its own (GET) request, over its target with
        // the query and its empty body.
        if let Some(signer) = &part.upstream.signer {
            let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
            signer.sign(
                req.headers_mut(),
                "GET",
                target,
                SignedBody::Whole(b""),
                now,
            );
        }
        *req.uri_mut() = uri;
        requests.push(req);
    }

    let mut pending: FuturesUnordered<_> = agg
        .parts
        .iter()
        .zip(requests)
        .enumerate()
        .map(|(i, (part, req))| async move {
            (i, fetch(part, req, balance, span, tracestate, worker).await)
        })
        .collect();
    let mut bodies: Vec<Option<Bytes>> = vec![None; agg.parts.len()];
    while let Some((i, result)) = pending.next().await {
        let part = &agg.parts[i];
        match result {
            Ok(body) => {
                part.metrics.record(PartOutcome::Ok);
                bodies[i] = Some(body);
            }
            Err(failure) => {
                part.metrics.record(failure.outcome());
                if part.required {
                    return Err(ProxyError::AggregatePart {
                        part: part.name.clone(),
                        failure,
                    });
                }
            }
        }
    }
    Ok(assemble(&agg.parts, &bodies))
}

/// The headers every part is sent: the caller's, minus [`DROPPED_HEADERS`], asking for JSON.
fn part_headers(caller: &HeaderMap) -> HeaderMap {
    let mut headers = caller.clone();
    for name in &DROPPED_HEADERS {
        headers.remove(name);
    }
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    headers
}

/// One part: balance (failing at once when nothing admits), forward, read and check the body.
async fn fetch(
    part: &Part,
    req: Box<Request<RequestBody>>,
    balance: Balance<'_>,
    span: &ServerSpan,
    tracestate: Option<&HeaderValue>,
    worker: Worker,
) -> Result<Bytes, PartFailure> {
    let key = balancer::affinity(&part.upstream.policy, balance.user, req.headers(), || {
        balance.client
    });
    let pick = balancer::pick(&part.upstream, key, None).ok_or(PartFailure::Unavailable)?;
    let deadline = Instant::now() + part.timeout;
    let mut served_by = None;
    let trace = Trace {
        span,
        tracestate,
        served_by: &mut served_by,
    };
    let resp = proxy::forward(&part.upstream, pick, req, part.timeout, None, trace, worker)
        .await
        .map_err(|e| match e {
            ProxyError::Upstream(e) if e.is_timeout() => PartFailure::Timeout,
            ProxyError::NoInstance => PartFailure::Unavailable,
            _ => PartFailure::Unreachable,
        })?;
    if !resp.status().is_success() {
        return Err(PartFailure::Status(resp.status()));
    }
    let body = resp.into_body();
    if body
        .size_hint()
        .exact()
        .is_some_and(|n| n > MAX_PART_BODY as u64)
    {
        return Err(PartFailure::TooLarge {
            limit: MAX_PART_BODY,
        });
    }
    let body = tokio::time::timeout_at(deadline, Limited::new(body, MAX_PART_BODY).collect())
        .await
        .map_err(|_| PartFailure::Timeout)?
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                PartFailure::TooLarge {
                    limit: MAX_PART_BODY,
                }
            } else {
                PartFailure::Unreachable
            }
        })?
        .to_bytes();
    serde_json::from_slice::<serde::de::IgnoredAny>(&body).map_err(|_| PartFailure::InvalidJson)?;
    Ok(body)
}

/// The JSON object of every part's body (`null` for failed ones), plus
/// `X-Partial-Failure` when any failed. Bodies are valid JSON already and
/// names are `[a-z0-9-]`, so nothing is re-encoded.
fn assemble(parts: &[Part], bodies: &[Option<Bytes>]) -> Response<ResponseBody> {
    let len = 2 + parts
        .iter()
        .zip(bodies)
        .map(|(p, b)| p.name.len() + 4 + b.as_ref().map_or(4, Bytes::len))
        .sum::<usize>();
    let mut out = BytesMut::with_capacity(len);
    let mut failed = String::new();
    out.put_u8(b'{');
    for (i, (part, body)) in parts.iter().zip(bodies).enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_u8(b'"');
        out.put_slice(part.name.as_bytes());
        out.put_slice(b"\":");
        match body {
            Some(b) => out.put_slice(b),
            None => {
                out.put_slice(b"null");
                if !failed.is_empty() {
                    failed.push(',');
                }
                failed.push_str(&part.name);
            }
        }
    }
    out.put_u8(b'}');
    let mut resp = Response::new(ResponseBody::full(out.freeze()));
    let h = resp.fields_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(&failed)
        && !failed.is_empty()
    {
        h.insert(X_PARTIAL_FAILURE, v);
    }
    resp
}

#[cfg(test)]
mod tests;
