//! The one place that maps failures to HTTP status codes and `application/problem+json` bodies
//! (RFC 9457).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use serde::Serialize;

/// Base of the stable `type` URIs of problem documents.
pub const PROBLEM_TYPE_BASE: &str = "urn:gateway:problem:";

/// A failure the client sees.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Unparseable, incomplete or oversized request.
    #[error("{0}")]
    BadRequest(String),
    /// Wrong user name or password (deliberately indistinguishable).
    #[error("invalid user name or password")]
    InvalidCredentials,
    /// The failed-login throttle refuses the attempt (per user name or per client address;
    /// deliberately not saying which).
    #[error(
        "too many failed logins for this user name or from this address; retry in {} s",
        retry_after.as_secs()
    )]
    TooManyFailedLogins {
        /// When the blocking window ends (`Retry-After`).
        retry_after: std::time::Duration,
    },
    /// Unknown, consumed, revoked or expired refresh token (deliberately indistinguishable).
    #[error("the refresh token is invalid, expired or revoked")]
    InvalidRefreshToken,
    /// No such endpoint.
    #[error("no such endpoint")]
    NotFound,
    /// Known endpoint, wrong method.
    #[error("method not allowed; use {0}")]
    MethodNotAllowed(&'static str),
    /// A dependency (Redis, SQLite) is unavailable.
    #[error("{0}")]
    Unavailable(String),
    /// A bug or a broken key: logged in full, reported vaguely.
    #[error("internal error")]
    Internal(String),
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    type_: String,
    title: &'a str,
    status: u16,
    detail: String,
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            Self::InvalidCredentials => (
                StatusCode::UNAUTHORIZED,
                "invalid-credentials",
                "Invalid credentials",
            ),
            Self::TooManyFailedLogins { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-failed-logins",
                "Too many failed logins",
            ),
            Self::InvalidRefreshToken => (
                StatusCode::UNAUTHORIZED,
                "invalid-refresh-token",
                "Invalid refresh token",
            ),
            Self::NotFound => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            Self::MethodNotAllowed(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            Self::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
            ),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// Renders the problem+json response.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let (status, slug, title) = self.parts();
        match &self {
            Self::Internal(cause) => tracing::error!(%cause, "internal error"),
            Self::Unavailable(cause) => tracing::warn!(%cause, "dependency unavailable"),
            _ => {}
        }
        let body = serde_json::to_vec(&Problem {
            type_: format!("{PROBLEM_TYPE_BASE}{slug}"),
            title,
            status: status.as_u16(),
            detail: self.to_string(),
        })
        .expect("problem serialises");
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Self::MethodNotAllowed(allow) = self {
            h.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Self::TooManyFailedLogins { retry_after } = self {
            h.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after.as_secs()),
            );
        }
        resp
    }
}

impl From<crate::refresh::RefreshError> for ApiError {
    fn from(e: crate::refresh::RefreshError) -> Self {
        match e {
            crate::refresh::RefreshError::Redis(e) => {
                Self::Unavailable(format!("token store: {e}"))
            }
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<crate::throttle::ThrottleError> for ApiError {
    fn from(e: crate::throttle::ThrottleError) -> Self {
        match e {
            // Fail closed: the login could not finish without Redis anyway.
            crate::throttle::ThrottleError::Redis(e) => {
                Self::Unavailable(format!("login throttle: {e}"))
            }
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<crate::users::UserError> for ApiError {
    fn from(e: crate::users::UserError) -> Self {
        match e {
            crate::users::UserError::Db(e) => Self::Unavailable(format!("user database: {e}")),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<crate::tokens::SignError> for ApiError {
    fn from(e: crate::tokens::SignError) -> Self {
        Self::Internal(e.to_string())
    }
}
