//! Traffic mirroring (docs/data-plane.md, "Traffic mirroring"): a route's
//! `mirror` sends a sampled copy of its requests to a shadow upstream, fire
//! and forget.
//!
//! The copy is made from the request as it is forwarded (after
//! authentication and the route's request headers, so with the identity
//! headers), without any credential ([`NEVER_COPIED`]) or header of the
//! route's `deny_headers`, plus `X-Gateway-Mirror: 1`, signed with the shadow
//! upstream's own secret (a v3 signature whose audience is the shadow and
//! whose mirror field is 1; a copy with a body is signed once that body has
//! been read, over its digest). The body is copied only with `include_body`;
//! otherwise the copy has none. It runs in a task of its own on the request's worker: its answer is
//! read and dropped, its latency never reaches the caller, and its outcome
//! only touches the shadow upstream's breakers and counters, never the
//! primary's. A body of at most [`MAX_MIRROR_BODY_BYTES`] is copied with a
//! [`Tee`] as the primary's exchange reads it (the primary is never held
//! back); the copy leaves once that body has ended. A larger body is not
//! mirrored. At most `--mirror-max-in-flight` copies are in flight per
//! replica: past it a copy is dropped (shed), never queued.
//!
//! A route without `mirror` pays one `Option` check.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gateway_telemetry::SpanParent;
use gateway_transport::body::{RequestBody, ResponseBody};
use gateway_transport::tee::{Tee, TeeReceiver};
use gateway_transport::workers::Worker;
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http_body_util::BodyExt as _;
use rand::Rng as _;
use tokio::time::Instant;

use crate::metrics::{Metrics, MirrorOutcome, RouteMetrics};
use crate::policy::api_key::X_API_KEY;
use crate::policy::signature::SignedBody;
use crate::upstream::UpstreamEntry;
use crate::upstream::attempt::Trace;
use crate::upstream::balancer::{self, Affinity};
use crate::upstream::proxy::{self, RouteView, upstream_request};

pub use gateway_proto::validate::MAX_MIRROR_BODY_BYTES;

/// The marker every copy carries (a client's own is removed when sanitising).
pub use crate::policy::sanitize::X_GATEWAY_MIRROR;

/// Credentials a copy never carries, whatever the route says: the shadow is
/// a test bed, and a user's token, cookie or key must not reach it.
pub static NEVER_COPIED: [&HeaderName; 4] = [
    &header::AUTHORIZATION,
    &header::COOKIE,
    &X_API_KEY,
    &header::PROXY_AUTHORIZATION,
];

/// A route's `mirror`, compiled.
#[derive(Debug)]
pub struct Mirror {
    /// The shadow upstream.
    pub upstream: Arc<UpstreamEntry>,
    /// Share of requests copied, 1 to 100.
    pub percent: u32,
    /// Whether the body is copied (`include_body`).
    pub include_body: bool,
    /// More header names never copied (`deny_headers`).
    pub deny: Box<[HeaderName]>,
}

impl Mirror {
    /// Whether this request is copied (sampled per request).
    pub fn sampled(&self) -> bool {
        self.percent >= 100 || rand::rng().random_range(0..100) < self.percent
    }
}

/// Everything a copy needs of the request and its route.
pub struct MirrorRequest<'r> {
    /// The route's mirror.
    pub mirror: &'r Mirror,
    /// The route (prefix, rewrite, timeout, counters).
    pub route: RouteView<'r>,
    /// The request head as forwarded.
    pub parts: &'r Parts,
    /// The normalised path.
    pub path: &'r str,
    /// The caller's SERVER span, parent of the copy's CLIENT span.
    pub span: SpanParent,
    /// Counters, including the replica's copies in flight.
    pub metrics: &'r Arc<Metrics>,
    /// Most copies in flight in the replica.
    pub max_in_flight: u64,
    /// The worker the copy runs on.
    pub worker: Worker,
}

/// Starts a copy of a sampled request whose body will be `body_size` (`None`:
/// unknown yet). Returns the tee to attach to the primary's body when the
/// copy waits for it; `None` when the copy left already (no body), or was
/// not made (shed, body too large, a head that cannot be copied).
pub fn start(copy: MirrorRequest<'_>, bodiless: bool, body_size: Option<u64>) -> Option<Tee> {
    let metrics = &copy.route.metrics.mirror;
    let with_body = copy.mirror.include_body && !bodiless;
    if with_body && body_size.is_some_and(|n| n > MAX_MIRROR_BODY_BYTES) {
        metrics.record(MirrorOutcome::BodyTooLarge);
        return None;
    }
    let Some(slot) = Slot::take(copy.metrics, copy.max_in_flight) else {
        metrics.record(MirrorOutcome::Shed);
        return None;
    };
    let mut head = http::Request::builder()
        .method(copy.parts.method.clone())
        .uri(copy.parts.uri.clone())
        .version(copy.parts.version)
        .body(())
        .ok()?
        .into_parts()
        .0;
    head.headers = copy.parts.headers.clone();
    for name in NEVER_COPIED.into_iter().chain(copy.mirror.deny.iter()) {
        head.headers.remove(name);
    }
    if !with_body {
        // The transport frames the empty body itself.
        head.headers.remove(header::CONTENT_LENGTH);
        head.headers.remove(header::TRANSFER_ENCODING);
    }
    head.headers
        .insert(X_GATEWAY_MIRROR.clone(), HeaderValue::from_static("1"));
    let view = RouteView {
        // A copy with a body is signed once the body is read, over its digest ([`Task::run`]).
        signer: copy.mirror.upstream.signer.as_ref().filter(|_| !with_body),
        retry: None,
        ..copy.route
    };
    let Ok(req) = upstream_request(head, &view, copy.path, RequestBody::empty()) else {
        metrics.record(MirrorOutcome::Failed);
        return None;
    };
    let (tee, body) = if !with_body {
        (None, None)
    } else {
        let (tee, rx) = Tee::new(MAX_MIRROR_BODY_BYTES as usize);
        (Some(tee), Some(rx))
    };
    let task = Task {
        upstream: Arc::clone(&copy.mirror.upstream),
        timeout: copy.route.timeout,
        metrics: Arc::clone(copy.route.metrics),
        span: copy.span,
        worker: copy.worker,
        _slot: slot,
    };
    tokio::spawn(task.run(req, body));
    tee
}

/// One copy in flight, counted in the replica's gauge until it drops.
struct Slot(Arc<Metrics>);

impl Slot {
    fn take(metrics: &Arc<Metrics>, max: u64) -> Option<Self> {
        let gauge = &metrics.mirror_in_flight;
        if gauge.fetch_add(1, Ordering::Relaxed) >= max {
            gauge.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Self(Arc::clone(metrics)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.mirror_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A copy, owned by its task.
struct Task {
    upstream: Arc<UpstreamEntry>,
    timeout: Duration,
    metrics: Arc<RouteMetrics>,
    span: SpanParent,
    worker: Worker,
    _slot: Slot,
}

impl Task {
    async fn run(self, mut req: Box<http::Request<RequestBody>>, body: Option<TeeReceiver>) {
        let deadline = Instant::now() + self.timeout;
        let outcome = match body {
            None => self.send(req, deadline).await,
            Some(rx) => match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(Ok(bytes))) => {
                    if let Some(signer) = &self.upstream.signer {
                        signer.sign_request(&mut req, SignedBody::Whole(&bytes));
                    }
                    *req.body_mut() = RequestBody::buffered(bytes);
                    self.send(req, deadline).await
                }
                Ok(Ok(Err(_too_large))) => MirrorOutcome::BodyTooLarge,
                // The primary's body failed or was dropped before its end, or never ended in time.
                Ok(Err(_)) | Err(_) => MirrorOutcome::Failed,
            },
        };
        self.metrics.mirror.record(outcome);
    }

    /// Sends the copy, reads its answer to the end and drops it.
    async fn send(&self, req: Box<http::Request<RequestBody>>, deadline: Instant) -> MirrorOutcome {
        let Some(pick) = balancer::pick(&self.upstream, Affinity::NONE, None) else {
            return MirrorOutcome::Failed;
        };
        let mut served_by = None;
        let trace = Trace {
            span: &self.span,
            tracestate: None,
            served_by: &mut served_by,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = proxy::forward(&self.upstream, pick, req, left, None, trace, self.worker);
        let Ok(resp) = answer.await else {
            return MirrorOutcome::Failed;
        };
        let status = resp.status();
        // Read to the end (frame by frame, nothing kept), so an HTTP/1.1 connection goes back to its pool.
        let mut body: ResponseBody = resp.into_body();
        let drain = async { while let Some(Ok(_)) = body.frame().await {} };
        let _ = tokio::time::timeout_at(deadline, drain).await;
        if status.is_server_error() {
            MirrorOutcome::Failed
        } else {
            MirrorOutcome::Sent
        }
    }
}
