//! Signed identity (`Upstream.identity_signing_secret`): every request
//! forwarded to such an upstream carries `X-Gateway-Signature`.
//!
//! **v3** (what the gateway sends):
//!
//! ```text
//! X-Gateway-Signature: t=<unix seconds>,id=<32 lowercase hex, fresh per request>,v3=<64 lowercase hex>
//! v3 = HMAC-SHA256(secret, field("x-gateway-signature-v3") || field(t) || field(id) || field(audience)
//!                          || field(mirror) || field(method) || field(host) || field(target)
//!                          || field(x-user-id) || field(x-user-role) || field(x-api-key-name)
//!                          || field(body))
//! field(x) = the length of x in bytes, 4 bytes big-endian, then x
//! ```
//!
//! `t` and `id` are the header's own digits; `audience` is the name of the
//! upstream the request is sent to; `mirror` is `1` when the request carries
//! `X-Gateway-Mirror: 1` (a mirror copy to a shadow: the gateway sets that
//! header on copies, after the route's header transforms, and removes a
//! client's) and `0` otherwise;
//! `host` is the `Host` header as sent; `target` is the request target as
//! sent (path after rewrite, with the query: `/users/7?x=1`); a missing header
//! is an empty field. `body` is the lowercase hex SHA-256 of the body when the
//! gateway holds the whole body before the request leaves, and empty when the
//! body streams:
//!
//! * covered: a request without a body (the SHA-256 of no bytes,
//!   `e3b0c442…b855`), a retrying route's request whose body it read to send
//!   again, a mirror copy with `include_body`, an aggregation part;
//! * not covered (empty field): any other request with a body, which streams
//!   upstream as it arrives; buffering it to sign it would hold back its first
//!   byte (and the whole body in memory).
//!
//! What v3 adds to v2: a secret shared by two upstreams, or a shadow that
//! received a copy, cannot replay a request to the other upstream (the
//! audience differs) nor pass a copy off as a primary request (the mirror
//! field), and a covered body cannot be swapped. Validation refuses one secret
//! on two upstreams. A verifier checks the audience it was configured with,
//! refuses `mirror=1` unless it is a shadow, and computes the MAC with an
//! empty body field and, when that does not match, with the digest of the
//! body it received (`mocks/src/identity.rs`).
//!
//! Every field is length-prefixed, so no two requests sign the same bytes,
//! and the first field separates v3 messages from v2's and v1's. `id` is
//! drawn from the thread's CSPRNG for each signed request (and each retry),
//! not taken from `X-Request-Id`, which clients may choose and reuse: a
//! backend remembers ids for the 60 s window and refuses one seen before.
//!
//! **v2** (the previous release, no longer sent; the mocks' verifier accepts
//! it for one more release unless it is told its audience, since v2 binds
//! none): the same without `audience`, `mirror` and `body`, context
//! `x-gateway-signature-v2`, header `t=..,id=..,v2=..`. v3 is not sent beside
//! v2: upgrade the backends' verifiers first (they accept both), then the
//! gateways, then give the verifiers their audience.
//!
//! Hot path: the HMAC key schedule (the inner and outer SHA-256 states after
//! the padded key block) is computed once per snapshot in [`Signer::new`];
//! signing a request clones that state, hashes a few hundred bytes at most
//! (plus the body, for the paths above that hold it), draws 16 random bytes
//! and formats the value into one buffer (its only allocation).

use hmac::{Hmac, KeyInit as _, Mac as _};
use http::header::{self, HeaderMap, HeaderValue};
use sha2_hmac::{Digest as _, Sha256};

pub use crate::policy::sanitize::X_GATEWAY_SIGNATURE;
use crate::policy::sanitize::{X_API_KEY_NAME, X_GATEWAY_MIRROR, X_USER_ID, X_USER_ROLE};

type HmacSha256 = Hmac<Sha256>;

/// The first field of every v3 message (domain separation from v2 and v1).
pub const V3_CONTEXT: &[u8] = b"x-gateway-signature-v3";

/// The body field of a request without a body: SHA-256 of no bytes.
pub const EMPTY_BODY_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The precomputed HMAC state of one upstream's secret, and its name (the audience).
#[derive(Clone)]
pub struct Signer {
    mac: HmacSha256,
    audience: Box<str>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret (nor state derived from it).
        write!(f, "Signer({:?}, ..)", self.audience)
    }
}

/// The body of a signed request, as far as the gateway holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignedBody<'a> {
    /// The body streams upstream as it arrives: not covered (an empty field).
    Streamed,
    /// The whole body (empty for a request without one): its SHA-256 is covered.
    Whole(&'a [u8]),
}

/// What a v3 signature covers, as sent upstream (the audience is the signer's).
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    /// Unix seconds (the header's `t`).
    pub t: u64,
    /// The per-request id (the header's `id`): visible ASCII without `,`.
    pub id: &'a str,
    /// Whether the request is a mirror copy (carries `X-Gateway-Mirror: 1`).
    pub mirror: bool,
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
    /// The lowercase hex SHA-256 of the body, or empty when it is not covered.
    pub body_sha256: &'a [u8],
}

impl Signer {
    /// The signer of `secret` for the upstream named `audience` (`None` for
    /// an empty secret: no signing).
    pub fn new(secret: &str, audience: &str) -> Option<Self> {
        if secret.is_empty() {
            return None;
        }
        let mac = HmacSha256::new_from_slice(secret.as_bytes()).ok()?;
        Some(Self {
            mac,
            audience: audience.into(),
        })
    }

    /// The audience signed: the upstream's name.
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The v3 header value for `signed`.
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
        field(V3_CONTEXT);
        field(&out.as_bytes()[2..]);
        for part in [
            signed.id.as_bytes(),
            self.audience.as_bytes(),
            if signed.mirror { b"1" } else { b"0" },
            signed.method.as_bytes(),
            signed.host,
            signed.target.as_bytes(),
            signed.user_id,
            signed.user_role,
            signed.api_key_name,
            signed.body_sha256,
        ] {
            field(part);
        }
        let tag = mac.finalize().into_bytes();
        let mut hex = [0u8; 64];
        gateway_hex::encode_to_slice(&tag, &mut hex);
        out.push_str(",id=");
        out.push_str(signed.id);
        out.push_str(",v3=");
        out.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
        HeaderValue::try_from(out)
            .expect("digits, hex, a visible ASCII id, '=' and ',' form a header value")
    }

    /// Sets a v3 `X-Gateway-Signature` on an upstream request's headers
    /// (replacing any), over `method`, `target` (path and query as sent),
    /// `body`, and the `Host`, identity and mirror headers it carries, with a
    /// fresh id.
    pub fn sign(
        &self,
        headers: &mut HeaderMap,
        method: &str,
        target: &str,
        body: SignedBody<'_>,
        unix_seconds: u64,
    ) {
        let id = new_id();
        let id = std::str::from_utf8(&id).expect("hex digits are ASCII");
        let digest;
        let body_sha256 = match body {
            SignedBody::Streamed => &b""[..],
            SignedBody::Whole([]) => EMPTY_BODY_SHA256.as_bytes(),
            SignedBody::Whole(bytes) => {
                digest = body_sha256(bytes);
                &digest[..]
            }
        };
        let get = |name| headers.get(name).map_or(&b""[..], HeaderValue::as_bytes);
        let value = self.value(&Signed {
            t: unix_seconds,
            id,
            mirror: get(&X_GATEWAY_MIRROR) == b"1",
            method,
            host: get(&header::HOST),
            target,
            user_id: get(&X_USER_ID),
            user_role: get(&X_USER_ROLE),
            api_key_name: get(&X_API_KEY_NAME),
            body_sha256,
        });
        headers.insert(X_GATEWAY_SIGNATURE.clone(), value);
    }

    /// [`Signer::sign`] over a request's own method and target.
    pub fn sign_request<B>(&self, req: &mut http::Request<B>, body: SignedBody<'_>) {
        // Cheap clones (a method is inline, a URI shares its bytes): the headers are borrowed mutably.
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
        self.sign(req.headers_mut(), method.as_str(), target, body, unix_now());
    }
}

/// The lowercase hex SHA-256 of `body`.
pub fn body_sha256(body: &[u8]) -> [u8; 64] {
    let mut hex = [0u8; 64];
    gateway_hex::encode_to_slice(&Sha256::digest(body), &mut hex);
    hex
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

    /// The known-answer vectors shared with mocks/src/identity.rs and the docs.
    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    /// Computed independently with Python:
    /// `hmac.new(SECRET, b"".join(len(f).to_bytes(4, "big") + f for f in [b"x-gateway-signature-v3",
    /// b"1700000000", b"0123456789abcdef0123456789abcdef", b"users", b"0", b"GET", b"api.example",
    /// b"/users/7?x=1", b"alice", b"admin", b"", BODY]), sha256).hexdigest()`
    /// with `BODY = b""` (a body not covered).
    const KNOWN_V3: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
         v3=15045b67488f76b821a3768a22d2b61562183d824f0447c119f995e4d5c17511";
    /// The same with `BODY = hashlib.sha256(b"").hexdigest().encode()` (no body, covered).
    const KNOWN_V3_NO_BODY: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
         v3=fece2348e358b8fccde29657bb3bf929e7a4c2a21bf6cf7e8e738c2d4a597bae";
    /// The same as a POST to `/users` with the body `{"name":"alice"}`, whose
    /// SHA-256 is `hashlib.sha256(b'{"name":"alice"}').hexdigest()`.
    const KNOWN_V3_POST: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
         v3=d82d2a470c9ed68ee5ee66570def61a760a442427e1f26c1bf354934e84f40a2";
    const POST_BODY_SHA256: &str =
        "3b8f02c64624e355de637e609642b441ab1427b619d9fb91cb6c7b0e8f8ceed1";
    /// `KNOWN_V3` with audience `b"users-shadow"` and mirror `b"1"`.
    const KNOWN_V3_SHADOW: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
         v3=861c4af7e8666d3da6fb737209eb3618b05c5f2a13c4a1a28d6605232b92ea9c";

    fn signer() -> Signer {
        Signer::new(SECRET, "users").unwrap()
    }

    fn signed<'a>() -> Signed<'a> {
        Signed {
            t: 1_700_000_000,
            id: "0123456789abcdef0123456789abcdef",
            mirror: false,
            method: "GET",
            host: b"api.example",
            target: "/users/7?x=1",
            user_id: b"alice",
            user_role: b"admin",
            api_key_name: b"",
            body_sha256: b"",
        }
    }

    /// The MAC of a header value.
    fn mac(v: &HeaderValue) -> String {
        v.to_str()
            .unwrap()
            .rsplit_once(",v3=")
            .unwrap()
            .1
            .to_owned()
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
    fn v3_format_and_known_answers() {
        let s = signer();
        assert_eq!(s.value(&signed()), KNOWN_V3);
        assert_eq!(
            s.value(&Signed {
                body_sha256: EMPTY_BODY_SHA256.as_bytes(),
                ..signed()
            }),
            KNOWN_V3_NO_BODY
        );
        assert_eq!(
            body_sha256(br#"{"name":"alice"}"#),
            POST_BODY_SHA256.as_bytes()
        );
        assert_eq!(body_sha256(b""), EMPTY_BODY_SHA256.as_bytes());
        assert_eq!(
            s.value(&Signed {
                method: "POST",
                target: "/users",
                body_sha256: POST_BODY_SHA256.as_bytes(),
                ..signed()
            }),
            KNOWN_V3_POST
        );
        let shadow = Signer::new(SECRET, "users-shadow").unwrap();
        assert_eq!(
            shadow.value(&Signed {
                mirror: true,
                ..signed()
            }),
            KNOWN_V3_SHADOW
        );
    }

    #[test]
    fn v3_covers_every_field_and_length_prefixes_them() {
        let s = signer();
        let base = s.value(&signed());
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
                mirror: true,
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
            Signed {
                body_sha256: EMPTY_BODY_SHA256.as_bytes(),
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
        // Another secret, or the same secret for another upstream (audience).
        let other = Signer::new(&"x".repeat(32), "users").unwrap();
        assert_ne!(mac(&other.value(&signed())), mac(&base));
        let elsewhere = Signer::new(SECRET, "orders").unwrap();
        assert_ne!(mac(&elsewhere.value(&signed())), mac(&base));
    }

    #[test]
    fn no_bytes_move_between_neighbouring_fields() {
        let s = signer();
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
        // The audience and the mirror flag are fields of their own too.
        let shadow = Signer::new(SECRET, "users1").unwrap();
        let bare = Signer::new(SECRET, "users").unwrap();
        assert_ne!(
            mac(&shadow.value(&signed())),
            mac(&bare.value(&Signed {
                mirror: true,
                ..signed()
            }))
        );
    }

    /// The id and t of a value `sign` made.
    fn id_of(value: &HeaderValue) -> (u64, String) {
        let v = value.to_str().unwrap();
        let (t, rest) = v.strip_prefix("t=").unwrap().split_once(",id=").unwrap();
        let id = rest.split_once(",v3=").unwrap().0;
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
        (t.parse().unwrap(), id.to_owned())
    }

    #[test]
    fn sign_reads_host_identity_and_mirror_and_draws_a_fresh_id() {
        let s = signer();
        let mut h = HeaderMap::new();
        h.insert(&X_GATEWAY_SIGNATURE, HeaderValue::from_static("forged"));
        h.insert(header::HOST, HeaderValue::from_static("api.example"));
        h.insert(&X_USER_ID, HeaderValue::from_static("alice"));
        h.insert(&X_USER_ROLE, HeaderValue::from_static("admin"));
        h.insert(&X_API_KEY_NAME, HeaderValue::from_static("billing"));
        s.sign(
            &mut h,
            "GET",
            "/users/7?x=1",
            SignedBody::Streamed,
            1_700_000_000,
        );
        assert_eq!(h.get_all(&X_GATEWAY_SIGNATURE).iter().count(), 1);
        let value = h[&X_GATEWAY_SIGNATURE].clone();
        let (t, id) = id_of(&value);
        assert_eq!(t, 1_700_000_000);
        let want = s.value(&Signed {
            id: &id,
            api_key_name: b"billing",
            ..signed()
        });
        assert_eq!(value, want);
        // Another request, another id.
        s.sign(
            &mut h,
            "GET",
            "/users/7?x=1",
            SignedBody::Streamed,
            1_700_000_000,
        );
        assert_ne!(h[&X_GATEWAY_SIGNATURE], value);
        // A mirror copy (the gateway's marker) flips the mirror field, and so the MAC.
        h.insert(&X_GATEWAY_MIRROR, HeaderValue::from_static("1"));
        s.sign(
            &mut h,
            "GET",
            "/users/7?x=1",
            SignedBody::Streamed,
            1_700_000_000,
        );
        let (_, id) = id_of(&h[&X_GATEWAY_SIGNATURE]);
        let copy = Signed {
            id: &id,
            api_key_name: b"billing",
            ..signed()
        };
        assert_eq!(
            h[&X_GATEWAY_SIGNATURE],
            s.value(&Signed {
                mirror: true,
                ..copy
            })
        );
        assert_ne!(mac(&h[&X_GATEWAY_SIGNATURE]), mac(&s.value(&copy)));
        // Missing headers are empty fields.
        let mut bare = HeaderMap::new();
        s.sign(&mut bare, "GET", "/", SignedBody::Streamed, 1);
        let (_, id) = id_of(&bare[&X_GATEWAY_SIGNATURE]);
        let empty = Signed {
            t: 1,
            id: &id,
            mirror: false,
            method: "GET",
            host: b"",
            target: "/",
            user_id: b"",
            user_role: b"",
            api_key_name: b"",
            body_sha256: b"",
        };
        assert_eq!(bare[&X_GATEWAY_SIGNATURE], s.value(&empty));
    }

    #[test]
    fn a_held_body_is_covered_by_its_digest() {
        let s = signer();
        let sign = |body| {
            let mut req = http::Request::post("/users")
                .header("host", "api.example")
                .header("x-user-id", "alice")
                .header("x-user-role", "admin")
                .body(())
                .unwrap();
            s.sign_request(&mut req, body);
            let value = req.headers()[&X_GATEWAY_SIGNATURE].clone();
            let (t, id) = id_of(&value);
            (value, t, id)
        };
        let (value, t, id) = sign(SignedBody::Whole(br#"{"name":"alice"}"#));
        let post = Signed {
            t,
            id: &id,
            method: "POST",
            target: "/users",
            body_sha256: POST_BODY_SHA256.as_bytes(),
            ..signed()
        };
        assert_eq!(value, s.value(&post));
        // Another body, no body, a streamed body: other MACs for the same request.
        for (body, digest) in [
            (
                SignedBody::Whole(br#"{"name":"mallory"}"#),
                body_sha256(br#"{"name":"mallory"}"#),
            ),
            (
                SignedBody::Whole(b""),
                *<&[u8; 64]>::try_from(EMPTY_BODY_SHA256.as_bytes()).unwrap(),
            ),
        ] {
            let (value, t, id) = sign(body);
            let want = Signed {
                t,
                id: &id,
                body_sha256: &digest,
                ..post
            };
            assert_eq!(value, s.value(&want));
            let same_id = Signed { t, id: &id, ..post };
            assert_ne!(mac(&value), mac(&s.value(&same_id)));
        }
        let (value, t, id) = sign(SignedBody::Streamed);
        assert_eq!(
            value,
            s.value(&Signed {
                t,
                id: &id,
                body_sha256: b"",
                ..post
            })
        );
    }

    #[test]
    fn no_secret_no_signer_and_debug_hides_it() {
        assert!(Signer::new("", "users").is_none());
        assert_eq!(format!("{:?}", signer()), "Signer(\"users\", ..)");
        assert_eq!(signer().audience(), "users");
    }
}
