//! Reading and writing the trace headers on `http` requests and responses.
//!
//! ```
//! use gateway_telemetry::{propagation, Tracer};
//! # let mut req = http::Request::builder().uri("/api/users/1").body(()).unwrap();
//! # let tracer = Tracer::disabled();
//! let incoming = propagation::extract(req.headers());            // strict; invalid => None
//! let span = tracer.server_span(incoming.parent.as_ref(), req.method(), req.uri().path());
//! let client = span.client_span(req.method());
//! propagation::inject(req.headers_mut(), &client.context(), incoming.tracestate.as_ref());
//! # let mut response_headers = http::HeaderMap::new();
//! propagation::set_traceresponse(&mut response_headers, &span.context());
//! ```

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::traceparent::TraceContext;
use crate::tracestate::{MAX_PROPAGATED_LEN, TraceState};

/// `traceparent` request header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate` request header.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// `traceresponse` response header (Trace Context level 2).
pub const TRACERESPONSE: HeaderName = HeaderName::from_static("traceresponse");

/// What an incoming request carried, after validation.
#[derive(Debug, Clone, Default)]
pub struct Incoming {
    /// The caller's context when `traceparent` is present and valid; `None`
    /// means: start a new trace.
    pub parent: Option<TraceContext>,
    /// The `tracestate` to forward: only with a valid parent, only when valid,
    /// truncated to 512 bytes by the specification's rules. Usually a clone of
    /// the incoming value (a reference count, no copy).
    pub tracestate: Option<HeaderValue>,
    /// `traceparent` was present but invalid (or repeated), so a new trace starts.
    pub invalid_traceparent: bool,
}

/// Reads `traceparent` and `tracestate` strictly. A missing, repeated or
/// invalid `traceparent` yields no parent and drops `tracestate`; an invalid
/// `tracestate` is dropped on its own.
pub fn extract(headers: &HeaderMap) -> Incoming {
    let mut values = headers.get_all(&TRACEPARENT).iter();
    let first = values.next();
    let (Some(first), None) = (first, values.next()) else {
        // None at all, or repeated (which is invalid).
        return Incoming {
            invalid_traceparent: first.is_some(),
            ..Incoming::default()
        };
    };
    let Ok(parent) = TraceContext::parse(first.as_bytes()) else {
        return Incoming {
            invalid_traceparent: true,
            ..Incoming::default()
        };
    };
    Incoming {
        parent: Some(parent),
        tracestate: extract_tracestate(headers),
        invalid_traceparent: false,
    }
}

fn extract_tracestate(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(&TRACESTATE).iter();
    let first = values.next()?;
    match values.next() {
        None => {
            let state = TraceState::parse_bytes(first.as_bytes()).ok()?;
            match state.to_propagate(MAX_PROPAGATED_LEN)? {
                std::borrow::Cow::Borrowed(_) => Some(first.clone()),
                std::borrow::Cow::Owned(s) => HeaderValue::from_str(&s).ok(),
            }
        }
        Some(_) => {
            // Several tracestate headers form one list (RFC 9110 field combination).
            let mut joined = Vec::new();
            for value in headers.get_all(&TRACESTATE) {
                if !joined.is_empty() {
                    joined.push(b',');
                }
                joined.extend_from_slice(value.as_bytes());
            }
            let state = TraceState::parse_bytes(&joined).ok()?;
            let out = state.to_propagate(MAX_PROPAGATED_LEN)?;
            HeaderValue::from_str(&out).ok()
        }
    }
}

/// Sets `traceparent` for an upstream request (replacing whatever the client
/// sent) and sets or removes `tracestate`.
pub fn inject(headers: &mut HeaderMap, ctx: &TraceContext, tracestate: Option<&HeaderValue>) {
    headers.insert(TRACEPARENT, ctx.to_header_value());
    match tracestate {
        Some(state) => {
            headers.insert(TRACESTATE, state.clone());
        }
        None => {
            headers.remove(TRACESTATE);
        }
    }
}

/// Sets `traceresponse: 00-<trace-id>-<server-span-id>-<flags>` on a response.
pub fn set_traceresponse(headers: &mut HeaderMap, server_span: &TraceContext) {
    headers.insert(TRACERESPONSE, server_span.to_header_value());
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append((*name).clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn valid_parent_and_state() {
        let h = headers(&[(&TRACEPARENT, PARENT), (&TRACESTATE, "congo=t61rcWkgMzE")]);
        let inc = extract(&h);
        assert_eq!(inc.parent.unwrap().to_string(), PARENT);
        assert_eq!(inc.tracestate.unwrap(), "congo=t61rcWkgMzE");
        assert!(!inc.invalid_traceparent);
    }

    #[test]
    fn invalid_parent_drops_state() {
        let h = headers(&[
            (&TRACEPARENT, &PARENT.to_uppercase()),
            (&TRACESTATE, "congo=t61rcWkgMzE"),
        ]);
        let inc = extract(&h);
        assert!(inc.parent.is_none());
        assert!(inc.tracestate.is_none());
        assert!(inc.invalid_traceparent);
    }

    #[test]
    fn repeated_parent_is_invalid() {
        let h = headers(&[(&TRACEPARENT, PARENT), (&TRACEPARENT, PARENT)]);
        let inc = extract(&h);
        assert!(inc.parent.is_none());
        assert!(inc.invalid_traceparent);
    }

    #[test]
    fn no_headers() {
        let inc = extract(&HeaderMap::new());
        assert!(inc.parent.is_none() && inc.tracestate.is_none() && !inc.invalid_traceparent);
    }

    #[test]
    fn invalid_state_alone_is_dropped() {
        let h = headers(&[(&TRACEPARENT, PARENT), (&TRACESTATE, "Bad=1")]);
        let inc = extract(&h);
        assert!(inc.parent.is_some());
        assert!(inc.tracestate.is_none());
    }

    #[test]
    fn several_state_headers_are_combined_and_normalised() {
        let h = headers(&[
            (&TRACEPARENT, PARENT),
            (&TRACESTATE, "a=1 , b=2"),
            (&TRACESTATE, "c=3"),
        ]);
        assert_eq!(extract(&h).tracestate.unwrap(), "a=1,b=2,c=3");
    }

    #[test]
    fn inject_replaces_client_values() {
        let mut h = headers(&[(&TRACEPARENT, "garbage"), (&TRACESTATE, "x=1")]);
        let ctx: TraceContext = PARENT.parse().unwrap();
        inject(&mut h, &ctx, None);
        assert_eq!(h.get_all(&TRACEPARENT).iter().count(), 1);
        assert_eq!(h[&TRACEPARENT], PARENT);
        assert!(!h.contains_key(&TRACESTATE));
        inject(&mut h, &ctx, Some(&HeaderValue::from_static("a=1")));
        assert_eq!(h[&TRACESTATE], "a=1");
        set_traceresponse(&mut h, &ctx);
        assert_eq!(h[&TRACERESPONSE], PARENT);
    }
}
