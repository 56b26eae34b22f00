//! Verification of the gateway's signed identity (`X-Gateway-Signature`), as
//! a backend should do it, when the mock runs with `--identity-secret` /
//! `MOCK_IDENTITY_SECRET`:
//!
//! ```text
//! X-Gateway-Signature: t=<unix seconds>,v1=<lowercase hex HMAC-SHA256(secret, "t.method.path.x-user-id.x-user-role")>
//! ```
//!
//! `path` is the request path without the query; a missing identity header
//! counts as an empty string. A request is refused (401) when the header is
//! missing or malformed, the MAC does not match (compared in constant time),
//! or `t` is more than [`MAX_SKEW_SECONDS`] away from the mock's clock
//! (replay window). Written independently of the gateway's signer so each
//! checks the other; both are pinned to the same known-answer vector.

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

type HmacSha256 = Hmac<Sha256>;

/// Why a request's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// No `X-Gateway-Signature` (or more than one).
    #[error("missing X-Gateway-Signature")]
    Missing,
    /// Not `t=<digits>,v1=<64 hex digits>`.
    #[error("malformed X-Gateway-Signature (expected t=<unix seconds>,v1=<64 hex digits>)")]
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
}

/// Checks signatures made with one secret.
#[derive(Clone)]
pub struct IdentityVerifier {
    mac: HmacSha256,
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
        })
    }

    /// The lowercase hex MAC of one request (what `v1=` must hold).
    pub fn mac_hex(&self, t: u64, method: &str, path: &str, user: &[u8], role: &[u8]) -> String {
        hex::encode(self.tag(t, method, path, user, role))
    }

    fn tag(&self, t: u64, method: &str, path: &str, user: &[u8], role: &[u8]) -> Vec<u8> {
        let mut mac = self.mac.clone();
        mac.update(format!("{t}.{method}.{path}.").as_bytes());
        mac.update(user);
        mac.update(b".");
        mac.update(role);
        mac.finalize().into_bytes().to_vec()
    }

    /// Verifies the signature of a request with these `headers`, `method` and
    /// `path` (no query), at `now` (Unix seconds).
    pub fn verify(
        &self,
        headers: &HeaderMap,
        method: &str,
        path: &str,
        now: u64,
    ) -> Result<(), IdentityError> {
        let mut all = headers.get_all(SIGNATURE_HEADER).iter();
        let value = all.next().ok_or(IdentityError::Missing)?;
        if all.next().is_some() {
            return Err(IdentityError::Missing);
        }
        let (t, given) = parse(value.as_bytes()).ok_or(IdentityError::Malformed)?;
        if t + MAX_SKEW_SECONDS < now {
            return Err(IdentityError::Expired(now - t));
        }
        if t > now + MAX_SKEW_SECONDS {
            return Err(IdentityError::Future(t - now));
        }
        let header = |name| headers.get(name).map_or(&b""[..], |v| v.as_bytes());
        let mut mac = self.mac.clone();
        mac.update(format!("{t}.{method}.{path}.").as_bytes());
        mac.update(header("x-user-id"));
        mac.update(b".");
        mac.update(header("x-user-role"));
        mac.verify_slice(&given)
            .map_err(|_| IdentityError::Mismatch)
    }
}

/// `t=<digits>,v1=<64 lowercase hex>` → (t, MAC bytes).
fn parse(value: &[u8]) -> Option<(u64, [u8; 32])> {
    let text = std::str::from_utf8(value).ok()?;
    let (t, v1) = text.strip_prefix("t=")?.split_once(",v1=")?;
    if t.is_empty() || t.len() > 19 || !t.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if v1.len() != 64 || !v1.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut mac = [0u8; 32];
    hex::decode_to_slice(v1, &mut mac).ok()?;
    Some((t.parse().ok()?, mac))
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
    /// The gateway's known-answer vector (data-plane/src/signature.rs), computed with Python's hmac.
    const KNOWN: &str =
        "t=1700000000,v1=5f666c26655b77ca111cd84631aee8bc23f13431e7695b14e9a861f5bb3ae1c0";

    fn headers(signature: &str, user: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(signature).unwrap());
        if let Some(u) = user {
            h.insert("x-user-id", HeaderValue::from_str(u).unwrap());
            h.insert("x-user-role", HeaderValue::from_static("admin"));
        }
        h
    }

    fn verifier() -> IdentityVerifier {
        IdentityVerifier::new(SECRET).unwrap()
    }

    #[test]
    fn accepts_the_known_answer_within_the_window() {
        let v = verifier();
        let h = headers(KNOWN, Some("alice"));
        for now in [1_700_000_000, 1_700_000_060, 1_699_999_940] {
            assert_eq!(v.verify(&h, "GET", "/users/7", now), Ok(()), "now {now}");
        }
        assert_eq!(
            format!(
                "t=1700000000,v1={}",
                v.mac_hex(1_700_000_000, "GET", "/users/7", b"alice", b"admin")
            ),
            KNOWN
        );
    }

    #[test]
    fn refuses_replays_and_future_signatures() {
        let v = verifier();
        let h = headers(KNOWN, Some("alice"));
        assert_eq!(
            v.verify(&h, "GET", "/users/7", 1_700_000_061),
            Err(IdentityError::Expired(61))
        );
        assert_eq!(
            v.verify(&h, "GET", "/users/7", 1_699_999_939),
            Err(IdentityError::Future(61))
        );
    }

    #[test]
    fn refuses_any_change_to_what_was_signed() {
        let v = verifier();
        let now = 1_700_000_000;
        let h = headers(KNOWN, Some("alice"));
        assert_eq!(
            v.verify(&h, "POST", "/users/7", now),
            Err(IdentityError::Mismatch)
        );
        assert_eq!(
            v.verify(&h, "GET", "/users/8", now),
            Err(IdentityError::Mismatch)
        );
        let other_user = headers(KNOWN, Some("mallory"));
        assert_eq!(
            v.verify(&other_user, "GET", "/users/7", now),
            Err(IdentityError::Mismatch)
        );
        let anonymous = headers(KNOWN, None);
        assert_eq!(
            v.verify(&anonymous, "GET", "/users/7", now),
            Err(IdentityError::Mismatch)
        );
        // One flipped hex digit.
        let tampered = KNOWN.replace("5f666c26", "5f666c27");
        assert_eq!(
            v.verify(&headers(&tampered, Some("alice")), "GET", "/users/7", now),
            Err(IdentityError::Mismatch)
        );
        // Another secret.
        let other = IdentityVerifier::new(&"z".repeat(32)).unwrap();
        assert_eq!(
            other.verify(&h, "GET", "/users/7", now),
            Err(IdentityError::Mismatch)
        );
    }

    #[test]
    fn refuses_missing_and_malformed_headers() {
        let v = verifier();
        assert_eq!(
            v.verify(&HeaderMap::new(), "GET", "/", 0),
            Err(IdentityError::Missing)
        );
        for bad in [
            "v1=00",
            "t=,v1=00",
            "t=12x,v1=5f666c26655b77ca111cd84631aee8bc23f13431e7695b14e9a861f5bb3ae1c0",
            "t=1700000000,v1=5F666C26655B77CA111CD84631AEE8BC23F13431E7695B14E9A861F5BB3AE1C0",
            "t=1700000000,v1=5f66",
            "t=1700000000;v1=5f666c26655b77ca111cd84631aee8bc23f13431e7695b14e9a861f5bb3ae1c0",
        ] {
            assert_eq!(
                v.verify(&headers(bad, None), "GET", "/", 1_700_000_000),
                Err(IdentityError::Malformed),
                "{bad}"
            );
        }
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
