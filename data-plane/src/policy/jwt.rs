//! The token verification stage: [`JwtAuth`] plugs `gateway-jwt`'s
//! [`JwtVerifier`] into the pipeline's [`Authenticator`] hook (the data
//! plane's flag-configured issuer, for `AUTH_JWT` routes without
//! `jwt_issuers`); [`JwtIssuers`] holds one verifier per configured
//! `JwtIssuer`, and [`RouteJwt`] verifies a route's tokens against the
//! issuers it names, picking one by the token's `iss`.
//!
//! Every refusal maps to a 401 with `WWW-Authenticate: Bearer` (no token) or
//! `Bearer error="invalid_token"` (anything wrong with the token); the reason
//! itself stays in debug logs, never in the response.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use gateway_jwt::{
    Algorithm, JwtConfig, JwtConfigError, JwtError, JwtVerifier, bearer_candidate, is_b64token,
    unverified_issuer,
};
use gateway_proto::v1::JwtIssuer;
use gateway_proto::validate::{
    DEFAULT_JWT_ALGORITHM, DEFAULT_LEEWAY_SECONDS, DEFAULT_ROLE_CLAIM, DEFAULT_USER_ID_CLAIM,
};
use http::request::Parts;

use crate::policy::hooks::{AuthError, Authenticator, Identity};

/// A verifier's settings from a validated `JwtIssuer`.
fn config_of(i: &JwtIssuer) -> JwtConfig {
    let or = |v: &str, default: &str| if v.is_empty() { default } else { v }.to_owned();
    let algorithms = if i.algorithms.is_empty() {
        vec![DEFAULT_JWT_ALGORITHM.to_owned()]
    } else {
        i.algorithms.clone()
    };
    JwtConfig {
        jwks_url: i.jwks_url.clone(),
        discovery_url: i.discovery_url.clone(),
        jwks_hosts: i.jwks_hosts.clone(),
        issuer: i.issuer.clone(),
        audiences: i.audiences.clone(),
        // Validation admitted only names jsonwebtoken parses.
        algorithms: algorithms
            .iter()
            .filter_map(|a| a.parse::<Algorithm>().ok())
            .collect(),
        user_id_claim: or(&i.user_id_claim, DEFAULT_USER_ID_CLAIM),
        role_claim: or(&i.role_claim, DEFAULT_ROLE_CLAIM),
        required_claims: i.required_claims.clone(),
        leeway: Duration::from_secs(u64::from(if i.leeway_seconds == 0 {
            DEFAULT_LEEWAY_SECONDS
        } else {
            i.leeway_seconds
        })),
        ..JwtConfig::default()
    }
}

/// One verifier per configured `JwtIssuer` that some route names, each with
/// its own JWKS cache and verified-token cache. A verifier survives a new
/// configuration while its issuer's settings stay the same.
#[derive(Default)]
pub struct JwtIssuers {
    by_name: HashMap<String, (JwtIssuer, JwtVerifier)>,
    /// Every configured issuer's `iss`, to tell an unknown issuer from one
    /// a route does not accept.
    known: Arc<HashSet<String>>,
}

impl std::fmt::Debug for JwtIssuers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtIssuers")
            .field("issuers", &self.by_name.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl JwtIssuers {
    /// Verifiers for the `issuers` some route of `used` names, reusing
    /// `previous`'s verifier of an unchanged issuer (its keys and verified
    /// tokens stay). A new verifier starts fetching its keys at once.
    pub fn compile<'a>(
        issuers: &[JwtIssuer],
        used: impl IntoIterator<Item = &'a str>,
        previous: &JwtIssuers,
    ) -> Result<Self, JwtConfigError> {
        let used: HashSet<&str> = used.into_iter().collect();
        let mut by_name = HashMap::new();
        for i in issuers.iter().filter(|i| used.contains(i.name.as_str())) {
            let verifier = match previous.by_name.get(&i.name) {
                Some((old, v)) if old == i => v.clone(),
                _ => JwtVerifier::new(config_of(i))?,
            };
            by_name.insert(i.name.clone(), (i.clone(), verifier));
        }
        Ok(Self {
            by_name,
            known: Arc::new(issuers.iter().map(|i| i.issuer.clone()).collect()),
        })
    }

    /// The verifier of a route naming `names` (validated: each exists).
    pub fn route(&self, names: &[String]) -> Option<Arc<RouteJwt>> {
        let issuers: Vec<JwtVerifier> = names
            .iter()
            .filter_map(|n| self.by_name.get(n).map(|(_, v)| v.clone()))
            .collect();
        (!issuers.is_empty()).then(|| {
            Arc::new(RouteJwt {
                issuers: issuers.into(),
                known: Arc::clone(&self.known),
            })
        })
    }

    /// Each issuer's counters in `/metrics` (Prometheus text), labelled
    /// with its name: `gateway_jwt_issuer_*`, as `gateway_jwt_*` for the
    /// flag-configured issuer. Nothing while no route names an issuer.
    pub fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        if self.by_name.is_empty() {
            return;
        }
        let mut issuers: Vec<(&String, gateway_jwt::JwtStats)> = self
            .by_name
            .iter()
            .map(|(n, (_, v))| (n, v.stats()))
            .collect();
        issuers.sort_by(|a, b| a.0.cmp(b.0));
        type Field = fn(&gateway_jwt::JwtStats) -> u64;
        let series: [(&str, &str, &str, Field); 6] = [
            (
                "gateway_jwt_issuer_jwks_fetches_total",
                "counter",
                "JWKS fetches, per JWT issuer.",
                |s| s.jwks_fetches,
            ),
            (
                "gateway_jwt_issuer_jwks_fetch_failures_total",
                "counter",
                "JWKS fetches that failed, per JWT issuer.",
                |s| s.jwks_fetch_failures,
            ),
            (
                "gateway_jwt_issuer_keys",
                "gauge",
                "Signing keys known, per JWT issuer.",
                |s| s.keys as u64,
            ),
            (
                "gateway_jwt_issuer_cached_tokens",
                "gauge",
                "Verified tokens in the cache, per JWT issuer.",
                |s| s.cached_tokens as u64,
            ),
            (
                "gateway_jwt_issuer_cache_hits_total",
                "counter",
                "Bearer tokens found in the issuer's verified-token cache.",
                |s| s.cache_hits,
            ),
            (
                "gateway_jwt_issuer_cache_misses_total",
                "counter",
                "Bearer tokens the issuer had to verify.",
                |s| s.cache_misses,
            ),
        ];
        for (name, kind, help, field) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (issuer, stats) in &issuers {
                // Issuer names are validated ([a-z0-9-]): nothing to escape.
                let _ = writeln!(out, "{name}{{issuer=\"{issuer}\"}} {}", field(stats));
            }
        }
    }
}

/// Verifies the tokens of a route with `jwt_issuers`: a token verified
/// before is found in its issuer's cache; otherwise its `iss` picks the
/// issuer among the route's, whose verifier checks it.
pub struct RouteJwt {
    issuers: Box<[JwtVerifier]>,
    known: Arc<HashSet<String>>,
}

impl std::fmt::Debug for RouteJwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteJwt")
            .field("issuers", &self.issuers.len())
            .finish_non_exhaustive()
    }
}

impl RouteJwt {
    /// The caller's identity, or why the request is refused.
    pub async fn authenticate(&self, req: &Parts) -> Result<Identity, AuthError> {
        let token = bearer_candidate(&req.headers).ok_or(AuthError::Missing)?;
        // Each cache holds only tokens its issuer verified: a hit in the
        // cache of one of the route's issuers is a token the route accepts.
        let cached = self.issuers.iter().find_map(|v| v.cached(token));
        let id = match cached {
            Some(id) => id,
            None if !is_b64token(token) => return Err(AuthError::Missing),
            None => {
                let iss = unverified_issuer(token).ok_or(AuthError::Invalid)?;
                let verifier = self
                    .issuers
                    .iter()
                    .find(|v| v.issuer() == iss)
                    .ok_or_else(|| {
                        tracing::debug!(%iss, "bearer token of an issuer this route does not accept");
                        if self.known.contains(&iss) {
                            AuthError::IssuerNotAccepted
                        } else {
                            AuthError::UnknownIssuer
                        }
                    })?;
                verifier.verify(token).await.map_err(refusal)?
            }
        };
        Ok(Identity {
            subject: id.sub_header().clone(),
            role: id.role_header().clone(),
            api_key: None,
        })
    }
}

fn refusal(e: JwtError) -> AuthError {
    match e {
        JwtError::Missing => AuthError::Missing,
        e => {
            tracing::debug!(reason = e.label(), error = %e, "bearer token refused");
            AuthError::Invalid
        }
    }
}

/// Verifies `Authorization: Bearer` tokens against the auth service's JWKS.
#[derive(Clone)]
pub struct JwtAuth(pub JwtVerifier);

impl std::fmt::Debug for JwtAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuth").finish_non_exhaustive()
    }
}

impl Authenticator for JwtAuth {
    fn authenticate<'a>(&'a self, req: &'a Parts) -> BoxFuture<'a, Result<Identity, AuthError>> {
        Box::pin(async move {
            let token = bearer_candidate(&req.headers).ok_or(AuthError::Missing)?;
            // A token verified before needs neither the character check nor a
            // signature check: the cache compares whole tokens (≈ 2.4k instructions
            // per request saved on the full route, callgrind).
            let id = match self.0.cached(token) {
                Some(id) => id,
                // Not a b64token: no usable bearer token, as `bearer_token` would say.
                None if !is_b64token(token) => return Err(AuthError::Missing),
                None => self.0.verify(token).await.map_err(|e| match e {
                    JwtError::Missing => AuthError::Missing,
                    e => {
                        tracing::debug!(reason = e.label(), "bearer token refused");
                        AuthError::Invalid
                    }
                })?,
            };
            // The verifier caches the header values per token: these clones do not allocate.
            Ok(Identity {
                subject: id.sub_header().clone(),
                role: id.role_header().clone(),
                api_key: None,
            })
        })
    }

    fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let s = self.0.stats();
        for (name, kind, help, value) in [
            (
                "gateway_jwt_jwks_fetches_total",
                "counter",
                "JWKS fetches.",
                s.jwks_fetches,
            ),
            (
                "gateway_jwt_jwks_fetch_failures_total",
                "counter",
                "JWKS fetches that failed.",
                s.jwks_fetch_failures,
            ),
            (
                "gateway_jwt_keys",
                "gauge",
                "Signing keys known.",
                s.keys as u64,
            ),
            (
                "gateway_jwt_cached_tokens",
                "gauge",
                "Verified tokens in the cache.",
                s.cached_tokens as u64,
            ),
            (
                "gateway_jwt_cache_hits_total",
                "counter",
                "Bearer tokens found in the verified-token cache.",
                s.cache_hits,
            ),
            (
                "gateway_jwt_cache_misses_total",
                "counter",
                "Bearer tokens not in the cache, so verified.",
                s.cache_misses,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(name: &str, iss: &str) -> JwtIssuer {
        JwtIssuer {
            name: name.into(),
            issuer: iss.into(),
            // Nothing listens on port 1: no key is ever known.
            jwks_url: "http://127.0.0.1:1/jwks".into(),
            audiences: vec!["gateway".into()],
            ..JwtIssuer::default()
        }
    }

    fn bearer(iss: &str) -> Parts {
        use base64::Engine as _;
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let token = format!(
            "{}.{}.c2ln",
            b64(r#"{"alg":"RS256","kid":"k"}"#),
            b64(&format!(r#"{{"iss":"{iss}","exp":4000000000}}"#))
        );
        http::Request::get("/")
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn defaults_of_an_issuer_become_the_verifier_settings() {
        let c = config_of(&issuer("kc", "https://kc"));
        assert_eq!(c.algorithms, vec![Algorithm::RS256]);
        assert_eq!(
            (c.user_id_claim.as_str(), c.role_claim.as_str()),
            ("sub", "role")
        );
        assert_eq!(c.leeway, Duration::from_secs(30));
        assert!(
            c.required_claims.is_empty(),
            "nbf is not required of OIDC tokens"
        );
    }

    #[tokio::test]
    async fn a_token_is_routed_by_its_iss_and_unknown_or_foreign_issuers_are_told_apart() {
        let all = [issuer("a", "https://a"), issuer("b", "https://b")];
        let issuers = JwtIssuers::compile(&all, ["a"], &JwtIssuers::default()).unwrap();
        assert_eq!(
            issuers.by_name.len(),
            1,
            "only issuers a route names get a verifier"
        );
        assert!(issuers.route(&[]).is_none());
        let route = issuers.route(&["a".into()]).unwrap();
        assert_eq!(
            route.authenticate(&bearer("https://b")).await.unwrap_err(),
            AuthError::IssuerNotAccepted
        );
        assert_eq!(
            route.authenticate(&bearer("https://zz")).await.unwrap_err(),
            AuthError::UnknownIssuer
        );
        // Its own issuer's verifier checks it (and, keyless, refuses it).
        assert_eq!(
            route.authenticate(&bearer("https://a")).await.unwrap_err(),
            AuthError::Invalid
        );
    }
}

#[cfg(test)]
mod builtin_tests {
    use super::*;
    use gateway_jwt::JwtConfig;
    use std::time::Duration;

    fn auth() -> JwtAuth {
        // Nothing listens on port 1: the JWKS is unavailable, so no token can verify.
        JwtAuth(
            JwtVerifier::new(JwtConfig {
                jwks_url: "http://127.0.0.1:1/.well-known/jwks.json".into(),
                fetch_timeout: Duration::from_millis(200),
                refresh_interval: Duration::ZERO,
                ..JwtConfig::default()
            })
            .unwrap(),
        )
    }

    fn parts(authorization: Option<&str>) -> Parts {
        let mut b = http::Request::get("/api/users/1");
        if let Some(a) = authorization {
            b = b.header(http::header::AUTHORIZATION, a);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[tokio::test]
    async fn missing_token_is_missing() {
        let a = auth();
        assert_eq!(
            a.authenticate(&parts(None)).await.unwrap_err(),
            AuthError::Missing
        );
        assert_eq!(
            a.authenticate(&parts(Some("Basic dXNlcjpwdw==")))
                .await
                .unwrap_err(),
            AuthError::Missing
        );
        // Characters a bearer token cannot have: no usable token, as before the cache fast path.
        for header in ["Bearer a\"b.c.d", "Bearer a b", "Bearer abc,def"] {
            assert_eq!(
                a.authenticate(&parts(Some(header))).await.unwrap_err(),
                AuthError::Missing,
                "{header}"
            );
        }
    }

    #[tokio::test]
    async fn bad_tokens_are_invalid() {
        let a = auth();
        for token in [
            "Bearer not-a-jwt",
            "Bearer a.b.c",
            // alg none, refused before any key lookup.
            "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
            // A well-formed EdDSA header with a kid nobody publishes.
            "Bearer eyJhbGciOiJFZERTQSIsImtpZCI6Im5vcGUifQ.eyJzdWIiOiJ4In0.c2ln",
        ] {
            assert_eq!(
                a.authenticate(&parts(Some(token))).await.unwrap_err(),
                AuthError::Invalid,
                "{token}"
            );
        }
    }
}
