//! Who may call what: the `--auth-tokens-file` (`NAME ROLE TOKEN` lines), and
//! the tower layer that checks `authorization: Bearer TOKEN` on every
//! AdminService and ConfigDiscoveryService call.
//!
//! * A missing or unknown token is `UNAUTHENTICATED`; a known token whose role
//!   does not allow the RPC is `PERMISSION_DENIED`.
//! * Health and reflection stay open.
//! * `viewer` may call the read-only AdminService RPCs (`ListApiKeys`,
//!   `GetCertificate` and `ListCertificates` included: they show no secret),
//!   `admin` every AdminService RPC (`CreateApiKey`, `RevokeApiKey`,
//!   `UpsertCertificate`, `DeleteCertificate`, `UpsertJwtIssuer` and
//!   `DeleteJwtIssuer` included; viewers may `GetJwtIssuer` and
//!   `ListJwtIssuers`), `data-plane` only
//!   `UpsertCertificate`, `DeleteCertificate` and `PurgeCache` included), `data-plane` only
//!   `StreamConfig`, the one place private keys travel. An admin token is
//!   refused on `StreamConfig`, so a leaked operator token cannot pose as a
//!   data plane (and a data-plane token can never change the configuration).
//! * Tokens are compared as SHA-256 digests in constant time; the file may hold
//!   `sha256:<hex>` instead of the token itself.
//!
//! The authenticated [`Caller`] is put into the request extensions; the admin
//! service records its name as the author of every committed version.

use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower_layer::Layer;
use tower_service::Service;

pub use crate::store::ANONYMOUS;

const ADMIN_PREFIX: &str = "/gateway.v1.AdminService/";
const DISCOVERY_PREFIX: &str = "/gateway.v1.ConfigDiscoveryService/";

/// The AdminService RPCs a `viewer` may call.
const READ_ONLY: &[&str] = &[
    "ListRoutes",
    "GetRoute",
    "ListUpstreams",
    "GetUpstream",
    "GetConfig",
    "ListConfigVersions",
    "ListDataPlanes",
    "ListApiKeys",
    "GetCertificate",
    "ListCertificates",
    "GetJwtIssuer",
    "ListJwtIssuers",
];

/// What a token allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every AdminService RPC.
    Admin,
    /// The read-only AdminService RPCs.
    Viewer,
    /// `ConfigDiscoveryService/StreamConfig` only.
    DataPlane,
}

impl Role {
    fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "viewer" => Some(Role::Viewer),
            "data-plane" => Some(Role::DataPlane),
            _ => None,
        }
    }

    /// The name used in the tokens file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Viewer => "viewer",
            Role::DataPlane => "data-plane",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The authenticated identity of a call, found in the request extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's (or client certificate's) name; [`ANONYMOUS`] without authentication.
    pub name: String,
    /// What it may do.
    pub role: Role,
}

impl Caller {
    /// The caller accepted when authentication is off.
    pub fn anonymous() -> Caller {
        Caller {
            name: ANONYMOUS.into(),
            role: Role::Admin,
        }
    }

    /// Whether this is the unauthenticated caller of an open control plane.
    /// (No token may be named [`ANONYMOUS`]: [`Tokens::parse`] refuses it.)
    pub fn is_anonymous(&self) -> bool {
        self.name == ANONYMOUS
    }
}

/// The author to record for a request: the caller's name, or [`ANONYMOUS`].
pub fn author<T>(req: &tonic::Request<T>) -> String {
    req.extensions()
        .get::<Caller>()
        .map(|c| c.name.clone())
        .unwrap_or_else(|| ANONYMOUS.into())
}

/// Why the tokens file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file could not be read.
    #[error("cannot read auth tokens file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is not `NAME ROLE TOKEN`.
    #[error("auth tokens file {path}, line {line}: {problem}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (never contains the token).
        problem: String,
    },
    /// No token at all: the file would lock everyone out.
    #[error("auth tokens file {0} holds no token")]
    Empty(PathBuf),
}

struct Entry {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// The tokens loaded from `--auth-tokens-file`.
pub struct Tokens {
    entries: Vec<Entry>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names and roles only: digests stay out of logs too.
        f.debug_list()
            .entries(self.entries.iter().map(|e| (&e.name, e.role)))
            .finish()
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Equality that takes the same time wherever the inputs differ.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Reads and parses the tokens file.
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: path.to_owned(),
            source,
        })?;
        Tokens::parse(&text, path)
    }

    /// Parses `NAME ROLE TOKEN` lines (blank lines and `#` comments allowed);
    /// `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Tokens, TokensError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |problem: String| TokensError::Line {
                path: path.to_owned(),
                line: i + 1,
                problem,
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, token] = fields[..] else {
                return Err(bad(format!(
                    "expected 3 fields `NAME ROLE TOKEN`, found {}",
                    fields.len()
                )));
            };
            let role = Role::parse(role).ok_or_else(|| {
                bad(format!(
                    "role {role:?} is not one of admin, viewer, data-plane"
                ))
            })?;
            if name == ANONYMOUS {
                return Err(bad(format!(
                    "name {ANONYMOUS:?} is reserved for unauthenticated callers"
                )));
            }
            if entries.iter().any(|e| e.name == name) {
                return Err(bad(format!("name {name:?} is used twice")));
            }
            let digest = match token.strip_prefix("sha256:") {
                Some(hex_digest) => {
                    let bytes = gateway_hex::decode(hex_digest)
                        .ok()
                        .filter(|b| b.len() == 32);
                    let bytes = bytes.ok_or_else(|| {
                        bad("sha256: must be followed by 64 hex digits".to_owned())
                    })?;
                    let mut d = [0u8; 32];
                    d.copy_from_slice(&bytes);
                    d
                }
                None => sha256(token.as_bytes()),
            };
            if entries.iter().any(|e| constant_time_eq(&e.digest, &digest)) {
                return Err(bad(format!(
                    "the token of {name:?} is also used by another name"
                )));
            }
            entries.push(Entry {
                name: name.to_owned(),
                role,
                digest,
            });
        }
        if entries.is_empty() {
            return Err(TokensError::Empty(path.to_owned()));
        }
        Ok(Tokens { entries })
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Always false: an empty file is refused by [`Tokens::parse`].
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller owning `token`, if any. Every entry is compared, in constant time.
    pub fn lookup(&self, token: &str) -> Option<Caller> {
        let digest = sha256(token.as_bytes());
        let mut found = None;
        for e in &self.entries {
            if constant_time_eq(&e.digest, &digest) {
                found = Some(e);
            }
        }
        found.map(|e| Caller {
            name: e.name.clone(),
            role: e.role,
        })
    }
}

/// Whether `role` may call the gRPC method at `path` (`/package.Service/Method`).
/// Paths outside AdminService and ConfigDiscoveryService are always allowed.
pub fn allowed(role: Role, path: &str) -> bool {
    if let Some(method) = path.strip_prefix(ADMIN_PREFIX) {
        match role {
            Role::Admin => true,
            Role::Viewer => READ_ONLY.contains(&method),
            Role::DataPlane => false,
        }
    } else if path.starts_with(DISCOVERY_PREFIX) {
        role == Role::DataPlane
    } else {
        true
    }
}

/// Whether `path` needs authentication.
fn protected(path: &str) -> bool {
    path.starts_with(ADMIN_PREFIX) || path.starts_with(DISCOVERY_PREFIX)
}

/// How calls are authenticated.
#[derive(Clone, Debug, Default)]
pub enum Policy {
    /// No tokens: every call is accepted as [`Caller::anonymous`].
    #[default]
    Open,
    /// Every protected call needs a known token (or a trusted client certificate).
    Tokens(Arc<Tokens>),
}

impl Policy {
    /// Decides a call from its path and headers (and the identity a verified
    /// client certificate gave, if any).
    pub fn check(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        cert_caller: Option<Caller>,
    ) -> Result<Caller, Status> {
        let tokens = match self {
            Policy::Open => return Ok(cert_caller.unwrap_or_else(Caller::anonymous)),
            Policy::Tokens(t) => t,
        };
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.to_str().ok().and_then(bearer_token));
        let caller = match bearer {
            None => cert_caller.ok_or_else(|| {
                Status::unauthenticated("missing `authorization: Bearer TOKEN` metadata")
            })?,
            Some(None) => {
                return Err(Status::unauthenticated(
                    "authorization metadata must be `Bearer TOKEN`",
                ));
            }
            Some(Some(token)) => tokens
                .lookup(token)
                .ok_or_else(|| Status::unauthenticated("unknown token"))?,
        };
        if !protected(path) || allowed(caller.role, path) {
            Ok(caller)
        } else {
            let method = path.strip_prefix('/').unwrap_or(path);
            Err(Status::permission_denied(format!(
                "{} (role {}) may not call {method}",
                caller.name, caller.role
            )))
        }
    }
}

fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Tower layer applying a [`Policy`] to every gRPC call.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    policy: Policy,
}

impl AuthLayer {
    /// Enforces `policy`.
    pub fn new(policy: Policy) -> Self {
        AuthLayer { policy }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// The service made by [`AuthLayer`].
#[derive(Clone, Debug)]
pub struct Auth<S> {
    inner: S,
    policy: Policy,
}

/// The identity a verified client certificate gives: role `data-plane`, named
/// `client-cert:` and the first 16 hex digits of the certificate's SHA-256.
/// Certificates are only requested (and then required and verified against the
/// CA) when the server runs with a client CA.
fn cert_caller<B>(request: &http::Request<B>) -> Option<Caller> {
    let info = request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()?;
    let certs = info.peer_certs()?;
    let leaf = certs.first()?;
    let fingerprint = gateway_hex::encode(&sha256(leaf.as_ref())[..8]);
    Some(Caller {
        name: format!("client-cert:{fingerprint}"),
        role: Role::DataPlane,
    })
}

impl<S, B, ResB> Service<http::Request<B>> for Auth<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResB: Default + Send + 'static,
{
    type Response = http::Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        if !protected(path) {
            return Box::pin(self.inner.call(request));
        }
        let cert = cert_caller(&request);
        match self.policy.check(path, request.headers(), cert) {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                Box::pin(self.inner.call(request))
            }
            Err(status) => {
                tracing::debug!(path, code = ?status.code(), "call refused");
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# operators\n\nalice admin s3cret-admin\n  bob viewer s3cret-view  \n\
                        dp data-plane sha256:";

    fn tokens() -> Tokens {
        let text = format!("{FILE}{}\n", gateway_hex::encode(sha256(b"dp-token")));
        Tokens::parse(&text, Path::new("t")).unwrap()
    }

    fn headers(auth: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(a) = auth {
            h.insert(http::header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn parses_plain_and_hashed_tokens() {
        let t = tokens();
        assert_eq!(t.len(), 3);
        assert_eq!(t.lookup("s3cret-admin").unwrap().name, "alice");
        assert_eq!(t.lookup("s3cret-view").unwrap().role, Role::Viewer);
        assert_eq!(t.lookup("dp-token").unwrap().role, Role::DataPlane);
        assert_eq!(t.lookup("nope"), None);
        assert_eq!(t.lookup(""), None);
        // The hash itself is not a token.
        assert_eq!(t.lookup(&gateway_hex::encode(sha256(b"dp-token"))), None);
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn malformed_lines_name_the_line_and_never_the_token() {
        let cases = [
            ("a admin\n", 1, "expected 3 fields"),
            ("\n# c\na root tok\n", 3, "role \"root\""),
            ("a admin t1\na viewer t2\n", 2, "used twice"),
            ("a admin t1\nb viewer t1\n", 2, "also used"),
            ("a admin sha256:abc\n", 1, "64 hex digits"),
            ("a admin t1 extra\n", 1, "found 4"),
        ];
        for (text, line, problem) in cases {
            let e = Tokens::parse(text, Path::new("tokens.txt")).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("line {line}:")), "{text:?}: {msg}");
            assert!(msg.contains(problem), "{text:?}: {msg}");
            assert!(msg.contains("tokens.txt"), "{msg}");
            assert!(!msg.contains("t1"), "{msg}");
        }
        let e = Tokens::parse("# only\n\n", Path::new("x")).unwrap_err();
        assert!(e.to_string().contains("holds no token"), "{e}");
    }

    #[test]
    fn roles_allow_the_documented_rpcs() {
        use Role::*;
        let admin = |m: &str| format!("{ADMIN_PREFIX}{m}");
        for m in READ_ONLY {
            assert!(allowed(Viewer, &admin(m)) && allowed(Admin, &admin(m)));
            assert!(!allowed(DataPlane, &admin(m)));
        }
        for m in [
            "UpsertRoute",
            "DeleteRoute",
            "UpsertUpstream",
            "DeleteUpstream",
            "ApplyConfig",
            "RollbackConfig",
            "CreateApiKey",
            "RevokeApiKey",
            "UpsertCertificate",
            "DeleteCertificate",
            "UpsertJwtIssuer",
            "DeleteJwtIssuer",
            "PurgeCache",
        ] {
            assert!(allowed(Admin, &admin(m)), "{m}");
            assert!(!allowed(Viewer, &admin(m)), "{m}");
            assert!(!allowed(DataPlane, &admin(m)), "{m}");
        }
        // Viewers see which API keys and certificates exist (no secret is ever listed).
        assert!(allowed(Viewer, &admin("ListApiKeys")));
        assert!(allowed(Viewer, &admin("GetCertificate")));
        assert!(allowed(Viewer, &admin("ListCertificates")));
        assert!(allowed(Viewer, &admin("GetJwtIssuer")));
        assert!(allowed(Viewer, &admin("ListJwtIssuers")));
        let stream = format!("{DISCOVERY_PREFIX}StreamConfig");
        assert!(allowed(DataPlane, &stream));
        assert!(!allowed(Admin, &stream));
        assert!(!allowed(Viewer, &stream));
    }

    #[test]
    fn policy_codes() {
        let p = Policy::Tokens(Arc::new(tokens()));
        let list = "/gateway.v1.AdminService/ListRoutes";
        let upsert = "/gateway.v1.AdminService/UpsertRoute";
        let code = |path: &str, auth: Option<&str>| {
            p.check(path, &headers(auth), None)
                .map(|c| c.name)
                .map_err(|s| s.code())
        };
        assert_eq!(code(list, None), Err(tonic::Code::Unauthenticated));
        assert_eq!(
            code(list, Some("Bearer wrong")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            code(list, Some("Basic s3cret-view")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(code(list, Some("Bearer s3cret-view")), Ok("bob".into()));
        assert_eq!(code(list, Some("bearer  s3cret-view")), Ok("bob".into()));
        assert_eq!(
            code(upsert, Some("Bearer s3cret-view")),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(
            code(upsert, Some("Bearer s3cret-admin")),
            Ok("alice".into())
        );
        let e = p
            .check(upsert, &headers(Some("Bearer dp-token")), None)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("dp (role data-plane)"), "{e:?}");
        assert!(!e.message().contains("dp-token"), "{e:?}");

        let open = Policy::Open;
        assert_eq!(
            open.check(upsert, &headers(None), None).unwrap(),
            Caller::anonymous()
        );
    }
}
