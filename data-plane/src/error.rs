//! Every way the gateway itself answers a request with an error, and the one
//! place that maps them to a status and an `application/problem+json` body
//! (RFC 9457: `type`, `title`, `status`, `detail`).
//!
//! Bodies are static strings: an error flood (503 from open breakers, 429s)
//! costs no formatting or allocation beyond the response itself.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gateway_transport::body::ResponseBody;
use gateway_transport::h1_server::Refusal;
use gateway_transport::response::Response;
use gateway_transport::upstream_error::UpstreamError;
use http::StatusCode;
use http::header::{self, HeaderValue};

pub mod grpc;

use crate::metrics::PartOutcome;
use crate::policy::api_key::ApiKeyError;
use crate::policy::hooks::{AuthError, RateLimited};
use crate::policy::mtls::MtlsError;
use crate::policy::normalize::NormalizeError;

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Prefix of every problem `type`; the suffix is a stable slug.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:gateway:problem:";

macro_rules! problem {
    ($status:literal, $slug:literal, $title:literal, $detail:literal) => {
        concat!(
            "{\"type\":\"urn:gateway:problem:",
            $slug,
            "\",\"title\":\"",
            $title,
            "\",\"status\":",
            $status,
            ",\"detail\":\"",
            $detail,
            "\"}"
        )
    };
}

/// A request the gateway answers itself.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The path cannot be normalised safely (400).
    #[error(transparent)]
    BadPath(#[from] NormalizeError),
    /// A malformed request the router cannot use (400).
    #[error("malformed request: {0}")]
    BadRequest(&'static str),
    /// Headers over `--max-header-bytes` (431).
    #[error("request headers exceed {limit} bytes")]
    HeadersTooLarge {
        /// The limit.
        limit: usize,
    },
    /// Body over `--max-body-bytes` (413).
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit.
        limit: u64,
    },
    /// The client's body could not be read (400).
    #[error("the request body could not be read")]
    ClientBody(#[source] gateway_transport::body::ClientBodyError),
    /// The client sent part of a request head and then nothing for
    /// `--header-read-timeout-ms` (408).
    #[error("the request head stalled for {0:?}")]
    HeadTimeout(Duration),
    /// The client sent no byte of its body for `--body-read-timeout-ms` (408).
    #[error("the request body stalled for {0:?}")]
    BodyTimeout(Duration),
    /// The replica's WebSocket tunnels are at `--max-websocket-tunnels` (503).
    #[error("too many open WebSocket tunnels")]
    TunnelLimit,
    /// The upstream answered a WebSocket handshake with a 101 that does not
    /// complete it (no `Upgrade: websocket`, or a wrong `Sec-WebSocket-Accept`) (502).
    #[error("the upstream's 101 does not complete the WebSocket handshake: {0}")]
    BadUpgrade(&'static str),
    /// No configuration has been loaded yet (503).
    #[error("no configuration loaded yet")]
    NotReady,
    /// No route matches host, path and method (404).
    #[error("no route matches the request")]
    NoRoute,
    /// A cleartext GET or HEAD on an `https_only` route (301 to this `Location`).
    #[error("the route is served over HTTPS only")]
    HttpsRedirect(HeaderValue),
    /// A cleartext request of another method on an `https_only` route (403).
    #[error("the route is served over HTTPS only")]
    HttpsRequired,
    /// The client address is refused by the route's IP rules (403).
    #[error("the client address is not allowed on this route")]
    IpDenied,
    /// A CORS preflight from an origin, or for a method or header, the route does not allow (403).
    #[error("the CORS preflight is not allowed on this route")]
    CorsRefused,
    /// A WebSocket upgrade on a route without `websocket`, or a malformed
    /// WebSocket handshake (400).
    #[error("the WebSocket upgrade is not allowed on this route")]
    UpgradeRefused,
    /// Authentication failed (401).
    #[error(transparent)]
    Unauthorized(#[from] AuthError),
    /// An `AUTH_API_KEY` route's key is missing, unknown or revoked (401).
    #[error(transparent)]
    ApiKey(#[from] ApiKeyError),
    /// An `AUTH_MTLS` route without a verified client certificate, or with
    /// one that names no usable subject (401), or one that is not on the
    /// route's `mtls_allow` (403).
    #[error(transparent)]
    ClientCertificate(#[from] MtlsError),
    /// Rate limit exceeded (429).
    #[error("rate limit exceeded")]
    RateLimited(RateLimited),
    /// Every instance is unhealthy or breaker-open (503).
    #[error("no instance of the upstream is available")]
    NoInstance,
    /// The last attempt at the upstream failed, retries included: no
    /// connection (502 `upstream-unreachable`), no response head within the
    /// route or per-try timeout (504 `upstream-timeout`), or the exchange
    /// broke (502 `upstream-failed`).
    #[error(transparent)]
    Upstream(UpstreamError),
    /// A required part of an aggregation route failed (502, naming the part).
    #[error("required part {part:?} failed: {failure}")]
    AggregatePart {
        /// The part's name.
        part: Arc<str>,
        /// Why it failed.
        failure: PartFailure,
    },
}

/// Why a part failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartFailure {
    /// No healthy instance whose breaker admits: failed without a network call.
    Unavailable,
    /// Connect error or broken exchange (retry included).
    Unreachable,
    /// No complete answer within the part's timeout.
    Timeout,
    /// A non-2xx answer.
    Status(StatusCode),
    /// A 2xx body that is not JSON.
    InvalidJson,
    /// A body over the part limit ([`MAX_PART_BODY`](crate::composition::aggregate::MAX_PART_BODY)).
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}

impl PartFailure {
    /// The metrics label of this failure.
    pub fn outcome(self) -> PartOutcome {
        match self {
            Self::Unavailable => PartOutcome::Unavailable,
            Self::Unreachable => PartOutcome::Unreachable,
            Self::Timeout => PartOutcome::Timeout,
            Self::Status(_) => PartOutcome::Status,
            Self::InvalidJson => PartOutcome::InvalidJson,
            Self::TooLarge { .. } => PartOutcome::TooLarge,
        }
    }
}

impl fmt::Display for PartFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable => {
                f.write_str("no instance is available (unhealthy or circuit open)")
            }
            Self::Unreachable => f.write_str("the upstream could not be reached"),
            Self::Timeout => f.write_str("it did not answer within its timeout"),
            Self::Status(s) => write!(f, "it answered {}", s.as_u16()),
            Self::InvalidJson => f.write_str("its body is not JSON"),
            Self::TooLarge { limit } => write!(f, "its body exceeds {limit} bytes"),
        }
    }
}

impl ProxyError {
    /// The status the client sees.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadPath(_) | Self::BadRequest(_) | Self::ClientBody(_) | Self::UpgradeRefused => {
                StatusCode::BAD_REQUEST
            }
            Self::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotReady | Self::NoInstance | Self::TunnelLimit => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::BodyTimeout(_) | Self::HeadTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::BadUpgrade(_) => StatusCode::BAD_GATEWAY,
            Self::NoRoute => StatusCode::NOT_FOUND,
            Self::HttpsRedirect(_) => StatusCode::MOVED_PERMANENTLY,
            Self::HttpsRequired | Self::ClientCertificate(MtlsError::NotAllowed) => {
                StatusCode::FORBIDDEN
            }
            Self::Unauthorized(_) | Self::ApiKey(_) | Self::ClientCertificate(_) => {
                StatusCode::UNAUTHORIZED
            }
            Self::IpDenied | Self::CorsRefused => StatusCode::FORBIDDEN,
            Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Upstream(e) if e.is_timeout() => StatusCode::GATEWAY_TIMEOUT,
            Self::Upstream(_) | Self::AggregatePart { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// A short stable name of the failure, for the trace span's `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::BadPath(_) => "bad_path",
            Self::BadRequest(_) => "bad_request",
            Self::HeadersTooLarge { .. } => "headers_too_large",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::ClientBody(_) => "client_body",
            Self::BodyTimeout(_) => "body_timeout",
            Self::HeadTimeout(_) => "head_timeout",
            Self::TunnelLimit => "tunnel_limit",
            Self::BadUpgrade(_) => "bad_upgrade",
            Self::NotReady => "not_ready",
            Self::NoRoute => "no_route",
            Self::HttpsRedirect(_) => "https_redirect",
            Self::HttpsRequired => "https_required",
            Self::Unauthorized(_) => "unauthorized",
            Self::ApiKey(ApiKeyError::Missing) => "api_key_missing",
            Self::ApiKey(ApiKeyError::Invalid) => "api_key_invalid",
            Self::ClientCertificate(MtlsError::Missing) => "client_certificate_missing",
            Self::ClientCertificate(MtlsError::NoSubject) => "client_certificate_unusable",
            Self::ClientCertificate(MtlsError::NotAllowed) => "client_certificate_not_allowed",
            Self::IpDenied => "ip_denied",
            Self::CorsRefused => "cors_refused",
            Self::UpgradeRefused => "upgrade_refused",
            Self::RateLimited(_) => "rate_limited",
            Self::NoInstance => "no_instance",
            Self::Upstream(e) if e.is_connect() => "connect",
            Self::Upstream(e) if e.is_tls() => "tls",
            Self::Upstream(e) if e.is_timeout() => "timeout",
            Self::Upstream(_) => "upstream",
            Self::AggregatePart { .. } => "aggregate_part",
        }
    }

    /// The problem document (static).
    pub fn body(&self) -> &'static str {
        use NormalizeError as N;
        match self {
            Self::BadPath(N::NotOriginForm) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path must start with '/'."
            ),
            Self::BadPath(N::EncodedSlash) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path contains an encoded slash (%2F)."
            ),
            Self::BadPath(N::Backslash) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path contains a backslash."
            ),
            Self::BadPath(N::ControlCharacter) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path contains a NUL or control character."
            ),
            Self::BadPath(N::BadEscape) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path contains a malformed percent-escape."
            ),
            Self::BadPath(N::EncodedDotSegment) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path contains an encoded dot-segment."
            ),
            Self::BadPath(N::EscapesRoot) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path climbs above the root."
            ),
            Self::BadPath(N::Semicolon) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path contains a ';' (path parameters are not accepted)."
            ),
            Self::BadPath(N::DoubleEncoded) => problem!(
                400,
                "bad-path",
                "Bad request path",
                "The request path contains a double-encoded escape (%25 followed by two hex digits)."
            ),
            Self::BadRequest(_) => problem!(
                400,
                "bad-request",
                "Bad request",
                "The request could not be understood."
            ),
            Self::ClientBody(_) => problem!(
                400,
                "bad-request-body",
                "Bad request body",
                "The request body could not be read."
            ),
            Self::HeadTimeout(_) => problem!(
                408,
                "head-timeout",
                "Request timeout",
                "The request head stalled longer than the gateway waits for it."
            ),
            Self::BodyTimeout(_) => problem!(
                408,
                "body-timeout",
                "Request timeout",
                "The request body stalled longer than the gateway waits for it."
            ),
            Self::TunnelLimit => problem!(
                503,
                "tunnel-limit",
                "Service unavailable",
                "The gateway has as many WebSocket tunnels open as it allows; try again later."
            ),
            Self::BadUpgrade(_) => problem!(
                502,
                "upstream-bad-upgrade",
                "Bad gateway",
                "The upstream's 101 answer does not complete the WebSocket handshake."
            ),
            Self::HeadersTooLarge { .. } => problem!(
                431,
                "headers-too-large",
                "Request header fields too large",
                "The request headers exceed the gateway's limit."
            ),
            Self::BodyTooLarge { .. } => problem!(
                413,
                "body-too-large",
                "Content too large",
                "The request body exceeds the gateway's limit."
            ),
            Self::NotReady => problem!(
                503,
                "not-ready",
                "Gateway not ready",
                "The gateway has not loaded a configuration yet."
            ),
            Self::NoRoute => problem!(
                404,
                "no-route",
                "No route",
                "No route matches the request's host, path and method."
            ),
            Self::HttpsRedirect(_) => problem!(
                301,
                "https-redirect",
                "Moved permanently",
                "This route is served over HTTPS only: the same URL in https is in Location."
            ),
            Self::HttpsRequired => problem!(
                403,
                "https-required",
                "Forbidden",
                "This route is served over HTTPS only; send the request again over HTTPS."
            ),
            Self::IpDenied => problem!(
                403,
                "ip-denied",
                "Forbidden",
                "The client address is not allowed on this route."
            ),
            Self::CorsRefused => problem!(
                403,
                "cors-refused",
                "Forbidden",
                "The CORS preflight's origin, method or headers are not allowed on this route."
            ),
            Self::UpgradeRefused => problem!(
                400,
                "upgrade-refused",
                "Upgrade refused",
                "This route does not accept WebSocket upgrades, or the WebSocket handshake is malformed."
            ),
            Self::Unauthorized(AuthError::Missing) => problem!(
                401,
                "unauthorized",
                "Unauthorized",
                "A bearer token is required."
            ),
            Self::Unauthorized(AuthError::Invalid) => problem!(
                401,
                "unauthorized",
                "Unauthorized",
                "The bearer token is invalid or expired."
            ),
            Self::Unauthorized(AuthError::UnknownIssuer) => problem!(
                401,
                "jwt-issuer-unknown",
                "Unknown token issuer",
                "The bearer token's issuer (iss) is not a JWT issuer this gateway knows."
            ),
            Self::Unauthorized(AuthError::IssuerNotAccepted) => problem!(
                401,
                "jwt-issuer-not-accepted",
                "Token issuer not accepted",
                "The bearer token's issuer (iss) is not one this route accepts."
            ),
            Self::Unauthorized(AuthError::NotConfigured) => problem!(
                401,
                "unauthorized",
                "Unauthorized",
                "This route requires a bearer token, and token verification is not configured on this gateway."
            ),
            Self::ApiKey(ApiKeyError::Missing) => problem!(
                401,
                "api-key-missing",
                "Unauthorized",
                "This route requires an API key in the X-API-Key header."
            ),
            Self::ApiKey(ApiKeyError::Invalid) => problem!(
                401,
                "api-key-invalid",
                "Unauthorized",
                "The API key is invalid or has been revoked."
            ),
            Self::ClientCertificate(MtlsError::Missing) => problem!(
                401,
                "client-certificate-required",
                "Unauthorized",
                "This route requires a client certificate, presented over HTTPS."
            ),
            Self::ClientCertificate(MtlsError::NoSubject) => problem!(
                401,
                "client-certificate-unusable",
                "Unauthorized",
                "The client certificate names no subject to identify the caller by."
            ),
            Self::ClientCertificate(MtlsError::NotAllowed) => problem!(
                403,
                "client-certificate-not-allowed",
                "Forbidden",
                "The client certificate is not one this route admits."
            ),
            Self::RateLimited(_) => problem!(
                429,
                "rate-limited",
                "Too many requests",
                "The rate limit for this route was exceeded."
            ),
            Self::NoInstance => problem!(
                503,
                "no-healthy-upstream",
                "Service unavailable",
                "No instance of the upstream is available (unhealthy or circuit open)."
            ),
            Self::Upstream(e) if e.is_connect() || e.is_tls() => problem!(
                502,
                "upstream-unreachable",
                "Bad gateway",
                "The upstream could not be reached."
            ),
            Self::Upstream(e) if e.is_timeout() => problem!(
                504,
                "upstream-timeout",
                "Gateway timeout",
                "The upstream did not answer within the route's timeout."
            ),
            Self::Upstream(_) => problem!(
                502,
                "upstream-failed",
                "Bad gateway",
                "The upstream connection failed before a response was received."
            ),
            // The response itself names the part (see `document`).
            Self::AggregatePart { .. } => problem!(
                502,
                "aggregate-part-failed",
                "Bad gateway",
                "A required part of the aggregation failed."
            ),
        }
    }

    /// The problem document sent: [`body`](Self::body), except that a failed
    /// aggregate part is named (in `detail` and in a `part` member).
    fn document(&self) -> Bytes {
        match self {
            Self::AggregatePart { part, failure } => Bytes::from(format!(
                "{{\"type\":\"{PROBLEM_TYPE_PREFIX}aggregate-part-failed\",\"title\":\"Bad gateway\",\"status\":502,\
                 \"detail\":\"The required part \\\"{part}\\\" failed: {failure}.\",\"part\":\"{part}\"}}"
            )),
            _ => Bytes::from_static(self.body().as_bytes()),
        }
    }

    /// The response: status, problem body, and the headers the status calls for.
    pub fn into_response(self) -> Response<ResponseBody> {
        self.to_response()
    }

    /// [`into_response`](Self::into_response) without consuming the error
    /// (request coalescing hands the same answer to every waiting caller).
    pub fn to_response(&self) -> Response<ResponseBody> {
        let mut resp = Response::new(ResponseBody::full(self.document()));
        *resp.status_mut() = self.status();
        let h = resp.fields_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        match self {
            Self::Unauthorized(
                AuthError::Invalid | AuthError::UnknownIssuer | AuthError::IssuerNotAccepted,
            ) => {
                h.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
            }
            Self::Unauthorized(_) => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // No registered scheme exists for API keys; this names the header to use.
            Self::ApiKey(_) => {
                h.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("ApiKey header=\"X-API-Key\""),
                );
            }
            Self::HttpsRedirect(location) => {
                h.insert(header::LOCATION, location.clone());
            }
            Self::RateLimited(rl) => {
                for (name, value) in &rl.headers {
                    h.append(name.clone(), value.clone());
                }
            }
            Self::HeadersTooLarge { .. } | Self::BodyTooLarge { .. } | Self::ClientBody(_) => {
                // The connection may hold unread bytes of the refused request.
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        resp
    }
}

/// The answer to a head the transport refused before the pipeline saw it
/// (`HttpSettings::refusal`): the same problem documents as every other error.
pub fn refusal(refused: Refusal) -> Response<ResponseBody> {
    match refused {
        Refusal::BadRequest(why) => ProxyError::BadRequest(why),
        Refusal::HeadTooLarge(limit) => ProxyError::HeadersTooLarge { limit },
        Refusal::HeadTimeout(waited) => ProxyError::HeadTimeout(waited),
    }
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_transport::upstream_error::Failure;

    fn all() -> Vec<ProxyError> {
        use NormalizeError as N;
        let mut v: Vec<ProxyError> = [
            N::NotOriginForm,
            N::EncodedSlash,
            N::Backslash,
            N::ControlCharacter,
            N::BadEscape,
            N::EncodedDotSegment,
            N::EscapesRoot,
            N::Semicolon,
            N::DoubleEncoded,
        ]
        .into_iter()
        .map(ProxyError::BadPath)
        .collect();
        v.extend([
            ProxyError::BadRequest("x"),
            ProxyError::HeadersTooLarge { limit: 1 },
            ProxyError::BodyTooLarge { limit: 1 },
            ProxyError::NotReady,
            ProxyError::NoRoute,
            ProxyError::IpDenied,
            ProxyError::CorsRefused,
            ProxyError::UpgradeRefused,
            ProxyError::Unauthorized(AuthError::Missing),
            ProxyError::Unauthorized(AuthError::Invalid),
            ProxyError::Unauthorized(AuthError::NotConfigured),
            ProxyError::Unauthorized(AuthError::UnknownIssuer),
            ProxyError::Unauthorized(AuthError::IssuerNotAccepted),
            ProxyError::ApiKey(ApiKeyError::Missing),
            ProxyError::ApiKey(ApiKeyError::Invalid),
            ProxyError::ClientCertificate(MtlsError::Missing),
            ProxyError::ClientCertificate(MtlsError::NoSubject),
            ProxyError::ClientCertificate(MtlsError::NotAllowed),
            ProxyError::RateLimited(RateLimited::new("api", 20, 60, 0, 7)),
            ProxyError::NoInstance,
            ProxyError::Upstream(UpstreamError::timeout(Duration::from_secs(1))),
            ProxyError::Upstream(UpstreamError::not_sent(Failure::ConnectTimeout {
                authority: "127.0.0.1:1".into(),
            })),
            ProxyError::Upstream(UpstreamError::sent(Failure::Closed)),
            ProxyError::BodyTimeout(Duration::from_secs(1)),
            ProxyError::HeadTimeout(Duration::from_secs(1)),
            ProxyError::TunnelLimit,
            ProxyError::BadUpgrade("x"),
            ProxyError::AggregatePart {
                part: "users".into(),
                failure: PartFailure::Timeout,
            },
        ]);
        v
    }

    #[test]
    fn the_one_upstream_error_answers_by_what_failed() {
        let slug = |e: UpstreamError| {
            let e = ProxyError::Upstream(e);
            let doc: serde_json::Value = serde_json::from_str(e.body()).unwrap();
            (
                e.status().as_u16(),
                e.kind(),
                doc["type"].as_str().unwrap().to_owned(),
            )
        };
        let refused = UpstreamError::not_sent(Failure::Connect {
            authority: "127.0.0.1:1".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        });
        assert_eq!(
            slug(refused),
            (
                502,
                "connect",
                "urn:gateway:problem:upstream-unreachable".into()
            )
        );
        assert_eq!(
            slug(UpstreamError::timeout(Duration::from_secs(3))),
            (
                504,
                "timeout",
                "urn:gateway:problem:upstream-timeout".into()
            )
        );
        // A fresh connection that died before the request was written, and a
        // broken exchange, are failures of the connection, not of connecting.
        for e in [
            UpstreamError::not_sent(Failure::Closed),
            UpstreamError::sent(Failure::Invalid("x")),
        ] {
            assert_eq!(
                slug(e),
                (
                    502,
                    "upstream",
                    "urn:gateway:problem:upstream-failed".into()
                )
            );
        }
    }

    #[test]
    fn a_failed_required_part_is_named_in_the_problem() {
        let e = ProxyError::AggregatePart {
            part: "orders".into(),
            failure: PartFailure::Status(StatusCode::INTERNAL_SERVER_ERROR),
        };
        assert_eq!(e.kind(), "aggregate_part");
        let doc: serde_json::Value = serde_json::from_slice(&e.document()).unwrap();
        assert_eq!(doc["type"], "urn:gateway:problem:aggregate-part-failed");
        assert_eq!(doc["status"], 502);
        assert_eq!(doc["part"], "orders");
        assert_eq!(
            doc["detail"],
            "The required part \"orders\" failed: it answered 500."
        );
        assert_eq!(e.to_response().status(), StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn every_body_is_valid_problem_json_matching_the_status() {
        for e in all() {
            let status = e.status();
            let doc: serde_json::Value = serde_json::from_str(e.body())
                .unwrap_or_else(|err| panic!("{e:?}: {err}: {}", e.body()));
            assert_eq!(doc["status"], status.as_u16(), "{e:?}");
            assert!(
                doc["type"]
                    .as_str()
                    .unwrap()
                    .starts_with(PROBLEM_TYPE_PREFIX)
            );
            assert!(!doc["title"].as_str().unwrap().is_empty());
            assert!(!doc["detail"].as_str().unwrap().is_empty());
            let resp = e.into_response();
            assert_eq!(resp.status(), status);
            assert_eq!(resp.fields().get_str("content-type"), Some(PROBLEM_JSON));
        }
    }

    #[test]
    fn auth_and_rate_limit_headers() {
        let r = ProxyError::Unauthorized(AuthError::Missing).into_response();
        assert_eq!(r.fields().get_str("www-authenticate"), Some("Bearer"));
        for (e, slug) in [
            (ApiKeyError::Missing, "api-key-missing"),
            (ApiKeyError::Invalid, "api-key-invalid"),
        ] {
            let r = ProxyError::ApiKey(e).into_response();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            assert_eq!(
                r.fields().get_str("www-authenticate"),
                Some("ApiKey header=\"X-API-Key\"")
            );
            let doc: serde_json::Value =
                serde_json::from_str(ProxyError::ApiKey(e).body()).unwrap();
            assert_eq!(doc["type"], format!("urn:gateway:problem:{slug}"));
        }
        let r = ProxyError::RateLimited(RateLimited::new("api", 20, 60, 0, 7)).into_response();
        let r = r.into_http();
        let h = r.headers();
        assert_eq!(h[header::RETRY_AFTER], "7");
        assert_eq!(h["x-ratelimit-limit"], "20");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["ratelimit-policy"], "\"api\";q=20;w=60");
        assert_eq!(h["ratelimit"], "\"api\";r=0;t=7");
    }
}
