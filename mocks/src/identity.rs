//! Verification of the gateway's signed identity (`X-Gateway-Signature`), as
//! a backend should do it, when the mock runs with `--identity-secret` /
//! `MOCK_IDENTITY_SECRET`. Written independently of the gateway's signer
//! (data-plane/src/policy/signature.rs) so each checks the other; both are
//! pinned to the same known-answer vectors.
//!
//! **v3** (what the gateway sends):
//!
//! ```text
//! X-Gateway-Signature: t=<unix seconds>,id=<request id>,v3=<64 lowercase hex>
//! v3 = HMAC-SHA256(secret, field("x-gateway-signature-v3") || field(t) || field(id) || field(audience)
//!                          || field(mirror) || field(method) || field(host) || field(target)
//!                          || field(x-user-id) || field(x-user-role) || field(x-api-key-name)
//!                          || field(body))
//! field(x) = the length of x in bytes, 4 bytes big-endian, then x
//! ```
//!
//! `t` and `id` exactly as in the header; `audience` the name of the upstream
//! this backend is (`--identity-audience`, by default the service's name: the
//! gateway signs the name of the upstream it sends to, which is not in the
//! header); `mirror` `1` when the request carries `X-Gateway-Mirror: 1`, else
//! `0`; `host` the `Host` header; `target` the raw request target (path and
//! query, not decoded); a missing header is an empty field; `body` empty when
//! the gateway streamed the body, else the lowercase hex SHA-256 of the body:
//! the MAC is computed with an empty body field first and, when that does not
//! match, with the digest of the body received ([`IdentityError::BodyNeeded`]
//! asks the caller for it). After the MAC matches, the id is remembered until
//! `t` leaves the window ([`ReplayCache`]); a second request with the same id
//! is refused.
//!
//! So a request signed for another upstream (another audience, even with the
//! same secret) does not match, a body the gateway covered cannot be changed,
//! and a mirror copy (`X-Gateway-Mirror: 1`) is refused unless this backend is
//! a shadow (`--identity-shadow`): a shadow cannot pass on the copies it gets
//! as requests to the primary.
//!
//! **v2** (the previous release, no audience, mirror flag nor body): refused
//! unless `--identity-accept-v2`, which is there for one release, while the
//! gateways are upgraded (verifiers first); v2 binds no audience, so while it
//! is accepted any upstream sharing the secret can replay to this one.
//! **v1** (two releases ago) is refused.
//!
//! The header is a comma-separated list of `key=value` pairs; unknown keys are
//! ignored (room for a later version), a repeated key is malformed, and the
//! newest version present decides. A request is refused (401) when the header
//! is missing or malformed, of a version not accepted, a mirror copy to a
//! backend that is not a shadow, the MAC does not match (compared in constant
//! time), `t` is more than [`MAX_SKEW_SECONDS`] away from the mock's clock, or
//! the id was seen before.

use parking_lot::Mutex;
use std::collections::HashMap;

use hmac::{Hmac, KeyInit as _, Mac as _};
use http::HeaderMap;
use sha2_hmac::{Digest as _, Sha256};

/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-gateway-signature";
/// The header the gateway puts on a mirror copy (value `1`).
pub const MIRROR_HEADER: &str = "x-gateway-mirror";
/// Largest accepted distance between `t` and now, either way, in seconds.
pub const MAX_SKEW_SECONDS: u64 = 60;
/// Shortest accepted secret (the gateway's minimum).
pub const MIN_SECRET_LEN: usize = 32;
/// Longest accepted secret (the gateway's maximum).
pub const MAX_SECRET_LEN: usize = 256;
/// Longest accepted request id (the gateway sends 32 hex digits).
pub const MAX_ID_LEN: usize = 128;
/// Largest body read to check a body digest (the gateway covers at most 64 KiB).
pub const MAX_SIGNED_BODY_BYTES: usize = 1 << 20;
/// The first field of every v3 message.
pub const V3_CONTEXT: &[u8] = b"x-gateway-signature-v3";
/// The first field of every v2 message.
pub const V2_CONTEXT: &[u8] = b"x-gateway-signature-v2";

type HmacSha256 = Hmac<Sha256>;

/// Why a request's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// No `X-Gateway-Signature` (or more than one).
    #[error("missing X-Gateway-Signature")]
    Missing,
    /// Not `t=<digits>,id=<id>,v3=<64 hex digits>` (nor v2's).
    #[error(
        "malformed X-Gateway-Signature (expected t=<unix seconds>,id=<request id>,v3=<64 hex digits>)"
    )]
    Malformed,
    /// A version this verifier does not accept (v1; v2 without `--identity-accept-v2`).
    #[error(
        "X-Gateway-Signature {0} is not accepted: expected v3 (v2 only with --identity-accept-v2, while gateways are upgraded)"
    )]
    Outdated(&'static str),
    /// A mirror copy (`X-Gateway-Mirror: 1`) sent to a backend that is not a shadow.
    #[error("X-Gateway-Signature is a mirror copy's: this backend is not a shadow")]
    MirrorCopy,
    /// The MAC over an empty body field does not match: the body's digest is
    /// needed (the caller reads the body and verifies again with it).
    #[error("X-Gateway-Signature needs the request body")]
    BodyNeeded,
    /// `t` is older than the window.
    #[error("X-Gateway-Signature expired: signed {0} s ago (at most 60 s accepted)")]
    Expired(u64),
    /// `t` is further in the future than the window.
    #[error("X-Gateway-Signature is {0} s in the future (at most 60 s accepted)")]
    Future(u64),
    /// The MAC does not match the request (another upstream's signature included).
    #[error("X-Gateway-Signature does not match the request")]
    Mismatch,
    /// The request id was seen before within the window.
    #[error("X-Gateway-Signature replayed: request id already seen")]
    Replayed,
}

/// What a v3 signature covers, as the backend received it (the audience is the verifier's).
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    /// The header's `t` digits.
    pub t: &'a str,
    /// The header's `id`.
    pub id: &'a str,
    /// Whether the request carries `X-Gateway-Mirror: 1`.
    pub mirror: bool,
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
    /// The lowercase hex SHA-256 of the body, or empty (a body the gateway streamed).
    pub body_sha256: &'a [u8],
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

/// Checks signatures made with one secret for one audience, and remembers
/// the ids it accepted.
pub struct IdentityVerifier {
    mac: HmacSha256,
    audience: String,
    shadow: bool,
    accept_v2: bool,
    seen: ReplayCache,
}

impl std::fmt::Debug for IdentityVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("IdentityVerifier")
            .field("audience", &self.audience)
            .field("shadow", &self.shadow)
            .field("accept_v2", &self.accept_v2)
            .finish_non_exhaustive()
    }
}

impl IdentityVerifier {
    /// A verifier for `secret` (32 to 256 visible ASCII characters, like the
    /// gateway's `identity_signing_secret`) behind the upstream named
    /// `audience` (not empty); `None` otherwise. It refuses mirror copies and
    /// v2 until told otherwise.
    pub fn new(secret: &str, audience: &str) -> Option<Self> {
        let ok = (MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&secret.len())
            && secret.bytes().all(|c| c.is_ascii_graphic())
            && !audience.is_empty();
        if !ok {
            return None;
        }
        Some(Self {
            mac: HmacSha256::new_from_slice(secret.as_bytes()).ok()?,
            audience: audience.to_owned(),
            shadow: false,
            accept_v2: false,
            seen: ReplayCache::default(),
        })
    }

    /// The same verifier, accepting mirror copies when `shadow` (a shadow upstream's backend).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The same verifier, accepting v2 signatures when `accept` (while gateways are upgraded).
    pub fn accept_v2(mut self, accept: bool) -> Self {
        self.accept_v2 = accept;
        self
    }

    /// The audience it expects: its upstream's name.
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The lowercase hex v3 MAC of one request (what `v3=` must hold).
    pub fn v3_hex(&self, request: &SignedRequest<'_>) -> String {
        gateway_hex::encode(self.v3_mac(request).finalize().into_bytes())
    }

    fn v3_mac(&self, r: &SignedRequest<'_>) -> HmacSha256 {
        self.fields([
            V3_CONTEXT,
            r.t.as_bytes(),
            r.id.as_bytes(),
            self.audience.as_bytes(),
            if r.mirror { b"1" } else { b"0" },
            r.method.as_bytes(),
            r.host,
            r.target.as_bytes(),
            r.user_id,
            r.user_role,
            r.api_key_name,
            r.body_sha256,
        ])
    }

    /// The lowercase hex v2 MAC of one request (what `v2=` must hold; no
    /// audience, mirror flag nor body).
    pub fn v2_hex(&self, request: &SignedRequest<'_>) -> String {
        gateway_hex::encode(self.v2_mac(request).finalize().into_bytes())
    }

    fn v2_mac(&self, r: &SignedRequest<'_>) -> HmacSha256 {
        self.fields([
            V2_CONTEXT,
            r.t.as_bytes(),
            r.id.as_bytes(),
            r.method.as_bytes(),
            r.host,
            r.target.as_bytes(),
            r.user_id,
            r.user_role,
            r.api_key_name,
        ])
    }

    /// The secret's MAC over `fields`, each as its length (4 bytes big-endian) then its bytes.
    fn fields<const N: usize>(&self, fields: [&[u8]; N]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        for field in fields {
            let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
            mac.update(&len.to_be_bytes());
            mac.update(field);
        }
        mac
    }

    /// Verifies the signature of a request with these `headers`, `method`,
    /// raw request `target` (path and query) and `body` (`None`: not read
    /// yet), at `now` (Unix seconds), and records its id.
    ///
    /// [`IdentityError::BodyNeeded`] when the signature may cover the body
    /// and `body` is `None`: read the body (at most [`MAX_SIGNED_BODY_BYTES`])
    /// and call again with it.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        method: &str,
        target: &str,
        body: Option<&[u8]>,
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
        let mut request = SignedRequest {
            t: parsed.t,
            id: parsed.id,
            mirror: header(MIRROR_HEADER) == b"1",
            method,
            host: header("host"),
            target,
            user_id: header("x-user-id"),
            user_role: header("x-user-role"),
            api_key_name: header("x-api-key-name"),
            body_sha256: b"",
        };
        match parsed.version {
            Version::V3 => {
                if request.mirror && !self.shadow {
                    return Err(IdentityError::MirrorCopy);
                }
                // A streamed body (empty field) first: no body to read.
                if self.v3_mac(&request).verify_slice(&parsed.mac).is_err() {
                    let Some(body) = body else {
                        return Err(IdentityError::BodyNeeded);
                    };
                    let mut digest = [0u8; 64];
                    gateway_hex::encode_to_slice(&Sha256::digest(body), &mut digest);
                    request.body_sha256 = &digest;
                    self.v3_mac(&request)
                        .verify_slice(&parsed.mac)
                        .map_err(|_| IdentityError::Mismatch)?;
                }
            }
            Version::V2 if self.accept_v2 => self
                .v2_mac(&request)
                .verify_slice(&parsed.mac)
                .map_err(|_| IdentityError::Mismatch)?,
            Version::V2 => return Err(IdentityError::Outdated("v2")),
            Version::V1 => return Err(IdentityError::Outdated("v1")),
        }
        // Only after the MAC matched: forged requests cannot fill the cache or burn ids.
        if !self.seen.insert(parsed.id, t + MAX_SKEW_SECONDS, now) {
            return Err(IdentityError::Replayed);
        }
        Ok(())
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
    /// The request id (empty for v1, which has none).
    id: &'a str,
    version: Version,
    mac: [u8; 32],
}

enum Version {
    V3,
    V2,
    V1,
}

/// `t=<digits>,id=<id>,v3=<64 lowercase hex>` (or `v2=`; or v1's
/// `t=<digits>,v1=<64 lowercase hex>`), pairs in any order, unknown keys
/// ignored, none repeated.
fn parse(value: &[u8]) -> Option<Parsed<'_>> {
    let text = std::str::from_utf8(value).ok()?;
    let (mut t, mut id, mut v1, mut v2, mut v3) = (None, None, None, None, None);
    for pair in text.split(',') {
        let (key, value) = pair.split_once('=')?;
        let slot = match key {
            "t" => &mut t,
            "id" => &mut id,
            "v1" => &mut v1,
            "v2" => &mut v2,
            "v3" => &mut v3,
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
    let (version, given) = match (v3, v2, v1) {
        (Some(v3), _, _) => (Version::V3, v3),
        (None, Some(v2), _) => (Version::V2, v2),
        (None, None, Some(v1)) => (Version::V1, v1),
        (None, None, None) => return None,
    };
    let id = match version {
        Version::V1 => "",
        Version::V2 | Version::V3 => {
            let id = id?;
            let id_ok = !id.is_empty()
                && id.len() <= MAX_ID_LEN
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !id_ok {
                return None;
            }
            id
        }
    };
    Some(Parsed {
        t,
        t_value: t.parse().ok()?,
        id,
        version,
        mac: mac(given)?,
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
mod tests;
