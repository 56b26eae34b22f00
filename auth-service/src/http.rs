//! HTTP API (docs/auth-service.md): routing, body limits, JSON in and out. Flows live in [`crate::service`].

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Body;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::client_addr::TrustedProxies;
use crate::problem::ApiError;
use crate::service::AuthService;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// A client must send its request headers within this time (slowloris guard).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A request body must arrive within this time (a trickled body cannot hold a task forever).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections get this long to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginRequest {
    username: String,
    password: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RefreshRequest {
    refresh_token: String,
}

/// Serves the API on `listener` until `shutdown` resolves, then drains open connections.
/// `trusted` decides whose `X-Forwarded-For` names a login's client.
pub async fn serve(
    listener: gateway_listener::Listener,
    service: Arc<AuthService>,
    trusted: TrustedProxies,
    tracer: gateway_telemetry::Tracer,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = service.clone();
        let tracer = tracer.clone();
        let trusted = trusted.clone();
        let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
            let service = service.clone();
            let client = trusted.client_ip(req.headers(), peer.ip());
            // One SERVER span per request, continuing the caller's traceparent; traceresponse on every answer.
            let mut span = tracer.http_server_span(req.headers(), req.method(), req.uri().path());
            async move {
                let mut resp = handle(&service, client, req).await;
                span.record_response(resp.status().as_u16(), resp.headers_mut());
                span.end();
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("shutting down: draining open connections");
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
    Ok(())
}

/// Routes one request from `client` (the address a login is counted against).
pub async fn handle<B>(
    service: &AuthService,
    client: IpAddr,
    req: Request<B>,
) -> Response<Full<Bytes>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let result = match (req.method(), req.uri().path()) {
        (&Method::POST, "/auth/login") => match read_json::<LoginRequest, _>(req).await {
            Ok(r) => service
                .login(&r.username, &r.password, client)
                .await
                .map(json_ok),
            Err(e) => Err(e),
        },
        (&Method::POST, "/auth/refresh") => match read_json::<RefreshRequest, _>(req).await {
            Ok(r) => service.refresh(&r.refresh_token).await.map(json_ok),
            Err(e) => Err(e),
        },
        (&Method::POST, "/auth/logout") => match read_json::<RefreshRequest, _>(req).await {
            Ok(r) => service
                .logout(&r.refresh_token)
                .await
                .map(|()| no_content()),
            Err(e) => Err(e),
        },
        (&Method::GET | &Method::HEAD, "/.well-known/jwks.json") => Ok(jwks(service)),
        (&Method::GET | &Method::HEAD, "/healthz") => Ok(text(StatusCode::OK, "ok\n")),
        (_, "/auth/login" | "/auth/refresh" | "/auth/logout") => {
            Err(ApiError::MethodNotAllowed("POST"))
        }
        (_, "/.well-known/jwks.json" | "/healthz") => Err(ApiError::MethodNotAllowed("GET, HEAD")),
        _ => Err(ApiError::NotFound),
    };
    result.unwrap_or_else(ApiError::into_response)
}

async fn read_json<T: DeserializeOwned, B>(req: Request<B>) -> Result<T, ApiError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let too_large = || ApiError::BadRequest(format!("request body exceeds {MAX_BODY_BYTES} bytes"));
    // Refuse early when the client announces a large body, before reading any of it.
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH) {
        let len: u64 = len
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ApiError::BadRequest("invalid Content-Length".into()))?;
        if len > MAX_BODY_BYTES as u64 {
            return Err(too_large());
        }
    }
    let collect = Limited::new(req.into_body(), MAX_BODY_BYTES).collect();
    let body = tokio::time::timeout(BODY_READ_TIMEOUT, collect)
        .await
        .map_err(|_| {
            ApiError::BadRequest(format!(
                "request body not received within {BODY_READ_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                too_large()
            } else {
                ApiError::BadRequest(format!("reading the request body: {e}"))
            }
        })?
        .to_bytes();
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "empty request body; expected a JSON object".into(),
        ));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

fn json_ok<T: serde::Serialize>(value: T) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(&value).expect("response serialises"),
    )));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Token responses must never be cached (RFC 6749 §5.1).
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    resp
}

fn no_content() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn jwks(service: &AuthService) -> Response<Full<Bytes>> {
    let (body, max_age) = service.jwks();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/jwk-set+json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_str(&format!("public, max-age={max_age}")).expect("ascii header"),
    );
    resp
}

#[cfg(test)]
mod tests;
