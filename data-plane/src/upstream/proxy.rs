//! Forwarding to an upstream instance (docs/data-plane.md, "Proxy and retries").
//!
//! Bodies stream both ways. The route timeout bounds the time to the response
//! head across every attempt (504 when it passes).
//!
//! Without a route `retry` (the default once-rules), at most one retry, on
//! another instance when there is one, not charged to any budget:
//!
//! * the request never reached the first instance (connect refused or timed
//!   out, or a fresh connection died before the request was written): retried
//!   whatever its method, since the body is still untouched;
//! * the connection failed after the request was written but before a response
//!   head arrived, and the request is a bodiless GET/HEAD/OPTIONS: replayed,
//!   because repeating it cannot change anything (this is what keeps clients
//!   error-free when an instance dies under load).
//!
//! With a route `retry` ([`RetryPolicy`]) up to `attempts` retries, each on an
//! instance this request has not tried yet, for the listed failures:
//! `CONNECT_FAILURE` (either case above), `STATUS_5XX` (500, 502, 503, 504:
//! the answer is dropped and the last attempt's answer is returned when no
//! retry follows) and `TIMEOUT` (`per_try_timeout_ms` passed). A request that
//! reached an instance is sent again only when it is idempotent (GET, HEAD,
//! OPTIONS, PUT, DELETE) and its body is empty or declared at most
//! [`MAX_REPLAY_BODY_BYTES`] (read into memory before the first attempt);
//! one that never reached an instance is resent whatever its method. Each such
//! retry is charged to the upstream's [`RetryBudget`](crate::upstream::retry::RetryBudget)
//! and not made when it is spent. The once-rule for a request that never
//! reached an instance still holds when the policy does not list
//! `CONNECT_FAILURE`.
//!
//! Breaker outcomes: connect failure, timeout, broken exchange and 5xx count as
//! failures; anything else is a success; a request that failed because of the
//! client (body too large, client went away) reports nothing.
//!
//! Tracing: every attempt is a CLIENT span under the request's SERVER span;
//! its context goes upstream as `traceparent` (replacing whatever the client
//! sent) with the caller's validated `tracestate`.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use gateway_transport::body::{RequestBody, RequestBodyError, ResponseBody, UpstreamBody};
use gateway_transport::deadline;
use gateway_transport::h1::H1Body;
use gateway_transport::h2_client::H2Stream;
use gateway_transport::pool::{Checkin, Protocol};
use gateway_transport::response::{Fields, Response};
use gateway_transport::upstream_error::{SendError, Side, UpstreamError};
use gateway_transport::workers::Worker;
use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{HeaderMap, Method, Request, Version};
use http_body::Body as _;
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::error::ProxyError;
use crate::metrics::RouteMetrics;
use crate::policy::router::rewrite_path;
use crate::policy::sanitize::remove_hop_by_hop_fields;
use crate::policy::signature::{SignedBody, Signer, X_GATEWAY_SIGNATURE, unix_now};
use crate::upstream::UpstreamEntry;
use crate::upstream::attempt::{Attempt, Trace};
use crate::upstream::balancer::{self, Pick};
use crate::upstream::retry::{
    Failed, MAX_REPLAY_BODY_BYTES, RetryPolicy, Verdict, default_rule, is_idempotent,
    is_retryable_status,
};

/// What forwarding needs of the route a request matched (the compiled route
/// itself lives in [`crate::config`], above this layer).
#[derive(Debug, Clone, Copy)]
pub struct RouteView<'r> {
    /// The matched prefix.
    pub prefix: &'r str,
    /// Replacement for the prefix, if any.
    pub rewrite: Option<&'r str>,
    /// Signs the identity of the forwarded request (its upstream's `identity_signing_secret`).
    pub signer: Option<&'r Signer>,
    /// Time allowed until the upstream's response head.
    pub timeout: Duration,
    /// Retries on other instances (`None`: the default once-rules).
    pub retry: Option<&'r RetryPolicy>,
    /// WebSocket upgrades allowed, with this tunnel idle timeout (`None`: refused).
    pub websocket: Option<Duration>,
    /// The route's counters.
    pub metrics: &'r Arc<RouteMetrics>,
}

/// Builds the request sent upstream: origin-form URI with the normalised (and
/// rewritten) path and the original query, HTTP/1.1, and a `Host` header (an
/// HTTP/2 client sends `:authority` instead).
pub fn upstream_request(
    mut parts: http::request::Parts,
    route: &RouteView<'_>,
    path: &str,
    body: RequestBody,
) -> Result<Box<Request<RequestBody>>, ProxyError> {
    let query = parts.uri.query();
    let unchanged =
        route.rewrite.is_none() && parts.uri.scheme().is_none() && parts.uri.path() == path;
    if !unchanged {
        let rewritten;
        let path = match &route.rewrite {
            Some(rw) => {
                rewritten = rewrite_path(path, route.prefix, rw);
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
    // Signed identity: last, over the target (path and query), Host, identity and mirror headers
    // exactly as sent. A request without a body has its (empty) body covered; any other body
    // streams and is not ([`Replay::buffered`] signs again over one it reads to retry).
    if let Some(signer) = route.signer {
        let covered = if body.is_end_stream() {
            SignedBody::Whole(b"")
        } else {
            SignedBody::Streamed
        };
        signer.sign(
            &mut parts.headers,
            parts.method.as_str(),
            parts.uri.path_and_query().map_or("/", PathAndQuery::as_str),
            covered,
            unix_now(),
        );
    }
    parts.version = Version::HTTP_11;
    // Boxed once here: the exchange passes the pointer down to the connection
    // and, when an attempt fails, back for the next one.
    Ok(Box::new(Request::from_parts(parts, body)))
}

/// The answer to a client's body that could not be read.
fn client_body_error(e: RequestBodyError) -> ProxyError {
    match e {
        RequestBodyError::TooLarge { limit } => ProxyError::BodyTooLarge { limit },
        RequestBodyError::Client(e) => ProxyError::ClientBody(e),
        RequestBodyError::Stalled(d) => ProxyError::BodyTimeout(d),
    }
}

/// What is needed to send a request again: its head, and its body when it
/// had one (buffered by a retrying route), and the signer that signed it.
struct Replay<'s> {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Option<Bytes>,
    signer: Option<&'s Signer>,
}

impl<'s> Replay<'s> {
    fn new(req: &Request<RequestBody>, body: Option<Bytes>, signer: Option<&'s Signer>) -> Self {
        Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers: req.headers().clone(),
            body,
            // Only a signed request is signed again (with the upstream's signer, which signed it).
            signer: signer.filter(|_| req.headers().contains_key(&X_GATEWAY_SIGNATURE)),
        }
    }

    /// A retrying route's rule: an idempotent request whose body is empty or
    /// declared at most [`MAX_REPLAY_BODY_BYTES`]; that body is read now so it
    /// can be sent again. Other requests are sent as they are, with no replay.
    ///
    /// A signed request whose body is read here is signed again over that
    /// body's digest (it no longer streams).
    async fn buffered(
        mut req: Box<Request<RequestBody>>,
        signer: Option<&'s Signer>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(Box<Request<RequestBody>>, Option<Self>), ProxyError> {
        if !is_idempotent(req.method()) {
            return Ok((req, None));
        }
        if req.body().is_end_stream() {
            let replay = Self::new(&req, None, signer);
            return Ok((req, Some(replay)));
        }
        let small = req
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= MAX_REPLAY_BODY_BYTES);
        if !small {
            return Ok((req, None));
        }
        let body = std::mem::replace(req.body_mut(), RequestBody::empty());
        // Read within the body-read timeout (each wait for the client's next
        // bytes) and the route deadline (the whole read): a trickled body
        // gets 408, not an attempt with the rest of the deadline.
        let bytes = match tokio::time::timeout_at(deadline, body.read_all()).await {
            Ok(read) => read.map_err(client_body_error)?,
            Err(_) => return Err(ProxyError::BodyTimeout(timeout)),
        };
        *req.body_mut() = RequestBody::buffered(bytes.clone());
        let replay = Self::new(&req, Some(bytes), signer);
        if let Some(signer) = replay.signer {
            signer.sign_request(
                &mut req,
                SignedBody::Whole(replay.body.as_deref().unwrap_or_default()),
            );
        }
        Ok((req, Some(replay)))
    }

    /// The request again, signed afresh when it was signed: a new id (the
    /// instance that saw the last one may share its replay check with the
    /// next) over the same body.
    fn request(&self) -> Box<Request<RequestBody>> {
        let body = self
            .body
            .clone()
            .map_or_else(RequestBody::empty, RequestBody::buffered);
        let mut r = Box::new(Request::new(body));
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.headers_mut() = self.headers.clone();
        if let Some(signer) = self.signer {
            signer.sign_request(
                &mut r,
                SignedBody::Whole(self.body.as_deref().unwrap_or_default()),
            );
        }
        r
    }
}

/// An instance's answer, its body not yet wrapped: read from an HTTP/1.1
/// connection that goes back to the pool at its end, or from an HTTP/2
/// stream released at its end.
enum Answer {
    H1(Response<H1Body>, Checkin),
    H2(http::Response<Incoming>, H2Stream),
}

/// What a failed attempt leaves for the next one.
enum Outcome {
    /// The attempt failed; the request came back when it can be sent again as it is.
    Error(SendError),
    /// The instance answered with a retryable 5xx; returned if no retry follows.
    Answered(Response<ResponseBody>),
}

impl Outcome {
    /// The outcome when no retry follows: a 5xx answer is returned as it is.
    fn stands(self) -> Result<Response<ResponseBody>, ProxyError> {
        match self {
            Self::Answered(resp) => Ok(resp),
            Self::Error(SendError { error, .. }) => Err(ProxyError::Upstream(error)),
        }
    }
}

/// Sends `req` to the instance in `first`, retrying per the module rules
/// (`retry`: the route's policy; `None`: the default once-rules). Returns the
/// upstream's response (hop-by-hop headers removed, body streaming). Every
/// attempt is an [`Attempt`].
pub async fn forward<'a>(
    upstream: &'a UpstreamEntry,
    first: Pick<'a>,
    req: Box<Request<RequestBody>>,
    timeout: Duration,
    retry: Option<&RetryPolicy>,
    mut trace: Trace<'_, 'a>,
    worker: Worker,
) -> Result<Response<ResponseBody>, ProxyError> {
    // One clock reading for the deadline, the retry budget and the pool's idle check.
    let started = Instant::now();
    let deadline = started + timeout;
    upstream.retry.record_request(started, worker);
    // The default rules replay only a bodiless request, which the pool hands
    // back when its exchange fails ([`SendError::request`]): no copy up front.
    let (mut req, replay) = match retry {
        None => (req, None),
        Some(_) => Replay::buffered(req, upstream.signer.as_ref(), deadline, timeout).await?,
    };
    let mut pick = first;
    // Instances tried so far (a retrying route never goes back to one).
    let mut tried: Vec<usize> = Vec::new();
    let mut retries = 0u32;
    loop {
        let (index, key) = (pick.index, pick.key);
        let attempt = Attempt::start(upstream, pick, &mut req, &mut trace, retries);
        let instance = attempt.instance();
        // The first attempt without a retry policy follows `started` with no
        // `.await` between; any other reads the clock again.
        let now = if retries == 0 && retry.is_none() {
            started
        } else {
            Instant::now()
        };
        let per_try = retry.and_then(|p| p.per_try_timeout);
        let attempt_deadline = per_try.map_or(deadline, |t| deadline.min(now + t));
        // Pinned where it is made, so the timeout wraps a pointer instead of taking
        // (copying) the whole exchange future. `None`: the deadline passed.
        let sent = match instance.pool.protocol() {
            Protocol::Http1 => {
                let send = std::pin::pin!(instance.pool.send(req, now, worker));
                deadline::within(attempt_deadline, send, worker)
                    .await
                    .map(|r| r.map(|(resp, checkin)| Answer::H1(resp, checkin)))
            }
            Protocol::Http2 => {
                let send = std::pin::pin!(instance.pool.send_h2(req, now, worker));
                deadline::within(attempt_deadline, send, worker)
                    .await
                    .map(|r| r.map(|(resp, stream)| Answer::H2(resp, stream)))
            }
        };
        // Only a retrying route needs the list (no allocation otherwise).
        if retry.is_some() {
            tried.push(index);
        }
        let outcome = match sent {
            None => {
                let whole = attempt_deadline >= deadline;
                let error = UpstreamError::timeout(if whole {
                    timeout
                } else {
                    per_try.unwrap_or(timeout)
                });
                attempt.failed(&error);
                if whole {
                    return Err(ProxyError::Upstream(error));
                }
                Outcome::Error(SendError {
                    error,
                    request: None,
                })
            }
            Some(Ok(answer)) => {
                let (status, mut fields, body) = match answer {
                    Answer::H1(resp, checkin) => {
                        let in_flight = attempt.answered(resp.status());
                        let (status, fields, body) = resp.into_parts();
                        (status, fields, UpstreamBody::new(body, checkin, in_flight))
                    }
                    Answer::H2(resp, stream) => {
                        let (head, body) = resp.into_parts();
                        let in_flight = attempt.answered(head.status);
                        let body = UpstreamBody::h2(body, stream, in_flight);
                        (head.status, Fields::from(head.headers), body)
                    }
                };
                remove_hop_by_hop_fields(&mut fields);
                let resp = Response::from_parts(status, fields, ResponseBody::Upstream(body));
                if !is_retryable_status(status) || retry.is_none() {
                    return Ok(resp);
                }
                Outcome::Answered(resp)
            }
            Some(Err(mut failed)) => {
                attempt.failed(&failed.error);
                // The client's body failed, not the instance: answered for the client.
                if failed.error.side() == Side::Client {
                    return Err(match failed.error.into_client_body() {
                        Ok(e) => client_body_error(e),
                        Err(e) => ProxyError::Upstream(e),
                    });
                }
                // A request whose body was read cannot be sent again as it is.
                if failed
                    .request
                    .as_ref()
                    .is_some_and(|r| r.body().was_polled())
                {
                    failed.request = None;
                }
                Outcome::Error(failed)
            }
        };
        // The retry rules decide from the failure alone; then an instance is
        // picked and, for a budgeted retry, the budget asked (only retries
        // actually sent are charged).
        let failed = match &outcome {
            Outcome::Answered(_) => Failed::status_5xx(),
            Outcome::Error(f) => Failed::of(&f.error, f.request.is_some()),
        };
        let verdict = match (retry, &outcome) {
            (Some(policy), _) => policy.decide(&failed, replay.is_some(), retries),
            (
                None,
                Outcome::Error(SendError {
                    request: Some(r), ..
                }),
            ) => default_rule(&failed, r.method(), retries),
            (None, _) => Verdict::Stands,
        };
        let next = match verdict {
            Verdict::Stands => None,
            Verdict::Elsewhere { budgeted } => match retry {
                Some(_) => balancer::pick_excluding(upstream, key, &tried),
                None => balancer::pick(upstream, key, Some(index)),
            }
            .filter(|_| !budgeted || upstream.retry.try_retry(failed.reason, worker)),
            Verdict::ElsewhereOrSame => balancer::pick(upstream, key, Some(index))
                .or_else(|| balancer::pick(upstream, key, None)),
        };
        let Some(next) = next else {
            return outcome.stands();
        };
        // What is sent again: the request itself when it came back (never
        // reached an instance, or the default rules' bodiless replay), else
        // the retrying route's copy.
        req = match (outcome, &replay) {
            (
                Outcome::Error(SendError {
                    request: Some(back),
                    ..
                }),
                _,
            ) if failed.not_reached || retry.is_none() => back,
            (_, Some(r)) => r.request(),
            // `decide` retries a reached request only when it is replayable.
            (outcome, None) => return outcome.stands(),
        };
        pick = next;
        retries += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RouteMetrics;
    use std::time::Duration;

    static METRICS: std::sync::LazyLock<Arc<RouteMetrics>> = std::sync::LazyLock::new(Arc::default);

    fn route<'r>(prefix: &'r str, rewrite: Option<&'r str>) -> RouteView<'r> {
        RouteView {
            prefix,
            rewrite,
            signer: None,
            timeout: Duration::from_secs(15),
            retry: None,
            websocket: None,
            metrics: &METRICS,
        }
    }

    fn build(
        uri: &str,
        host: Option<&str>,
        route: &RouteView<'_>,
        path: &str,
    ) -> Box<Request<RequestBody>> {
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
    fn upstreams_with_a_secret_get_the_rewritten_path_and_identity_signed() {
        use crate::policy::signature::{EMPTY_BODY_SHA256, Signer, X_GATEWAY_SIGNATURE};
        let secret = "s".repeat(32);
        let signer = Signer::new(&secret, "users").unwrap();
        let r = RouteView {
            signer: Some(&signer),
            ..route("/api/users", Some("/users"))
        };
        let (mut parts, ()) = Request::post("/api/users/7?x=1")
            .header("host", "api.example")
            .header("x-user-id", "alice")
            .header("x-user-role", "admin")
            .body(())
            .unwrap()
            .into_parts();
        parts
            .headers
            .insert(&X_GATEWAY_SIGNATURE, HeaderValue::from_static("forged"));
        let before = crate::policy::signature::unix_now();
        let req = upstream_request(parts, &r, "/api/users/7", RequestBody::empty()).unwrap();
        let value = req.headers()[&X_GATEWAY_SIGNATURE].to_str().unwrap();
        let (t, id) = value
            .strip_prefix("t=")
            .and_then(|v| v.split_once(",id="))
            .and_then(|(t, rest)| Some((t.parse::<u64>().ok()?, rest.split_once(",v3=")?.0)))
            .unwrap();
        assert!(t >= before && t <= crate::policy::signature::unix_now());
        // Signed over the target as forwarded (rewritten, with the query), Host, the identity,
        // the upstream's name and the (empty) body.
        let want =
            Signer::new(&secret, "users")
                .unwrap()
                .value(&crate::policy::signature::Signed {
                    t,
                    id,
                    mirror: false,
                    method: "POST",
                    host: b"api.example",
                    target: "/users/7?x=1",
                    user_id: b"alice",
                    user_role: b"admin",
                    api_key_name: b"",
                    body_sha256: EMPTY_BODY_SHA256.as_bytes(),
                });
        assert_eq!(req.headers()[&X_GATEWAY_SIGNATURE], want);
        // Without a secret nothing is added.
        let plain = build(
            "/api/users/7",
            Some("gw"),
            &route("/api", None),
            "/api/users/7",
        );
        assert!(!plain.headers().contains_key(&X_GATEWAY_SIGNATURE));
    }

    /// The `t`, id and MAC of a v3 signature.
    fn signature_of(req: &Request<RequestBody>) -> (u64, String, String) {
        use crate::policy::signature::X_GATEWAY_SIGNATURE;
        let value = req.headers()[&X_GATEWAY_SIGNATURE].to_str().unwrap();
        let (t, rest) = value
            .strip_prefix("t=")
            .unwrap()
            .split_once(",id=")
            .unwrap();
        let (id, mac) = rest.split_once(",v3=").unwrap();
        (t.parse().unwrap(), id.to_owned(), mac.to_owned())
    }

    #[tokio::test]
    async fn a_body_read_to_retry_is_signed_over_its_digest_and_each_retry_afresh() {
        use crate::policy::signature::{Signed, Signer, body_sha256};
        use gateway_transport::body::ClientBody;
        let signer = Signer::new(&"s".repeat(32), "users").unwrap();
        let r = RouteView {
            signer: Some(&signer),
            ..route("/users", None)
        };
        let (parts, ()) = Request::put("/users/7")
            .header("host", "api.example")
            .body(())
            .unwrap()
            .into_parts();
        let body = RequestBody::new(
            ClientBody::full(Bytes::from_static(b"{\"name\":\"alice\"}")),
            1 << 20,
            Duration::from_secs(5),
        );
        let req = upstream_request(parts, &r, "/users/7", body).unwrap();
        let want = |t, id: &str, body_sha256: &[u8]| {
            let signed = Signed {
                t,
                id,
                mirror: false,
                method: "PUT",
                host: b"api.example",
                target: "/users/7",
                user_id: b"",
                user_role: b"",
                api_key_name: b"",
                body_sha256,
            };
            let value = signer.value(&signed);
            value
                .to_str()
                .unwrap()
                .rsplit_once(",v3=")
                .unwrap()
                .1
                .to_owned()
        };
        // As it streams, the body is not covered.
        let (t, id, mac) = signature_of(&req);
        assert_eq!(mac, want(t, &id, b""));
        // Read to be sent again: signed over its digest.
        let deadline = Instant::now() + Duration::from_secs(5);
        let (req, replay) = Replay::buffered(req, Some(&signer), deadline, Duration::from_secs(5))
            .await
            .unwrap();
        let digest = body_sha256(b"{\"name\":\"alice\"}");
        let (t, first, mac) = signature_of(&req);
        assert_eq!(mac, want(t, &first, &digest));
        // A retry is a new request to the upstream: a fresh id, the same body.
        let again = replay.unwrap().request();
        let (t, second, mac) = signature_of(&again);
        assert_ne!(second, first);
        assert_eq!(mac, want(t, &second, &digest));
    }

    #[test]
    fn absolute_form_becomes_origin_form_with_host() {
        let r = route("/", None);
        let req = build("http://example.test:8080/a/b?c", None, &r, "/a/b");
        assert_eq!(req.uri(), "/a/b?c");
        assert_eq!(req.headers()[header::HOST], "example.test:8080");
    }
}
