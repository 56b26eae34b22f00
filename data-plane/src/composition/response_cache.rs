//! Response caching (`Route.cache`, docs/data-plane.md "Response caching"):
//! a route's GET answers kept in the replica's memory and served without
//! touching the upstream while they are fresh.
//!
//! * **Key**: the route, `Host` (or `:authority`), the scheme and the
//!   forwarding fields ([`KEYED_FORWARDING`]), normalised path, query, the
//!   route's `vary` headers, and on an authenticated route (unless `shared`)
//!   the caller's identity (`X-User-Id` / `X-User-Role` set by authentication).
//!   Under one key the answer's own `Vary` keeps one answer per combination of
//!   the request fields it names ([`store`]).
//! * **Bypassed** (proxied as if the route had no cache): methods other than
//!   GET (HEAD included), requests with a body, `Range`, or `Cache-Control:
//!   no-store`, and requests with credentials the key does not hold
//!   (`Cookie`, `Authorization` or `X-API-Key` still present after
//!   authentication and not in `vary`) unless the route's
//!   `shared_with_credentials` says its answers do not depend on them.
//! * **Lookup**: a fresh answer is a HIT (with `Age`). A request with
//!   `Cache-Control: no-cache` or `max-age=0` goes upstream. Otherwise the
//!   request joins the key's **flight** ([`Coalescer`]): the first makes one
//!   upstream call in a task of its own, the others wait for its answer. A
//!   stale answer with an `ETag` is revalidated with `If-None-Match`; a 304
//!   refreshes it and it is served as STALE; any other answer replaces it.
//! * **Stored** ([`control`]): statuses of [`control::CACHEABLE_STATUSES`],
//!   without `no-store`, `private`, `Set-Cookie` or `Vary: *`, with a body of
//!   at most `max_body_bytes`, fresh for a while or carrying an `ETag`.
//! * **Answers** carry `X-Cache: HIT | MISS | STALE`; a client's
//!   `If-None-Match` that matches the answer's `ETag` gets 304.

pub mod control;
pub mod store;

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use gateway_proto::spec::Auth;
use gateway_proto::v1::RouteCache;
use gateway_telemetry::SpanParent;
use gateway_transport::body::{ClientBody, RequestBody, ResponseBody};
use gateway_transport::response::{Fields, Response};
use gateway_transport::workers::Worker;
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Method, StatusCode};
use http_body::Body as _;
use tokio::time::Instant;

use crate::composition::coalesce::{
    self, CoalesceLimits, Coalescer, Join, LeaderCall, Outcome, Read, Snapshot,
};
use crate::error::ProxyError;
use crate::policy::api_key::X_API_KEY;
use crate::policy::sanitize::{
    FORWARDED, X_FORWARDED_HOST, X_FORWARDED_PORT, X_FORWARDED_PREFIX, X_FORWARDED_PROTO,
    X_FORWARDED_SCHEME, X_ORIGINAL_URL, X_REWRITE_URL, X_USER_ID, X_USER_ROLE,
};
use crate::upstream::UpstreamEntry;
use crate::upstream::attempt::Trace;
use crate::upstream::balancer::Affinity;
use crate::upstream::proxy::{RouteView, upstream_request};
use crate::upstream::retry::RetryPolicy;
use control::Directives;
pub use store::ResponseCache;
use store::{Slot, Stored};

/// `X-Cache`: where an answer of a cached route came from.
pub static X_CACHE: HeaderName = HeaderName::from_static("x-cache");
const HIT: HeaderValue = HeaderValue::from_static("HIT");
const MISS: HeaderValue = HeaderValue::from_static("MISS");
const STALE: HeaderValue = HeaderValue::from_static("STALE");

/// Request fields an answer often varies on: requests that differ in them do
/// not share a flight (the answer's `Vary` may name them).
static FLIGHT_HEADERS: [&HeaderName; 4] = [
    &header::ACCEPT,
    &header::ACCEPT_ENCODING,
    &header::ACCEPT_LANGUAGE,
    &header::COOKIE,
];

/// Credential fields: a request that still carries one at the cache (not
/// consumed by authentication) bypasses it unless the key holds it (`vary`) or
/// the route's `shared_with_credentials` says answers do not depend on it.
static CREDENTIALS: [&HeaderName; 3] = [&header::COOKIE, &header::AUTHORIZATION, &X_API_KEY];

/// The scheme and the forwarding fields an upstream may build links, redirects
/// or access decisions from, beyond `Host`, path and query: all in the key, so
/// that an answer built for cleartext is never served to HTTPS, nor one built
/// for a poisoned field to the next caller. Sanitising sets the first two from
/// the connection for any client that is not a trusted proxy and strips the
/// rest from it (`policy/sanitize.rs`): what is keyed is what the gateway believes.
pub static KEYED_FORWARDING: [&HeaderName; 8] = [
    &X_FORWARDED_PROTO,
    &X_FORWARDED_HOST,
    &X_FORWARDED_PREFIX,
    &X_FORWARDED_PORT,
    &X_FORWARDED_SCHEME,
    &X_ORIGINAL_URL,
    &X_REWRITE_URL,
    &FORWARDED,
];

/// `name`'s index in [`KEYED_FORWARDING`] (a `match` on the lower-case name).
fn keyed_forwarding_index(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"x-forwarded-proto" => 0,
        b"x-forwarded-host" => 1,
        b"x-forwarded-prefix" => 2,
        b"x-forwarded-port" => 3,
        b"x-forwarded-scheme" => 4,
        b"x-original-url" => 5,
        b"x-rewrite-url" => 6,
        b"forwarded" => 7,
        _ => return None,
    })
}

/// Writes the values of [`KEYED_FORWARDING`] into `k` in its order, with one
/// pass over the request's fields (a lookup each would cost ~8 hashes of the
/// name on every HIT); a request that repeats one of them takes the lookups,
/// under another leading byte, so the two encodings never meet.
fn forwarding_into(k: &mut impl BufMut, headers: &HeaderMap) {
    let mut found: [Option<&HeaderValue>; KEYED_FORWARDING.len()] = [None; KEYED_FORWARDING.len()];
    let mut repeated = false;
    for (name, value) in headers {
        if let Some(i) = keyed_forwarding_index(name.as_str().as_bytes()) {
            repeated |= found[i].replace(value).is_some();
        }
    }
    if repeated {
        k.put_u8(1);
        for name in KEYED_FORWARDING {
            values(k, headers, name);
        }
        return;
    }
    k.put_u8(0);
    for value in found {
        match value {
            Some(v) => {
                k.put_u8(1);
                field(k, v.as_bytes());
            }
            None => k.put_u8(0),
        }
    }
}

/// Fields a 304 carries over from the answer it stands for (RFC 9110 §15.4.5).
static NOT_MODIFIED_FIELDS: [&HeaderName; 6] = [
    &header::CACHE_CONTROL,
    &header::CONTENT_LOCATION,
    &header::DATE,
    &header::ETAG,
    &header::EXPIRES,
    &header::VARY,
];

/// A route's cache settings, compiled once per snapshot.
#[derive(Debug)]
pub struct RouteCacheEntry {
    /// The route's name (part of every key; purges match it).
    route: Arc<str>,
    /// Freshness of answers that give none.
    ttl: Duration,
    /// Largest body stored.
    max_body: usize,
    /// Request headers in the key.
    vary: Box<[HeaderName]>,
    /// Whether the caller's identity is in the key (an authenticated route, not `shared`).
    by_identity: bool,
    /// Which of [`CREDENTIALS`] a request may carry and still be cached: those
    /// in `vary`, or all with `shared_with_credentials` (bit `i` for `CREDENTIALS[i]`).
    credentials_allowed: u8,
    /// The route's upstream calls in flight, by key.
    flights: Arc<Coalescer>,
}

impl RouteCacheEntry {
    /// The settings of route `route` (authenticated by `auth`), already validated.
    pub fn compile(route: &str, auth: Auth, c: &RouteCache) -> Self {
        let max_body = gateway_proto::validate::cache_max_body_bytes(c.max_body_bytes) as usize;
        Self {
            route: route.into(),
            ttl: Duration::from_secs(u64::from(c.ttl_seconds)),
            max_body,
            vary: c
                .vary
                .iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect(),
            by_identity: auth != Auth::None && !c.shared,
            credentials_allowed: if c.shared_with_credentials {
                u8::MAX
            } else {
                CREDENTIALS
                    .iter()
                    .enumerate()
                    .filter(|(_, name)| {
                        c.vary.iter().any(|v| v.eq_ignore_ascii_case(name.as_str()))
                    })
                    .fold(0, |bits, (i, _)| bits | 1 << i)
            },
            flights: Arc::new(Coalescer::new(CoalesceLimits {
                max_body,
                ..CoalesceLimits::default()
            })),
        }
    }

    /// The key of a request with normalised path `path`: route, authority,
    /// path, query, the listed headers and (when keyed by it) the identity,
    /// each length-prefixed so no two requests collide.
    pub fn key(&self, parts: &Parts, path: &str) -> Bytes {
        let mut k = Vec::new();
        self.key_into(parts, path, &mut k);
        k.into()
    }

    /// [`key`](Self::key), written at the end of `k`.
    pub fn key_into(&self, parts: &Parts, path: &str, k: &mut Vec<u8>) {
        let query = parts.uri.query().unwrap_or_default();
        k.reserve(64 + self.route.len() + path.len() + query.len());
        field(k, self.route.as_bytes());
        let host = parts
            .uri
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or_else(|| parts.headers.get(header::HOST).map(HeaderValue::as_bytes))
            .unwrap_or_default();
        field(k, host);
        forwarding_into(k, &parts.headers);
        field(k, path.as_bytes());
        k.put_u8(u8::from(parts.uri.query().is_some()));
        field(k, query.as_bytes());
        for name in &self.vary {
            values(k, &parts.headers, name);
        }
        if self.by_identity {
            values(k, &parts.headers, &X_USER_ID);
            values(k, &parts.headers, &X_USER_ROLE);
        }
    }
}

impl RouteCacheEntry {
    /// Which of [`CREDENTIALS`] `headers` carry, as bits: one pass over the
    /// fields comparing names by `match` (three map lookups would hash each
    /// name, ~500 instructions on every HIT).
    fn credentials_of(headers: &HeaderMap) -> u8 {
        headers.keys().fold(0, |bits, name| {
            bits | match name.as_str().as_bytes() {
                b"cookie" => 0b001,
                b"authorization" => 0b010,
                b"x-api-key" => 0b100,
                _ => 0,
            }
        })
    }
}

thread_local! {
    /// The worker's buffer for the key of a lookup: a HIT allocates nothing for it.
    static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Largest key buffer a worker keeps between requests.
const KEY_BUFFER_KEPT: usize = 4096;

/// The key of a request (as [`RouteCacheEntry::key`]) and what `store` holds
/// under it; the key is copied out only when the lookup does not answer.
fn look_up(
    cache: &RouteCacheEntry,
    store: &ResponseCache,
    parts: &Parts,
    path: &str,
    answers: impl FnOnce(&Arc<Stored>) -> bool,
) -> Result<Arc<Stored>, (Bytes, Option<Arc<Stored>>)> {
    KEY.with_borrow_mut(|k| {
        k.clear();
        cache.key_into(parts, path, k);
        let found = store.get(k, &parts.headers);
        let result = match found {
            Some(stored) if answers(&stored) => Ok(stored),
            other => Err((Bytes::copy_from_slice(k), other)),
        };
        if k.capacity() > KEY_BUFFER_KEPT {
            *k = Vec::new();
        }
        result
    })
}

fn field(k: &mut impl BufMut, bytes: &[u8]) {
    k.put_u32(bytes.len() as u32);
    k.put_slice(bytes);
}

fn values(k: &mut impl BufMut, headers: &HeaderMap, name: &HeaderName) {
    let values = headers.get_all(name);
    k.put_u32(values.iter().count() as u32);
    for v in values {
        field(k, v.as_bytes());
    }
}

/// What the caching stage did with a request.
pub enum Cached<'s, 'a> {
    /// Answered: from the cache, or by the flight's upstream call.
    Answered(Result<Response<ResponseBody>, ProxyError>),
    /// Not for the cache: proxy it as usual (everything handed back).
    Bypass(Parts, ClientBody, Trace<'s, 'a>),
}

/// The upstream side of a request: where the flight's call goes.
pub struct Upstream<'r, 'a> {
    /// The route as forwarding sees it.
    pub route: RouteView<'r>,
    /// Its upstream.
    pub upstream: &'a Arc<UpstreamEntry>,
    /// The request's balancing key.
    pub affinity: Affinity,
    /// The proxy worker serving the request.
    pub worker: Worker,
}

/// The caching stage of the pipeline, for a request of a route with `cache`
/// after authentication, rate limiting and the request header transforms.
pub async fn stage<'s, 'a>(
    cache: &RouteCacheEntry,
    store: &Arc<ResponseCache>,
    to: Upstream<'_, 'a>,
    mut parts: Parts,
    body: ClientBody,
    path: &str,
    trace: Trace<'s, 'a>,
) -> Cached<'s, 'a> {
    let asked = Directives::parse(
        parts
            .headers
            .get_all(header::CACHE_CONTROL)
            .iter()
            .map(HeaderValue::as_bytes),
    );
    let credentials = RouteCacheEntry::credentials_of(&parts.headers);
    let not_for_cache = parts.method != Method::GET
        || !body.is_end_stream()
        || asked.no_store
        || parts.headers.contains_key(header::RANGE)
        || credentials & !cache.credentials_allowed != 0;
    if not_for_cache {
        return Cached::Bypass(parts, body, trace);
    }
    let metrics = store.metrics();
    let now = Instant::now();
    let looked_up = look_up(cache, store, &parts, path, |stored| {
        !asked.wants_upstream() && stored.is_fresh(now)
    });
    let client_etags = parts.headers.remove(header::IF_NONE_MATCH);
    let (key, found) = match looked_up {
        Ok(stored) => {
            metrics.hits.fetch_add(1, Ordering::Relaxed);
            let answer = from_store(&stored, now, HIT);
            return Cached::Answered(Ok(conditional(answer, client_etags.as_ref())));
        }
        Err(missed) => missed,
    };
    // The flight: one upstream call per key (and per representation asked for).
    let mut flight = BytesMut::from(&key[..]);
    for name in FLIGHT_HEADERS {
        values(&mut flight, &parts.headers, name);
    }
    flight.put_u8(u8::from(asked.wants_upstream()));
    let answer = match cache.flights.join(flight.freeze().into()) {
        Join::Full => return bypass(parts, body, trace, client_etags),
        Join::Follower(rx) => match coalesce::wait(rx).await {
            Some(Outcome::Shared(snapshot)) => Ok(snapshot.response()),
            Some(Outcome::Alone) | None => return bypass(parts, body, trace, client_etags),
        },
        Join::Leader(lead) => {
            // The gateway revalidates with its own validator; the client's condition is answered below.
            parts.headers.remove(header::IF_MODIFIED_SINCE);
            let validator = found.filter(|s| s.etag.is_some());
            if let Some(etag) = validator.as_ref().and_then(|s| s.etag.clone()) {
                parts.headers.insert(header::IF_NONE_MATCH, etag);
            }
            let request_fields = parts.headers.clone();
            let req = match upstream_request(parts, &to.route, path, RequestBody::empty()) {
                Ok(req) => req,
                Err(e) => {
                    lead.finish(Outcome::Shared(Arc::new(Snapshot::of_error(&e))));
                    return Cached::Answered(Err(e));
                }
            };
            let fetch = Fetch {
                upstream: Arc::clone(to.upstream),
                timeout: to.route.timeout,
                retry: to.route.retry.cloned(),
                span: trace.span.parent(),
                tracestate: trace.tracestate.cloned(),
                affinity: to.affinity,
                worker: to.worker,
                store: Arc::clone(store),
                slot: Place {
                    key,
                    route: Arc::clone(&cache.route),
                    path: path.into(),
                    request_fields,
                    ttl: cache.ttl,
                    max_body: cache.max_body,
                    credentialed: credentials != 0,
                },
                validator,
            };
            let task = tokio::spawn(async move {
                let (mine, theirs, served) = fetch.run(req).await;
                lead.finish(theirs);
                (mine, served)
            });
            let (result, served) = match task.await {
                Ok(done) => done,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Only when the runtime shuts down.
                Err(_) => return Cached::Answered(Err(ProxyError::NotReady)),
            };
            *trace.served_by = served
                .and_then(|i| to.upstream.instances.get(i))
                .map(|i| &*i.id);
            result
        }
    };
    let answer = answer.map(|a| {
        let counter = match a.fields().get("x-cache") {
            Some(b"STALE") => &metrics.stale,
            _ => &metrics.misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        conditional(a, client_etags.as_ref())
    });
    Cached::Answered(answer)
}

/// The request handed back to be proxied as usual, with the client's
/// `If-None-Match` back in place (the upstream answers it then).
fn bypass<'s, 'a>(
    mut parts: Parts,
    body: ClientBody,
    trace: Trace<'s, 'a>,
    if_none_match: Option<HeaderValue>,
) -> Cached<'s, 'a> {
    if let Some(v) = if_none_match {
        parts.headers.insert(header::IF_NONE_MATCH, v);
    }
    Cached::Bypass(parts, body, trace)
}

/// A stored answer for one caller, with its `Age` and `X-Cache`.
fn from_store(stored: &Stored, now: Instant, tag: HeaderValue) -> Response<ResponseBody> {
    let mut resp = stored.response();
    let fields = resp.fields_mut();
    fields.insert(header::AGE, age_value(stored.age(now).as_secs()));
    fields.insert(X_CACHE.clone(), tag);
    resp
}

/// Slots of the worker's `Age` values, by age modulo their number.
const AGE_SLOTS: usize = 64;

thread_local! {
    /// The worker's last `Age` values: under load, hot answers ask for the
    /// same few ages in a row, each otherwise formatted into a new allocation.
    static AGES: RefCell<[Option<(u64, HeaderValue)>; AGE_SLOTS]> =
        const { RefCell::new([const { None }; AGE_SLOTS]) };
}

/// The `Age` value of `secs` seconds.
fn age_value(secs: u64) -> HeaderValue {
    AGES.with_borrow_mut(|ages| {
        let slot = &mut ages[(secs % AGE_SLOTS as u64) as usize];
        match slot {
            Some((at, value)) if *at == secs => value.clone(),
            _ => slot.insert((secs, HeaderValue::from(secs))).1.clone(),
        }
    })
}

/// `resp`, or a 304 when the client's `If-None-Match` matches its `ETag`.
fn conditional(
    resp: Response<ResponseBody>,
    if_none_match: Option<&HeaderValue>,
) -> Response<ResponseBody> {
    let Some(inm) = if_none_match else {
        return resp;
    };
    let matches = resp.status() == StatusCode::OK
        && resp
            .fields()
            .get("etag")
            .is_some_and(|etag| control::none_match(inm.as_bytes(), etag));
    if !matches {
        return resp;
    }
    let mut kept = HeaderMap::new();
    for name in NOT_MODIFIED_FIELDS
        .iter()
        .copied()
        .chain([&header::AGE, &X_CACHE])
    {
        for v in resp.fields().get_all(name.as_str()) {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                kept.append(name.clone(), v);
            }
        }
    }
    Response::from_parts(
        StatusCode::NOT_MODIFIED,
        Fields::from(kept),
        ResponseBody::empty(),
    )
}

/// Where a fetched answer is stored.
struct Place {
    key: Bytes,
    route: Arc<str>,
    path: Box<str>,
    /// The request's fields, for the values the answer's `Vary` names.
    request_fields: HeaderMap,
    ttl: Duration,
    max_body: usize,
    /// The request carried credentials (admitted by `vary` or
    /// `shared_with_credentials`): the answer is stored only if it allows
    /// shared caching explicitly, and the route's TTL applies only with `public`.
    credentialed: bool,
}

/// A flight's upstream call, owned by a spawned task.
struct Fetch {
    upstream: Arc<UpstreamEntry>,
    timeout: Duration,
    retry: Option<RetryPolicy>,
    span: SpanParent,
    tracestate: Option<HeaderValue>,
    affinity: Affinity,
    worker: Worker,
    store: Arc<ResponseCache>,
    slot: Place,
    /// The stale answer being revalidated (its `ETag` was sent as `If-None-Match`).
    validator: Option<Arc<Stored>>,
}

type Fetched = (
    Result<Response<ResponseBody>, ProxyError>,
    Outcome,
    Option<usize>,
);

impl Fetch {
    /// Balances, forwards, reads the body and stores what may be stored.
    /// Returns the leader's answer, the followers' outcome, and the index of
    /// the instance that answered.
    async fn run(self, req: Box<http::Request<RequestBody>>) -> Fetched {
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
        let (status, mut fields, body) = resp.into_parts();
        if status == StatusCode::NOT_MODIFIED
            && let Some(old) = &self.validator
        {
            let now = Instant::now();
            let refreshed = self.refreshed(old, &fields, now);
            let answer = from_store(&refreshed, now, STALE);
            self.store(refreshed);
            let snapshot = Arc::new(snapshot_of(answer));
            return (Ok(snapshot.response()), Outcome::Shared(snapshot), served);
        }
        let max = self.slot.max_body;
        if body.size_hint().lower() > max as u64 {
            fields.insert(X_CACHE.clone(), MISS);
            let mine = Response::from_parts(status, fields, body);
            return (Ok(mine), Outcome::Alone, served);
        }
        let (mine, theirs) = match coalesce::read(body, max, deadline).await {
            Read::Complete(bytes) => {
                if let Some(stored) = self.storable(status, &fields, &bytes) {
                    self.store(stored);
                }
                fields.insert(X_CACHE.clone(), MISS);
                let snapshot = Arc::new(Snapshot::new(status, fields, bytes));
                (Ok(snapshot.response()), Outcome::Shared(snapshot))
            }
            Read::Stopped {
                read,
                rest,
                timed_out,
            } => {
                let read = (!read.is_empty()).then_some(read);
                fields.insert(X_CACHE.clone(), MISS);
                let mine = Response::from_parts(
                    status,
                    fields,
                    ResponseBody::Resumed(read, Box::new(rest)),
                );
                let theirs = if timed_out {
                    let e = ProxyError::Upstream(
                        gateway_transport::upstream_error::UpstreamError::timeout(self.timeout),
                    );
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

    /// The route's heuristic freshness (its `ttl_seconds`), for an answer with
    /// directives `d` that gives none of its own: only where the answer allows
    /// shared caching (a credentialed request's answer needs `public`).
    fn heuristic_ttl(&self, d: &Directives) -> Duration {
        if self.slot.credentialed && !d.public {
            Duration::ZERO
        } else {
            self.slot.ttl
        }
    }

    /// The answer as it will be stored, or `None` when it must not be.
    fn storable(&self, status: StatusCode, fields: &Fields, body: &Bytes) -> Option<Stored> {
        if !control::cacheable_status(status) || fields.contains("set-cookie") {
            return None;
        }
        let d = Directives::parse(fields.get_all("cache-control"));
        if d.no_store || d.private {
            return None;
        }
        if self.slot.credentialed && !d.allows_shared_with_credentials() {
            return None;
        }
        let vary = vary_names(fields)?;
        let lifetime = control::freshness_lifetime(
            &d,
            fields.get("date"),
            fields.get("expires"),
            SystemTime::now(),
            self.heuristic_ttl(&d),
        );
        let etag = fields
            .get("etag")
            .and_then(|v| HeaderValue::from_bytes(v).ok());
        if lifetime.is_zero() && etag.is_none() {
            return None; // never fresh, and nothing to revalidate with
        }
        let fields = fields.clone();
        Some(Stored {
            status,
            initial_age: control::initial_age(fields.get("age")),
            fields,
            body: body.clone(),
            stored_at: Instant::now(),
            lifetime,
            etag,
            vary_values: store::vary_values(&vary, &self.slot.request_fields),
        })
    }

    /// `old`, refreshed by the fields of a 304 (RFC 9111 §4.3.4: they replace
    /// the stored ones of the same name), stored again as of `now`.
    fn refreshed(&self, old: &Stored, update: &Fields, now: Instant) -> Stored {
        let mut fields = old.fields.clone();
        let map = fields.map_mut();
        for (name, value) in update.iter() {
            let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            else {
                continue;
            };
            if name == header::CONTENT_LENGTH || name == X_CACHE {
                continue;
            }
            map.insert(name, value);
        }
        let d = Directives::parse(fields.get_all("cache-control"));
        let lifetime = control::freshness_lifetime(
            &d,
            fields.get("date"),
            fields.get("expires"),
            SystemTime::now(),
            self.heuristic_ttl(&d),
        );
        Stored {
            status: old.status,
            initial_age: control::initial_age(update.get("age")),
            etag: fields
                .get("etag")
                .and_then(|v| HeaderValue::from_bytes(v).ok()),
            fields,
            body: old.body.clone(),
            stored_at: now,
            lifetime,
            vary_values: old.vary_values.clone(),
        }
    }

    fn store(&self, stored: Stored) {
        let vary = vary_names(&stored.fields).unwrap_or_default();
        let slot = Slot {
            key: &self.slot.key,
            route: &self.slot.route,
            path: &self.slot.path,
            vary,
        };
        self.store.put(slot, stored);
    }
}

/// The request fields an answer's `Vary` names, lower-case, in order;
/// `None` for `Vary: *` (not stored).
fn vary_names(fields: &Fields) -> Option<Box<[HeaderName]>> {
    let mut names = Vec::new();
    for value in fields.get_all("vary") {
        if control::varies_on_everything(value) {
            return None;
        }
        for name in value.split(|&b| b == b',') {
            if let Ok(name) = HeaderName::from_bytes(name.trim_ascii())
                && !names.contains(&name)
            {
                names.push(name);
            }
        }
    }
    Some(names.into())
}

/// A complete answer as a flight's shared snapshot.
fn snapshot_of(resp: Response<ResponseBody>) -> Snapshot {
    let (status, fields, body) = resp.into_parts();
    let body = match body {
        ResponseBody::Full(b) => b.unwrap_or_default(),
        _ => Bytes::new(),
    };
    Snapshot::new(status, fields, body)
}

#[cfg(test)]
mod tests;
