//! The gateway's own answers to a gRPC call ([`crate::policy::grpc`]): a
//! gRPC status instead of a problem document.
//!
//! gRPC clients read the outcome of a call from `grpc-status`, not from the
//! HTTP status, so every refusal or failure is a "Trailers-Only" response:
//! HTTP 200, `content-type: application/grpc`, `grpc-status` and a
//! percent-encoded `grpc-message` in the one header block that ends the
//! stream. The code follows what failed (docs/errors.md, "gRPC calls"): an
//! open breaker or no instance is `UNAVAILABLE`, a timeout
//! `DEADLINE_EXCEEDED`, a 401 `UNAUTHENTICATED`, a 429 `RESOURCE_EXHAUSTED`.

use gateway_transport::body::ResponseBody;
use gateway_transport::response::Response;
use http::StatusCode;
use http::header::{self, HeaderName, HeaderValue};

use super::ProxyError;

/// `grpc-status` of the answer.
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message` of the answer.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// gRPC status codes the gateway answers with (the numbering of
/// `google.rpc.Code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    /// The deadline passed before the call completed.
    DeadlineExceeded = 4,
    /// The caller may not make this call.
    PermissionDenied = 7,
    /// A quota or a size limit was exceeded.
    ResourceExhausted = 8,
    /// The method is not served.
    Unimplemented = 12,
    /// The request could not be processed.
    Internal = 13,
    /// The service cannot be reached now; retrying may succeed.
    Unavailable = 14,
    /// No valid credentials.
    Unauthenticated = 16,
}

impl Code {
    /// The code of `e`.
    pub fn of(e: &ProxyError) -> Self {
        match e {
            ProxyError::Unauthorized(_)
            | ProxyError::ApiKey(_)
            | ProxyError::ClientCertificate(_) => Self::Unauthenticated,
            ProxyError::RateLimited(_)
            | ProxyError::BodyTooLarge { .. }
            | ProxyError::HeadersTooLarge { .. } => Self::ResourceExhausted,
            ProxyError::Upstream(u) if u.is_timeout() => Self::DeadlineExceeded,
            ProxyError::HeadTimeout(_) | ProxyError::BodyTimeout(_) => Self::DeadlineExceeded,
            ProxyError::NoRoute => Self::Unimplemented,
            ProxyError::IpDenied
            | ProxyError::CorsRefused
            | ProxyError::HttpsRedirect(_)
            | ProxyError::HttpsRequired => Self::PermissionDenied,
            ProxyError::NoInstance
            | ProxyError::NotReady
            | ProxyError::TunnelLimit
            | ProxyError::Upstream(_)
            | ProxyError::AggregatePart { .. }
            | ProxyError::BadUpgrade(_) => Self::Unavailable,
            ProxyError::BadPath(_)
            | ProxyError::BadRequest(_)
            | ProxyError::ClientBody(_)
            | ProxyError::UpgradeRefused => Self::Internal,
        }
    }

    fn header_value(self) -> HeaderValue {
        HeaderValue::from(u16::from(self as u8))
    }
}

/// The Trailers-Only answer to a gRPC call the gateway refused or could not
/// complete: [`Code::of`] the error, its message, and the rate limiter's
/// and authentication's fields as on any other answer.
pub fn response(e: &ProxyError) -> Response<ResponseBody> {
    let mut resp = e.to_response();
    *resp.status_mut() = StatusCode::OK;
    *resp.body_mut() = ResponseBody::empty();
    let h = resp.fields_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(GRPC_STATUS.clone(), Code::of(e).header_value());
    if let Ok(message) = HeaderValue::from_str(&percent_encode(&e.to_string())) {
        h.insert(GRPC_MESSAGE.clone(), message);
    }
    resp.fields_mut().map_mut().remove(header::CONNECTION);
    resp
}

/// `grpc-message` encoding: printable ASCII but `%` as it is, every other
/// byte of the UTF-8 as `%XX`.
fn percent_encode(message: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::hooks::{AuthError, RateLimited};
    use gateway_transport::upstream_error::{Failure, UpstreamError};
    use http_body::Body as _;
    use std::time::Duration;

    #[test]
    fn the_issue_s_mappings_and_a_trailers_only_answer() {
        let cases = [
            (ProxyError::NoInstance, 14),
            (
                ProxyError::Upstream(UpstreamError::timeout(Duration::from_secs(1))),
                4,
            ),
            (ProxyError::Unauthorized(AuthError::Missing), 16),
            (
                ProxyError::RateLimited(RateLimited {
                    headers: http::HeaderMap::new(),
                }),
                8,
            ),
            (ProxyError::NoRoute, 12),
            (
                ProxyError::Upstream(UpstreamError::not_sent(Failure::Closed)),
                14,
            ),
        ];
        for (e, code) in cases {
            let resp = response(&e);
            assert_eq!(resp.status(), StatusCode::OK);
            let f = resp.fields();
            assert_eq!(
                f.get("grpc-status").unwrap(),
                code.to_string().as_bytes(),
                "{e:?}"
            );
            assert_eq!(f.get("content-type").unwrap(), b"application/grpc", "{e:?}");
            assert!(f.get("grpc-message").is_some());
            assert!(resp.body().is_end_stream(), "no body: trailers-only");
        }
        // The 401's challenge is kept.
        let resp = response(&ProxyError::Unauthorized(AuthError::Missing));
        assert!(resp.fields().get("www-authenticate").is_some());
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(percent_encode("rate limit 100%"), "rate limit 100%25");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }
}
