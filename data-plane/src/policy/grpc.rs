//! gRPC calls through the gateway (issue 27): recognising one, and the
//! deadline its caller set.
//!
//! A call is a request whose `content-type` is `application/grpc` or one of
//! its `application/grpc+…` forms. Such a call is proxied like any request;
//! what changes is that the gateway's own refusals and failures are answered
//! as gRPC statuses ([`crate::error::grpc`]) and that its `grpc-timeout`
//! shortens the route timeout. The header itself is forwarded unchanged, so
//! the upstream enforces the same deadline on the whole call, streams
//! included.

use std::time::Duration;

use http::HeaderMap;
use http::header::CONTENT_TYPE;

/// The `grpc-timeout` request header.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";

/// Whether the request is a gRPC call (its `content-type`).
pub fn is_call(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.len() >= 16
            && v[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(v.get(16), None | Some(b'+' | b';'))
    })
}

/// The caller's deadline from `grpc-timeout`: at most 8 digits and a unit
/// (`H`, `M`, `S`, `m`, `u`, `n`). `None` when the header is absent or
/// malformed (a malformed one is ignored, as gRPC servers do).
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(GRPC_TIMEOUT)?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(name: &'static str, value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_static(value));
        h
    }

    #[test]
    fn grpc_content_types_are_calls_and_look_alikes_are_not() {
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+json",
            "application/grpc; charset=x",
        ] {
            assert!(is_call(&headers("content-type", ct)), "{ct}");
        }
        for ct in [
            "application/grpc-web",
            "application/json",
            "application/grp",
        ] {
            assert!(!is_call(&headers("content-type", ct)), "{ct}");
        }
        assert!(!is_call(&HeaderMap::new()));
    }

    #[test]
    fn grpc_timeout_units_and_malformed_values() {
        let t = |v| timeout(&headers(GRPC_TIMEOUT, v));
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("3M"), Some(Duration::from_secs(180)));
        assert_eq!(t("5S"), Some(Duration::from_secs(5)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("1n"), Some(Duration::from_nanos(1)));
        for bad in ["", "S", "100", "123456789S", "-1S", "1.5S", "10s", "1 S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        assert_eq!(timeout(&HeaderMap::new()), None);
    }
}
