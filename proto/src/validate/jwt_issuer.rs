//! Validation of JWT issuers (`JwtIssuer`) and of the routes that name them
//! (`Route.jwt_issuers`). Both planes run it: the control plane before every
//! commit, the data plane before it builds the issuers' verifiers.

use std::collections::{HashMap, HashSet};

use super::{MAX_NAME_LEN, ValidationError, Validator, is_valid_hostname, is_valid_name};
use crate::v1::{AuthMode, JwtIssuer, Route};

/// The signature algorithms an issuer may list (`JwtIssuer.algorithms`).
pub const JWT_ALGORITHMS: [&str; 5] = ["EdDSA", "ES256", "ES384", "RS256", "PS256"];
/// What an empty `JwtIssuer.algorithms` means.
pub const DEFAULT_JWT_ALGORITHM: &str = "RS256";
/// What an empty `user_id_claim` means.
pub const DEFAULT_USER_ID_CLAIM: &str = "sub";
/// What an empty `role_claim` means.
pub const DEFAULT_ROLE_CLAIM: &str = "role";
/// What a zero `leeway_seconds` means.
pub const DEFAULT_LEEWAY_SECONDS: u32 = 30;
/// Largest accepted `leeway_seconds`.
pub const MAX_LEEWAY_SECONDS: u32 = 300;
/// Most issuers one route may name.
pub const MAX_ROUTE_JWT_ISSUERS: usize = 8;
/// Most audiences (and required claims) of one issuer.
pub const MAX_JWT_AUDIENCES: usize = 16;
/// Longest `issuer`.
pub const MAX_ISSUER_LEN: usize = 1024;
/// Longest claim path.
pub const MAX_CLAIM_PATH_LEN: usize = 256;
/// Longest JWKS or discovery URL.
pub const MAX_JWKS_URL_LEN: usize = 2048;

fn visible_ascii(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

/// Most `jwks_hosts` of one issuer.
pub const MAX_JWKS_HOSTS: usize = 16;

/// Whether plain `http://` may reach `host`: `localhost`, or a loopback or
/// private IP literal (127.0.0.0/8, ::1, 10/8, 172.16/12, 192.168/16,
/// fc00::/7). A host name never: it could resolve to anything, and the keys
/// that decide who is authenticated would cross the internet unauthenticated.
pub fn cleartext_host_allowed(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => ip.is_loopback() || ip.is_private(),
        Ok(std::net::IpAddr::V6(ip)) => ip.is_loopback() || (ip.segments()[0] & 0xfe00) == 0xfc00,
        Err(_) => false,
    }
}

/// Why a JWKS or discovery URL is unusable, if it is.
fn check_url(url: &str) -> Result<(), &'static str> {
    if url.len() > MAX_JWKS_URL_LEN {
        return Err("is longer than 2048 characters");
    }
    let uri: http::Uri = url.parse().map_err(|_| "is not a valid URL")?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("must be an absolute http:// or https:// URL");
    }
    let Some(host) = uri.host().filter(|h| !h.is_empty()) else {
        return Err("has no host");
    };
    if uri.scheme_str() == Some("http") && !cleartext_host_allowed(host) {
        return Err(
            "uses http:// to a host that is not localhost or a loopback or private IP literal: use https:// (the keys that decide who is authenticated must not travel unauthenticated)",
        );
    }
    Ok(())
}

/// Whether `h` is a host name (any case: hosts are compared without it) or an
/// IP literal, with no scheme, port or path.
fn is_host(h: &str) -> bool {
    h.parse::<std::net::IpAddr>().is_ok() || is_valid_hostname(&h.to_ascii_lowercase())
}

fn check_claim_path(v: &mut Validator, who: &str, field: &str, path: &str) {
    if path.is_empty() || path.len() > MAX_CLAIM_PATH_LEN || !visible_ascii(path) {
        v.push(format!(
            "{who}: {field} {path:?} must be 1 to {MAX_CLAIM_PATH_LEN} visible ASCII characters (a claim name or a dotted path such as realm_access.roles)"
        ));
    }
}

fn issuer(v: &mut Validator, i: &JwtIssuer) {
    let who = format!("jwt issuer \"{}\"", i.name);
    if !is_valid_name(&i.name) {
        v.push(format!(
            "{who}: name must match [a-z0-9][a-z0-9-]* and be at most {MAX_NAME_LEN} characters"
        ));
    }
    if i.issuer.is_empty() || i.issuer.len() > MAX_ISSUER_LEN || !visible_ascii(&i.issuer) {
        v.push(format!(
            "{who}: issuer must be 1 to {MAX_ISSUER_LEN} visible ASCII characters (the tokens' exact iss)"
        ));
    }
    match (i.jwks_url.is_empty(), i.discovery_url.is_empty()) {
        (true, true) => v.push(format!(
            "{who}: one of jwks_url and discovery_url is required"
        )),
        (false, false) => v.push(format!(
            "{who}: jwks_url and discovery_url cannot both be set"
        )),
        (false, true) => {
            if let Err(why) = check_url(&i.jwks_url) {
                v.push(format!("{who}: jwks_url {:?} {why}", i.jwks_url));
            }
        }
        (true, false) => {
            if let Err(why) = check_url(&i.discovery_url) {
                v.push(format!("{who}: discovery_url {:?} {why}", i.discovery_url));
            }
        }
    }
    if !i.jwks_hosts.is_empty() && i.discovery_url.is_empty() {
        v.push(format!(
            "{who}: jwks_hosts is only allowed with discovery_url (it widens where a discovery document's jwks_uri may point)"
        ));
    }
    if i.jwks_hosts.len() > MAX_JWKS_HOSTS {
        v.push(format!(
            "{who}: jwks_hosts may list at most {MAX_JWKS_HOSTS} hosts"
        ));
    }
    for h in &i.jwks_hosts {
        if !is_host(h) {
            v.push(format!(
                "{who}: jwks_hosts entry {h:?} must be a host name or an IP literal (no scheme, port or path)"
            ));
        }
    }
    if i.audiences.is_empty() || i.audiences.len() > MAX_JWT_AUDIENCES {
        v.push(format!(
            "{who}: audiences must list 1 to {MAX_JWT_AUDIENCES} audiences (a token's aud must contain one)"
        ));
    }
    for a in &i.audiences {
        if a.is_empty() || a.len() > 256 || a.chars().any(char::is_control) {
            v.push(format!(
                "{who}: audience {a:?} must be 1 to 256 characters without control characters"
            ));
        }
    }
    let mut seen = HashSet::new();
    for a in &i.algorithms {
        if !JWT_ALGORITHMS.contains(&a.as_str()) {
            v.push(format!(
                "{who}: algorithm {a:?} is not supported (use {})",
                JWT_ALGORITHMS.join(", ")
            ));
        } else if !seen.insert(a.as_str()) {
            v.push(format!("{who}: algorithm {a:?} is listed twice"));
        }
    }
    if !i.user_id_claim.is_empty() {
        check_claim_path(v, &who, "user_id_claim", &i.user_id_claim);
    }
    if !i.role_claim.is_empty() {
        check_claim_path(v, &who, "role_claim", &i.role_claim);
    }
    if i.required_claims.len() > MAX_JWT_AUDIENCES {
        v.push(format!(
            "{who}: required_claims may list at most {MAX_JWT_AUDIENCES} claims"
        ));
    }
    let mut seen = HashSet::new();
    for c in &i.required_claims {
        check_claim_path(v, &who, "required_claims entry", c);
        if !seen.insert(c.as_str()) {
            v.push(format!("{who}: required claim {c:?} is listed twice"));
        }
    }
    if i.leeway_seconds > MAX_LEEWAY_SECONDS {
        v.push(format!(
            "{who}: leeway_seconds must be at most {MAX_LEEWAY_SECONDS}"
        ));
    }
}

/// Validates every issuer, and every route's `jwt_issuers` against them:
/// only on `AUTH_JWT` routes, each must exist, no duplicates, at most
/// [`MAX_ROUTE_JWT_ISSUERS`], no two with the same `issuer`.
pub fn validate_jwt_issuers(
    issuers: &[JwtIssuer],
    routes: &[Route],
) -> Result<(), ValidationError> {
    let mut v = Validator::default();
    let mut by_name: HashMap<&str, &JwtIssuer> = HashMap::new();
    for i in issuers {
        issuer(&mut v, i);
        if by_name.insert(i.name.as_str(), i).is_some() {
            v.push(format!("jwt issuer \"{}\": name is used twice", i.name));
        }
    }
    for r in routes.iter().filter(|r| !r.jwt_issuers.is_empty()) {
        let who = format!("route \"{}\"", r.name);
        if r.auth != AuthMode::AuthJwt as i32 {
            v.push(format!(
                "{who}: jwt_issuers is only allowed with auth AUTH_JWT"
            ));
        }
        if r.jwt_issuers.len() > MAX_ROUTE_JWT_ISSUERS {
            v.push(format!(
                "{who}: jwt_issuers may name at most {MAX_ROUTE_JWT_ISSUERS} issuers"
            ));
        }
        let mut names = HashSet::new();
        let mut iss: HashMap<&str, &str> = HashMap::new();
        for name in &r.jwt_issuers {
            if !names.insert(name.as_str()) {
                v.push(format!("{who}: jwt_issuers names \"{name}\" twice"));
                continue;
            }
            let Some(i) = by_name.get(name.as_str()) else {
                v.push(format!(
                    "{who}: jwt issuer \"{name}\" does not exist (add it with UpsertJwtIssuer first; an issuer a route names cannot be deleted)"
                ));
                continue;
            };
            if let Some(other) = iss.insert(i.issuer.as_str(), name.as_str()) {
                v.push(format!(
                    "{who}: jwt issuers \"{other}\" and \"{name}\" have the same issuer {:?}: a token's iss could not choose between them",
                    i.issuer
                ));
            }
        }
    }
    v.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> JwtIssuer {
        JwtIssuer {
            name: "keycloak".into(),
            issuer: "https://idp.example.com/realms/acme".into(),
            discovery_url: "https://idp.example.com/realms/acme/.well-known/openid-configuration"
                .into(),
            audiences: vec!["gateway".into()],
            algorithms: vec!["RS256".into(), "ES256".into()],
            role_claim: "realm_access.roles".into(),
            required_claims: vec!["email".into()],
            leeway_seconds: 60,
            ..Default::default()
        }
    }

    fn route(auth: AuthMode, issuers: &[&str]) -> Route {
        Route {
            name: "orders".into(),
            auth: auth as i32,
            jwt_issuers: issuers.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn refused(issuers: &[JwtIssuer], routes: &[Route]) -> String {
        validate_jwt_issuers(issuers, routes)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn a_good_issuer_and_route_pass() {
        validate_jwt_issuers(&[good()], &[route(AuthMode::AuthJwt, &["keycloak"])]).unwrap();
        validate_jwt_issuers(&[], &[route(AuthMode::AuthJwt, &[])]).unwrap();
    }

    #[test]
    fn every_field_refusal_names_the_issuer_and_the_field() {
        let cases: Vec<(JwtIssuer, &str)> = vec![
            (
                JwtIssuer {
                    name: "Bad_Name".into(),
                    ..good()
                },
                "name must match",
            ),
            (
                JwtIssuer {
                    issuer: String::new(),
                    ..good()
                },
                "issuer must be 1 to 1024",
            ),
            (
                JwtIssuer {
                    issuer: "a b".into(),
                    ..good()
                },
                "issuer must be 1 to 1024",
            ),
            (
                JwtIssuer {
                    discovery_url: String::new(),
                    ..good()
                },
                "one of jwks_url and discovery_url is required",
            ),
            (
                JwtIssuer {
                    jwks_url: "https://idp/jwks".into(),
                    ..good()
                },
                "cannot both be set",
            ),
            (
                JwtIssuer {
                    discovery_url: "ftp://idp/x".into(),
                    ..good()
                },
                "discovery_url \"ftp://idp/x\" must be an absolute http:// or https:// URL",
            ),
            (
                JwtIssuer {
                    discovery_url: String::new(),
                    jwks_url: "/relative".into(),
                    ..good()
                },
                "jwks_url \"/relative\" must be an absolute",
            ),
            (
                JwtIssuer {
                    audiences: vec![],
                    ..good()
                },
                "audiences must list 1 to 16",
            ),
            // Issue 41, item 14: cleartext only to loopback and private literals.
            (
                JwtIssuer {
                    discovery_url: "http://idp.example.com/.well-known/openid-configuration".into(),
                    ..good()
                },
                "uses http:// to a host that is not localhost or a loopback or private IP literal",
            ),
            (
                JwtIssuer {
                    discovery_url: String::new(),
                    jwks_url: "http://8.8.8.8/jwks".into(),
                    ..good()
                },
                "jwks_url \"http://8.8.8.8/jwks\" uses http://",
            ),
            (
                JwtIssuer {
                    discovery_url: String::new(),
                    jwks_url: "http://auth:4000/jwks".into(),
                    ..good()
                },
                "uses http://",
            ),
            (
                JwtIssuer {
                    jwks_hosts: vec!["https://www.googleapis.com".into()],
                    ..good()
                },
                "jwks_hosts entry \"https://www.googleapis.com\" must be a host name",
            ),
            (
                JwtIssuer {
                    jwks_hosts: (0..17).map(|i| format!("h{i}.example.com")).collect(),
                    ..good()
                },
                "jwks_hosts may list at most 16",
            ),
            (
                JwtIssuer {
                    discovery_url: String::new(),
                    jwks_url: "https://idp.example.com/jwks".into(),
                    jwks_hosts: vec!["www.googleapis.com".into()],
                    ..good()
                },
                "jwks_hosts is only allowed with discovery_url",
            ),
            (
                JwtIssuer {
                    audiences: vec!["a\nb".into()],
                    ..good()
                },
                "audience \"a\\nb\" must be 1 to 256",
            ),
            (
                JwtIssuer {
                    algorithms: vec!["HS256".into()],
                    ..good()
                },
                "algorithm \"HS256\" is not supported",
            ),
            (
                JwtIssuer {
                    algorithms: vec!["none".into()],
                    ..good()
                },
                "algorithm \"none\" is not supported",
            ),
            (
                JwtIssuer {
                    algorithms: vec!["RS256".into(), "RS256".into()],
                    ..good()
                },
                "algorithm \"RS256\" is listed twice",
            ),
            (
                JwtIssuer {
                    user_id_claim: "a b".into(),
                    ..good()
                },
                "user_id_claim \"a b\" must be 1 to 256",
            ),
            (
                JwtIssuer {
                    role_claim: "x".repeat(257),
                    ..good()
                },
                "role_claim",
            ),
            (
                JwtIssuer {
                    required_claims: vec![String::new()],
                    ..good()
                },
                "required_claims entry \"\" must be 1 to 256",
            ),
            (
                JwtIssuer {
                    required_claims: vec!["a".into(), "a".into()],
                    ..good()
                },
                "required claim \"a\" is listed twice",
            ),
            (
                JwtIssuer {
                    required_claims: (0..17).map(|i| format!("c{i}")).collect(),
                    ..good()
                },
                "required_claims may list at most 16",
            ),
            (
                JwtIssuer {
                    leeway_seconds: 301,
                    ..good()
                },
                "leeway_seconds must be at most 300",
            ),
        ];
        for (i, want) in cases {
            let got = refused(std::slice::from_ref(&i), &[]);
            assert!(got.contains("jwt issuer \""), "{got}");
            assert!(got.contains(want), "want {want:?} in {got:?}");
        }
        assert!(refused(&[good(), good()], &[]).contains("name is used twice"));
    }

    #[test]
    fn cleartext_urls_only_to_loopback_and_private_literals() {
        for ok in [
            "http://127.0.0.1:4000/jwks",
            "http://localhost/jwks",
            "http://[::1]:8/jwks",
            "http://10.1.2.3/jwks",
            "http://172.16.0.1/jwks",
            "http://192.168.1.1/jwks",
            "http://[fd00::1]/jwks",
            "https://idp.example.com/jwks",
            "https://8.8.8.8/jwks",
        ] {
            let i = JwtIssuer {
                discovery_url: String::new(),
                jwks_url: ok.into(),
                ..good()
            };
            validate_jwt_issuers(&[i], &[]).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "http://172.32.0.1/jwks",
            "http://169.254.169.254/jwks",
            "http://[2001:db8::1]/jwks",
            "http://localhost.example.com/jwks",
            "http://idp/jwks",
        ] {
            let i = JwtIssuer {
                discovery_url: String::new(),
                jwks_url: bad.into(),
                ..good()
            };
            assert!(refused(&[i], &[]).contains("uses http://"), "{bad}");
        }
        let google = JwtIssuer {
            jwks_hosts: vec!["www.googleapis.com".into(), "10.0.0.1".into()],
            ..good()
        };
        validate_jwt_issuers(&[google], &[]).unwrap();
    }

    #[test]
    fn routes_may_name_only_existing_distinct_issuers_and_only_with_auth_jwt() {
        let other = JwtIssuer {
            name: "auth0".into(),
            issuer: "https://acme.auth0.com/".into(),
            ..good()
        };
        let same_iss = JwtIssuer {
            name: "keycloak-2".into(),
            ..good()
        };
        let issuers = [good(), other, same_iss];
        validate_jwt_issuers(
            &issuers,
            &[route(AuthMode::AuthJwt, &["keycloak", "auth0"])],
        )
        .unwrap();
        for (r, want) in [
            (
                route(AuthMode::AuthNone, &["keycloak"]),
                "route \"orders\": jwt_issuers is only allowed with auth AUTH_JWT",
            ),
            (
                route(AuthMode::AuthApiKey, &["keycloak"]),
                "only allowed with auth AUTH_JWT",
            ),
            (
                route(AuthMode::AuthJwt, &["okta"]),
                "route \"orders\": jwt issuer \"okta\" does not exist",
            ),
            (
                route(AuthMode::AuthJwt, &["keycloak", "keycloak"]),
                "names \"keycloak\" twice",
            ),
            (
                route(AuthMode::AuthJwt, &["keycloak", "keycloak-2"]),
                "have the same issuer",
            ),
            (
                route(
                    AuthMode::AuthJwt,
                    &["a", "b", "c", "d", "e", "f", "g", "h", "i"],
                ),
                "at most 8 issuers",
            ),
        ] {
            let got = refused(&issuers, &[r]);
            assert!(got.contains(want), "want {want:?} in {got:?}");
        }
    }
}
