//! Validation of a route's `match` (conditions on headers, query parameters
//! and cookies), and [`can_both_match`]: whether two routes at the same hosts,
//! prefix and methods could both take one request, which the configuration
//! check refuses when they have as many matchers each (a tie nothing breaks).

use super::{HOP_BY_HOP, MAX_HEADER_NAME_LEN, Validator, is_valid_header_name};
use crate::v1::{MatchMode, Matcher, Route, RouteMatch};

/// Most matchers (headers, query and cookies together) of one route.
pub const MAX_MATCHERS: usize = 16;
/// Longest matcher name.
pub const MAX_MATCHER_NAME_LEN: usize = 128;
/// Longest matcher value.
pub const MAX_MATCHER_VALUE_LEN: usize = 1024;

/// Headers the data plane removes or owns before routing, so a matcher on one
/// would see the gateway's value rather than the client's (or none).
const NOT_MATCHABLE_HEADERS: &[&str] = &["host", "x-user-id", "x-user-role"];

/// The first policy in which two match siblings (routes at the same hosts,
/// prefix and methods, one with a `match`) differ, among those a client could
/// weaken by choosing a matched header: auth mode, issuers and admitted
/// client certificates (`mtls_allow`), IP rules, `https_only`, rate limits.
/// `None`: they agree.
pub fn sibling_policy_difference(a: &Route, b: &Route) -> Option<&'static str> {
    fn sorted(v: &[String]) -> Vec<&str> {
        let mut v: Vec<&str> = v.iter().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
    fn limits(r: &Route) -> Vec<(String, i32, i32, String, u64, u64)> {
        let mut v: Vec<_> = super::route_limits(r)
            .map(|(_, l)| {
                (
                    l.policy.clone(),
                    l.algorithm,
                    l.key,
                    l.key_header.to_ascii_lowercase(),
                    u64::from(l.limit),
                    u64::from(l.window_seconds),
                )
            })
            .collect();
        v.sort_unstable();
        v
    }
    if a.auth != b.auth {
        Some("auth")
    } else if sorted(&a.jwt_issuers) != sorted(&b.jwt_issuers) {
        Some("jwt_issuers")
    } else if sorted(&a.mtls_allow) != sorted(&b.mtls_allow) {
        Some("mtls_allow")
    } else if sorted(&a.ip_allow) != sorted(&b.ip_allow) {
        Some("ip_allow")
    } else if sorted(&a.ip_deny) != sorted(&b.ip_deny) {
        Some("ip_deny")
    } else if a.https_only != b.https_only {
        Some("https_only")
    } else if limits(a) != limits(b) {
        Some("rate limits")
    } else {
        None
    }
}

/// The number of matchers of a route: among routes at the same hosts, prefix
/// and methods, the one with more wins.
pub fn matcher_count(m: Option<&RouteMatch>) -> usize {
    m.map_or(0, |m| m.headers.len() + m.query.len() + m.cookies.len())
}

impl Validator {
    /// The `match` of a route (`who` names it in messages).
    pub(super) fn route_match(&mut self, who: &str, m: &RouteMatch) {
        let count = matcher_count(Some(m));
        if count == 0 {
            self.push(format!(
                "{who}: match lists no matcher (leave it unset, or list headers, query or cookies)"
            ));
        }
        if count > MAX_MATCHERS {
            self.push(format!(
                "{who}: match lists {count} matchers, at most {MAX_MATCHERS} are allowed"
            ));
        }
        for (kind, list) in [
            (Kind::Header, &m.headers),
            (Kind::Query, &m.query),
            (Kind::Cookie, &m.cookies),
        ] {
            for (i, matcher) in list.iter().enumerate() {
                self.matcher(who, kind, i, matcher);
                if list[..i]
                    .iter()
                    .any(|o| kind.same_name(&o.name, &matcher.name))
                {
                    self.push(format!(
                        "{who}: match.{}[{i}]: \"{}\" is listed twice",
                        kind.field(),
                        matcher.name
                    ));
                }
            }
        }
    }

    fn matcher(&mut self, who: &str, kind: Kind, i: usize, m: &Matcher) {
        let at = format!("{who}: match.{}[{i}]", kind.field());
        let name = m.name.as_str();
        if name.is_empty() || name.len() > MAX_MATCHER_NAME_LEN {
            self.push(format!(
                "{at}: name must be 1 to {MAX_MATCHER_NAME_LEN} characters"
            ));
        } else if kind == Kind::Header {
            let lower = name.to_ascii_lowercase();
            if !is_valid_header_name(name) {
                self.push(format!(
                    "{at}: \"{name}\" is not a valid header name (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME_LEN})"
                ));
            } else if HOP_BY_HOP.contains(&lower.as_str()) {
                self.push(format!(
                    "{at}: \"{name}\" is a hop-by-hop header, removed before routing"
                ));
            } else if NOT_MATCHABLE_HEADERS.contains(&lower.as_str()) {
                self.push(format!(
                    "{at}: \"{name}\" cannot be matched (route by hosts for Host; the gateway removes a client's X-User-Id and X-User-Role)"
                ));
            }
        } else if name.bytes().any(|b| !b.is_ascii_graphic()) {
            self.push(format!(
                "{at}: name \"{name}\" must be visible ASCII characters"
            ));
        }
        let Ok(mode) = MatchMode::try_from(m.mode) else {
            self.push(format!(
                "{at}: mode: unknown value {} (EXACT, PREFIX, PRESENT or ABSENT)",
                m.mode
            ));
            return;
        };
        match mode {
            MatchMode::Exact | MatchMode::Prefix => {
                if m.value.is_empty() || m.value.len() > MAX_MATCHER_VALUE_LEN {
                    self.push(format!(
                        "{at}: value must be 1 to {MAX_MATCHER_VALUE_LEN} characters with mode {}",
                        mode.as_str_name()
                    ));
                } else if m
                    .value
                    .bytes()
                    .any(|b| b != b'\t' && !(b' '..=b'~').contains(&b))
                {
                    self.push(format!(
                        "{at}: value must be visible ASCII characters, spaces and tabs"
                    ));
                }
            }
            MatchMode::Present | MatchMode::Absent => {
                if !m.value.is_empty() {
                    self.push(format!(
                        "{at}: value must be empty with mode {}",
                        mode.as_str_name()
                    ));
                }
            }
        }
    }
}

/// What a matcher looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Header,
    Query,
    Cookie,
}

impl Kind {
    fn field(self) -> &'static str {
        match self {
            Kind::Header => "headers",
            Kind::Query => "query",
            Kind::Cookie => "cookies",
        }
    }

    /// Header names are case-insensitive; parameter and cookie names are not.
    fn same_name(self, a: &str, b: &str) -> bool {
        match self {
            Kind::Header => a.eq_ignore_ascii_case(b),
            Kind::Query | Kind::Cookie => a == b,
        }
    }
}

/// False when no request can satisfy both `a` and `b` (`None`: no
/// conditions): some name is matched by both with conditions that exclude
/// each other (two different EXACT values; PRESENT, EXACT or PREFIX against
/// ABSENT; an EXACT value outside a PREFIX; two PREFIXes neither of which
/// starts the other). A header sent several times is matched on its values
/// joined with ",", a repeated parameter or cookie on its first value, so each
/// name has one value to compare and such conditions really exclude each other.
pub fn can_both_match(a: Option<&RouteMatch>, b: Option<&RouteMatch>) -> bool {
    let (Some(a), Some(b)) = (a, b) else {
        return true;
    };
    let lists = [
        (Kind::Header, &a.headers, &b.headers),
        (Kind::Query, &a.query, &b.query),
        (Kind::Cookie, &a.cookies, &b.cookies),
    ];
    !lists.iter().any(|(kind, xs, ys)| {
        xs.iter().any(|x| {
            ys.iter()
                .any(|y| kind.same_name(&x.name, &y.name) && excludes(x, y))
        })
    })
}

/// Two conditions on one name that no single value (or absence) satisfies.
fn excludes(x: &Matcher, y: &Matcher) -> bool {
    use MatchMode::{Absent, Exact, Prefix, Present};
    let (Ok(mx), Ok(my)) = (MatchMode::try_from(x.mode), MatchMode::try_from(y.mode)) else {
        return false;
    };
    match (mx, my) {
        (Absent, Absent) => false,
        (Absent, _) | (_, Absent) => true,
        (Present, _) | (_, Present) => false,
        (Exact, Exact) => x.value != y.value,
        (Exact, Prefix) => !x.value.starts_with(&y.value),
        (Prefix, Exact) => !y.value.starts_with(&x.value),
        (Prefix, Prefix) => !x.value.starts_with(&y.value) && !y.value.starts_with(&x.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, value: &str, mode: MatchMode) -> Matcher {
        Matcher {
            name: name.into(),
            value: value.into(),
            mode: mode as i32,
        }
    }

    fn headers(list: Vec<Matcher>) -> RouteMatch {
        RouteMatch {
            headers: list,
            ..Default::default()
        }
    }

    #[test]
    fn different_exact_values_of_one_header_exclude_each_other() {
        let v2 = headers(vec![m("Accept-Version", "2", MatchMode::Exact)]);
        let v3 = headers(vec![m("accept-version", "3", MatchMode::Exact)]);
        assert!(!can_both_match(Some(&v2), Some(&v3)));
        assert!(can_both_match(Some(&v2), Some(&v2.clone())));
        // Different names: one request can carry both.
        let tenant = headers(vec![m("x-tenant", "a", MatchMode::Exact)]);
        assert!(can_both_match(Some(&v2), Some(&tenant)));
        // No conditions at all overlaps with anything.
        assert!(can_both_match(None, Some(&v2)));
    }

    #[test]
    fn modes_exclude_as_documented() {
        let pairs = [
            (("1", MatchMode::Present), ("", MatchMode::Absent), false),
            (("", MatchMode::Absent), ("", MatchMode::Absent), true),
            (("", MatchMode::Present), ("2", MatchMode::Exact), true),
            (("20", MatchMode::Exact), ("2", MatchMode::Prefix), true),
            (("30", MatchMode::Exact), ("2", MatchMode::Prefix), false),
            (("ab", MatchMode::Prefix), ("a", MatchMode::Prefix), true),
            (("ab", MatchMode::Prefix), ("b", MatchMode::Prefix), false),
        ];
        for ((va, ma), (vb, mb), both) in pairs {
            let va = if ma == MatchMode::Present { "" } else { va };
            let a = RouteMatch {
                query: vec![m("v", va, ma)],
                ..Default::default()
            };
            let b = RouteMatch {
                query: vec![m("v", vb, mb)],
                ..Default::default()
            };
            assert_eq!(
                can_both_match(Some(&a), Some(&b)),
                both,
                "{ma:?} {va} / {mb:?} {vb}"
            );
            assert_eq!(can_both_match(Some(&b), Some(&a)), both, "symmetric");
        }
    }

    #[test]
    fn cookie_and_query_names_are_case_sensitive() {
        let a = RouteMatch {
            cookies: vec![m("Beta", "1", MatchMode::Exact)],
            ..Default::default()
        };
        let b = RouteMatch {
            cookies: vec![m("beta", "2", MatchMode::Exact)],
            ..Default::default()
        };
        assert!(can_both_match(Some(&a), Some(&b)));
    }

    #[test]
    fn counts_every_list() {
        let r = RouteMatch {
            headers: vec![m("a", "1", MatchMode::Exact)],
            query: vec![
                m("b", "", MatchMode::Present),
                m("c", "", MatchMode::Absent),
            ],
            cookies: vec![m("d", "x", MatchMode::Prefix)],
        };
        assert_eq!(matcher_count(Some(&r)), 4);
        assert_eq!(matcher_count(None), 0);
    }
}
