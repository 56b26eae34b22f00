//! Header hygiene at the trust boundary (DESIGN §4, "Sanitise").
//!
//! Requests: hop-by-hop headers (the fixed RFC 9110 list plus every header the
//! `Connection` header names) and client-supplied identity headers
//! (`X-User-Id`, `X-User-Role`, `X-Api-Key-Name`, which only the gateway may
//! set after authentication, and `X-Gateway-Signature`, which only it may
//! sign) are removed; `X-Forwarded-For` gets the peer appended,
//! `X-Forwarded-Proto` is set, `X-Request-Id` is kept when valid or generated.
//! Responses: hop-by-hop headers are removed the same way.
//!
//! The common request carries none of the removed headers; it costs one pass
//! over the header names and no removal.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::str::FromStr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use rand::Rng as _;

/// `Keep-Alive` (not in the `http` crate's constants).
pub static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
/// `Proxy-Connection`, a non-standard hop-by-hop header some clients send.
pub static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
/// Identity header set by the gateway from a verified token.
pub static X_USER_ID: HeaderName = HeaderName::from_static("x-user-id");
/// Identity header set by the gateway from a verified token.
pub static X_USER_ROLE: HeaderName = HeaderName::from_static("x-user-role");
/// Identity header set by the gateway from a verified API key (its name).
pub static X_API_KEY_NAME: HeaderName = HeaderName::from_static("x-api-key-name");
/// The gateway's signature of the identity headers (see [`crate::signature`]).
pub static X_GATEWAY_SIGNATURE: HeaderName = HeaderName::from_static("x-gateway-signature");
/// Request correlation id.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Client address chain.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// Scheme the client used.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Longest accepted incoming `X-Request-Id`.
pub const MAX_REQUEST_ID_LEN: usize = 128;

fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::PROXY_AUTHORIZATION
        || name == header::PROXY_AUTHENTICATE
        || name == KEEP_ALIVE
        || name == PROXY_CONNECTION
}

fn is_identity(name: &HeaderName) -> bool {
    name == X_USER_ID
        || name == X_USER_ROLE
        || name == X_API_KEY_NAME
        || name == X_GATEWAY_SIGNATURE
}

/// Removes hop-by-hop headers, including every header named in `Connection`
/// (and `Proxy-Connection`). With `strip_identity`, also `X-User-Id`, `X-User-Role`,
/// `X-Api-Key-Name` and `X-Gateway-Signature`.
/// Returns the total size of the headers before removal (name + value + 4 per
/// field, as on the wire), for the header size limit.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, strip_identity: bool) -> usize {
    let mut size = 0;
    let mut found = false;
    for (name, value) in headers.iter() {
        size += name.as_str().len() + value.len() + 4;
        found |= is_hop_by_hop(name) || (strip_identity && is_identity(name));
    }
    if !found {
        return size;
    }
    // Headers named as hop-by-hop by the sender ("Connection: close, X-Secret").
    let mut named: Vec<HeaderName> = Vec::new();
    for list in [&header::CONNECTION, &PROXY_CONNECTION] {
        for value in headers.get_all(list) {
            let Ok(value) = value.to_str() else { continue };
            named.extend(
                value
                    .split(',')
                    .filter_map(|t| HeaderName::from_str(t.trim()).ok()),
            );
        }
    }
    for name in named {
        headers.remove(name);
    }
    for name in [
        &header::CONNECTION,
        &header::TE,
        &header::TRAILER,
        &header::TRANSFER_ENCODING,
        &header::UPGRADE,
        &header::PROXY_AUTHORIZATION,
        &header::PROXY_AUTHENTICATE,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
    ] {
        headers.remove(name);
    }
    if strip_identity {
        headers.remove(&X_USER_ID);
        headers.remove(&X_USER_ROLE);
        headers.remove(&X_API_KEY_NAME);
        headers.remove(&X_GATEWAY_SIGNATURE);
    }
    size
}

/// True for an `X-Request-Id` we pass on: 1 to 128 characters of `[A-Za-z0-9._-]`.
pub fn is_valid_request_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_REQUEST_ID_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A new random request id: 32 lower-case hex digits.
pub fn new_request_id() -> HeaderValue {
    let n: u128 = rand::rng().random();
    let mut s = String::with_capacity(32);
    let _ = write!(s, "{n:032x}");
    HeaderValue::from_str(&s).expect("hex is a valid header value")
}

/// Keeps a valid incoming `X-Request-Id` or replaces it with a new one. Returns the id.
pub fn ensure_request_id(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(&X_REQUEST_ID)
        && is_valid_request_id(v.as_bytes())
        && headers.get_all(&X_REQUEST_ID).iter().count() == 1
    {
        return v.clone();
    }
    let id = new_request_id();
    headers.insert(X_REQUEST_ID.clone(), id.clone());
    id
}

/// Appends the peer address to `X-Forwarded-For` (joining repeated header lines)
/// and sets `X-Forwarded-Proto: http`.
pub fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr) {
    let mut xff = String::new();
    for v in headers.get_all(&X_FORWARDED_FOR) {
        if let Ok(v) = v.to_str() {
            xff.push_str(v.trim());
            xff.push_str(", ");
        }
    }
    let _ = write!(xff, "{peer}");
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
}

pub use gateway_proto::cidr::{Cidr, CidrError};

/// The client address: the peer, unless the peer is a trusted proxy, in which
/// case the right-most `X-Forwarded-For` entry that is not a trusted proxy.
pub fn client_ip(headers: &HeaderMap, peer: IpAddr, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut client = peer;
    let values: Vec<&str> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    for entry in values.iter().rev().flat_map(|v| v.rsplit(',')) {
        match entry.trim().parse::<IpAddr>() {
            Ok(ip) => {
                client = ip;
                if !is_trusted(ip) {
                    break;
                }
            }
            // Garbage from beyond the trusted chain: stop at the last good hop.
            Err(_) => break,
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_str(k).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn drops_hop_by_hop_and_connection_named_headers() {
        let mut h = map(&[
            ("host", "example.com"),
            ("connection", "close, X-Secret, keep-alive"),
            ("Connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "x-proxy-named"),
            ("x-proxy-named", "1"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-authenticate", "Basic"),
            ("x-secret", "s"),
            ("x-other", "o"),
            ("X-User-Id", "admin"),
            ("x-user-role", "admin"),
            ("X-USER-ROLE", "root"),
            ("x-api-key-name", "forged"),
            ("X-Gateway-Signature", "t=1,v1=00"),
            ("accept", "*/*"),
            ("authorization", "Bearer t"),
        ]);
        remove_hop_by_hop(&mut h, true);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "authorization", "host"]);
    }

    #[test]
    fn responses_keep_identity_headers_and_ordinary_requests_are_untouched() {
        let mut h = map(&[
            ("x-user-id", "7"),
            ("connection", "keep-alive"),
            ("keep-alive", "x"),
        ]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-user-id"));
        let mut plain = map(&[("host", "a"), ("accept", "b")]);
        let size = remove_hop_by_hop(&mut plain, true);
        assert_eq!(plain.len(), 2);
        assert_eq!(size, "host".len() + 1 + 4 + "accept".len() + 1 + 4);
    }

    #[test]
    fn request_id_kept_when_valid_else_generated() {
        let mut h = map(&[("x-request-id", "abc-123_X.y")]);
        assert_eq!(ensure_request_id(&mut h), "abc-123_X.y");
        for bad in ["has space", "semi;colon", &"a".repeat(129)] {
            let mut h = map(&[("x-request-id", bad)]);
            let id = ensure_request_id(&mut h);
            assert_ne!(id, bad);
            assert_eq!(id.len(), 32);
            assert_eq!(h.get("x-request-id").unwrap(), &id);
        }
        let mut twice = map(&[("x-request-id", "a"), ("x-request-id", "b")]);
        assert_eq!(ensure_request_id(&mut twice).len(), 32);
        assert_eq!(twice.get_all("x-request-id").iter().count(), 1);
        let mut none = HeaderMap::new();
        let id = ensure_request_id(&mut none);
        assert!(is_valid_request_id(id.as_bytes()));
        assert_ne!(id, ensure_request_id(&mut HeaderMap::new()));
    }

    #[test]
    fn forwarded_headers() {
        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "5.6.7.8"),
            ("x-forwarded-proto", "https"),
        ]);
        set_forwarded(&mut h, "10.0.0.1".parse().unwrap());
        assert_eq!(
            h.get("x-forwarded-for").unwrap(),
            "1.2.3.4, 5.6.7.8, 10.0.0.1"
        );
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        let mut empty = HeaderMap::new();
        set_forwarded(&mut empty, "::1".parse().unwrap());
        assert_eq!(empty.get("x-forwarded-for").unwrap(), "::1");
    }

    #[test]
    fn cidr_and_client_ip() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains("10.9.8.7".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        let host: Cidr = "127.0.0.1".parse().unwrap();
        assert!(host.contains("127.0.0.1".parse().unwrap()));
        assert!(!host.contains("127.0.0.2".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "nope", "10.0.0/8", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let h = map(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.0.0.2")]);
        let trusted = [net];
        let peer_untrusted: IpAddr = "9.9.9.9".parse().unwrap();
        assert_eq!(client_ip(&h, peer_untrusted, &trusted), peer_untrusted);
        assert_eq!(
            client_ip(&h, "10.0.0.1".parse().unwrap(), &trusted),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_ip(&h, "10.0.0.1".parse().unwrap(), &[]),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
