//! Header hygiene at the trust boundary (docs/data-plane.md, "Sanitise").
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

use std::net::IpAddr;
use std::str::FromStr;

use gateway_transport::response::Fields;
use gateway_transport::server::Scheme;
use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::uri::Authority;
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
/// The gateway's signature of the identity headers (see [`crate::policy::signature`]).
pub static X_GATEWAY_SIGNATURE: HeaderName = HeaderName::from_static("x-gateway-signature");
/// The marker of a mirrored copy (`composition/mirror.rs`); a client's is
/// removed, so an upstream can trust it (e.g. to skip side effects).
pub static X_GATEWAY_MIRROR: HeaderName = HeaderName::from_static("x-gateway-mirror");
/// Request correlation id.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Client address chain.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// Scheme the client used.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Longest accepted incoming `X-Request-Id`.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// `Forwarded` (RFC 7239): believed only from a trusted proxy.
pub static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
/// `X-Real-IP`: believed only from a trusted proxy.
pub static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
/// Host the client asked for, as the gateway saw it (or a trusted proxy did).
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// Path prefix a proxy removed (Spring, ASP.NET): believed only from a trusted proxy.
pub static X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");
/// Port the client used: believed only from a trusted proxy.
pub static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
/// Scheme the client used (a non-standard spelling): believed only from a trusted proxy.
pub static X_FORWARDED_SCHEME: HeaderName = HeaderName::from_static("x-forwarded-scheme");
/// The URL before a proxy's rewrite (IIS, Symfony, Zend read it for routing
/// and access rules): believed only from a trusted proxy.
pub static X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
/// As `X-Original-URL`: believed only from a trusted proxy.
pub static X_REWRITE_URL: HeaderName = HeaderName::from_static("x-rewrite-url");

/// The headers removed at the trust boundary: the hop-by-hop ones (the first
/// [`HOP_BY_HOP_COUNT`], removed both ways), the identity ones (requests
/// only), then the forwarding ones (requests from a peer that is not a
/// trusted proxy), then the mirror marker (requests only). A header's index
/// is its bit in [`remove_hop_by_hop`]'s scan.
static REMOVED: [&HeaderName; 21] = [
    &header::CONNECTION,
    &PROXY_CONNECTION,
    &header::TE,
    &header::TRAILER,
    &header::TRANSFER_ENCODING,
    &header::UPGRADE,
    &header::PROXY_AUTHORIZATION,
    &header::PROXY_AUTHENTICATE,
    &KEEP_ALIVE,
    &X_USER_ID,
    &X_USER_ROLE,
    &X_API_KEY_NAME,
    &X_GATEWAY_SIGNATURE,
    &FORWARDED,
    &X_REAL_IP,
    &X_GATEWAY_MIRROR,
    &X_FORWARDED_PREFIX,
    &X_FORWARDED_PORT,
    &X_FORWARDED_SCHEME,
    &X_ORIGINAL_URL,
    &X_REWRITE_URL,
];
/// How many of [`REMOVED`] are hop-by-hop (the rest are removed from requests only).
const HOP_BY_HOP_COUNT: usize = 9;
/// The bits of the hop-by-hop fields.
const HOP_BITS: u32 = (1 << HOP_BY_HOP_COUNT) - 1;
/// The bits of the identity fields.
const IDENTITY_BITS: u32 = 0b1111 << HOP_BY_HOP_COUNT;
/// The bits of `Forwarded`, `X-Real-IP` and the five after the mirror marker
/// (`X-Forwarded-Prefix`, `-Port`, `-Scheme`, `X-Original-URL`, `X-Rewrite-URL`).
const FORWARDING_BITS: u32 = (0b11 << (HOP_BY_HOP_COUNT + 4)) | (0b11111 << (HOP_BY_HOP_COUNT + 7));
/// The bit of `X-Gateway-Mirror`.
const MIRROR_BIT: u32 = 1 << (HOP_BY_HOP_COUNT + 6);
/// The bits of `Connection` and `Proxy-Connection`, whose values name more headers.
const CONNECTION_BITS: u32 = 0b11;
/// Not a field of [`REMOVED`]: a request field spelt with `_` for `-` whose
/// dashed form is one the gateway protects (`X_User_Id`); see [`is_spoof_spelling`].
const UNDERSCORE_BIT: u32 = 1 << 31;

/// What [`remove_hop_by_hop`] removes besides the hop-by-hop fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strip {
    /// An upstream's answer: the hop-by-hop fields only.
    Response,
    /// A client's request: also the identity fields (any spelling with `_`
    /// for `-` too, as nginx drops underscored names), and, unless the peer is
    /// a trusted proxy, `Forwarded`, `X-Real-IP`, `X-Forwarded-Prefix`,
    /// `-Port`, `-Scheme`, `X-Original-URL` and `X-Rewrite-URL` (issue 41:
    /// an upstream or a cache must never build on a client's word for them).
    Request {
        /// The peer is one of `--trusted-proxies`.
        trusted_peer: bool,
    },
}

impl Strip {
    fn mask(self) -> u32 {
        match self {
            Self::Response => HOP_BITS,
            Self::Request { trusted_peer: true } => {
                HOP_BITS | IDENTITY_BITS | MIRROR_BIT | UNDERSCORE_BIT
            }
            Self::Request {
                trusted_peer: false,
            } => HOP_BITS | IDENTITY_BITS | FORWARDING_BITS | MIRROR_BIT | UNDERSCORE_BIT,
        }
    }
}

/// `name`'s bit among [`REMOVED`] (or [`UNDERSCORE_BIT`]), or 0; only bits in `mask` count.
///
/// A `match` on the (lower-case) name: the compiler switches on its length and
/// compares at most a few bytes, where comparing against each of the
/// `HeaderName`s cost ≈ 1.3k instructions per message (callgrind,
/// BENCHMARKS.md). `removed_bits_follow_the_list` keeps it in step with [`REMOVED`].
fn removed_bit(name: &[u8], mask: u32) -> u32 {
    let i = match name {
        b"connection" => 0,
        b"proxy-connection" => 1,
        b"te" => 2,
        b"trailer" => 3,
        b"transfer-encoding" => 4,
        b"upgrade" => 5,
        b"proxy-authorization" => 6,
        b"proxy-authenticate" => 7,
        b"keep-alive" => 8,
        b"x-user-id" => 9,
        b"x-user-role" => 10,
        b"x-api-key-name" => 11,
        b"x-gateway-signature" => 12,
        b"forwarded" => 13,
        b"x-real-ip" => 14,
        b"x-gateway-mirror" => 15,
        b"x-forwarded-prefix" => 16,
        b"x-forwarded-port" => 17,
        b"x-forwarded-scheme" => 18,
        b"x-original-url" => 19,
        b"x-rewrite-url" => 20,
        // Only names of a protected one's length are looked at for `_`.
        _ if mask & UNDERSCORE_BIT != 0 && is_spoof_spelling(name) => return UNDERSCORE_BIT,
        _ => return 0,
    };
    (1 << i) & mask
}

/// The fields a backend may read with `_` and `-` taken as one (CGI, PHP,
/// Django and others turn both into `_`): their underscored spellings never
/// pass the gateway.
const PROTECTED_SPELLINGS: [&[u8]; 15] = [
    b"x-user-id",
    b"x-user-role",
    b"x-api-key-name",
    b"x-gateway-signature",
    b"x-gateway-mirror",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"x-real-ip",
    b"x-request-id",
    b"x-forwarded-prefix",
    b"x-forwarded-port",
    b"x-forwarded-scheme",
    b"x-original-url",
    b"x-rewrite-url",
];

/// Whether `name` (lower case) has a `_` and reads as one of
/// [`PROTECTED_SPELLINGS`] with `_` taken as `-`.
fn is_spoof_spelling(name: &[u8]) -> bool {
    if !matches!(name.len(), 9 | 11..=19) || !name.contains(&b'_') {
        return false;
    }
    PROTECTED_SPELLINGS.iter().any(|p| {
        p.len() == name.len()
            && p.iter()
                .zip(name)
                .all(|(&a, &b)| a == b || (a == b'-' && b == b'_'))
    })
}

/// Fields the gateway itself relies on: a client's (or upstream's)
/// `Connection` can never nominate them for removal. `X-Forwarded-For` above
/// all: dropping it would make the trusted proxy's own address the client's.
fn is_protected_from_connection(name: &[u8]) -> bool {
    matches!(
        name,
        b"host"
            | b"content-length"
            | b"x-forwarded-for"
            | b"x-forwarded-proto"
            | b"x-forwarded-host"
            | b"forwarded"
            | b"x-real-ip"
            | b"x-request-id"
            | b"traceparent"
            | b"tracestate"
    )
}

/// Removes the hop-by-hop fields of an upstream's answer ([`remove_hop_by_hop`]
/// with [`Strip::Response`]). Fields kept as bytes lost theirs when they were
/// read (`gateway_transport::response_head`): nothing to do then.
pub fn remove_hop_by_hop_fields(fields: &mut Fields) {
    if !fields.kept_as_bytes() {
        remove_hop_by_hop(fields.map_mut(), Strip::Response);
    }
}

/// Removes hop-by-hop headers, including every header named in `Connection`
/// (and `Proxy-Connection`) except those the gateway relies on
/// ([`is_protected_from_connection`]), and what `strip` adds.
/// Returns the total size of the headers before removal (name + value + 4 per
/// field, as on the wire), for the header size limit.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, strip: Strip) -> usize {
    let mask = strip.mask();
    let mut size = 0;
    // Which of REMOVED are present: only those are looked up and removed (an
    // upstream's `Connection: keep-alive` is on nearly every response).
    let mut present = 0u32;
    for (name, value) in headers.iter() {
        let name = name.as_str();
        size += name.len() + value.len() + 4;
        present |= removed_bit(name.as_bytes(), mask);
    }
    if present == 0 {
        return size;
    }
    // Headers named as hop-by-hop by the sender ("Connection: close, X-Secret").
    if present & CONNECTION_BITS != 0 {
        let mut named: Vec<HeaderName> = Vec::new();
        for (bit, list) in [&header::CONNECTION, &PROXY_CONNECTION]
            .into_iter()
            .enumerate()
        {
            if present & (1 << bit) == 0 {
                continue;
            }
            for value in headers.get_all(list) {
                let Ok(value) = value.to_str() else { continue };
                for token in value.split(',').map(str::trim) {
                    // "close" names no header; the fixed list is removed below.
                    if token.eq_ignore_ascii_case("close")
                        || token.eq_ignore_ascii_case("keep-alive")
                    {
                        continue;
                    }
                    if let Ok(name) = HeaderName::from_str(token)
                        && removed_bit(name.as_str().as_bytes(), HOP_BITS) == 0
                        && !is_protected_from_connection(name.as_str().as_bytes())
                    {
                        named.push(name);
                    }
                }
            }
        }
        for name in named {
            headers.remove(name);
        }
    }
    if present & UNDERSCORE_BIT != 0 {
        let spoofed: Vec<HeaderName> = headers
            .keys()
            .filter(|n| is_spoof_spelling(n.as_str().as_bytes()))
            .cloned()
            .collect();
        for name in spoofed {
            headers.remove(name);
        }
    }
    for (i, name) in REMOVED.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(*name);
        }
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
    // Hex by hand: `format!` costs several times more on every request.
    let mut buf = [0u8; 32];
    gateway_hex::encode_to_slice(&n.to_be_bytes(), &mut buf);
    HeaderValue::from_bytes(&buf).expect("hex is a valid header value")
}

/// Keeps a valid incoming `X-Request-Id` or replaces it with a new one. Returns the id.
pub fn ensure_request_id(headers: &mut HeaderMap) -> HeaderValue {
    // One lookup (a custom name is hashed byte by byte on every lookup).
    match headers.entry(&X_REQUEST_ID) {
        Entry::Occupied(mut entry) => {
            let mut values = entry.iter();
            if let (Some(v), None) = (values.next(), values.next())
                && is_valid_request_id(v.as_bytes())
            {
                return v.clone();
            }
            let id = new_request_id();
            entry.insert(id.clone());
            id
        }
        Entry::Vacant(entry) => entry.insert(new_request_id()).clone(),
    }
}

/// Appends the peer address to `X-Forwarded-For` (joining repeated header
/// lines), and sets `X-Forwarded-Proto` (the listener's `scheme`) and `X-Forwarded-Host` (the
/// request's `Host`, else the request target's `authority`: an HTTP/2
/// request's `:authority`). From a trusted proxy (`trusted_peer`) the proxy's own
/// `X-Forwarded-Proto` / `X-Forwarded-Host` are kept when it sent them.
pub fn set_forwarded(
    headers: &mut HeaderMap,
    authority: Option<&Authority>,
    peer: IpAddr,
    trusted_peer: bool,
    scheme: Scheme,
) {
    let proto = HeaderValue::from_static(match scheme {
        Scheme::Http => "http",
        Scheme::Https => "https",
    });
    let mut text = [0u8; 45];
    let len = write_ip(peer, &mut text);
    let peer = &text[..len];
    // One lookup for X-Forwarded-For, as in `ensure_request_id`.
    match headers.entry(&X_FORWARDED_FOR) {
        Entry::Occupied(mut entry) => {
            let mut xff = Vec::new();
            for v in entry.iter() {
                if let Ok(v) = v.to_str() {
                    xff.extend_from_slice(v.trim().as_bytes());
                    xff.extend_from_slice(b", ");
                }
            }
            xff.extend_from_slice(peer);
            if let Ok(v) = HeaderValue::from_bytes(&xff) {
                entry.insert(v);
            }
        }
        Entry::Vacant(entry) => {
            if let Ok(v) = HeaderValue::from_bytes(peer) {
                entry.insert(v);
            }
        }
    }
    let host = headers.get(header::HOST).cloned().or_else(|| {
        // Never a `user:password@` part, should an authority carry one.
        let a = authority?.as_str();
        let host = a.rsplit_once('@').map_or(a, |(_, host)| host);
        HeaderValue::from_str(host).ok()
    });
    if trusted_peer {
        if !headers.contains_key(&X_FORWARDED_PROTO) {
            headers.insert(X_FORWARDED_PROTO.clone(), proto);
        }
        if let Some(host) = host
            && !headers.contains_key(&X_FORWARDED_HOST)
        {
            headers.insert(X_FORWARDED_HOST.clone(), host);
        }
        return;
    }
    headers.insert(X_FORWARDED_PROTO.clone(), proto);
    match host {
        Some(host) => {
            headers.insert(X_FORWARDED_HOST.clone(), host);
        }
        None => {
            headers.remove(&X_FORWARDED_HOST);
        }
    }
}

/// Writes `ip` as `Display` would into `buf` (45 bytes hold any address) and
/// returns the length. IPv4, the common case, is formatted by hand, without
/// the `fmt` machinery that costs several times more per request.
pub fn write_ip(ip: IpAddr, buf: &mut [u8; 45]) -> usize {
    match ip {
        IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    buf[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    buf[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                buf[n] = b'0' + octet % 10;
                n += 1;
            }
            n
        }
        IpAddr::V6(_) => {
            use std::io::Write as _;
            let mut rest = &mut buf[..];
            let _ = write!(rest, "{ip}");
            45 - rest.len()
        }
    }
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
    #[test]
    fn removed_bits_follow_the_list() {
        for (i, name) in REMOVED.iter().enumerate() {
            let all = Strip::Request {
                trusted_peer: false,
            }
            .mask();
            assert_eq!(removed_bit(name.as_str().as_bytes(), all), 1 << i, "{name}");
            let hop = if i < HOP_BY_HOP_COUNT { 1 << i } else { 0 };
            assert_eq!(
                removed_bit(name.as_str().as_bytes(), Strip::Response.mask()),
                hop,
                "{name}"
            );
        }
        let all = Strip::Request {
            trusted_peer: false,
        }
        .mask();
        for other in [header::HOST, header::CONTENT_LENGTH, X_REQUEST_ID.clone()] {
            assert_eq!(removed_bit(other.as_str().as_bytes(), all), 0, "{other}");
        }
    }

    /// The transport's hop-by-hop list ([`gateway_transport::h1::is_hop_by_hop`], for the
    /// upstream fields forwarded as bytes) is this one's.
    #[test]
    fn hop_by_hop_names_are_found_in_any_case() {
        use gateway_transport::h1::is_hop_by_hop;
        for (i, name) in REMOVED.iter().enumerate() {
            let hop = i < HOP_BY_HOP_COUNT;
            assert_eq!(is_hop_by_hop(name.as_str().as_bytes()), hop, "{name}");
            let upper = name.as_str().to_ascii_uppercase();
            assert_eq!(is_hop_by_hop(upper.as_bytes()), hop, "{upper}");
        }
        for other in [
            &b"Content-Length"[..],
            b"date",
            b"",
            b"proxy-authorization-x",
            b"\xff",
        ] {
            assert!(!is_hop_by_hop(other), "{other:?}");
        }
    }

    use super::*;

    const UNTRUSTED: Strip = Strip::Request {
        trusted_peer: false,
    };

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
        remove_hop_by_hop(&mut h, UNTRUSTED);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "authorization", "host"]);
    }

    /// Issue 41, item 3: the forwarding fields an upstream (or the cache) may
    /// build URLs or access rules from come only from trusted proxies.
    #[test]
    fn forwarding_fields_from_untrusted_peers_are_dropped_in_any_spelling() {
        let fields = [
            ("host", "example.com"),
            ("x-forwarded-prefix", "/evil"),
            ("X-Forwarded-Port", "8443"),
            ("x-forwarded-scheme", "https"),
            ("x-original-url", "/admin"),
            ("X-Rewrite-URL", "/admin"),
            ("forwarded", "for=1.2.3.4;proto=https"),
            ("x-real-ip", "1.2.3.4"),
            ("x_original_url", "/admin"),
            ("x_forwarded_prefix", "/evil"),
            ("x_rewrite_url", "/admin"),
        ];
        let mut h = map(&fields);
        remove_hop_by_hop(&mut h, UNTRUSTED);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["host"]);
        // A trusted proxy's dashed fields are kept; underscored spellings never are.
        let mut h = map(&fields);
        remove_hop_by_hop(&mut h, Strip::Request { trusted_peer: true });
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            [
                "forwarded",
                "host",
                "x-forwarded-port",
                "x-forwarded-prefix",
                "x-forwarded-scheme",
                "x-original-url",
                "x-real-ip",
                "x-rewrite-url"
            ]
        );
    }

    #[test]
    fn responses_keep_identity_headers_and_ordinary_requests_are_untouched() {
        let mut h = map(&[
            ("x-user-id", "7"),
            ("connection", "keep-alive"),
            ("keep-alive", "x"),
        ]);
        remove_hop_by_hop(&mut h, Strip::Response);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-user-id"));
        let mut plain = map(&[("host", "a"), ("accept", "b")]);
        let size = remove_hop_by_hop(&mut plain, UNTRUSTED);
        assert_eq!(plain.len(), 2);
        assert_eq!(size, "host".len() + 1 + 4 + "accept".len() + 1 + 4);
    }

    #[test]
    fn write_ip_matches_display() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.0.0.1",
            "127.0.0.1",
            "99.100.109.110",
            "255.255.255.255",
            "::1",
            "2001:db8::5",
            "::ffff:10.1.2.3",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut buf = [0u8; 45];
            let n = write_ip(ip, &mut buf);
            assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), ip.to_string());
        }
    }

    #[test]
    fn connection_tokens_naming_fixed_or_identity_headers_are_removed() {
        // A response: identity headers stay unless the upstream names them in Connection.
        let mut h = map(&[
            ("connection", "Keep-Alive, x-user-role, CLOSE"),
            ("x-user-role", "r"),
            ("x-user-id", "u"),
            ("te", "trailers"),
        ]);
        remove_hop_by_hop(&mut h, Strip::Response);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-user-id"]);
    }

    #[test]
    fn connection_cannot_nominate_what_the_gateway_relies_on() {
        let mut h = map(&[
            (
                "connection",
                "X-Forwarded-For, forwarded, host, content-length, x-real-ip, x-request-id, x-custom",
            ),
            ("x-forwarded-for", "6.6.6.6"),
            ("host", "a"),
            ("content-length", "0"),
            ("x-request-id", "abc"),
            ("x-custom", "gone"),
        ]);
        remove_hop_by_hop(&mut h, Strip::Request { trusted_peer: true });
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            ["content-length", "host", "x-forwarded-for", "x-request-id"]
        );
    }

    #[test]
    fn underscore_spellings_of_protected_fields_are_dropped() {
        let mut h = map(&[
            ("X_User_Id", "admin"),
            ("x-user_role", "admin"),
            ("X_Api_Key_Name", "k"),
            ("X_Gateway_Signature", "t=1"),
            ("x_forwarded_for", "6.6.6.6"),
            ("X_Forwarded_Proto", "https"),
            ("x_forwarded_host", "evil"),
            ("x_real_ip", "6.6.6.6"),
            ("x_request_id", "r"),
            ("x_custom_thing", "kept"),
            ("my_header", "kept"),
        ]);
        remove_hop_by_hop(&mut h, UNTRUSTED);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["my_header", "x_custom_thing"]);
        // An answer keeps them: only requests are the trust boundary.
        let mut resp = map(&[("x_user_id", "u")]);
        remove_hop_by_hop(&mut resp, Strip::Response);
        assert_eq!(resp.len(), 1);
    }

    #[test]
    fn forwarding_fields_are_believed_only_from_trusted_proxies() {
        let fields = [("forwarded", "for=6.6.6.6"), ("x-real-ip", "6.6.6.6")];
        let mut h = map(&fields);
        remove_hop_by_hop(&mut h, UNTRUSTED);
        assert!(h.is_empty(), "{h:?}");
        let mut h = map(&fields);
        remove_hop_by_hop(&mut h, Strip::Request { trusted_peer: true });
        assert_eq!(h.len(), 2);
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
        assert_eq!(none.get("x-request-id"), Some(&id));
        assert_ne!(id, ensure_request_id(&mut HeaderMap::new()));
        // A new id: 32 lower-case hex digits (128 random bits).
        for _ in 0..100 {
            let id = new_request_id();
            assert_eq!(id.len(), 32);
            assert!(
                id.as_bytes()
                    .iter()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{id:?}"
            );
        }
    }

    #[test]
    fn forwarded_headers() {
        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "5.6.7.8"),
            ("x-forwarded-proto", "https"),
        ]);
        let before = h.clone();
        set_forwarded(
            &mut h,
            None,
            "10.0.0.1".parse().unwrap(),
            false,
            Scheme::Http,
        );
        assert_eq!(
            h.get("x-forwarded-for").unwrap(),
            "1.2.3.4, 5.6.7.8, 10.0.0.1"
        );
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        assert!(
            h.get("x-forwarded-host").is_none(),
            "no Host, no X-Forwarded-Host"
        );
        let mut empty = HeaderMap::new();
        set_forwarded(
            &mut empty,
            None,
            "::1".parse().unwrap(),
            false,
            Scheme::Http,
        );
        assert_eq!(empty.get("x-forwarded-for").unwrap(), "::1");

        // A trusted proxy's scheme and host are kept; anyone else's are replaced.
        let mut from_proxy = before.clone();
        from_proxy.insert("host", HeaderValue::from_static("gw.example"));
        from_proxy.insert(
            "x-forwarded-host",
            HeaderValue::from_static("public.example"),
        );
        let mut from_client = from_proxy.clone();
        set_forwarded(
            &mut from_proxy,
            None,
            "10.0.0.1".parse().unwrap(),
            true,
            Scheme::Http,
        );
        assert_eq!(from_proxy.get("x-forwarded-proto").unwrap(), "https");
        assert_eq!(
            from_proxy.get("x-forwarded-host").unwrap(),
            "public.example"
        );
        let mut h2_client = from_client.clone();
        set_forwarded(
            &mut from_client,
            None,
            "10.0.0.1".parse().unwrap(),
            false,
            Scheme::Http,
        );
        assert_eq!(from_client.get("x-forwarded-proto").unwrap(), "http");
        let mut over_tls = before.clone();
        set_forwarded(
            &mut over_tls,
            None,
            "10.0.0.1".parse().unwrap(),
            false,
            Scheme::Https,
        );
        assert_eq!(over_tls.get("x-forwarded-proto").unwrap(), "https");
        assert_eq!(from_client.get("x-forwarded-host").unwrap(), "gw.example");
        assert_eq!(from_client.get_all("x-forwarded-host").iter().count(), 1);

        // An HTTP/2 request has no Host: its `:authority` is the host.
        h2_client.remove("host");
        let authority = Authority::from_static("h2.example:8080");
        set_forwarded(
            &mut h2_client,
            Some(&authority),
            "10.0.0.1".parse().unwrap(),
            false,
            Scheme::Http,
        );
        assert_eq!(
            h2_client.get("x-forwarded-host").unwrap(),
            "h2.example:8080"
        );
        let mut with_userinfo = HeaderMap::new();
        set_forwarded(
            &mut with_userinfo,
            Some(&Authority::from_static("user:secret@h2.example")),
            "10.0.0.1".parse().unwrap(),
            false,
            Scheme::Http,
        );
        assert_eq!(with_userinfo.get("x-forwarded-host").unwrap(), "h2.example");
        // Host wins when both are there.
        set_forwarded(
            &mut from_client,
            Some(&authority),
            "10.0.0.1".parse().unwrap(),
            false,
            Scheme::Http,
        );
        assert_eq!(from_client.get("x-forwarded-host").unwrap(), "gw.example");
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
