//! The one error of an exchange with an upstream instance.
//!
//! [`UpstreamError`] says what failed ([`Failure`]), on which side
//! ([`Side`]: the upstream, or the client whose body was being forwarded),
//! whether any of the request was written (so whether it may have reached the
//! instance), and whether its connection had served earlier requests. From
//! those, [`UpstreamError::never_reached`] is what a retry policy needs: a
//! request that never reached the instance can go to another one whatever its
//! method. A failed send hands the request back with the error when nothing of
//! it was consumed ([`SendError`]), so it can be sent again without a copy.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::Request;

use crate::body::{RequestBody, RequestBodyError};

/// What failed.
#[derive(Debug)]
pub enum Failure {
    /// TCP connect failed (refused, unreachable).
    Connect {
        /// host:port of the instance.
        authority: Arc<str>,
        /// The cause.
        source: io::Error,
    },
    /// TCP connect did not finish within the connect timeout.
    ConnectTimeout {
        /// host:port of the instance.
        authority: Arc<str>,
    },
    /// The TLS handshake with an https:// instance failed (its certificate
    /// not trusted or not for its name, no common protocol, the instance
    /// wanting a client certificate it did not get), or did not finish within
    /// the connect timeout. Nothing of the request was sent.
    Tls {
        /// host:port of the instance.
        authority: Arc<str>,
        /// The cause.
        source: io::Error,
    },
    /// Reading from or writing to the upstream connection failed.
    Io(io::Error),
    /// The upstream closed the connection before its response was complete.
    Closed,
    /// The upstream's response is not valid HTTP/1.1 (or exceeds a limit).
    Invalid(&'static str),
    /// The request body did not match its own `Content-Length`.
    BodyLength,
    /// The client's request body could not be read to forward it.
    ClientBody(RequestBodyError),
    /// No response head within the time allowed (the caller's deadline).
    Timeout(Duration),
    /// The HTTP/2 exchange with an `HTTP2` upstream failed (the connection's
    /// handshake, the stream reset, or the connection gone away).
    Http2(hyper::Error),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect { authority, .. } => write!(f, "connecting to {authority} failed"),
            Self::ConnectTimeout { authority } => write!(f, "connecting to {authority} timed out"),
            Self::Tls { authority, source } => {
                write!(f, "the TLS handshake with {authority} failed: {source}")
            }
            Self::Io(_) => f.write_str("upstream connection I/O failed"),
            Self::Closed => {
                f.write_str("the upstream closed the connection before the response was complete")
            }
            Self::Invalid(why) => write!(f, "the upstream sent an invalid response: {why}"),
            Self::BodyLength => f.write_str("the request body does not match its content-length"),
            Self::ClientBody(_) => f.write_str("the request body could not be forwarded"),
            Self::Timeout(d) => write!(f, "the upstream did not answer within {d:?}"),
            Self::Http2(e) => write!(f, "the HTTP/2 exchange with the upstream failed: {e}"),
        }
    }
}

/// Which side of the exchange is to blame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The upstream instance (or the network to it).
    Upstream,
    /// The client, whose request body failed while it was being forwarded.
    Client,
}

/// Why an exchange with an upstream instance failed.
#[derive(Debug)]
pub struct UpstreamError {
    failure: Failure,
    reached: bool,
    reused: bool,
}

impl UpstreamError {
    /// A failure before any byte of the request was written.
    pub fn not_sent(failure: Failure) -> Self {
        Self {
            failure,
            reached: false,
            reused: false,
        }
    }

    /// A failure after (part of) the request was written: it may have
    /// reached the instance.
    pub fn sent(failure: Failure) -> Self {
        Self {
            failure,
            reached: true,
            reused: false,
        }
    }

    /// No response head within `waited`; the request may have reached the instance.
    pub fn timeout(waited: Duration) -> Self {
        Self::sent(Failure::Timeout(waited))
    }

    /// The same error, marked as on a connection that had served earlier
    /// requests (a stale keep-alive connection rather than a broken instance).
    pub fn on_reused(mut self, reused: bool) -> Self {
        self.reused = reused;
        self
    }

    /// What failed.
    pub fn failure(&self) -> &Failure {
        &self.failure
    }

    /// Which side is to blame.
    pub fn side(&self) -> Side {
        match self.failure {
            Failure::ClientBody(_) => Side::Client,
            _ => Side::Upstream,
        }
    }

    /// Whether the request certainly never reached the instance (nothing of
    /// it was written): sending it elsewhere is safe whatever its method.
    pub fn never_reached(&self) -> bool {
        !self.reached
    }

    /// Whether the connection had served earlier requests.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Whether no connection could be made (connect failed or timed out).
    pub fn is_connect(&self) -> bool {
        matches!(
            self.failure,
            Failure::Connect { .. } | Failure::ConnectTimeout { .. }
        )
    }

    /// Whether the TLS handshake with the instance failed.
    pub fn is_tls(&self) -> bool {
        matches!(self.failure, Failure::Tls { .. })
    }

    /// Whether the time allowed for the response head ran out.
    pub fn is_timeout(&self) -> bool {
        matches!(self.failure, Failure::Timeout(_))
    }

    /// The error, for the client's body that failed ([`Side::Client`]).
    pub fn into_client_body(self) -> Result<RequestBodyError, Self> {
        match self.failure {
            Failure::ClientBody(e) => Ok(e),
            _ => Err(self),
        }
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.failure.fmt(f)
    }
}

impl std::error::Error for UpstreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.failure {
            Failure::Connect { source, .. } | Failure::Io(source) => Some(source),
            Failure::ClientBody(e) => Some(e),
            Failure::Http2(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Failure> for UpstreamError {
    /// A failure of a response body: the request was sent.
    fn from(failure: Failure) -> Self {
        Self::sent(failure)
    }
}

/// A failed send: the error, and the request when nothing of it was consumed
/// (never sent, or sent without a body), for another attempt.
#[derive(Debug)]
pub struct SendError {
    /// Why it failed.
    pub error: UpstreamError,
    /// The request, when it can be sent again as it is.
    pub request: Option<Box<Request<RequestBody>>>,
}

impl SendError {
    /// Nothing was written: the request comes back untouched.
    pub fn not_sent(request: Box<Request<RequestBody>>, failure: Failure) -> Self {
        Self {
            error: UpstreamError::not_sent(failure),
            request: Some(request),
        }
    }

    /// (Part of) the request was written; `request` comes back when it had no body.
    pub fn sent(failure: Failure, request: Option<Box<Request<RequestBody>>>) -> Self {
        Self {
            error: UpstreamError::sent(failure),
            request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_failed_decides_side_reach_and_kind() {
        let refused = UpstreamError::not_sent(Failure::Connect {
            authority: "127.0.0.1:1".into(),
            source: io::ErrorKind::ConnectionRefused.into(),
        });
        assert!(refused.never_reached() && refused.is_connect());
        assert_eq!(refused.side(), Side::Upstream);
        assert_eq!(refused.to_string(), "connecting to 127.0.0.1:1 failed");
        assert!(std::error::Error::source(&refused).is_some());

        let closed = UpstreamError::sent(Failure::Closed).on_reused(true);
        assert!(!closed.never_reached() && closed.reused() && !closed.is_connect());

        let timeout = UpstreamError::timeout(Duration::from_secs(2));
        assert!(timeout.is_timeout() && !timeout.never_reached());

        let client = UpstreamError::sent(Failure::ClientBody(RequestBodyError::TooLarge {
            limit: 10,
        }));
        assert_eq!(client.side(), Side::Client);
        assert!(matches!(
            client.into_client_body(),
            Ok(RequestBodyError::TooLarge { limit: 10 })
        ));
        assert!(
            UpstreamError::sent(Failure::Closed)
                .into_client_body()
                .is_err()
        );
    }
}
