//! Signed identity (`Upstream.identity_signing_secret`): every request
//! forwarded to such an upstream carries `X-Gateway-Signature`.
//!
//! **v2** (what the gateway sends):
//!
//! ```text
//! X-Gateway-Signature: t=<unix seconds>,id=<32 lowercase hex, fresh per request>,v2=<64 lowercase hex>
//! v2 = HMAC-SHA256(secret, field("x-gateway-signature-v2") || field(t) || field(id) || field(method)
//!                          || field(host) || field(target) || field(x-user-id) || field(x-user-role)
//!                          || field(x-api-key-name))
//! field(x) = the length of x in bytes, 4 bytes big-endian, then x
//! ```
//!
//! `t` and `id` are the header's own digits; `host` is the `Host` header as
//! sent; `target` is the request target as sent (path after rewrite, with the
//! query: `/users/7?x=1`); a missing header is an empty field. Every field is
//! length-prefixed, so no two requests sign the same bytes (with v1's dots,
//! subject `john.smith` on `/users/1` signed what `smith` on `/users/1.john`
//! did), and the first field separates v2 messages from v1's (which start
//! with digits). `id` is drawn from the thread's CSPRNG for each signed
//! request, not taken from `X-Request-Id`, which clients may choose and reuse:
//! a backend remembers ids for the 60 s window and refuses one seen before.
//! The body is not covered: it streams, and signing it would mean buffering
//! it before the first byte goes upstream.
//!
//! **v1** (the previous release, no longer sent; backends accept it for one
//! more release, for gateways not yet upgraded):
//! `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "t.method.path.x-user-id.x-user-role")>`,
//! path without the query. v1 is not sent beside v2: verifiers of the previous
//! release parse `t=...,v1=...` strictly and would refuse any longer header,
//! so upgrade the backends' verifiers first (they accept both), then the
//! gateways.
//!
//! Hot path: the HMAC key schedule (the inner and outer SHA-256 states after
//! the padded key block) is computed once per snapshot in [`Signer::new`];
//! signing a request clones that state, hashes a few hundred bytes at most,
//! draws 16 random bytes and formats the value into one buffer (its only
//! allocation).

use hmac::{Hmac, KeyInit as _, Mac as _};
use http::header::{self, HeaderMap, HeaderValue};
use sha2_hmac::Sha256;

pub use crate::policy::sanitize::X_GATEWAY_SIGNATURE;
use crate::policy::sanitize::{X_API_KEY_NAME, X_USER_ID, X_USER_ROLE};

type HmacSha256 = Hmac<Sha256>;

/// The first field of every v2 message (domain separation from v1).
pub const V2_CONTEXT: &[u8] = b"x-gateway-signature-v2";

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

/// What a v2 signature covers, as sent upstream.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    /// Unix seconds (the header's `t`).
    pub t: u64,
    /// The per-request id (the header's `id`): visible ASCII without `,`.
    pub id: &'a str,
    /// The method.
    pub method: &'a str,
    /// The `Host` header (empty when there is none).
    pub host: &'a [u8],
    /// The request target: path and query, exactly as in the request line.
    pub target: &'a str,
    /// `X-User-Id` (empty when there is none).
    pub user_id: &'a [u8],
    /// `X-User-Role` (empty when there is none).
    pub user_role: &'a [u8],
    /// `X-Api-Key-Name` (empty when there is none).
    pub api_key_name: &'a [u8],
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

    /// The v2 header value for `signed`.
    ///
    /// # Panics
    ///
    /// When `signed.id` is not visible ASCII (ids are made by this module).
    pub fn value(&self, signed: &Signed<'_>) -> HeaderValue {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(2 + 20 + 4 + signed.id.len() + 4 + 64);
        out.push_str("t=");
        let _ = write!(out, "{}", signed.t);
        let mut mac = self.mac.clone();
        let mut field = |bytes: &[u8]| {
            let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            mac.update(&len.to_be_bytes());
            mac.update(bytes);
        };
        field(V2_CONTEXT);
        field(&out.as_bytes()[2..]);
        for part in [
            signed.id.as_bytes(),
            signed.method.as_bytes(),
            signed.host,
            signed.target.as_bytes(),
            signed.user_id,
            signed.user_role,
            signed.api_key_name,
        ] {
            field(part);
        }
        let tag = mac.finalize().into_bytes();
        let mut hex = [0u8; 64];
        gateway_hex::encode_to_slice(&tag, &mut hex);
        out.push_str(",id=");
        out.push_str(signed.id);
        out.push_str(",v2=");
        out.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
        HeaderValue::try_from(out)
            .expect("digits, hex, a visible ASCII id, '=' and ',' form a header value")
    }

    /// Sets a v2 `X-Gateway-Signature` on an upstream request's headers
    /// (replacing any), over `method`, `target` (path and query as sent) and
    /// the `Host` and identity headers it carries, with a fresh id.
    pub fn sign(&self, headers: &mut HeaderMap, method: &str, target: &str, unix_seconds: u64) {
        let id = new_id();
        let id = std::str::from_utf8(&id).expect("hex digits are ASCII");
        let get = |name| headers.get(name).map_or(&b""[..], HeaderValue::as_bytes);
        let value = self.value(&Signed {
            t: unix_seconds,
            id,
            method,
            host: get(&header::HOST),
            target,
            user_id: get(&X_USER_ID),
            user_role: get(&X_USER_ROLE),
            api_key_name: get(&X_API_KEY_NAME),
        });
        headers.insert(X_GATEWAY_SIGNATURE.clone(), value);
    }
}

/// A fresh per-request id: 16 bytes from the thread's CSPRNG, as 32 lowercase hex digits.
fn new_id() -> [u8; 32] {
    use rand::Rng as _;
    let n: u128 = rand::rng().random();
    let mut out = [0u8; 32];
    gateway_hex::encode_to_slice(&n.to_be_bytes(), &mut out);
    out
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
    /// Computed independently with Python:
    /// `hmac.new(SECRET, b"".join(len(f).to_bytes(4, "big") + f for f in [b"x-gateway-signature-v2",
    /// b"1700000000", b"0123456789abcdef0123456789abcdef", b"GET", b"api.example", b"/users/7?x=1",
    /// b"alice", b"admin", b""]), sha256)`.
    const KNOWN_V2: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
         v2=0da8f92987adf82b1a259915f1a48d5a183b85ea7effb0bb468e93f47f78709d";

    fn signed<'a>() -> Signed<'a> {
        Signed {
            t: 1_700_000_000,
            id: "0123456789abcdef0123456789abcdef",
            method: "GET",
            host: b"api.example",
            target: "/users/7?x=1",
            user_id: b"alice",
            user_role: b"admin",
            api_key_name: b"",
        }
    }

    #[test]
    fn rfc4231_test_case_2() {
        // HMAC-SHA256 with key "Jefe" — RFC 4231 §4.3: the primitive is right.
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            gateway_hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn v2_format_and_known_answer() {
        let s = Signer::new(SECRET).unwrap();
        assert_eq!(s.value(&signed()), KNOWN_V2);
    }

    #[test]
    fn v2_covers_every_field_and_length_prefixes_them() {
        let s = Signer::new(SECRET).unwrap();
        let base = s.value(&signed());
        let mac = |v: &HeaderValue| {
            v.to_str()
                .unwrap()
                .rsplit_once(",v2=")
                .unwrap()
                .1
                .to_owned()
        };
        let variants = [
            Signed {
                t: 1_700_000_001,
                ..signed()
            },
            Signed {
                id: "0123456789abcdef0123456789abcdee",
                ..signed()
            },
            Signed {
                method: "HEAD",
                ..signed()
            },
            Signed {
                host: b"evil.example",
                ..signed()
            },
            Signed {
                host: b"",
                ..signed()
            },
            Signed {
                target: "/users/7?x=2",
                ..signed()
            },
            Signed {
                target: "/users/7",
                ..signed()
            },
            Signed {
                user_id: b"bob",
                ..signed()
            },
            Signed {
                user_role: b"user",
                ..signed()
            },
            Signed {
                api_key_name: b"billing",
                ..signed()
            },
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(
                mac(&s.value(v)),
                mac(&base),
                "variant {i} signs the same MAC"
            );
        }
        let other = Signer::new(&"x".repeat(32)).unwrap();
        assert_ne!(mac(&other.value(&signed())), mac(&base));
    }

    #[test]
    fn the_v1_ambiguity_is_gone_in_v2() {
        let s = Signer::new(SECRET).unwrap();
        // v1 signed "t.GET./users/1.john.smith.user" for both of these.
        let john = Signed {
            target: "/users/1",
            user_id: b"john.smith",
            user_role: b"user",
            ..signed()
        };
        let smith = Signed {
            target: "/users/1.john",
            user_id: b"smith",
            ..john
        };
        assert_ne!(s.value(&john), s.value(&smith));
        // Nor can bytes move between neighbouring fields.
        let a = Signed {
            user_id: b"ab",
            user_role: b"c",
            ..signed()
        };
        let b = Signed {
            user_id: b"a",
            user_role: b"bc",
            ..signed()
        };
        assert_ne!(s.value(&a), s.value(&b));
    }

    #[test]
    fn sign_reads_host_and_identity_and_draws_a_fresh_id() {
        let s = Signer::new(SECRET).unwrap();
        let mut h = HeaderMap::new();
        h.insert(&X_GATEWAY_SIGNATURE, HeaderValue::from_static("forged"));
        h.insert(header::HOST, HeaderValue::from_static("api.example"));
        h.insert(&X_USER_ID, HeaderValue::from_static("alice"));
        h.insert(&X_USER_ROLE, HeaderValue::from_static("admin"));
        h.insert(&X_API_KEY_NAME, HeaderValue::from_static("billing"));
        s.sign(&mut h, "GET", "/users/7?x=1", 1_700_000_000);
        assert_eq!(h.get_all(&X_GATEWAY_SIGNATURE).iter().count(), 1);
        let value = h[&X_GATEWAY_SIGNATURE].to_str().unwrap().to_owned();
        let id = value
            .strip_prefix("t=1700000000,id=")
            .and_then(|rest| rest.split_once(",v2="))
            .map(|(id, _)| id.to_owned())
            .unwrap();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
        let want = s.value(&Signed {
            id: &id,
            api_key_name: b"billing",
            ..signed()
        });
        assert_eq!(h[&X_GATEWAY_SIGNATURE], want);
        // Another request, another id.
        s.sign(&mut h, "GET", "/users/7?x=1", 1_700_000_000);
        assert_ne!(h[&X_GATEWAY_SIGNATURE].to_str().unwrap(), value);
        // Missing headers are empty fields.
        let mut bare = HeaderMap::new();
        s.sign(&mut bare, "GET", "/", 1);
        let v = bare[&X_GATEWAY_SIGNATURE].to_str().unwrap();
        let id = &v["t=1,id=".len().."t=1,id=".len() + 32];
        let empty = Signed {
            t: 1,
            id,
            method: "GET",
            host: b"",
            target: "/",
            user_id: b"",
            user_role: b"",
            api_key_name: b"",
        };
        assert_eq!(bare[&X_GATEWAY_SIGNATURE], s.value(&empty));
    }

    #[test]
    fn no_secret_no_signer_and_debug_hides_it() {
        assert!(Signer::new("").is_none());
        assert_eq!(format!("{:?}", Signer::new(SECRET).unwrap()), "Signer(..)");
    }
}
