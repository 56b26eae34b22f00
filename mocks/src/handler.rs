//! Answers one request: health, demo records, POST byte counts, and the
//! fault hooks.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use serde_json::{Value, json};

use gateway_telemetry::Tracer;

use crate::body::MockBody;
use crate::config::MockConfig;
use crate::hooks::Hooks;
use crate::identity::IdentityError;
use crate::records;
use crate::stats::RequestStats;
use crate::websocket;

/// Response header naming the instance that answered.
pub const INSTANCE_HEADER: &str = "x-instance-id";

/// Answers `req`. Never fails: every problem becomes an HTTP answer.
///
/// Every request but `/health` and `/stats` is counted in `stats` and gets a
/// SERVER span that continues the incoming `traceparent` (health checks would
/// only add noise to traces); the response names it in `traceresponse`.
pub async fn handle<B>(
    config: &MockConfig,
    tracer: &Tracer,
    stats: &RequestStats,
    req: Request<B>,
) -> Response<MockBody>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().path();
    if path == "/stats" {
        let mut response = match *req.method() {
            Method::GET => json_response(
                StatusCode::OK,
                &json!({"requests": stats.requests(), "recent": stats.recent()}),
            ),
            _ => method_not_allowed("GET"),
        };
        if let Ok(id) = HeaderValue::from_str(&config.instance_id) {
            response.headers_mut().insert(INSTANCE_HEADER, id);
        }
        return response;
    }
    if path != "/health" {
        stats.count();
    }
    let mut span = (path != "/health").then(|| {
        let mut span = tracer.http_server_span(req.headers(), req.method(), path);
        if let Some(route) = route_template(config.service.name(), path) {
            span.set_route(route);
        }
        span
    });
    let is_websocket = path == websocket::PATH;
    let (req, verdict) = check_identity(config, req).await;
    let mut response = match verdict {
        Err(why) => error(StatusCode::UNAUTHORIZED, &why.to_string()),
        Ok(()) if is_websocket => websocket::answer(config, req),
        Ok(()) => answer(config, stats, req).await,
    };
    if let Ok(id) = HeaderValue::from_str(&config.instance_id) {
        response.headers_mut().insert(INSTANCE_HEADER, id);
    }
    if let Some(span) = span.as_mut() {
        let status = response.status().as_u16();
        span.record_response(status, response.headers_mut());
    }
    response
}

/// A request whose body may have been read to check its signature.
type Checked<B> = Request<Either<B, Full<Bytes>>>;

/// With an identity secret, the request's `X-Gateway-Signature` must verify
/// (`/health` is exempt: health checks are not signed identities). When the
/// signature may cover the body, the body is read (at most
/// [`MAX_SIGNED_BODY_BYTES`](crate::identity::MAX_SIGNED_BODY_BYTES)) and
/// handed on as read.
async fn check_identity<B>(
    config: &MockConfig,
    req: Request<B>,
) -> (Checked<B>, Result<(), IdentityError>)
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(verifier) = &config.identity else {
        return (req.map(Either::Left), Ok(()));
    };
    if req.uri().path() == "/health" {
        return (req.map(Either::Left), Ok(()));
    }
    // The raw request target (path and query), as v3 signs it.
    let verify = |parts: &http::request::Parts, body: Option<&[u8]>| {
        let target = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
        verifier.verify(
            &parts.headers,
            parts.method.as_str(),
            target,
            body,
            crate::identity::unix_now(),
        )
    };
    let (parts, body) = req.into_parts();
    match verify(&parts, None) {
        Err(IdentityError::BodyNeeded) => {}
        verdict => return (Request::from_parts(parts, Either::Left(body)), verdict),
    }
    let limited = Limited::new(body, crate::identity::MAX_SIGNED_BODY_BYTES);
    let verdict = match limited.collect().await {
        Ok(read) => {
            let bytes = read.to_bytes();
            let verdict = verify(&parts, Some(&bytes));
            let req = Request::from_parts(parts, Either::Right(Full::new(bytes)));
            return (req, verdict);
        }
        // Too large or broken: not the body the gateway signed.
        Err(_) => Err(IdentityError::Mismatch),
    };
    (
        Request::from_parts(parts, Either::Right(Full::default())),
        verdict,
    )
}

/// The low-cardinality route of `path`, for the span's `http.route`.
fn route_template(service: &str, path: &str) -> Option<&'static str> {
    let item = match service {
        "users" => ("/users", "/users/{id}"),
        _ => ("/orders", "/orders/{id}"),
    };
    match target(service, path)? {
        Target::Collection => Some(item.0),
        Target::Item(_) => Some(item.1),
        Target::Deeper => None,
    }
}

/// What the path asks for, relative to the service's prefix.
enum Target<'a> {
    /// `/users`.
    Collection,
    /// `/users/{id}`.
    Item(&'a str),
    /// Anything deeper under the prefix (`/users/1/x`): only POST accepts it.
    Deeper,
}

async fn answer<B>(config: &MockConfig, stats: &RequestStats, req: Request<B>) -> Response<MockBody>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let path = req.uri().path().to_owned();
    if path == "/health" {
        // While draining, health checks are told to stop sending; requests are still served.
        let (status, word) = if config.is_draining() {
            (StatusCode::SERVICE_UNAVAILABLE, "draining")
        } else {
            (StatusCode::OK, "ok")
        };
        return match *req.method() {
            Method::GET | Method::HEAD => json_response(
                status,
                &json!({"status": word, "service": config.service.name(), "instance": config.instance_id}),
            ),
            _ => method_not_allowed("GET, HEAD"),
        };
    }

    // Kept on arrival (a POST once its body is counted, with `body_bytes`).
    if req.method() != Method::POST {
        stats.keep(kept(req.method(), req.uri(), req.headers(), None));
    }
    let uri = req.uri().clone();
    let hooks = match Hooks::parse(uri.query()) {
        Ok(hooks) => hooks,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let delay = config.delay + hooks.delay.unwrap_or_default();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if config.fail_rate > 0.0 && rand::random::<f64>() < config.fail_rate {
        return error(config.fail_status, "injected failure (FAIL_RATE)");
    }

    // `?etag=`: a request that already has this representation gets 304.
    if let Some(etag) = hooks.etag
        && req
            .headers()
            .get_all(http::header::IF_NONE_MATCH)
            .iter()
            .any(|v| v.as_bytes() == format!("\"{etag}\"").as_bytes())
    {
        let resp = Response::builder()
            .status(StatusCode::NOT_MODIFIED)
            .body(MockBody::full(String::new()))
            .expect("static response parts are valid");
        return caching_headers(resp, &hooks);
    }
    let Some(target) = target(config.service.name(), &path) else {
        return error(StatusCode::NOT_FOUND, &format!("no such resource: {path}"));
    };
    let method = req.method().clone();
    let mut doc = match (&method, target) {
        (&Method::GET | &Method::HEAD, Target::Collection) => {
            json!({"items": records::list(config.service)})
        }
        (&Method::GET | &Method::HEAD, Target::Item(id)) => records::record(config.service, id),
        (&Method::GET | &Method::HEAD, Target::Deeper) => {
            return error(StatusCode::NOT_FOUND, &format!("no such resource: {path}"));
        }
        (&Method::POST, _) => {
            let (parts, body) = req.into_parts();
            let received = match count_body(body).await {
                Ok(n) => n,
                Err(e) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!("reading the body failed: {e}"),
                    );
                }
            };
            stats.keep(kept(
                &parts.method,
                &parts.uri,
                &parts.headers,
                Some(received),
            ));
            let mut doc = json!({"received_bytes": received});
            echo_request(&mut doc, config, &parts.method, &parts.uri, &parts.headers);
            return finish(doc, hooks, StatusCode::OK);
        }
        _ => return method_not_allowed("GET, HEAD, POST"),
    };
    echo_request(&mut doc, config, &method, req.uri(), req.headers());
    finish(doc, hooks, StatusCode::OK)
}

/// What `/stats` shows of one request: method, path, query, headers (as in
/// the echo) and, for a POST, the body's size.
fn kept(method: &Method, uri: &http::Uri, headers: &HeaderMap, body_bytes: Option<u64>) -> Value {
    json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "headers": header_echo(headers),
        "body_bytes": body_bytes,
    })
}

/// Splits `path` into the service's resource, or `None` when it is not under `/{service}`.
fn target<'a>(service: &str, path: &'a str) -> Option<Target<'a>> {
    let rest = path.strip_prefix('/')?.strip_prefix(service)?;
    if rest.is_empty() || rest == "/" {
        return Some(Target::Collection);
    }
    let rest = rest.strip_prefix('/')?;
    match rest.split_once('/') {
        None => Some(Target::Item(rest)),
        Some(_) => Some(Target::Deeper),
    }
}

/// Adds the request echo fields to a JSON object.
fn echo_request(
    doc: &mut Value,
    config: &MockConfig,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
) {
    if let Value::Object(map) = doc {
        map.insert("service".into(), config.service.name().into());
        map.insert("instance".into(), config.instance_id.clone().into());
        map.insert("method".into(), method.as_str().into());
        map.insert("path".into(), uri.path().into());
        map.insert("query".into(), uri.query().map_or(Value::Null, Value::from));
        map.insert("headers".into(), header_echo(headers));
    }
}

/// Applies the `status` and `bytes` hooks to a successful answer.
fn finish(doc: Value, hooks: Hooks<'_>, default_status: StatusCode) -> Response<MockBody> {
    let status = hooks.status.unwrap_or(default_status);
    let resp = match hooks.bytes {
        Some(n) => Response::builder()
            .status(status)
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(MockBody::generated(n))
            .expect("static response parts are valid"),
        None => json_response(status, &doc),
    };
    caching_headers(resp, &hooks)
}

/// The caching hooks' headers on an answer (a value that is not a valid header value is left out).
fn caching_headers(mut resp: Response<MockBody>, hooks: &Hooks<'_>) -> Response<MockBody> {
    use http::header::{self, HeaderValue};
    let headers = resp.headers_mut();
    let mut set = |name: header::HeaderName, value: Option<String>| {
        if let Some(v) = value.and_then(|v| HeaderValue::try_from(v).ok()) {
            headers.insert(name, v);
        }
    };
    set(
        header::CACHE_CONTROL,
        hooks.cache_control.map(str::to_owned),
    );
    set(header::ETAG, hooks.etag.map(|e| format!("\"{e}\"")));
    set(header::VARY, hooks.vary.map(str::to_owned));
    set(header::SET_COOKIE, hooks.set_cookie.map(str::to_owned));
    if let Some(n) = hooks.expires_in {
        let now = std::time::SystemTime::now();
        set(header::DATE, Some(httpdate::fmt_http_date(now)));
        let expires = now + std::time::Duration::from_secs(n);
        set(header::EXPIRES, Some(httpdate::fmt_http_date(expires)));
    }
    resp
}

/// Request headers as a JSON object, lower-case name → value; repeated
/// headers are joined with ", " and non-UTF-8 bytes replaced.
pub fn header_echo(headers: &HeaderMap) -> Value {
    let mut out: BTreeMap<&str, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        out.entry(name.as_str())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    Value::Object(
        out.into_iter()
            .map(|(k, v)| (k.to_owned(), Value::String(v)))
            .collect(),
    )
}

/// Counts the body's bytes frame by frame, holding none of them.
async fn count_body<B>(body: B) -> Result<u64, B::Error>
where
    B: Body<Data = Bytes>,
{
    let mut body = std::pin::pin!(body);
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            total += data.len() as u64;
        }
    }
    Ok(total)
}

fn json_response(status: StatusCode, doc: &Value) -> Response<MockBody> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(MockBody::full(doc.to_string()))
        .expect("static response parts are valid")
}

fn error(status: StatusCode, message: &str) -> Response<MockBody> {
    json_response(
        status,
        &json!({"error": message, "status": status.as_u16()}),
    )
}

fn method_not_allowed(allow: &'static str) -> Response<MockBody> {
    let mut response = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Service;
    use http_body_util::Full;

    fn users() -> MockConfig {
        MockConfig::new(Service::Users, "users-1", 0.0).unwrap()
    }

    async fn call(
        config: &MockConfig,
        req: Request<Full<Bytes>>,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let response = handle(config, &Tracer::disabled(), &RequestStats::default(), req).await;
        let (parts, body) = response.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes(),
        )
    }

    fn get(uri: &str) -> Request<Full<Bytes>> {
        Request::get(uri).body(Full::default()).unwrap()
    }

    #[tokio::test]
    async fn record_echoes_instance_and_headers() {
        let req = Request::get("/users/1?x=1")
            .header("X-Test", "a")
            .header("x-test", "b")
            .body(Full::default())
            .unwrap();
        let (status, headers, body) = call(&users(), req).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[INSTANCE_HEADER], "users-1");
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["instance"], "users-1");
        assert_eq!(doc["service"], "users");
        assert_eq!(doc["id"], "1");
        assert_eq!(doc["name"], "Alice");
        assert_eq!(doc["query"], "x=1");
        assert_eq!(doc["headers"]["x-test"], "a, b");
    }

    #[tokio::test]
    async fn other_service_paths_are_404_with_instance_header() {
        let (status, headers, _) = call(&users(), get("/orders/1")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(headers[INSTANCE_HEADER], "users-1");
        let (status, _, _) = call(&users(), get("/usersx/1")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = call(&users(), get("/users/1/extra")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn collection_lists_records() {
        let (status, _, body) = call(&users(), get("/users")).await;
        assert_eq!(status, StatusCode::OK);
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["items"].as_array().map(Vec::len), Some(3));
    }

    #[tokio::test]
    async fn status_hook_and_bad_status() {
        let (status, _, _) = call(&users(), get("/users/1?status=503")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let (status, headers, body) = call(&users(), get("/users/1?status=1000")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(headers[INSTANCE_HEADER], "users-1");
        assert!(String::from_utf8_lossy(&body).contains("status must be"));
    }

    #[tokio::test]
    async fn bytes_hook_streams_n_bytes() {
        let (status, headers, body) = call(&users(), get("/users/1?bytes=100000")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[CONTENT_TYPE], "application/octet-stream");
        assert_eq!(body.len(), 100_000);
    }

    #[tokio::test(start_paused = true)]
    async fn delay_hook_waits() {
        let start = tokio::time::Instant::now();
        let (status, _, _) = call(&users(), get("/users/1?delay_ms=1500")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(start.elapsed() >= std::time::Duration::from_millis(1500));
    }

    #[tokio::test]
    async fn post_counts_body_bytes() {
        let req = Request::post("/users")
            .body(Full::new(Bytes::from(vec![7u8; 12345])))
            .unwrap();
        let (status, _, body) = call(&users(), req).await;
        assert_eq!(status, StatusCode::OK);
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["received_bytes"], 12345);
        assert_eq!(doc["method"], "POST");
    }

    #[tokio::test]
    async fn fail_rate_one_always_fails_but_health_stays_up() {
        let config = MockConfig::new(Service::Orders, "orders-1", 1.0).unwrap();
        for _ in 0..5 {
            let (status, _, _) = call(&config, get("/orders/1")).await;
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        }
        let (status, _, _) = call(&config, get("/health")).await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn delay_ms_slows_every_answer_but_health() {
        let config = users().with_delay(std::time::Duration::from_millis(300));
        let started = tokio::time::Instant::now();
        let (status, _, _) = call(&config, get("/users/1")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(started.elapsed().as_millis(), 300);
        let started = tokio::time::Instant::now();
        call(&config, get("/users/1?delay_ms=100")).await;
        assert_eq!(started.elapsed().as_millis(), 400, "the hook adds to it");
        let started = tokio::time::Instant::now();
        call(&config, get("/health")).await;
        assert_eq!(started.elapsed().as_millis(), 0);
    }

    #[tokio::test]
    async fn draining_fails_health_but_serves_requests() {
        let config = users();
        config.start_draining();
        let (status, _, body) = call(&config, get("/health")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["status"], "draining");
        let (status, _, _) = call(&config, get("/users/1")).await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn stats_count_every_request_but_health_and_stats() {
        let config = users();
        let stats = RequestStats::default();
        let tracer = Tracer::disabled();
        for uri in [
            "/users/1",
            "/users/2?status=500",
            "/nowhere",
            "/health",
            "/stats",
        ] {
            let _ = handle(&config, &tracer, &stats, get(uri)).await;
        }
        let response = handle(&config, &tracer, &stats, get("/stats")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[INSTANCE_HEADER], "users-1");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["requests"], 3);
        let kept: Vec<(&str, &str)> = doc["recent"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["method"].as_str().unwrap(), r["path"].as_str().unwrap()))
            .collect();
        assert_eq!(
            kept,
            [
                ("GET", "/users/1"),
                ("GET", "/users/2"),
                ("GET", "/nowhere")
            ]
        );
        assert_eq!(doc["recent"][1]["query"], "status=500");
    }

    #[tokio::test]
    async fn stats_keep_a_post_with_its_body_size_and_headers() {
        let config = users();
        let stats = RequestStats::default();
        let tracer = Tracer::disabled();
        let post = Request::post("/users/1/notes")
            .header("x-gateway-mirror", "1")
            .body(Full::new(Bytes::from_static(b"hello")))
            .unwrap();
        let _ = handle(&config, &tracer, &stats, post).await;
        let recent = stats.recent();
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0]["method"], "POST");
        assert_eq!(recent[0]["body_bytes"], 5);
        assert_eq!(recent[0]["headers"]["x-gateway-mirror"], "1");
        for i in 0..crate::stats::RECENT + 5 {
            stats.keep(json!(i));
        }
        assert_eq!(stats.recent().len(), crate::stats::RECENT, "bounded");
        assert_eq!(stats.recent()[0], json!(5), "oldest dropped first");
    }

    /// A v3 signature for `audience` made now over a POST /users with this body digest.
    fn signed_post(audience: &str, mirror: bool, body_sha256: &[u8]) -> String {
        use crate::identity::{IdentityVerifier, SignedRequest};
        let signer = IdentityVerifier::new(&"k".repeat(32), audience).unwrap();
        let t = crate::identity::unix_now().to_string();
        let id = format!("{:032x}", rand::random::<u128>());
        let request = SignedRequest {
            t: &t,
            id: &id,
            mirror,
            method: "POST",
            host: b"users.test",
            target: "/users",
            user_id: b"alice",
            user_role: b"",
            api_key_name: b"",
            body_sha256,
        };
        format!("t={t},id={id},v3={}", signer.v3_hex(&request))
    }

    #[tokio::test]
    async fn a_signed_body_is_read_and_checked_and_a_shadows_copy_refused() {
        use sha2_hmac::{Digest as _, Sha256};
        let config = users()
            .with_identity_secret(&"k".repeat(32), &Default::default())
            .unwrap();
        let post = |signature: &str, mirror: bool, body: &'static [u8]| {
            let mut req = Request::post("/users")
                .header("host", "users.test")
                .header("x-user-id", "alice")
                .header("x-gateway-signature", signature);
            if mirror {
                req = req.header("x-gateway-mirror", "1");
            }
            req.body(Full::new(Bytes::from_static(body))).unwrap()
        };
        let digest = gateway_hex::encode(Sha256::digest(b"hello"));
        // The body signed: accepted, and still counted once read.
        let (status, _, body) = call(
            &config,
            post(
                &signed_post("users", false, digest.as_bytes()),
                false,
                b"hello",
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["received_bytes"], 5);
        // Another body under the same kind of signature: refused.
        let (status, _, body) = call(
            &config,
            post(
                &signed_post("users", false, digest.as_bytes()),
                false,
                b"hellO",
            ),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            doc["error"],
            "X-Gateway-Signature does not match the request"
        );
        // A shadow's copy (same secret, its own name, mirror 1) replayed here: refused,
        // with or without the marker.
        let copy = signed_post("users-shadow", true, b"");
        let (status, _, body) = call(&config, post(&copy, true, b"hello")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let doc: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            doc["error"],
            "X-Gateway-Signature is a mirror copy's: this backend is not a shadow"
        );
        let (status, _, _) = call(&config, post(&copy, false, b"hello")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // A streamed body (not covered) is accepted whatever it is.
        let (status, _, _) = call(
            &config,
            post(&signed_post("users", false, b""), false, b"x"),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn unsupported_method_is_405() {
        let req = Request::delete("/users/1").body(Full::default()).unwrap();
        let (status, headers, _) = call(&users(), req).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(headers[ALLOW], "GET, HEAD, POST");
    }
}
