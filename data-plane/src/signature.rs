//! Signed identity (`Upstream.identity_signing_secret`): every request
//! forwarded to such an upstream carries
//!
//! ```text
//! X-Gateway-Signature: t=<unix seconds>,v1=<lowercase hex HMAC-SHA256(secret, "t.method.path.x-user-id.x-user-role")>
//! ```
//!
//! `path` is the path as sent upstream (after rewrite), without the query: the
//! query is often re-encoded by frameworks, which would make honest requests
//! fail verification; backends that need it covered should not take authority
//! from it. A missing `X-User-Id` / `X-User-Role` signs as an empty string, so
//! an anonymous request cannot be turned into an authenticated one.
//!
//! Hot path: the HMAC key schedule (the inner and outer SHA-256 states after
//! the padded key block) is computed once per snapshot in [`Signer::new`];
//! signing a request clones that state, hashes about a hundred bytes and
//! formats the value into one buffer (its only allocation).

use hmac::{Hmac, KeyInit as _, Mac as _};
use http::header::{HeaderMap, HeaderValue};
use sha2_hmac::Sha256;

pub use crate::sanitize::X_GATEWAY_SIGNATURE;
use crate::sanitize::{X_USER_ID, X_USER_ROLE};

type HmacSha256 = Hmac<Sha256>;

/// The precomputed HMAC state of one upstream's secret.
#[derive(Clone)]
pub struct Signer {
    mac: HmacSha256,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret (nor state derived from it).
        f.write_str("Signer(..)")
    }
}

impl Signer {
    /// The signer of `secret` (`None` for an empty secret: no signing).
    pub fn new(secret: &str) -> Option<Self> {
        if secret.is_empty() {
            return None;
        }
        let mac = HmacSha256::new_from_slice(secret.as_bytes()).ok()?;
        Some(Self { mac })
    }

    /// The header value for a request at `unix_seconds`.
    pub fn value(
        &self,
        unix_seconds: u64,
        method: &str,
        path: &str,
        user_id: &[u8],
        user_role: &[u8],
    ) -> HeaderValue {
        use std::fmt::Write as _;
        // One allocation: the header value, whose digits after "t=" are also the signed `t`.
        let mut out = String::with_capacity(2 + 20 + 4 + 64);
        out.push_str("t=");
        let _ = write!(out, "{unix_seconds}");
        let mut mac = self.mac.clone();
        mac.update(&out.as_bytes()[2..]);
        for part in [method.as_bytes(), path.as_bytes(), user_id, user_role] {
            mac.update(b".");
            mac.update(part);
        }
        let tag = mac.finalize().into_bytes();
        let mut hex = [0u8; 64];
        hex::encode_to_slice(tag, &mut hex).expect("32 bytes are 64 hex digits");
        out.push_str(",v1=");
        out.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
        HeaderValue::try_from(out).expect("digits, letters, '=' and ',' form a header value")
    }

    /// Sets `X-Gateway-Signature` on an upstream request's headers (replacing
    /// any), signing the identity headers it carries.
    pub fn sign(&self, headers: &mut HeaderMap, method: &str, path: &str, unix_seconds: u64) {
        let id = headers.get(&X_USER_ID).map_or(&b""[..], |v| v.as_bytes());
        let role = headers.get(&X_USER_ROLE).map_or(&b""[..], |v| v.as_bytes());
        let value = self.value(unix_seconds, method, path, id, role);
        headers.insert(X_GATEWAY_SIGNATURE.clone(), value);
    }
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

    /// The known-answer vector shared with mocks/src/identity.rs and the README.
    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    /// Computed independently with Python: `hmac.new(SECRET, b"1700000000.GET./users/7.alice.admin", sha256)`.
    const KNOWN: &str =
        "t=1700000000,v1=5f666c26655b77ca111cd84631aee8bc23f13431e7695b14e9a861f5bb3ae1c0";

    #[test]
    fn rfc4231_test_case_2() {
        // HMAC-SHA256 with key "Jefe" — RFC 4231 §4.3: the primitive is right.
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn format_and_known_answer() {
        let s = Signer::new(SECRET).unwrap();
        let v = s.value(1_700_000_000, "GET", "/users/7", b"alice", b"admin");
        let text = v.to_str().unwrap();
        let (t, mac) = text.split_once(",v1=").unwrap();
        assert_eq!(t, "t=1700000000");
        assert_eq!(mac.len(), 64);
        assert!(mac.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
        // Same as signing the message in one piece.
        let mut one = HmacSha256::new_from_slice(SECRET.as_bytes()).unwrap();
        one.update(b"1700000000.GET./users/7.alice.admin");
        assert_eq!(mac, hex::encode(one.finalize().into_bytes()));
        assert_eq!(text, KNOWN);
    }

    #[test]
    fn every_field_is_covered_and_missing_identity_is_empty() {
        let s = Signer::new(SECRET).unwrap();
        let base = s.value(1, "GET", "/p", b"u", b"r");
        for other in [
            s.value(2, "GET", "/p", b"u", b"r"),
            s.value(1, "POST", "/p", b"u", b"r"),
            s.value(1, "GET", "/q", b"u", b"r"),
            s.value(1, "GET", "/p", b"v", b"r"),
            s.value(1, "GET", "/p", b"u", b"s"),
            Signer::new(&"x".repeat(32))
                .unwrap()
                .value(1, "GET", "/p", b"u", b"r"),
        ] {
            assert_ne!(base, other);
        }
        let mut h = HeaderMap::new();
        h.insert(
            X_GATEWAY_SIGNATURE.clone(),
            HeaderValue::from_static("forged"),
        );
        s.sign(&mut h, "GET", "/p", 1);
        assert_eq!(h[&X_GATEWAY_SIGNATURE], s.value(1, "GET", "/p", b"", b""));
        assert_eq!(h.get_all(&X_GATEWAY_SIGNATURE).iter().count(), 1);
        assert!(Signer::new("").is_none());
        assert_eq!(format!("{:?}", s), "Signer(..)");
    }
}
