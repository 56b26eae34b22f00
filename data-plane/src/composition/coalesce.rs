//! Request coalescing (`Route.coalesce`, docs/data-plane.md "Coalesce"): identical
//! concurrent GET/HEAD requests share one upstream call.
//!
//! * **Identical** ([`Key`]): same route (one [`Coalescer`] per route), method,
//!   normalised path, query, authority (`Host` and an HTTP/2 `:authority`: a
//!   route may match several host names and the backend may answer each
//!   differently), identity (`X-User-Id` / `X-User-Role` after
//!   authentication, and `Authorization` / `Cookie` as forwarded), `Accept` /
//!   `Accept-Encoding` / `Accept-Language` (so nobody gets a representation they
//!   did not ask for), and `Range`, `If-Range` and the conditional headers
//!   (`If-None-Match`, `If-Modified-Since`, `If-Match`, `If-Unmodified-Since`):
//!   a 206 or 304 answers only the request that asked for it, so only requests
//!   that ask the same share it (a plain GET never gets another caller's 206 or
//!   304; identical revalidations still share one call).
//!   Requests with a body or `Cache-Control: no-cache` are never coalesced.
//! * The first request of a key is the **leader**: its upstream call (balancer,
//!   breaker, pool, CLIENT span under the leader's SERVER span, through
//!   [`proxy::forward`]) runs in a spawned task, so a leader whose client goes
//!   away still completes for its followers, and a follower that goes away
//!   cancels nothing. The task reads the response body (at most
//!   [`CoalesceLimits::max_body`], within the route timeout) and publishes
//!   status, headers and body; every **follower** answers with a copy, keeping
//!   its own `X-Request-Id` and `traceresponse` (added by the pipeline).
//! * A body over the limit is not shared: the leader streams it (the bytes read
//!   so far, then the rest), followers make their own upstream call. A body not
//!   complete within the route timeout: the leader streams it, followers get 504.
//!   Upstream errors (502, 503, 504) are shared like any answer.
//! * At most [`CoalesceLimits::max_waiters`] followers per key; beyond that a
//!   request goes upstream on its own.
//!
//! The flight map's lock is held only to look up, insert or remove a key.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use gateway_telemetry::SpanParent;
use gateway_transport::body::{ClientBody, RequestBody, ResponseBody};
use gateway_transport::response::{Fields, Response};
use gateway_transport::upstream_error::UpstreamError;
use gateway_transport::workers::Worker;
use http::header::{self, HeaderName};
use http::request::Parts;
use http::{HeaderMap, Method, StatusCode};
use http_body::Body;
use http_body_util::BodyExt as _;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::ProxyError;
use crate::metrics::CoalesceAlone;
use crate::policy::sanitize::{X_USER_ID, X_USER_ROLE};
use crate::upstream::UpstreamEntry;
use crate::upstream::attempt::Trace;
use crate::upstream::balancer::{self, Affinity};
use crate::upstream::proxy::{self, RouteView, upstream_request};
use crate::upstream::retry::RetryPolicy;

/// Default [`CoalesceLimits::max_waiters`].
pub const MAX_WAITERS: usize = 1024;
/// Default [`CoalesceLimits::max_body`]: 1 MiB.
pub const MAX_SHARED_BODY: usize = 1 << 20;

/// Request headers that are part of a request's identity for coalescing:
/// whatever the upstream's answer may depend on besides method, path and query.
static KEY_HEADERS: [&HeaderName; 14] = [
    // The authority the answer is built for.
    &header::HOST,
    // Who asks.
    &X_USER_ID,
    &X_USER_ROLE,
    &header::AUTHORIZATION,
    &header::COOKIE,
    // Which representation.
    &header::ACCEPT,
    &header::ACCEPT_ENCODING,
    &header::ACCEPT_LANGUAGE,
    // Partial and conditional answers (206, 304, 412).
    &header::RANGE,
    &header::IF_RANGE,
    &header::IF_NONE_MATCH,
    &header::IF_MODIFIED_SINCE,
    &header::IF_MATCH,
    &header::IF_UNMODIFIED_SINCE,
];

/// Bounds of one route's coalescing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceLimits {
    /// Followers per in-flight call; later identical requests go upstream on their own.
    pub max_waiters: usize,
    /// Largest response body shared, in bytes; a larger one is streamed to the leader only.
    pub max_body: usize,
}

impl Default for CoalesceLimits {
    fn default() -> Self {
        Self {
            max_waiters: MAX_WAITERS,
            max_body: MAX_SHARED_BODY,
        }
    }
}

/// What makes two requests of one route identical: method, path, query, the
/// URI's authority and the [`KEY_HEADERS`], each length-prefixed so no two
/// requests collide.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key(Bytes);

impl Key {
    /// The key of a bodiless request with normalised path `path`, or `None`
    /// when it must not be coalesced (not GET/HEAD, or `Cache-Control: no-cache`).
    pub fn of(parts: &Parts, path: &str) -> Option<Self> {
        if !matches!(parts.method, Method::GET | Method::HEAD) || no_cache(&parts.headers) {
            return None;
        }
        let query = parts.uri.query();
        let mut k = BytesMut::with_capacity(128 + path.len() + query.map_or(0, str::len));
        k.put_u8(u8::from(parts.method == Method::HEAD));
        field(&mut k, path.as_bytes());
        match query {
            Some(q) => {
                k.put_u8(1);
                field(&mut k, q.as_bytes());
            }
            None => k.put_u8(0),
        }
        // An HTTP/2 request's `:authority` (absolute-form for HTTP/1.1) is what
        // `proxy::upstream_request` turns into `Host` when there is none.
        match parts.uri.authority() {
            Some(a) => {
                k.put_u8(1);
                field(&mut k, a.as_str().as_bytes());
            }
            None => k.put_u8(0),
        }
        for name in KEY_HEADERS {
            let values = parts.headers.get_all(name);
            k.put_u32(values.iter().count() as u32);
            for v in values {
                field(&mut k, v.as_bytes());
            }
        }
        Some(Self(k.freeze()))
    }
}

impl From<Bytes> for Key {
    /// A key made elsewhere (the response cache's flights: its own key bytes).
    fn from(bytes: Bytes) -> Self {
        Self(bytes)
    }
}

fn field(k: &mut BytesMut, bytes: &[u8]) {
    k.put_u32(bytes.len() as u32);
    k.put_slice(bytes);
}

/// Whether a `Cache-Control` field carries the `no-cache` directive.
fn no_cache(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| {
            let name = d.split('=').next().unwrap_or_default().trim();
            name.eq_ignore_ascii_case("no-cache")
        })
}

/// A complete upstream answer, shared by every request of one flight.
#[derive(Debug)]
pub struct Snapshot {
    status: StatusCode,
    /// The leader's fields as they are (an upstream's kept as bytes stay so:
    /// a copy shares them).
    fields: Fields,
    body: Bytes,
}

impl Snapshot {
    /// A complete answer to share.
    pub fn new(status: StatusCode, fields: Fields, body: Bytes) -> Self {
        Self {
            status,
            fields,
            body,
        }
    }

    /// A copy of the answer for one caller.
    pub fn response(&self) -> Response<ResponseBody> {
        Response::from_parts(
            self.status,
            self.fields.clone(),
            ResponseBody::full(self.body.clone()),
        )
    }

    /// The answer a gateway error gives (problem documents are complete bodies).
    pub fn of_error(e: &ProxyError) -> Self {
        let (status, fields, body) = e.to_response().into_parts();
        let body = match body {
            ResponseBody::Full(b) => b.unwrap_or_default(),
            _ => Bytes::new(),
        };
        Self {
            status,
            fields,
            body,
        }
    }
}

/// What a flight's followers get.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The shared answer.
    Shared(Arc<Snapshot>),
    /// The answer could not be shared (body over the limit): go upstream alone.
    Alone,
}

#[derive(Debug)]
struct Flight {
    outcome: watch::Receiver<Option<Outcome>>,
    waiters: usize,
}

/// The in-flight upstream calls of one `coalesce` route.
#[derive(Debug)]
pub struct Coalescer {
    limits: CoalesceLimits,
    flights: Mutex<HashMap<Key, Flight>>,
}

/// A request's role in a flight.
#[derive(Debug)]
pub enum Join {
    /// First of its key: makes the upstream call and publishes the outcome.
    Leader(Lead),
    /// Waits for the leader's outcome.
    Follower(watch::Receiver<Option<Outcome>>),
    /// The flight has its maximum of followers: go upstream alone.
    Full,
}

/// The leader's side of a flight. Publishing ([`finish`](Self::finish)) or
/// dropping it (panic, cancellation) removes the flight, so the next request
/// of the key starts a new one; followers of a dropped lead go upstream alone.
#[derive(Debug)]
pub struct Lead {
    coalescer: Arc<Coalescer>,
    key: Key,
    tx: watch::Sender<Option<Outcome>>,
}

impl Lead {
    /// Removes the flight and hands `outcome` to its followers.
    pub fn finish(self, outcome: Outcome) {
        self.tx.send_replace(Some(outcome));
        // `Drop` removes the flight: a request arriving from now on starts a new one.
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        let mut flights = self.coalescer.flights.lock();
        flights.remove(&self.key);
    }
}

impl Coalescer {
    /// An empty coalescer with these bounds.
    pub fn new(limits: CoalesceLimits) -> Self {
        Self {
            limits,
            flights: Mutex::new(HashMap::new()),
        }
    }

    /// Its bounds.
    pub fn limits(&self) -> CoalesceLimits {
        self.limits
    }

    /// Calls in flight now (tests and diagnostics).
    pub fn in_flight(&self) -> usize {
        self.flights.lock().len()
    }

    /// Joins the flight of `key`, starting it if there is none.
    pub fn join(self: &Arc<Self>, key: Key) -> Join {
        let mut flights = self.flights.lock();
        if let Some(flight) = flights.get_mut(&key) {
            if flight.waiters >= self.limits.max_waiters {
                return Join::Full;
            }
            flight.waiters += 1;
            return Join::Follower(flight.outcome.clone());
        }
        let (tx, rx) = watch::channel(None);
        flights.insert(
            key.clone(),
            Flight {
                outcome: rx,
                waiters: 0,
            },
        );
        Join::Leader(Lead {
            coalescer: Arc::clone(self),
            key,
            tx,
        })
    }
}

/// Waits for a flight's outcome; `None` if its leader ended without one.
pub async fn wait(mut rx: watch::Receiver<Option<Outcome>>) -> Option<Outcome> {
    rx.wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|o| o.clone())
}

/// What the coalescing stage did with a request.
pub enum Coalesced<'s, 'a> {
    /// Answered, as a leader or a follower.
    Answered(Result<Response<ResponseBody>, ProxyError>),
    /// Not coalesced: proxy it as usual (everything handed back).
    Alone(Parts, ClientBody, Trace<'s, 'a>),
}

/// The coalescing stage of the pipeline, for a request of `route` (whose
/// coalescer is `coalescer` and upstream `upstream`) after authentication and
/// rate limiting. `affinity` is the request's balancing key; `worker` the
/// proxy worker serving it.
// The request's pieces travel separately because an uncoalesced request gets them back untouched.
#[allow(clippy::too_many_arguments)]
pub async fn stage<'s, 'a>(
    coalescer: &Arc<Coalescer>,
    route: RouteView<'_>,
    upstream: &'a Arc<UpstreamEntry>,
    parts: Parts,
    body: ClientBody,
    path: &str,
    affinity: Affinity,
    trace: Trace<'s, 'a>,
    worker: Worker,
) -> Coalesced<'s, 'a> {
    let key = if body.is_end_stream() {
        Key::of(&parts, path)
    } else {
        None
    };
    let Some(key) = key else {
        return Coalesced::Alone(parts, body, trace);
    };
    match coalescer.join(key) {
        Join::Full => {
            route.metrics.coalesce_alone(CoalesceAlone::WaitersFull);
            Coalesced::Alone(parts, body, trace)
        }
        Join::Follower(rx) => match wait(rx).await {
            Some(Outcome::Shared(snapshot)) => {
                route.metrics.coalesced.fetch_add(1, Ordering::Relaxed);
                Coalesced::Answered(Ok(snapshot.response()))
            }
            Some(Outcome::Alone) => {
                route.metrics.coalesce_alone(CoalesceAlone::BodyTooLarge);
                Coalesced::Alone(parts, body, trace)
            }
            None => Coalesced::Alone(parts, body, trace),
        },
        Join::Leader(lead) => {
            let limits = coalescer.limits;
            let call = CallOptions {
                limits,
                affinity,
                worker,
            };
            Coalesced::Answered(lead_call(lead, route, upstream, parts, path, trace, call).await)
        }
    }
}

/// How the leader's call is made.
struct CallOptions {
    limits: CoalesceLimits,
    /// The balancing key (the same for every coalesced request: the identity is part of the coalescing key).
    affinity: Affinity,
    /// The leader's proxy worker (the spawned call runs on it too).
    worker: Worker,
}

/// The leader: the upstream call in a task of its own, then the leader's own answer.
async fn lead_call<'a>(
    lead: Lead,
    route: RouteView<'_>,
    upstream: &'a Arc<UpstreamEntry>,
    parts: Parts,
    path: &str,
    trace: Trace<'_, 'a>,
    CallOptions {
        limits,
        affinity,
        worker,
    }: CallOptions,
) -> Result<Response<ResponseBody>, ProxyError> {
    let req = match upstream_request(parts, &route, path, RequestBody::empty()) {
        Ok(req) => req,
        Err(e) => {
            lead.finish(Outcome::Shared(Arc::new(Snapshot::of_error(&e))));
            return Err(e);
        }
    };
    let call = Call {
        upstream: Arc::clone(upstream),
        timeout: route.timeout,
        retry: route.retry.cloned(),
        span: trace.span.parent(),
        tracestate: trace.tracestate.cloned(),
        max_body: limits.max_body,
        affinity,
        worker,
    };
    let task = tokio::spawn(async move {
        let (mine, theirs, served) = call.run(req).await;
        lead.finish(theirs);
        (mine, served)
    });
    let (result, served) = match task.await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only when the runtime shuts down.
        Err(_) => return Err(ProxyError::NotReady),
    };
    *trace.served_by = served
        .and_then(|i| upstream.instances.get(i))
        .map(|i| &*i.id);
    result
}

/// The upstream call of a flight's leader (a coalesced call, or a cached
/// route's fetch): balanced and forwarded like any request, in the task that
/// owns it.
pub(crate) struct LeaderCall<'a> {
    pub upstream: &'a Arc<UpstreamEntry>,
    pub affinity: Affinity,
    pub timeout: Duration,
    pub retry: Option<&'a RetryPolicy>,
    pub span: &'a SpanParent,
    pub tracestate: Option<&'a http::HeaderValue>,
    pub worker: Worker,
}

impl LeaderCall<'_> {
    /// The answer (or error), and the index of the instance that answered.
    pub(crate) async fn forward(
        self,
        req: Box<http::Request<RequestBody>>,
    ) -> (Result<Response<ResponseBody>, ProxyError>, Option<usize>) {
        let mut served_by = None;
        let result = match balancer::pick(self.upstream, self.affinity, None) {
            None => Err(ProxyError::NoInstance),
            Some(pick) => {
                let trace = Trace {
                    span: self.span,
                    tracestate: self.tracestate,
                    served_by: &mut served_by,
                };
                proxy::forward(
                    self.upstream,
                    pick,
                    req,
                    self.timeout,
                    self.retry,
                    trace,
                    self.worker,
                )
                .await
            }
        };
        let served =
            served_by.and_then(|id| self.upstream.instances.iter().position(|i| *i.id == *id));
        (result, served)
    }
}

/// An upstream call owned by a spawned task.
struct Call {
    upstream: Arc<UpstreamEntry>,
    timeout: Duration,
    /// The route's retry policy.
    retry: Option<RetryPolicy>,
    span: SpanParent,
    tracestate: Option<http::HeaderValue>,
    max_body: usize,
    /// The balancing key of the request (identical for every coalesced request:
    /// the identity is part of the coalescing key).
    affinity: Affinity,
    /// The proxy worker the call runs on.
    worker: Worker,
}

impl Call {
    /// Balances, forwards and reads the body. Returns the leader's answer, the
    /// followers' outcome, and the index of the instance that answered.
    async fn run(
        self,
        req: Box<http::Request<RequestBody>>,
    ) -> (
        Result<Response<ResponseBody>, ProxyError>,
        Outcome,
        Option<usize>,
    ) {
        let deadline = Instant::now() + self.timeout;
        let (result, served) = LeaderCall {
            upstream: &self.upstream,
            affinity: self.affinity,
            timeout: self.timeout,
            retry: self.retry.as_ref(),
            span: &self.span,
            tracestate: self.tracestate.as_ref(),
            worker: self.worker,
        }
        .forward(req)
        .await;
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                let theirs = Outcome::Shared(Arc::new(Snapshot::of_error(&e)));
                return (Err(e), theirs, served);
            }
        };
        let (status, fields, body) = resp.into_parts();
        if body.size_hint().lower() > self.max_body as u64 {
            let mine = Response::from_parts(status, fields, body);
            return (Ok(mine), Outcome::Alone, served);
        }
        let (mine, theirs) = match read(body, self.max_body, deadline).await {
            Read::Complete(bytes) => {
                let snapshot = Arc::new(Snapshot {
                    status,
                    fields,
                    body: bytes,
                });
                (Ok(snapshot.response()), Outcome::Shared(snapshot))
            }
            Read::Stopped {
                read,
                rest,
                timed_out,
            } => {
                let read = (!read.is_empty()).then_some(read);
                let mine = Response::from_parts(
                    status,
                    fields,
                    ResponseBody::Resumed(read, Box::new(rest)),
                );
                let theirs = if timed_out {
                    let e = ProxyError::Upstream(UpstreamError::timeout(self.timeout));
                    Outcome::Shared(Arc::new(Snapshot::of_error(&e)))
                } else {
                    Outcome::Alone
                };
                (Ok(mine), theirs)
            }
            Read::Failed(e) => {
                let e = ProxyError::Upstream(e);
                let theirs = Outcome::Shared(Arc::new(Snapshot::of_error(&e)));
                (Err(e), theirs)
            }
        };
        (mine, theirs, served)
    }
}

/// How reading a body to share it ended.
#[derive(Debug)]
pub enum Read<B, E> {
    /// The whole body (trailers are not kept).
    Complete(Bytes),
    /// Past the size limit or the deadline: what was read, and the rest.
    Stopped {
        /// The bytes read so far.
        read: Bytes,
        /// The unread rest.
        rest: B,
        /// True when the deadline stopped it, false for the size limit.
        timed_out: bool,
    },
    /// The body failed.
    Failed(E),
}

/// Reads `body` whole if it is at most `max` bytes and ends before `deadline`.
pub async fn read<B>(mut body: B, max: usize, deadline: Instant) -> Read<B, B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    let hint = usize::try_from(body.size_hint().lower()).unwrap_or(max);
    let mut buf = BytesMut::with_capacity(hint.min(max));
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_elapsed) => {
                return Read::Stopped {
                    read: buf.freeze(),
                    rest: body,
                    timed_out: true,
                };
            }
            Ok(None) => return Read::Complete(buf.freeze()),
            Ok(Some(Err(e))) => return Read::Failed(e),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buf.put_slice(&data);
                    if buf.len() > max {
                        return Read::Stopped {
                            read: buf.freeze(),
                            rest: body,
                            timed_out: false,
                        };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
