//! Per-route CORS (`Route.cors`), compiled once per snapshot: the origin
//! list, and every response header value built ahead of time, so a request
//! costs a header lookup and a few comparisons.
//!
//! * A **preflight** (`OPTIONS` with `Origin` and
//!   `Access-Control-Request-Method`) is answered by the gateway: 204 with the
//!   `Access-Control-*` headers, or a refusal (403 problem+json) when the
//!   origin, method or any requested header is not allowed. It is routed by the
//!   method it asks about (see [`preflight_method`]), so a route whose
//!   `methods` omit OPTIONS still gets its preflights.
//! * An **actual request** from an allowed origin gets
//!   `Access-Control-Allow-Origin` (the origin itself, or `*` for an any-origin
//!   policy without credentials), `-Allow-Credentials` and `-Expose-Headers`
//!   on whatever response it gets (errors included, so scripts can read a 401
//!   or 429). From any other origin it is proxied unchanged: the browser, not
//!   the gateway, withholds the response.
//! * Every response of a CORS route carries `Vary: Origin` (caches must not
//!   hand one origin's answer to another).

use gateway_proto::v1;
use http::header::{self, HeaderMap, HeaderName, HeaderValue, InvalidHeaderValue};
use http::{Method, StatusCode};

use gateway_transport::body::ResponseBody;
use gateway_transport::response::Response;

/// Methods allowed when `allow_methods` is empty (the CORS-safelisted ones).
const DEFAULT_METHODS: &str = "GET, HEAD, POST";

/// A compiled CORS policy.
#[derive(Debug, Clone)]
pub struct CorsPolicy {
    /// `allow_origins` was `["*"]`.
    any_origin: bool,
    origins: Box<[Box<str>]>,
    methods: Box<[Method]>,
    methods_value: HeaderValue,
    headers: Box<[HeaderName]>,
    headers_value: Option<HeaderValue>,
    expose_value: Option<HeaderValue>,
    credentials: bool,
    max_age: Option<HeaderValue>,
}

/// A setting the HTTP library does not accept (validation refuses it first).
#[derive(Debug, thiserror::Error)]
pub enum CorsError {
    /// A bad method.
    #[error("method {0:?} is not a valid HTTP method")]
    Method(String),
    /// A bad header name.
    #[error("{0:?} is not a valid header name")]
    Header(String),
    /// A list that does not make a header value.
    #[error(transparent)]
    Value(#[from] InvalidHeaderValue),
}

/// What the CORS stage decided for a request.
#[derive(Debug)]
pub enum Cors {
    /// Not a preflight; `Some(origin)` when it comes from an allowed origin
    /// (the value for `Access-Control-Allow-Origin`).
    Actual(Option<HeaderValue>),
    /// A preflight the gateway answers with this 204.
    Preflight(Response<ResponseBody>),
    /// A preflight that is refused (403).
    Refused,
}

static ORIGIN: HeaderName = header::ORIGIN;
static VARY_ORIGIN: HeaderValue = HeaderValue::from_static("origin");
static ANY: HeaderValue = HeaderValue::from_static("*");
static TRUE: HeaderValue = HeaderValue::from_static("true");

/// The method a preflight asks about, when `headers` and `method` make a
/// preflight (OPTIONS with `Origin` and a valid `Access-Control-Request-Method`).
pub fn preflight_method(method: &Method, headers: &HeaderMap) -> Option<Method> {
    if method != Method::OPTIONS || !headers.contains_key(&ORIGIN) {
        return None;
    }
    let asked = headers.get(header::ACCESS_CONTROL_REQUEST_METHOD)?;
    Method::from_bytes(asked.as_bytes()).ok()
}

impl CorsPolicy {
    /// Compiles a route's settings (`None`: no CORS on the route).
    pub fn compile(c: Option<&v1::Cors>) -> Result<Option<Self>, CorsError> {
        let Some(c) = c else { return Ok(None) };
        let methods = c
            .allow_methods
            .iter()
            .map(|m| Method::from_bytes(m.as_bytes()).map_err(|_| CorsError::Method(m.clone())))
            .collect::<Result<Box<[Method]>, _>>()?;
        let methods_value = if methods.is_empty() {
            HeaderValue::from_static(DEFAULT_METHODS)
        } else {
            HeaderValue::from_str(&c.allow_methods.join(", "))?
        };
        let names = |list: &[String]| {
            list.iter()
                .map(|h| {
                    HeaderName::from_bytes(h.as_bytes()).map_err(|_| CorsError::Header(h.clone()))
                })
                .collect::<Result<Box<[HeaderName]>, _>>()
        };
        let joined = |list: &[HeaderName]| {
            (!list.is_empty())
                .then(|| {
                    let s: Vec<&str> = list.iter().map(HeaderName::as_str).collect();
                    HeaderValue::from_str(&s.join(", "))
                })
                .transpose()
        };
        let headers = names(&c.allow_headers)?;
        let expose = names(&c.expose_headers)?;
        Ok(Some(Self {
            any_origin: c.allow_origins.iter().any(|o| o == "*"),
            origins: c.allow_origins.iter().map(|o| o.as_str().into()).collect(),
            methods_value,
            headers_value: joined(&headers)?,
            expose_value: joined(&expose)?,
            methods,
            headers,
            credentials: c.allow_credentials,
            max_age: (c.max_age_seconds > 0).then(|| HeaderValue::from(c.max_age_seconds)),
        }))
    }

    /// The `Access-Control-Allow-Origin` value for a request's `Origin`, if allowed.
    fn allow_origin(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        if self.any_origin {
            return Some(if self.credentials {
                origin.clone()
            } else {
                ANY.clone()
            });
        }
        let o = origin.as_bytes();
        self.origins
            .iter()
            .any(|allowed| allowed.as_bytes() == o)
            .then(|| origin.clone())
    }

    fn method_allowed(&self, m: &Method) -> bool {
        if self.methods.is_empty() {
            matches!(*m, Method::GET | Method::HEAD | Method::POST)
        } else {
            self.methods.contains(m)
        }
    }

    /// Whether every header a preflight asks for (comma-separated) is allowed.
    fn headers_allowed(&self, asked: Option<&HeaderValue>) -> bool {
        let Some(asked) = asked else { return true };
        let Ok(asked) = asked.to_str() else {
            return false;
        };
        asked
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .all(|h| {
                self.headers
                    .iter()
                    .any(|a| a.as_str().eq_ignore_ascii_case(h))
            })
    }

    /// The CORS stage: answers or refuses a preflight, or notes an actual
    /// request's allowed origin.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Cors {
        let origin = headers.get(&ORIGIN);
        let allowed = origin.and_then(|o| self.allow_origin(o));
        let Some(asked) = preflight_method(method, headers) else {
            return Cors::Actual(allowed);
        };
        let Some(allowed) = allowed else {
            return Cors::Refused;
        };
        let requested = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS);
        if !self.method_allowed(&asked) || !self.headers_allowed(requested) {
            return Cors::Refused;
        }
        let mut resp = Response::new(ResponseBody::empty());
        *resp.status_mut() = StatusCode::NO_CONTENT;
        let h = resp.fields_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            self.methods_value.clone(),
        );
        if let Some(v) = &self.headers_value {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
        }
        if self.credentials {
            h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE.clone());
        }
        if let Some(v) = &self.max_age {
            h.insert(header::ACCESS_CONTROL_MAX_AGE, v.clone());
        }
        h.append(header::VARY, VARY_ORIGIN.clone());
        Cors::Preflight(resp)
    }

    /// Adds the headers of an actual request's response: `Vary: Origin`
    /// always, the `Access-Control-*` ones when the origin is allowed
    /// (replacing any the upstream sent).
    pub fn decorate(&self, headers: &mut HeaderMap, allowed: Option<&HeaderValue>) {
        headers.append(header::VARY, VARY_ORIGIN.clone());
        let Some(origin) = allowed else { return };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        if self.credentials {
            headers.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE.clone());
        }
        if let Some(v) = &self.expose_value {
            headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
        }
    }
}

#[cfg(test)]
mod tests;
