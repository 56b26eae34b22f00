//! [`JwtVerifier`]: verifies access tokens against one issuer's JWKS.
//!
//! Order of checks on a request: verified-token cache (keyed hash, full compare, `exp`) →
//! header (`alg` must be one of the issuer's algorithms; `kid` required unless the issuer
//! publishes exactly one key) → the payload's `exp`, unverified (a token that says it has
//! expired is refused at once) → key lookup (refresh the JWKS once on an unknown `kid`,
//! single-flight, with a cooldown) → the key's pinned algorithms must include the header's →
//! signature and `iss`/`aud`/`exp` presence (jsonwebtoken, algorithm pinned) → `exp`/`nbf` with
//! leeway against the injectable clock → the user id, role and required claims (claim paths).

use parking_lot::RwLock;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderValue, Uri};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde::Deserialize;

use crate::cache::TokenCache;
use crate::error::{JwtConfigError, JwtError};
use crate::jwks::{AlgSet, JwksClient, Key, KeySet, SUPPORTED_ALGORITHMS, Source};
use gateway_clock::{Clock, SystemClock};

/// Longest token considered at all; anything longer is refused before any work.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Settings of a [`JwtVerifier`]. Defaults are written down in [`JwtConfig::default`]: they are
/// those of the gateway's own auth service (EdDSA, `sub` and `role`, `nbf` required).
#[derive(Debug, Clone, PartialEq)]
pub struct JwtConfig {
    /// URL of the issuer's JWKS (the auth service's `/.well-known/jwks.json`): `https://`, or
    /// `http://` on a private network only (the keys that decide who is
    /// authenticated would travel unauthenticated). Ignored when `discovery_url` is set.
    pub jwks_url: String,
    /// URL of the issuer's OpenID Connect discovery document
    /// (`…/.well-known/openid-configuration`), same schemes as `jwks_url`; when set, the JWKS
    /// is the document's `jwks_uri` (same scheme), read again at every JWKS fetch, and the
    /// document's `issuer` must equal `issuer`. Empty: `jwks_url` is used.
    pub discovery_url: String,
    /// Hosts, besides the discovery URL's own, that the discovery document's `jwks_uri` may
    /// name (compared without case). Any other `jwks_uri` host is refused, so a tampered or
    /// careless discovery document cannot point the gateway at someone else's keys.
    pub jwks_hosts: Vec<String>,
    /// PEM CA certificate(s) an `https://` JWKS server's certificate must
    /// chain to (default: the system's roots). Read when the verifier is
    /// built; refused with an `http://` URL.
    pub jwks_ca: Option<PathBuf>,
    /// Required `iss`.
    pub issuer: String,
    /// `aud` must contain one of these (at least one is required).
    pub audiences: Vec<String>,
    /// Algorithms accepted, among [`crate::SUPPORTED_ALGORITHMS`] (default EdDSA). Each key is
    /// further pinned to what its type admits.
    pub algorithms: Vec<Algorithm>,
    /// Claim forwarded as `X-User-Id` (default `sub`): a claim name, or a dotted path into
    /// nested objects (see [`claim`]). Must be a string.
    pub user_id_claim: String,
    /// Claim forwarded as `X-User-Role` (default `role`), a name or dotted path: a string, a
    /// or an array of strings, which is joined with `,` in its order.
    pub role_claim: String,
    /// Claims (names or dotted paths) that must be present, whatever their value
    /// (default `nbf`, which the auth service always sets). `nbf` is checked when present.
    pub required_claims: Vec<String>,
    /// Clock skew tolerated on `exp` and `nbf` (default 30 s).
    pub leeway: Duration,
    /// Verified tokens remembered (default 10 000; 0 disables the cache).
    pub cache_capacity: usize,
    /// Minimum time between two JWKS fetches triggered by unknown `kid`s (default 5 s), so a
    /// flood of garbage `kid`s cannot hammer the auth service.
    pub refresh_cooldown: Duration,
    /// Longest background JWKS refresh period, so rotated keys appear (default 60 s). A shorter
    /// `Cache-Control: max-age` on the JWKS response (at least 1 s) takes precedence, so keys
    /// published ahead of use are known before they sign. Zero disables the periodic refresh;
    /// the initial fetch still happens.
    pub refresh_interval: Duration,
    /// Timeout of one JWKS fetch, connect included (default 2 s).
    pub fetch_timeout: Duration,
}

impl Default for JwtConfig {
    fn default() -> Self {
        Self {
            jwks_url: "http://127.0.0.1:4000/.well-known/jwks.json".to_owned(),
            jwks_ca: None,
            discovery_url: String::new(),
            jwks_hosts: Vec::new(),
            issuer: "gateway-auth".to_owned(),
            audiences: vec!["gateway".to_owned()],
            algorithms: vec![Algorithm::EdDSA],
            user_id_claim: "sub".to_owned(),
            role_claim: "role".to_owned(),
            required_claims: vec!["nbf".to_owned()],
            leeway: Duration::from_secs(30),
            cache_capacity: 10_000,
            refresh_cooldown: Duration::from_secs(5),
            refresh_interval: Duration::from_secs(60),
            fetch_timeout: Duration::from_secs(2),
        }
    }
}

/// The `X-User-Id` prefix of the data plane's client-certificate callers
/// (`AUTH_MTLS`, `gateway_proto::validate::MTLS_SUBJECT_PREFIX`): a token
/// whose subject starts with it is refused, so no token passes for a certificate.
pub const RESERVED_SUB_PREFIX: &str = "mtls:";

/// Who a verified token speaks for. Cached per token, so the header values the data plane
/// forwards are built once, not per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `sub`, forwarded as `X-User-Id`.
    pub sub: String,
    /// `role`, forwarded as `X-User-Role`.
    pub role: String,
    /// `exp` (Unix seconds).
    pub exp: u64,
    sub_header: HeaderValue,
    role_header: HeaderValue,
}

impl Identity {
    /// An identity; `sub` and `role` must be usable as header values (visible ASCII, no
    /// control characters), since they are forwarded to backends, and `sub` must not
    /// start with [`RESERVED_SUB_PREFIX`].
    pub fn new(sub: String, role: String, exp: u64) -> Result<Self, JwtError> {
        if sub.starts_with(RESERVED_SUB_PREFIX) {
            return Err(JwtError::InvalidClaims(format!(
                "sub starts with \"{RESERVED_SUB_PREFIX}\", which names client-certificate callers"
            )));
        }
        let header = |v: &str, name: &str| {
            HeaderValue::from_str(v)
                .ok()
                .filter(|_| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
                .ok_or_else(|| {
                    JwtError::InvalidClaims(format!("{name} is not a forwardable header value"))
                })
        };
        Ok(Self {
            sub_header: header(&sub, "sub")?,
            role_header: header(&role, "role")?,
            sub,
            role,
            exp,
        })
    }

    /// `sub` as the `X-User-Id` header value (cheap to clone).
    pub fn sub_header(&self) -> &HeaderValue {
        &self.sub_header
    }

    /// `role` as the `X-User-Role` header value (cheap to clone).
    pub fn role_header(&self) -> &HeaderValue {
        &self.role_header
    }
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JwtStats {
    /// JWKS fetches attempted (background and on-demand).
    pub jwks_fetches: u64,
    /// JWKS fetches that failed.
    pub jwks_fetch_failures: u64,
    /// Keys currently known.
    pub keys: usize,
    /// Tokens currently cached.
    pub cached_tokens: usize,
    /// Tokens found in the cache (verified before and not expired).
    pub cache_hits: u64,
    /// Tokens not in the cache, so checked (and, if valid, cached).
    pub cache_misses: u64,
}

#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    kid: Option<String>,
}

/// The claims, as JSON: jsonwebtoken checks the presence of `exp`, `iss` and `aud` and the
/// values of `iss` and `aud`; the rest is read here by claim path.
type Claims = serde_json::Map<String, serde_json::Value>;

/// The value of the claim at `path`: the claim of that exact name if there is one (so
/// namespaced claims such as `https://example.com/roles` work), else the dotted path into
/// nested objects (`realm_access.roles` is `claims["realm_access"]["roles"]`).
pub fn claim<'a>(claims: &'a Claims, path: &str) -> Option<&'a serde_json::Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    let mut parts = path.split('.');
    let mut value = claims.get(parts.next()?)?;
    for part in parts {
        value = value.as_object()?.get(part)?;
    }
    Some(value)
}

/// A claim's value as a header value's text: a string as it is and (`arrays` only) an array
/// of strings joined with `,`. `None`: null, an empty string or an empty array.
fn claim_text(value: &serde_json::Value, arrays: bool) -> Result<Option<String>, ()> {
    use serde_json::Value;
    match value {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(items) if arrays => {
            let texts: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            let texts = texts.ok_or(())?;
            Ok((!texts.is_empty()).then(|| texts.join(",")))
        }
        _ => Err(()),
    }
}

struct RefreshState {
    /// When the last fetch caused by an unknown `kid` started (clock time).
    last_on_demand: Option<Duration>,
    /// Error of the last fetch, reported while no key is known at all.
    last_error: Option<String>,
}

struct Inner {
    config: JwtConfig,
    /// The issuer's algorithms.
    allowed: AlgSet,
    /// One validation per allowed algorithm (jsonwebtoken wants every algorithm of a
    /// validation in the key's family).
    validations: Vec<(Algorithm, Validation)>,
    keys: RwLock<Arc<KeySet>>,
    cache: TokenCache,
    clock: Arc<dyn Clock>,
    client: JwksClient,
    /// Held for the duration of a fetch: concurrent callers wait for that one fetch
    /// (single-flight) instead of starting their own. A tokio mutex on purpose: it is held
    /// across the fetch's `.await`, and only on the rare unknown-`kid` path.
    refresh: tokio::sync::Mutex<RefreshState>,
    /// Bumped after every completed fetch, so a waiter can tell that a fetch happened.
    generation: AtomicU64,
    /// `max-age` of the last JWKS response, in milliseconds (0: none).
    max_age_ms: AtomicU64,
    fetches: AtomicU64,
    fetch_failures: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
}

/// Verifies access tokens with one issuer's public keys. Cheap to clone (shared).
#[derive(Clone)]
pub struct JwtVerifier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("issuer", &self.inner.config.issuer)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// Builds a verifier with the system clock. When called inside a Tokio runtime it starts a
    /// background task on it that fetches the JWKS right away and then every
    /// `refresh_interval`; the task ends when the last clone of the verifier is dropped.
    pub fn new(config: JwtConfig) -> Result<Self, JwtConfigError> {
        Self::with_clock(config, Arc::new(SystemClock))
    }

    /// Like [`JwtVerifier::new`] with an injected clock (tests, benches).
    pub fn with_clock(config: JwtConfig, clock: Arc<dyn Clock>) -> Result<Self, JwtConfigError> {
        let url = if config.discovery_url.is_empty() {
            &config.jwks_url
        } else {
            &config.discovery_url
        };
        let uri = parse_jwks_url(url)?;
        let tls = crate::tls::client_config(&uri, url, config.jwks_ca.as_deref())?;
        if tls.is_none() && !is_loopback(&uri) {
            tracing::warn!(jwks_url = %uri,
                "the JWKS is fetched over plain HTTP: keep it on a private network, or use https://");
        }
        if config.issuer.is_empty() {
            return Err(JwtConfigError::Empty("issuer"));
        }
        if config.audiences.iter().all(String::is_empty) {
            return Err(JwtConfigError::Empty("audience"));
        }
        if config.user_id_claim.is_empty() {
            return Err(JwtConfigError::Empty("user_id_claim"));
        }
        if config.role_claim.is_empty() {
            return Err(JwtConfigError::Empty("role_claim"));
        }
        let allowed = AlgSet::of(&config.algorithms);
        if allowed.is_empty() {
            return Err(JwtConfigError::Empty("algorithms"));
        }
        let validations = SUPPORTED_ALGORITHMS
            .into_iter()
            .filter(|&a| allowed.contains(a))
            .map(|alg| {
                let mut validation = Validation::new(alg);
                validation.set_issuer(&[&config.issuer]);
                validation.set_audience(&config.audiences);
                validation.required_spec_claims = ["exp", "iss", "aud"]
                    .into_iter()
                    .map(String::from)
                    .collect::<HashSet<_>>();
                // exp/nbf are checked below against the injectable clock (with the leeway).
                validation.validate_exp = false;
                validation.validate_nbf = false;
                (alg, validation)
            })
            .collect();
        let source = if config.discovery_url.is_empty() {
            Source::Jwks(uri)
        } else {
            Source::Discovery {
                uri,
                issuer: config.issuer.clone(),
                jwks_hosts: config.jwks_hosts.clone(),
            }
        };
        let inner = Arc::new(Inner {
            allowed,
            validations,
            keys: RwLock::new(Arc::new(KeySet::new())),
            cache: TokenCache::new(config.cache_capacity),
            clock,
            client: JwksClient::new(source, allowed, config.fetch_timeout, tls),
            refresh: tokio::sync::Mutex::new(RefreshState {
                last_on_demand: None,
                last_error: None,
            }),
            generation: AtomicU64::new(0),
            max_age_ms: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
            fetch_failures: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            config,
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(background_refresh(Arc::downgrade(&inner)));
        }
        Ok(Self { inner })
    }

    /// The identity of `token` if it was verified before and has not expired:
    /// the cache lookup [`JwtVerifier::verify`] starts with, alone. The token
    /// need not have been checked by [`crate::is_b64token`]: only a token that
    /// passed verification is ever cached, and the lookup compares whole tokens.
    pub fn cached(&self, token: &str) -> Option<Arc<Identity>> {
        let inner = &*self.inner;
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return None;
        }
        let found = inner.cache.get(token, inner.clock.now().as_secs());
        // A miss is counted by the `verify` that follows it, not here.
        if found.is_some() {
            inner.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Verifies `token` (the bare token, without `Bearer `) and returns who it speaks for.
    pub async fn verify(&self, token: &str) -> Result<Arc<Identity>, JwtError> {
        let inner = &*self.inner;
        if token.is_empty() {
            return Err(JwtError::Missing);
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(JwtError::Malformed("token too long"));
        }
        let now = inner.clock.now().as_secs();
        if let Some(identity) = inner.cache.get(token, now) {
            inner.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(identity);
        }
        inner.cache_misses.fetch_add(1, Ordering::Relaxed);

        let (alg, kid) = check_header(token, inner.allowed)?;
        let leeway = inner.config.leeway.as_secs();
        // A token whose payload says it has expired is refused whatever its signature,
        // so it is refused before the signature check (an Ed25519 verification, tens of
        // microseconds; this read about one) and before an unknown `kid` can ask for
        // the JWKS: a client that keeps sending its expired token costs next to nothing.
        if unverified_exp(token).is_some_and(|exp| now >= exp.saturating_add(leeway)) {
            return Err(JwtError::Expired);
        }
        let generation = inner.generation.load(Ordering::Acquire);
        let (kid, key) = match inner.lookup(kid.as_deref())? {
            Some(found) => found,
            None => inner.refresh_for_unknown_kid(kid, generation).await?,
        };
        // The algorithm is pinned per key: the header's must be one the key's type admits.
        if !key.algs.contains(alg) {
            return Err(JwtError::DisallowedAlgorithm(format!("{alg:?}")));
        }
        let validation = inner
            .validations
            .iter()
            .find_map(|(a, v)| (*a == alg).then_some(v))
            .ok_or_else(|| JwtError::DisallowedAlgorithm(format!("{alg:?}")))?;

        let claims = jsonwebtoken::decode::<Claims>(token, &key.decoding, validation)
            .map_err(map_decode_error)?
            .claims;
        let identity = Arc::new(inner.identity(&claims, now)?);
        inner.cache.insert(token, kid, identity.clone(), now);
        Ok(identity)
    }

    /// Fetches the JWKS now (e.g. at startup, to be ready before the first request).
    /// Returns the number of keys known afterwards.
    pub async fn refresh_now(&self) -> Result<usize, JwtError> {
        let mut state = self.inner.refresh.lock().await;
        self.inner
            .fetch_and_install(&mut state)
            .await
            .map_err(JwtError::KeysUnavailable)
    }

    /// The `iss` this verifier requires.
    pub fn issuer(&self) -> &str {
        &self.inner.config.issuer
    }

    /// Counters for metrics.
    pub fn stats(&self) -> JwtStats {
        JwtStats {
            jwks_fetches: self.inner.fetches.load(Ordering::Relaxed),
            jwks_fetch_failures: self.inner.fetch_failures.load(Ordering::Relaxed),
            keys: self.inner.keys.read().len(),
            cached_tokens: self.inner.cache.len(),
            cache_hits: self.inner.cache_hits.load(Ordering::Relaxed),
            cache_misses: self.inner.cache_misses.load(Ordering::Relaxed),
        }
    }
}

/// Validates the header before any key lookup: `alg` must be one of the issuer's algorithms
/// (so `none`, `HS*` with a public key as HMAC secret, algorithms the issuer does not use...
/// never reach a verifier). Returns the algorithm and the `kid`, if any.
fn check_header(token: &str, allowed: AlgSet) -> Result<(Algorithm, Option<String>), JwtError> {
    let mut parts = token.split('.');
    let (Some(header), Some(_payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed("expected three dot-separated segments"));
    };
    if signature.is_empty() {
        return Err(JwtError::Malformed("empty signature"));
    }
    let header = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| JwtError::Malformed("header is not base64url"))?;
    let header: RawHeader = serde_json::from_slice(&header)
        .map_err(|_| JwtError::Malformed("header is not a JSON object with alg"))?;
    match header.alg.parse::<Algorithm>() {
        Ok(alg) if allowed.contains(alg) => Ok((alg, header.kid)),
        _ => Err(JwtError::DisallowedAlgorithm(header.alg)),
    }
}

/// The payload's `iss`, read without verifying anything (to pick among a route's issuers);
/// `None` when the payload does not decode or has no string `iss`.
pub fn unverified_issuer(token: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Iss {
        iss: Option<String>,
    }
    let payload = token.split('.').nth(1)?;
    let json = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice::<Iss>(&json).ok()?.iss
}

/// The payload's `exp`, read without verifying anything; `None` when the payload
/// does not decode or has no numeric `exp` (the full check then says why).
fn unverified_exp(token: &str) -> Option<u64> {
    #[derive(Deserialize)]
    struct Exp {
        exp: Option<u64>,
    }
    let payload = token.split('.').nth(1)?;
    let json = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice::<Exp>(&json).ok()?.exp
}

fn map_decode_error(e: jsonwebtoken::errors::Error) -> JwtError {
    match e.into_kind() {
        ErrorKind::InvalidSignature => JwtError::BadSignature,
        ErrorKind::InvalidIssuer => JwtError::WrongIssuer,
        ErrorKind::InvalidAudience => JwtError::WrongAudience,
        ErrorKind::ExpiredSignature => JwtError::Expired,
        ErrorKind::ImmatureSignature => JwtError::NotYetValid,
        ErrorKind::MissingRequiredClaim(c) => JwtError::MissingClaim(c),
        ErrorKind::InvalidClaimFormat(c) => {
            JwtError::InvalidClaims(format!("{c} has the wrong type"))
        }
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => {
            JwtError::DisallowedAlgorithm("(mismatch)".to_owned())
        }
        ErrorKind::Json(e) => JwtError::InvalidClaims(e.to_string()),
        ErrorKind::Base64(_) => JwtError::Malformed("segment is not base64url"),
        ErrorKind::Utf8(_) => JwtError::Malformed("segment is not UTF-8"),
        _ => JwtError::Malformed("not a verifiable JWS"),
    }
}

fn parse_jwks_url(url: &str) -> Result<Uri, JwtConfigError> {
    let err = |reason| JwtConfigError::JwksUrl {
        url: url.to_owned(),
        reason,
    };
    let uri: Uri = url.parse().map_err(|_| err("not a valid URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(_) => return Err(err("must be http:// or https://")),
        None => {
            return Err(err(
                "must be absolute, e.g. http://127.0.0.1:4000/.well-known/jwks.json",
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(err("has no host"));
    }
    Ok(uri)
}

/// Whether the URL's host is `localhost` or a loopback address.
fn is_loopback(uri: &Uri) -> bool {
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A key found by `kid`: the name it is published under, and the key.
type Found = (Arc<str>, Arc<Key>);

/// The background refresh never runs more often than this, whatever `max-age` says.
const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

impl Inner {
    /// Delay until the next background fetch: `refresh_interval`, shortened to the JWKS
    /// `max-age` when that is smaller; `None` when periodic refresh is disabled.
    fn next_background_refresh(&self) -> Option<Duration> {
        let configured = self.config.refresh_interval;
        if configured.is_zero() {
            return None;
        }
        let max_age = match self.max_age_ms.load(Ordering::Relaxed) {
            0 => configured,
            ms => Duration::from_millis(ms).max(MIN_REFRESH_INTERVAL),
        };
        Some(configured.min(max_age))
    }

    /// The key named by `kid`; without a `kid`, the issuer's one key (`MissingKid` when it
    /// publishes more than one; `None` when none is known yet, so the JWKS is fetched).
    fn lookup(&self, kid: Option<&str>) -> Result<Option<Found>, JwtError> {
        let keys = self.keys.read();
        let found = match kid {
            Some(kid) => keys.get_key_value(kid),
            None if keys.len() > 1 => return Err(JwtError::MissingKid),
            None => keys.iter().next(),
        };
        Ok(found.map(|(k, v)| (k.clone(), v.clone())))
    }

    /// Who verified `claims` speak for, after `exp` / `nbf` (with leeway) and the required
    /// claims were checked.
    fn identity(&self, claims: &Claims, now: u64) -> Result<Identity, JwtError> {
        let leeway = self.config.leeway.as_secs();
        let number = |name: &str| -> Result<Option<u64>, JwtError> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| JwtError::InvalidClaims(format!("{name} has the wrong type"))),
            }
        };
        // jsonwebtoken already required `exp`.
        let exp = number("exp")?.ok_or_else(|| JwtError::MissingClaim("exp".to_owned()))?;
        let nbf = number("nbf")?;
        for required in &self.config.required_claims {
            if claim(claims, required).is_none_or(serde_json::Value::is_null) {
                return Err(JwtError::MissingClaim(required.clone()));
            }
        }
        if now >= exp.saturating_add(leeway) {
            return Err(JwtError::Expired);
        }
        if nbf.is_some_and(|nbf| nbf > now.saturating_add(leeway)) {
            return Err(JwtError::NotYetValid);
        }
        let text = |path: &str, arrays: bool| -> Result<String, JwtError> {
            let value =
                claim(claims, path).ok_or_else(|| JwtError::MissingClaim(path.to_owned()))?;
            claim_text(value, arrays)
                .map_err(|()| JwtError::InvalidClaims(format!("{path} has the wrong type")))?
                .ok_or_else(|| JwtError::MissingClaim(path.to_owned()))
        };
        let sub = text(&self.config.user_id_claim, false)?;
        let role = text(&self.config.role_claim, true)?;
        Identity::new(sub, role, exp)
    }

    /// One JWKS fetch for an unknown `kid`, shared by every concurrent caller and at most one
    /// per cooldown. `seen` is the fetch generation observed before the failed lookup.
    async fn refresh_for_unknown_kid(
        &self,
        kid: Option<String>,
        seen: u64,
    ) -> Result<Found, JwtError> {
        let mut state = match self.refresh.try_lock() {
            Ok(state) => state,
            // A fetch is in flight: wait for it rather than start another.
            Err(_) => self.refresh.lock().await,
        };
        if self.generation.load(Ordering::Acquire) == seen {
            let now = self.clock.now();
            let cooling = state
                .last_on_demand
                .is_some_and(|last| now.saturating_sub(last) < self.config.refresh_cooldown);
            if !cooling {
                state.last_on_demand = Some(now);
                let _ = self.fetch_and_install(&mut state).await;
            }
        }
        let last_error = state.last_error.clone();
        drop(state);
        match self.lookup(kid.as_deref())? {
            Some(found) => Ok(found),
            None => match last_error {
                Some(e) if self.keys.read().is_empty() => Err(JwtError::KeysUnavailable(e)),
                _ => Err(JwtError::UnknownKid(kid.unwrap_or_default())),
            },
        }
    }

    /// Fetches the JWKS and swaps the key set in; `state` proves the caller holds `refresh`.
    async fn fetch_and_install(&self, state: &mut RefreshState) -> Result<usize, String> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let result = self.client.fetch().await;
        state.last_error = result.as_ref().err().cloned();
        let outcome = match result {
            Ok((keys, max_age)) => {
                let max_age_ms =
                    max_age.map_or(0, |m| u64::try_from(m.as_millis()).unwrap_or(u64::MAX));
                self.max_age_ms.store(max_age_ms, Ordering::Relaxed);
                let count = keys.len();
                let changed = {
                    let mut current = self.keys.write();
                    let changed = current.len() != keys.len()
                        || current.keys().any(|k| !keys.contains_key(k));
                    *current = Arc::new(keys);
                    changed
                };
                if changed {
                    let current = self.keys.read().clone();
                    // Tokens signed by a key that is no longer published are no longer trusted.
                    self.cache.retain_kids(|kid| current.contains_key(kid));
                    tracing::info!(keys = count, "JWKS updated");
                }
                Ok(count)
            }
            Err(e) => {
                self.fetch_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "JWKS fetch failed; keeping the keys already known");
                Err(e)
            }
        };
        self.generation.fetch_add(1, Ordering::Release);
        outcome
    }
}

async fn background_refresh(inner: Weak<Inner>) {
    loop {
        let interval = {
            let Some(inner) = inner.upgrade() else { return };
            {
                let mut state = inner.refresh.lock().await;
                let _ = inner.fetch_and_install(&mut state).await;
            }
            inner.next_background_refresh()
        };
        let Some(interval) = interval else { return };
        tokio::time::sleep(interval).await;
    }
}

#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod tests;
