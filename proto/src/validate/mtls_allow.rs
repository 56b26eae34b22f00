//! Validation of an `AUTH_MTLS` route's `mtls_allow` (issue 41, item 15):
//! the client certificates it admits, by Common Name or subject alternative
//! name. [`parse_mtls_allow_entry`] is the one reading of an entry, shared
//! with the data plane, which compiles the list from it.

use std::collections::HashSet;

use super::Validator;
use crate::v1::{AuthMode, Route};

/// What the `X-User-Id` of an `AUTH_MTLS` caller starts with (then its
/// certificate's subject), so that a certificate never passes for a JWT
/// `sub` or an API key's subject: an API key's subject may not start with it,
/// and the data plane refuses a token whose `sub` does.
pub const MTLS_SUBJECT_PREFIX: &str = "mtls:";

/// Most entries of one route's `mtls_allow`.
pub const MAX_MTLS_ALLOW: usize = 256;
/// Longest `mtls_allow` entry, kind prefix included, in bytes.
pub const MAX_MTLS_ALLOW_ENTRY_LEN: usize = 1024;

/// Which name of a certificate an `mtls_allow` entry matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MtlsNameKind {
    /// A bare entry: the Common Name or any DNS, URI or e-mail SAN.
    Any,
    /// `cn:`: the subject's Common Name, compared exactly.
    Cn,
    /// `dns:`: a DNS SAN, compared ignoring ASCII case.
    Dns,
    /// `uri:`: a URI SAN, compared exactly.
    Uri,
    /// `email:`: an e-mail (RFC 822) SAN, compared ignoring ASCII case.
    Email,
}

/// Splits an `mtls_allow` entry into its kind and the name it matches:
/// `cn:`, `dns:`, `uri:` or `email:` then a name, or a bare name without
/// `':'`. The error says what is wrong with the entry.
pub fn parse_mtls_allow_entry(entry: &str) -> Result<(MtlsNameKind, &str), String> {
    if entry.len() > MAX_MTLS_ALLOW_ENTRY_LEN {
        return Err(format!(
            "is {} bytes long, at most {MAX_MTLS_ALLOW_ENTRY_LEN} are allowed",
            entry.len()
        ));
    }
    let (kind, name) = match entry.split_once(':') {
        None => (MtlsNameKind::Any, entry),
        Some(("cn", name)) => (MtlsNameKind::Cn, name),
        Some(("dns", name)) => (MtlsNameKind::Dns, name),
        Some(("uri", name)) => (MtlsNameKind::Uri, name),
        Some(("email", name)) => (MtlsNameKind::Email, name),
        Some((kind, _)) => {
            return Err(format!(
                "has the unknown kind \"{kind}:\" (an entry containing ':' must start with cn:, dns:, uri: or email:, as in \"uri:spiffe://example.org/billing\")"
            ));
        }
    };
    if name.is_empty() {
        return Err("names nothing (write a Common Name or a subject alternative name)".into());
    }
    if name.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if name.trim() != name {
        return Err("must not start or end with whitespace".into());
    }
    Ok((kind, name))
}

/// The form two entries are compared in for duplicates: DNS names and
/// e-mail addresses in lower case, as they are matched.
fn normalized(kind: MtlsNameKind, name: &str) -> (MtlsNameKind, String) {
    match kind {
        MtlsNameKind::Dns | MtlsNameKind::Email => (kind, name.to_ascii_lowercase()),
        MtlsNameKind::Any | MtlsNameKind::Cn | MtlsNameKind::Uri => (kind, name.to_owned()),
    }
}

impl Validator {
    /// The `mtls_allow` of route `r` (`who` names it in messages): only on
    /// an `AUTH_MTLS` route, at most [`MAX_MTLS_ALLOW`] valid entries, none twice.
    pub(super) fn mtls_allow(&mut self, who: &str, r: &Route) {
        if r.mtls_allow.is_empty() {
            return;
        }
        if r.auth != AuthMode::AuthMtls as i32 {
            self.push(format!(
                "{who}: mtls_allow is only allowed with auth AUTH_MTLS"
            ));
        }
        if r.mtls_allow.len() > MAX_MTLS_ALLOW {
            self.push(format!(
                "{who}: mtls_allow lists {} entries, at most {MAX_MTLS_ALLOW} are allowed",
                r.mtls_allow.len()
            ));
        }
        let mut seen = HashSet::new();
        for (i, entry) in r.mtls_allow.iter().enumerate() {
            match parse_mtls_allow_entry(entry) {
                Err(why) => self.push(format!("{who}: mtls_allow[{i}] {why}")),
                Ok((kind, name)) => {
                    if !seen.insert(normalized(kind, name)) {
                        self.push(format!(
                            "{who}: mtls_allow[{i}] \"{entry}\" is listed twice"
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Instance, Upstream};
    use crate::validate::valid;

    fn route(auth: AuthMode, allow: &[&str]) -> Route {
        Route {
            name: "billing".into(),
            path_prefix: "/billing".into(),
            upstream: "users".into(),
            auth: auth as i32,
            mtls_allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            ..Route::default()
        }
    }

    fn users() -> Upstream {
        Upstream {
            name: "users".into(),
            instances: vec![Instance {
                id: "u1".into(),
                url: "http://127.0.0.1:9001".into(),
                ..Instance::default()
            }],
            ..Upstream::default()
        }
    }

    fn check(r: Route) -> Result<(), String> {
        valid(&[r], &[users()]).map_err(|e| e.to_string())
    }

    #[test]
    fn entries_of_every_kind_are_accepted_on_an_mtls_route() {
        check(route(
            AuthMode::AuthMtls,
            &[
                "billing-service",
                "cn:svc:billing",
                "dns:billing.internal",
                "uri:spiffe://example.org/ns/prod/sa/billing",
                "email:ops@example.org",
                "cn:Reports Service",
            ],
        ))
        .unwrap();
        check(route(AuthMode::AuthMtls, &[])).unwrap();
    }

    #[test]
    fn parsing_says_the_kind_and_the_name() {
        assert_eq!(
            parse_mtls_allow_entry("uri:spiffe://a/b"),
            Ok((MtlsNameKind::Uri, "spiffe://a/b"))
        );
        assert_eq!(
            parse_mtls_allow_entry("billing"),
            Ok((MtlsNameKind::Any, "billing"))
        );
        assert_eq!(
            parse_mtls_allow_entry("cn:a:b"),
            Ok((MtlsNameKind::Cn, "a:b"))
        );
    }

    #[test]
    fn the_list_is_refused_off_an_mtls_route() {
        for auth in [AuthMode::AuthNone, AuthMode::AuthJwt, AuthMode::AuthApiKey] {
            let got = check(route(auth, &["billing"])).unwrap_err();
            assert_eq!(
                got,
                "route \"billing\": mtls_allow is only allowed with auth AUTH_MTLS"
            );
        }
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        for (entry, want) in [
            ("", "mtls_allow[0] names nothing"),
            ("dns:", "mtls_allow[0] names nothing"),
            ("CN:billing", "mtls_allow[0] has the unknown kind \"CN:\""),
            (
                "spiffe://example.org/billing",
                "mtls_allow[0] has the unknown kind \"spiffe:\"",
            ),
            (
                "bill\ning",
                "mtls_allow[0] must not contain control characters",
            ),
            (
                " billing",
                "mtls_allow[0] must not start or end with whitespace",
            ),
        ] {
            let got = check(route(AuthMode::AuthMtls, &[entry])).unwrap_err();
            assert!(got.contains(want), "{entry:?}: {got}");
        }
        let long = format!("cn:{}", "a".repeat(MAX_MTLS_ALLOW_ENTRY_LEN));
        let got = check(route(AuthMode::AuthMtls, &[&long])).unwrap_err();
        assert!(got.contains("at most 1024 are allowed"), "{got}");
    }

    #[test]
    fn match_siblings_must_admit_the_same_certificates() {
        use crate::v1::{MatchMode, Matcher, RouteMatch};
        let strict = route(AuthMode::AuthMtls, &["billing-service"]);
        let beta = Route {
            name: "beta".into(),
            r#match: Some(RouteMatch {
                headers: vec![Matcher {
                    name: "x-beta".into(),
                    value: "1".into(),
                    mode: MatchMode::Exact as i32,
                }],
                ..RouteMatch::default()
            }),
            ..route(AuthMode::AuthMtls, &[])
        };
        let got = valid(&[strict.clone(), beta.clone()], &[users()])
            .unwrap_err()
            .to_string();
        assert!(got.contains("differs in mtls_allow"), "{got}");
        let same = Route {
            mtls_allow: strict.mtls_allow.clone(),
            ..beta
        };
        valid(&[strict, same], &[users()]).unwrap();
    }

    #[test]
    fn an_api_key_subject_cannot_take_the_certificate_prefix() {
        let got =
            crate::validate::validate_api_key_fields("billing", "mtls:billing-service", "user")
                .unwrap_err()
                .to_string();
        assert_eq!(
            got,
            "api key \"billing\": subject must not start with \"mtls:\", which names client-certificate callers"
        );
        crate::validate::validate_api_key_fields("billing", "billing-mtls:x", "user").unwrap();
    }

    #[test]
    fn duplicates_and_oversize_lists_are_refused() {
        let got = check(route(
            AuthMode::AuthMtls,
            &["dns:Billing.Internal", "dns:billing.internal"],
        ))
        .unwrap_err();
        assert_eq!(
            got,
            "route \"billing\": mtls_allow[1] \"dns:billing.internal\" is listed twice"
        );
        // Common Names compare exactly: two spellings are two entries.
        check(route(AuthMode::AuthMtls, &["cn:Billing", "cn:billing"])).unwrap();
        let many: Vec<String> = (0..=MAX_MTLS_ALLOW).map(|i| format!("svc-{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let got = check(route(AuthMode::AuthMtls, &many)).unwrap_err();
        assert!(
            got.contains("mtls_allow lists 257 entries, at most 256 are allowed"),
            "{got}"
        );
    }
}
