//! Verification of the gateway's signed identity (`X-Gateway-Signature`), as
//! a backend should do it, when the mock runs with `--identity-secret` /
//! `MOCK_IDENTITY_SECRET`. Written independently of the gateway's signer
//! (data-plane/src/signature.rs) so each checks the other; both are pinned to
//! the same known-answer vectors.
//!
//! **v2** (what the gateway sends):
//!
//! ```text
//! X-Gateway-Signature: t=<unix seconds>,id=<request id>,v2=<64 lowercase hex>
//! v2 = HMAC-SHA256(secret, field("x-gateway-signature-v2") || field(t) || field(id) || field(method)
//!                          || field(host) || field(target) || field(x-user-id) || field(x-user-role)
//!                          || field(x-api-key-name))
//! field(x) = the length of x in bytes, 4 bytes big-endian, then x
//! ```
//!
//! `t` and `id` exactly as in the header, `host` the `Host` header, `target`
//! the raw request target (path and query, not decoded); a missing header is
//! an empty field. After the MAC matches, the id is remembered until `t` leaves
//! the window ([`ReplayCache`]); a second request with the same id is refused.
//!
//! **v1** (older gateways; accepted for one more release, then refused):
//! `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "t.method.path.x-user-id.x-user-role")>`,
//! path without the query. It has no id, so only the window bounds its replays.
//!
//! The header is a comma-separated list of `key=value` pairs; unknown keys are
//! ignored (room for a later version), a repeated key is malformed, and `v2`
//! wins when both versions are present. A request is refused (401) when the
//! header is missing or malformed, the MAC does not match (compared in
//! constant time), `t` is more than [`MAX_SKEW_SECONDS`] away from the mock's
//! clock, or the id was seen before.

use parking_lot::Mutex;
use std::collections::HashMap;

use hmac::{Hmac, KeyInit as _, Mac as _};
use http::HeaderMap;
use sha2_hmac::Sha256;

/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-gateway-signature";
/// Largest accepted distance between `t` and now, either way, in seconds.
pub const MAX_SKEW_SECONDS: u64 = 60;
/// Shortest accepted secret (the gateway's minimum).
pub const MIN_SECRET_LEN: usize = 32;
/// Longest accepted secret (the gateway's maximum).
pub const MAX_SECRET_LEN: usize = 256;
/// Longest accepted request id (the gateway sends 32 hex digits).
pub const MAX_ID_LEN: usize = 128;
/// The first field of every v2 message.
pub const V2_CONTEXT: &[u8] = b"x-gateway-signature-v2";

type HmacSha256 = Hmac<Sha256>;

/// Why a request's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// No `X-Gateway-Signature` (or more than one).
    #[error("missing X-Gateway-Signature")]
    Missing,
    /// Not `t=<digits>,id=<id>,v2=<64 hex digits>` (nor v1's `t=<digits>,v1=<64 hex digits>`).
    #[error(
        "malformed X-Gateway-Signature (expected t=<unix seconds>,id=<request id>,v2=<64 hex digits>)"
    )]
    Malformed,
    /// `t` is older than the window.
    #[error("X-Gateway-Signature expired: signed {0} s ago (at most 60 s accepted)")]
    Expired(u64),
    /// `t` is further in the future than the window.
    #[error("X-Gateway-Signature is {0} s in the future (at most 60 s accepted)")]
    Future(u64),
    /// The MAC does not match the request.
    #[error("X-Gateway-Signature does not match the request")]
    Mismatch,
    /// The request id was seen before within the window.
    #[error("X-Gateway-Signature replayed: request id already seen")]
    Replayed,
}

/// What a v2 signature covers, as the backend received it.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    /// The header's `t` digits.
    pub t: &'a str,
    /// The header's `id`.
    pub id: &'a str,
    /// The method.
    pub method: &'a str,
    /// The `Host` header (empty when there is none).
    pub host: &'a [u8],
    /// The raw request target (path and query).
    pub target: &'a str,
    /// `X-User-Id` (empty when there is none).
    pub user_id: &'a [u8],
    /// `X-User-Role` (empty when there is none).
    pub user_role: &'a [u8],
    /// `X-Api-Key-Name` (empty when there is none).
    pub api_key_name: &'a [u8],
}

/// Request ids seen with a valid signature, each until its `t` leaves the window.
#[derive(Debug, Default)]
pub struct ReplayCache {
    inner: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// id → the last second at which a request with it could still be accepted.
    until: HashMap<String, u64>,
    /// Expired entries are swept when the map reaches this size (amortised O(1)).
    sweep_at: usize,
}

impl ReplayCache {
    /// Records `id` (valid until `until`, Unix seconds); false when it is
    /// already recorded and still valid at `now` (a replay).
    pub fn insert(&self, id: &str, until: u64, now: u64) -> bool {
        let mut seen = self.inner.lock();
        if seen.until.get(id).is_some_and(|&u| u >= now) {
            return false;
        }
        if seen.until.len() >= seen.sweep_at {
            seen.until.retain(|_, u| *u >= now);
            seen.sweep_at = (seen.until.len() * 2).max(1024);
        }
        seen.until.insert(id.to_owned(), until);
        true
    }

    /// Ids remembered now (tests).
    pub fn len(&self) -> usize {
        self.inner.lock().until.len()
    }

    /// True when no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Checks signatures made with one secret, and remembers the ids it accepted.
pub struct IdentityVerifier {
    mac: HmacSha256,
    seen: ReplayCache,
}

impl std::fmt::Debug for IdentityVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityVerifier(..)")
    }
}

impl IdentityVerifier {
    /// A verifier for `secret` (32 to 256 visible ASCII characters, like the
    /// gateway's `identity_signing_secret`); `None` otherwise.
    pub fn new(secret: &str) -> Option<Self> {
        let ok = (MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&secret.len())
            && secret.bytes().all(|c| c.is_ascii_graphic());
        if !ok {
            return None;
        }
        Some(Self {
            mac: HmacSha256::new_from_slice(secret.as_bytes()).ok()?,
            seen: ReplayCache::default(),
        })
    }

    /// The lowercase hex v2 MAC of one request (what `v2=` must hold).
    pub fn v2_hex(&self, request: &SignedRequest<'_>) -> String {
        gateway_hex::encode(self.v2_mac(request).finalize().into_bytes())
    }

    fn v2_mac(&self, r: &SignedRequest<'_>) -> HmacSha256 {
        let mut mac = self.mac.clone();
        for field in [
            V2_CONTEXT,
            r.t.as_bytes(),
            r.id.as_bytes(),
            r.method.as_bytes(),
            r.host,
            r.target.as_bytes(),
            r.user_id,
            r.user_role,
            r.api_key_name,
        ] {
            let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
            mac.update(&len.to_be_bytes());
            mac.update(field);
        }
        mac
    }

    /// The lowercase hex v1 MAC of one request (what `v1=` must hold).
    pub fn mac_hex(&self, t: u64, method: &str, path: &str, user: &[u8], role: &[u8]) -> String {
        gateway_hex::encode(
            self.v1_mac(t, method, path, user, role)
                .finalize()
                .into_bytes(),
        )
    }

    fn v1_mac(&self, t: u64, method: &str, path: &str, user: &[u8], role: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(format!("{t}.{method}.{path}.").as_bytes());
        mac.update(user);
        mac.update(b".");
        mac.update(role);
        mac
    }

    /// Verifies the signature of a request with these `headers`, `method` and
    /// raw request `target` (path and query), at `now` (Unix seconds), and
    /// records its id.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        method: &str,
        target: &str,
        now: u64,
    ) -> Result<(), IdentityError> {
        let mut all = headers.get_all(SIGNATURE_HEADER).iter();
        let value = all.next().ok_or(IdentityError::Missing)?;
        if all.next().is_some() {
            return Err(IdentityError::Missing);
        }
        let parsed = parse(value.as_bytes()).ok_or(IdentityError::Malformed)?;
        let t = parsed.t_value;
        if t + MAX_SKEW_SECONDS < now {
            return Err(IdentityError::Expired(now - t));
        }
        if t > now + MAX_SKEW_SECONDS {
            return Err(IdentityError::Future(t - now));
        }
        let header = |name| headers.get(name).map_or(&b""[..], |v| v.as_bytes());
        match parsed.mac {
            Version::V2 { id, mac: given } => {
                let request = SignedRequest {
                    t: parsed.t,
                    id,
                    method,
                    host: header("host"),
                    target,
                    user_id: header("x-user-id"),
                    user_role: header("x-user-role"),
                    api_key_name: header("x-api-key-name"),
                };
                self.v2_mac(&request)
                    .verify_slice(&given)
                    .map_err(|_| IdentityError::Mismatch)?;
                // Only after the MAC matched: forged requests cannot fill the cache or burn ids.
                if !self.seen.insert(id, t + MAX_SKEW_SECONDS, now) {
                    return Err(IdentityError::Replayed);
                }
                Ok(())
            }
            Version::V1(given) => {
                let path = target.split_once('?').map_or(target, |(p, _)| p);
                let (user, role) = (header("x-user-id"), header("x-user-role"));
                self.v1_mac(t, method, path, user, role)
                    .verify_slice(&given)
                    .map_err(|_| IdentityError::Mismatch)
            }
        }
    }

    /// The ids remembered by the replay check.
    pub fn replay_cache(&self) -> &ReplayCache {
        &self.seen
    }
}

/// A parsed header.
struct Parsed<'a> {
    /// `t` as written.
    t: &'a str,
    t_value: u64,
    mac: Version<'a>,
}

enum Version<'a> {
    V2 { id: &'a str, mac: [u8; 32] },
    V1([u8; 32]),
}

/// `t=<digits>,id=<id>,v2=<64 lowercase hex>` (or `t=<digits>,v1=<64 lowercase hex>`),
/// pairs in any order, unknown keys ignored, none repeated.
fn parse(value: &[u8]) -> Option<Parsed<'_>> {
    let text = std::str::from_utf8(value).ok()?;
    let (mut t, mut id, mut v1, mut v2) = (None, None, None, None);
    for pair in text.split(',') {
        let (key, value) = pair.split_once('=')?;
        let slot = match key {
            "t" => &mut t,
            "id" => &mut id,
            "v1" => &mut v1,
            "v2" => &mut v2,
            _ => continue,
        };
        if slot.replace(value).is_some() {
            return None;
        }
    }
    let t = t?;
    if t.is_empty() || t.len() > 19 || !t.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mac = match (v2, v1) {
        (Some(v2), _) => {
            let id = id?;
            let id_ok = !id.is_empty()
                && id.len() <= MAX_ID_LEN
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !id_ok {
                return None;
            }
            Version::V2 { id, mac: mac(v2)? }
        }
        (None, Some(v1)) => Version::V1(mac(v1)?),
        (None, None) => return None,
    };
    Some(Parsed {
        t,
        t_value: t.parse().ok()?,
        mac,
    })
}

/// 64 lowercase hex digits → 32 bytes.
fn mac(hex_digits: &str) -> Option<[u8; 32]> {
    if hex_digits.len() != 64
        || !hex_digits
            .bytes()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let mut mac = [0u8; 32];
    gateway_hex::decode_to_slice(hex_digits, &mut mac).ok()?;
    Some(mac)
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    /// The gateway's known-answer vectors (data-plane/src/signature.rs), computed with Python's hmac.
    const KNOWN: &str =
        "t=1700000000,v1=5f666c26655b77ca111cd84631aee8bc23f13431e7695b14e9a861f5bb3ae1c0";
    const KNOWN_V2: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
         v2=0da8f92987adf82b1a259915f1a48d5a183b85ea7effb0bb468e93f47f78709d";
    /// What `KNOWN_V2` signs: GET api.example /users/7?x=1 as alice/admin, no API key.
    const TARGET: &str = "/users/7?x=1";
    const NOW: u64 = 1_700_000_000;

    fn headers(signature: &str, user: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(signature).unwrap());
        h.insert("host", HeaderValue::from_static("api.example"));
        if let Some(u) = user {
            h.insert("x-user-id", HeaderValue::from_str(u).unwrap());
            h.insert("x-user-role", HeaderValue::from_static("admin"));
        }
        h
    }

    fn verifier() -> IdentityVerifier {
        IdentityVerifier::new(SECRET).unwrap()
    }

    /// A v2 header for `request`, signed by `v`.
    fn sign(v: &IdentityVerifier, request: &SignedRequest<'_>) -> String {
        format!("t={},id={},v2={}", request.t, request.id, v.v2_hex(request))
    }

    fn request<'a>() -> SignedRequest<'a> {
        SignedRequest {
            t: "1700000000",
            id: "0123456789abcdef0123456789abcdef",
            method: "GET",
            host: b"api.example",
            target: TARGET,
            user_id: b"alice",
            user_role: b"admin",
            api_key_name: b"",
        }
    }

    #[test]
    fn accepts_the_v2_known_answer_once_within_the_window() {
        let v = verifier();
        assert_eq!(sign(&v, &request()), KNOWN_V2);
        let h = headers(KNOWN_V2, Some("alice"));
        assert_eq!(v.verify(&h, "GET", TARGET, NOW + 60), Ok(()));
        // The same request id again is a replay, whenever it comes.
        for now in [NOW, NOW + 60, NOW - 60] {
            assert_eq!(
                v.verify(&h, "GET", TARGET, now),
                Err(IdentityError::Replayed),
                "now {now}"
            );
        }
        // Another id (a new request) is accepted, in any key order.
        let other = SignedRequest {
            id: "fedcba9876543210fedcba9876543210",
            ..request()
        };
        let reordered = format!("v2={},id={},t={}", v.v2_hex(&other), other.id, other.t);
        assert_eq!(
            v.verify(&headers(&reordered, Some("alice")), "GET", TARGET, NOW),
            Ok(())
        );
        assert_eq!(v.replay_cache().len(), 2);
    }

    #[test]
    fn v1_still_verifies_for_one_release() {
        let v = verifier();
        let h = headers(KNOWN, Some("alice"));
        for now in [1_700_000_000, 1_700_000_060, 1_699_999_940] {
            // The path without the query is what v1 signed; v1 has no id to remember.
            assert_eq!(
                v.verify(&h, "GET", "/users/7?any=query", now),
                Ok(()),
                "now {now}"
            );
        }
        assert!(v.replay_cache().is_empty());
        assert_eq!(
            format!(
                "t=1700000000,v1={}",
                v.mac_hex(1_700_000_000, "GET", "/users/7", b"alice", b"admin")
            ),
            KNOWN
        );
        // With both, v2 decides.
        let both = format!(
            "{KNOWN_V2},v1=5f666c26655b77ca111cd84631aee8bc23f13431e7695b14e9a861f5bb3ae1c0"
        );
        assert_eq!(
            v.verify(&headers(&both, Some("alice")), "GET", "/users/7?x=2", NOW),
            Err(IdentityError::Mismatch)
        );
    }

    #[test]
    fn the_v1_ambiguity_is_refused_in_v2() {
        let v = verifier();
        let john = SignedRequest {
            target: "/users/1",
            user_id: b"john.smith",
            user_role: b"user",
            ..request()
        };
        let signature = sign(&v, &john);
        let mut as_smith = headers(&signature, None);
        as_smith.insert("x-user-id", HeaderValue::from_static("smith"));
        as_smith.insert("x-user-role", HeaderValue::from_static("user"));
        assert_eq!(
            v.verify(&as_smith, "GET", "/users/1.john", NOW),
            Err(IdentityError::Mismatch)
        );
        // v1 could not tell them apart.
        let v1 = format!(
            "t={NOW},v1={}",
            v.mac_hex(NOW, "GET", "/users/1", b"john.smith", b"user")
        );
        let mut v1_as_smith = as_smith.clone();
        v1_as_smith.insert(SIGNATURE_HEADER, HeaderValue::from_str(&v1).unwrap());
        assert_eq!(v.verify(&v1_as_smith, "GET", "/users/1.john", NOW), Ok(()));
    }

    #[test]
    fn refuses_any_change_to_what_was_signed() {
        let now = NOW;
        /// Changes the request's headers and gives its method and target.
        type Change = fn(&mut HeaderMap) -> (&'static str, &'static str);
        let changed: [(&str, Change); 9] = [
            ("method", |_| ("POST", TARGET)),
            ("path", |_| ("GET", "/users/8?x=1")),
            ("query", |_| ("GET", "/users/7?x=2")),
            ("no query", |_| ("GET", "/users/7")),
            ("host", |h| {
                h.insert("host", HeaderValue::from_static("evil.example"));
                ("GET", TARGET)
            }),
            ("user", |h| {
                h.insert("x-user-id", HeaderValue::from_static("mallory"));
                ("GET", TARGET)
            }),
            ("role", |h| {
                h.insert("x-user-role", HeaderValue::from_static("user"));
                ("GET", TARGET)
            }),
            ("api key name", |h| {
                h.insert("x-api-key-name", HeaderValue::from_static("billing"));
                ("GET", TARGET)
            }),
            ("anonymous", |h| {
                h.remove("x-user-id");
                h.remove("x-user-role");
                ("GET", TARGET)
            }),
        ];
        for (what, change) in changed {
            let v = verifier();
            let mut h = headers(KNOWN_V2, Some("alice"));
            let (method, target) = change(&mut h);
            assert_eq!(
                v.verify(&h, method, target, now),
                Err(IdentityError::Mismatch),
                "{what}"
            );
            // A refused request burns no id: the genuine one still passes.
            let genuine = headers(KNOWN_V2, Some("alice"));
            assert_eq!(v.verify(&genuine, "GET", TARGET, now), Ok(()), "{what}");
        }
        let v = verifier();
        // Another id in the header, one flipped hex digit, another secret.
        let other_id = KNOWN_V2.replace("id=0123", "id=1123");
        let tampered = KNOWN_V2.replace("v2=0da8", "v2=1da8");
        for bad in [other_id, tampered] {
            assert_eq!(
                v.verify(&headers(&bad, Some("alice")), "GET", TARGET, now),
                Err(IdentityError::Mismatch),
                "{bad}"
            );
        }
        let other = IdentityVerifier::new(&"z".repeat(32)).unwrap();
        assert_eq!(
            other.verify(&headers(KNOWN_V2, Some("alice")), "GET", TARGET, now),
            Err(IdentityError::Mismatch)
        );
    }

    #[test]
    fn refuses_expired_and_future_signatures() {
        let v = verifier();
        let h = headers(KNOWN_V2, Some("alice"));
        assert_eq!(
            v.verify(&h, "GET", TARGET, NOW + 61),
            Err(IdentityError::Expired(61))
        );
        assert_eq!(
            v.verify(&h, "GET", TARGET, NOW - 61),
            Err(IdentityError::Future(61))
        );
        let h = headers(KNOWN, Some("alice"));
        assert_eq!(
            v.verify(&h, "GET", "/users/7", NOW + 61),
            Err(IdentityError::Expired(61))
        );
    }

    #[test]
    fn refuses_missing_and_malformed_headers() {
        let v = verifier();
        assert_eq!(
            v.verify(&HeaderMap::new(), "GET", "/", 0),
            Err(IdentityError::Missing)
        );
        let mac = "0da8f92987adf82b1a259915f1a48d5a183b85ea7effb0bb468e93f47f78709d";
        for bad in [
            "v1=00".to_owned(),
            "t=,v1=00".to_owned(),
            format!("t=12x,v1={mac}"),
            format!("t=1700000000,v1={}", mac.to_uppercase()),
            "t=1700000000,v1=5f66".to_owned(),
            format!("t=1700000000;v1={mac}"),
            // v2 without an id, with an empty or invalid one, a short MAC, repeated keys.
            format!("t=1700000000,v2={mac}"),
            format!("t=1700000000,id=,v2={mac}"),
            format!("t=1700000000,id=a b,v2={mac}"),
            format!("t=1700000000,id={},v2={mac}", "a".repeat(129)),
            "t=1700000000,id=abc,v2=0da8".to_owned(),
            format!("t=1700000000,t=1700000001,id=abc,v2={mac}"),
            format!("t=1700000000,id=abc,id=abd,v2={mac}"),
            // No version at all, or a pair without '='.
            "t=1700000000,id=abc".to_owned(),
            format!("t=1700000000,id=abc,v2={mac},junk"),
        ] {
            assert_eq!(
                v.verify(&headers(&bad, None), "GET", "/", NOW),
                Err(IdentityError::Malformed),
                "{bad}"
            );
        }
        // Unknown keys are room for later versions.
        let later = format!("{KNOWN_V2},v3=whatever");
        assert_eq!(
            v.verify(&headers(&later, Some("alice")), "GET", TARGET, NOW),
            Ok(())
        );
    }

    #[test]
    fn the_replay_cache_forgets_ids_once_their_window_has_passed() {
        let cache = ReplayCache::default();
        assert!(cache.insert("a", 100, 50));
        assert!(!cache.insert("a", 100, 100));
        // Past its window the id may come again (its t would be refused anyway).
        assert!(cache.insert("a", 200, 101));
        // Expired entries are swept as the map grows: memory follows the traffic of one window.
        for i in 0..5000 {
            assert!(cache.insert(&format!("old-{i}"), 1000, 900));
        }
        for i in 0..5000 {
            assert!(cache.insert(&format!("new-{i}"), 3000, 2000));
        }
        assert!(cache.len() <= 5000 + 1024, "{}", cache.len());
    }

    #[test]
    fn secrets_must_match_the_gateway_rules() {
        assert!(IdentityVerifier::new(&"s".repeat(31)).is_none());
        assert!(IdentityVerifier::new(&"s".repeat(257)).is_none());
        assert!(IdentityVerifier::new(&format!("{} ", "s".repeat(32))).is_none());
        assert!(IdentityVerifier::new(&"s".repeat(32)).is_some());
        assert_eq!(format!("{:?}", verifier()), "IdentityVerifier(..)");
    }
}
