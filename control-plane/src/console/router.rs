//! From a request to an answer: the static stylesheet and the sign-in form
//! are open; everything else needs a session; every POST needs the session's
//! CSRF token (403 without, before the action is looked at). Every answer
//! carries the same security headers ([`finish`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::Full;
use std::net::IpAddr;

use crate::console::pages;
use crate::console::session::{self, Session};
use crate::console::{Console, csrf, html};

/// No script, no frame, no plugin; styles, images and form targets from the
/// console itself only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The embedded stylesheet, served at `/static/console.css`.
const STYLESHEET: &str = include_str!("console.css");

/// The embedded icon, served at `/static/favicon.svg` (and `/favicon.ico`,
/// which browsers ask for by themselves).
const FAVICON: &str = include_str!("favicon.svg");

/// A request as the pages see it: the form fields already decoded.
#[derive(Debug)]
pub struct Req {
    /// Method.
    pub method: Method,
    /// Path, without the query.
    pub path: String,
    /// Query parameters, decoded.
    pub query: Vec<(String, String)>,
    /// Headers.
    pub headers: HeaderMap,
    /// `application/x-www-form-urlencoded` body fields, decoded (POST).
    pub form: Vec<(String, String)>,
    /// The client's address (the sign-in throttle's key).
    pub peer: IpAddr,
}

fn lookup<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

impl Req {
    /// Query parameter `name`.
    pub fn query(&self, name: &str) -> Option<&str> {
        lookup(&self.query, name)
    }

    /// Form field `name`.
    pub fn form(&self, name: &str) -> Option<&str> {
        lookup(&self.form, name)
    }
}

/// What a handler answers, before the security headers.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Extra headers (`Location`, `Set-Cookie`).
    pub headers: Vec<(header::HeaderName, String)>,
    /// Body.
    pub body: Bytes,
}

impl Answer {
    /// An HTML page.
    pub fn html(status: StatusCode, body: String) -> Answer {
        Answer {
            status,
            content_type: "text/html; charset=utf-8",
            headers: Vec::new(),
            body: Bytes::from(body),
        }
    }

    /// A 303 to `location` (after a form was handled, and to the sign-in page).
    pub fn see_other(location: &str) -> Answer {
        Answer {
            status: StatusCode::SEE_OTHER,
            content_type: "text/plain; charset=utf-8",
            headers: vec![(header::LOCATION, location.to_owned())],
            body: Bytes::new(),
        }
    }

    /// A short page saying `message` (errors, refusals).
    pub fn message(status: StatusCode, title: &str, message: &str) -> Answer {
        let body = format!(
            "<main class=\"narrow\"><h1>{}</h1><p class=\"error\">{}</p>\
             <p><a href=\"/overview\">Back to the console</a></p></main>",
            html::escape(title),
            html::escape(message)
        );
        Answer::html(status, html::document(title, &body))
    }

    /// The same answer, also setting `cookie`.
    pub fn with_cookie(mut self, cookie: String) -> Answer {
        self.headers.push((header::SET_COOKIE, cookie));
        self
    }
}

/// Answers `req`.
pub async fn handle(console: &Console, req: Req) -> Response<Full<Bytes>> {
    let answer = route(console, &req).await;
    finish(answer, console.tls)
}

async fn route(c: &Console, req: &Req) -> Answer {
    let get = req.method == Method::GET || req.method == Method::HEAD;
    let post = req.method == Method::POST;
    match req.path.as_str() {
        "/static/console.css" if get => {
            return Answer {
                status: StatusCode::OK,
                content_type: "text/css; charset=utf-8",
                headers: vec![(header::CACHE_CONTROL, "max-age=300".into())],
                body: Bytes::from_static(STYLESHEET.as_bytes()),
            };
        }
        "/static/favicon.svg" | "/favicon.ico" if get => {
            return Answer {
                status: StatusCode::OK,
                content_type: "image/svg+xml",
                headers: vec![(header::CACHE_CONTROL, "max-age=86400".into())],
                body: Bytes::from_static(FAVICON.as_bytes()),
            };
        }
        "/signin" if get => return pages::signin::form(c, req),
        "/signin" if post => return pages::signin::submit(c, req),
        _ => {}
    }
    let Some((id, session)) = signed_in(c, req) else {
        return if get {
            Answer::see_other("/signin")
        } else {
            Answer::message(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "Sign in first; this form has expired.",
            )
        };
    };
    if post && !csrf::matches(&session.csrf, req.form(csrf::FIELD)) {
        return Answer::message(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "The form's CSRF token is missing or wrong. Reload the page and try again.",
        );
    }
    let path = req.path.as_str();
    match (get, post, path) {
        (true, _, "/") => Answer::see_other("/overview"),
        (true, _, "/overview") => pages::overview::render(c, &session).await,
        (true, _, "/config") => pages::config::render(c, &session).await,
        (true, _, "/health") => pages::health::render(c, &session).await,
        (true, _, "/versions") => pages::versions::render(c, &session, req).await,
        (true, _, "/versions/rollback") => pages::versions::confirm(c, &session, req).await,
        (_, true, "/versions/rollback") => pages::versions::rollback(c, &session, req).await,
        (true, _, "/api-keys") => pages::api_keys::render(c, &session).await,
        (_, true, "/api-keys") => pages::api_keys::create(c, &session, req).await,
        (_, true, "/api-keys/revoke") => pages::api_keys::revoke(c, &session, req).await,
        (true, _, "/certificates") => pages::certificates::render(c, &session).await,
        (_, true, "/signout") => {
            c.sessions.remove(id);
            Answer::see_other("/signin").with_cookie(session::clear_cookie(session::COOKIE, c.tls))
        }
        (
            _,
            _,
            "/" | "/overview" | "/config" | "/health" | "/versions" | "/versions/rollback"
            | "/api-keys" | "/api-keys/revoke" | "/certificates" | "/signout",
        ) => Answer::message(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            "This address does not take that method.",
        ),
        _ => Answer::message(StatusCode::NOT_FOUND, "Not found", "No such page."),
    }
}

/// The session of the request's cookie, if it is live.
fn signed_in<'r>(c: &Console, req: &'r Req) -> Option<(&'r str, Session)> {
    let id = session::cookie(&req.headers, session::COOKIE)?;
    c.sessions.get(id).map(|s| (id, s))
}

/// The response with the headers every answer carries: the CSP, no sniffing,
/// no framing, no referrer, no caching (pages show live state and, once, new
/// API keys), and HSTS over TLS.
pub fn finish(answer: Answer, tls: bool) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(answer.body));
    *response.status_mut() = answer.status;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(answer.content_type),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if tls {
        h.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    for (name, value) in answer.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            if name == header::CACHE_CONTROL {
                h.insert(name, v);
            } else {
                h.append(name, v);
            }
        }
    }
    response
}

/// The page for a refused AdminService call: its status and message.
pub fn status_answer(status: &tonic::Status) -> Answer {
    let (code, title) = match status.code() {
        tonic::Code::PermissionDenied => (StatusCode::FORBIDDEN, "Not allowed"),
        tonic::Code::FailedPrecondition => (StatusCode::CONFLICT, "Refused"),
        tonic::Code::InvalidArgument => (StatusCode::BAD_REQUEST, "Invalid"),
        tonic::Code::NotFound => (StatusCode::NOT_FOUND, "Not found"),
        tonic::Code::AlreadyExists => (StatusCode::CONFLICT, "Already exists"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "Error"),
    };
    Answer::message(code, title, status.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_carries_the_security_headers_and_hsts_only_over_tls() {
        let plain = finish(Answer::see_other("/signin"), false);
        let h = plain.headers();
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
        assert_eq!(h[header::LOCATION], "/signin");
        assert!(h.get(header::STRICT_TRANSPORT_SECURITY).is_none());
        let tls = finish(
            Answer::message(StatusCode::FORBIDDEN, "No", "<b>x</b>").with_cookie("a=b".into()),
            true,
        );
        assert_eq!(tls.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            tls.headers()[header::STRICT_TRANSPORT_SECURITY],
            "max-age=31536000"
        );
        assert_eq!(tls.headers()[header::SET_COOKIE], "a=b");
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
    }

    #[test]
    fn refused_calls_map_to_statuses() {
        for (status, code) in [
            (tonic::Status::permission_denied("x"), StatusCode::FORBIDDEN),
            (
                tonic::Status::failed_precondition("expected version 1, current is 2"),
                StatusCode::CONFLICT,
            ),
            (
                tonic::Status::invalid_argument("x"),
                StatusCode::BAD_REQUEST,
            ),
            (tonic::Status::not_found("x"), StatusCode::NOT_FOUND),
            (
                tonic::Status::internal("x"),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ] {
            assert_eq!(status_answer(&status).status, code, "{status:?}");
        }
        let body = status_answer(&tonic::Status::invalid_argument("<script>")).body;
        assert!(!String::from_utf8_lossy(&body).contains("<script>"));
    }
}
