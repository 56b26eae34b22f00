//! Route matching: host, longest whole-segment path prefix, method.
//!
//! Routes are grouped by host class: exact host names, `*.suffix` wildcards,
//! and "any host". Each class holds a hash map from path prefix to the routes
//! with that prefix. A lookup walks the request path's segment boundaries from
//! the longest candidate to `/` (`/api/orders/7` → `/api/orders/7`,
//! `/api/orders`, `/api`, `/`), probing the map at each. The cost grows with the
//! depth of the request path, not with the number of routes.
//!
//! Precedence, most specific first:
//! 1. host class: the exact host, then wildcards from the longest suffix to the
//!    shortest (`*.b.example.com` before `*.example.com`), then routes without
//!    hosts. A class with no match for the path falls through to the next one.
//! 2. within a class, the longest prefix; a prefix only matches on a segment
//!    boundary (`/api/orders` matches `/api/orders/7`, not `/api/ordersx`).
//! 3. at one prefix, a route listing the request's method beats an any-method
//!    route; when neither applies, shorter prefixes are tried.
//!
//! 4. at one host, prefix and method (or any-method) slot, routes with a
//!    `match` ([`RequestMatch`]) are tried first, most matchers first; the
//!    first whose conditions all hold wins, then the slot's route without
//!    conditions, if any. A slot where nothing holds is passed over like an
//!    empty one. Conditions are checked only at the slots a request reaches,
//!    so their cost does not grow with the number of routes either.
//!
//! Methods match exactly (a route listing `GET` does not answer `HEAD`).

use std::collections::HashMap;
use std::sync::Arc;

use gateway_proto::validate::can_both_match;
use http::{HeaderMap, Method};

use crate::policy::matching::{MatchInput, RequestMatch};

/// The router's maps hash with foldhash (the workspace's one fast hasher).
/// SipHash's flooding resistance buys nothing here: the keys (prefixes, hosts)
/// come from the operator's configuration, and a client only ever looks keys
/// up, so it cannot lengthen a probe sequence.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// Why a route could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// Another route already answers for this host, prefix and method.
    #[error(
        "route conflicts with another route on host {host:?}, prefix {prefix:?}, method {method}"
    )]
    Conflict {
        /// The host (or `*` for any host).
        host: String,
        /// The prefix.
        prefix: String,
        /// The method, or `any`.
        method: String,
    },
    /// A prefix that can never match a normalised path.
    #[error("path prefix {0:?} must start with \"/\" and not end with \"/\"")]
    BadPrefix(String),
    /// A host or method listed twice in one route.
    #[error("{0:?} is listed twice")]
    Duplicate(String),
}

/// The routes at one host class, prefix and method (or any method).
#[derive(Debug)]
enum Slot {
    /// One route without conditions: the common case, no scan.
    One(usize),
    /// Routes with conditions, most matchers first, then at most one without.
    Many(Vec<(Option<Arc<RequestMatch>>, usize)>),
}

impl Slot {
    fn new(conditions: Option<&Arc<RequestMatch>>, index: usize) -> Self {
        match conditions {
            None => Slot::One(index),
            Some(c) => Slot::Many(vec![(Some(c.clone()), index)]),
        }
    }

    fn find(&self, input: &MatchInput<'_>) -> Option<usize> {
        match self {
            Slot::One(i) => Some(*i),
            Slot::Many(list) => list
                .iter()
                .find(|(c, _)| c.as_ref().is_none_or(|c| c.holds(input)))
                .map(|&(_, i)| i),
        }
    }

    /// Whether a route with `conditions` would tie with one already here:
    /// as many matchers, and one request could satisfy both.
    fn ties(&self, conditions: Option<&Arc<RequestMatch>>) -> bool {
        let count = conditions.map_or(0, |c| c.len());
        let proto = conditions.map(|c| c.proto());
        let tie = |have: Option<&Arc<RequestMatch>>| {
            have.map_or(0, |c| c.len()) == count
                && (count == 0 || can_both_match(have.map(|c| c.proto()), proto))
        };
        match self {
            Slot::One(_) => tie(None),
            Slot::Many(list) => list.iter().any(|(c, _)| tie(c.as_ref())),
        }
    }

    fn add(&mut self, conditions: Option<&Arc<RequestMatch>>, index: usize) {
        let mut list = match std::mem::replace(self, Slot::Many(Vec::new())) {
            Slot::One(i) => vec![(None, i)],
            Slot::Many(list) => list,
        };
        list.push((conditions.cloned(), index));
        // Most matchers first; stable, so equal counts keep their order.
        list.sort_by_key(|(c, _)| std::cmp::Reverse(c.as_ref().map_or(0, |c| c.len())));
        *self = Slot::Many(list);
    }
}

#[derive(Debug, Default)]
struct MethodSet {
    /// Routes listing specific methods: (method, routes). Short: linear scan.
    by_method: Vec<(Method, Slot)>,
    /// The any-method routes, if any.
    any: Option<Slot>,
}

impl MethodSet {
    fn find(&self, method: &Method, input: &MatchInput<'_>) -> Option<usize> {
        self.by_method
            .iter()
            .find(|(m, _)| m == method)
            .and_then(|(_, slot)| slot.find(input))
            .or_else(|| self.any.as_ref().and_then(|slot| slot.find(input)))
    }
}

#[derive(Debug, Default)]
struct PrefixTable {
    prefixes: FastMap<Box<str>, MethodSet>,
    /// Longest prefix in the table: longer candidates are skipped without hashing.
    max_len: usize,
}

impl PrefixTable {
    /// The method (or `any`) at `prefix` where another route ties with one
    /// with `conditions`.
    fn conflict(
        &self,
        prefix: &str,
        methods: &[Method],
        conditions: Option<&Arc<RequestMatch>>,
    ) -> Option<String> {
        let set = self.prefixes.get(prefix)?;
        if methods.is_empty() {
            return set
                .any
                .as_ref()
                .is_some_and(|slot| slot.ties(conditions))
                .then(|| "any".to_string());
        }
        methods
            .iter()
            .find(|m| {
                set.by_method
                    .iter()
                    .any(|(have, slot)| have == *m && slot.ties(conditions))
            })
            .map(Method::to_string)
    }

    fn insert(
        &mut self,
        prefix: &str,
        methods: &[Method],
        conditions: Option<&Arc<RequestMatch>>,
        index: usize,
    ) {
        let set = self.prefixes.entry(prefix.into()).or_default();
        self.max_len = self.max_len.max(prefix.len());
        if methods.is_empty() {
            match &mut set.any {
                Some(slot) => slot.add(conditions, index),
                None => set.any = Some(Slot::new(conditions, index)),
            }
        }
        for m in methods {
            match set.by_method.iter_mut().find(|(have, _)| have == m) {
                Some((_, slot)) => slot.add(conditions, index),
                None => set
                    .by_method
                    .push((m.clone(), Slot::new(conditions, index))),
            }
        }
    }

    /// Longest prefix of `path` (on a segment boundary) with a route for `method`
    /// whose conditions hold.
    fn find(&self, method: &Method, path: &str, input: &MatchInput<'_>) -> Option<usize> {
        if self.prefixes.is_empty() {
            return None;
        }
        let mut end = path.len();
        loop {
            let candidate = if end == 0 { "/" } else { &path[..end] };
            if candidate.len() <= self.max_len
                && let Some(i) = self
                    .prefixes
                    .get(candidate)
                    .and_then(|s| s.find(method, input))
            {
                return Some(i);
            }
            if end == 0 {
                return None;
            }
            // Next shorter candidate ends just before the previous '/'.
            end = path[..end].rfind('/').unwrap_or(0);
        }
    }
}

/// A compiled routing table whose routes carry a `T`.
#[derive(Debug)]
pub struct Router<T> {
    routes: Vec<T>,
    exact: FastMap<Box<str>, PrefixTable>,
    /// Keyed by the suffix after `*.`.
    wildcard: FastMap<Box<str>, PrefixTable>,
    any_host: PrefixTable,
}

impl<T> Default for Router<T> {
    fn default() -> Self {
        Self {
            routes: Vec::new(),
            exact: FastMap::default(),
            wildcard: FastMap::default(),
            any_host: PrefixTable::default(),
        }
    }
}

impl<T> Router<T> {
    /// An empty table (matches nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// True when there are no routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Every route, in insertion order.
    pub fn routes(&self) -> &[T] {
        &self.routes
    }

    /// Adds a route without conditions; see [`Router::insert_matching`].
    pub fn insert(
        &mut self,
        hosts: &[String],
        prefix: &str,
        methods: &[Method],
        value: T,
    ) -> Result<(), RouterError> {
        self.insert_matching(hosts, prefix, methods, None, value)
    }

    /// Adds a route. `hosts` are lower-case names or `*.suffix` (empty: any host);
    /// `prefix` starts with `/` and has no trailing `/` (except `/` itself);
    /// `methods` empty means any method; `conditions` is the route's `match`.
    /// Refused when another route at one of its hosts, its prefix and one of
    /// its methods has as many matchers and could take the same request.
    pub fn insert_matching(
        &mut self,
        hosts: &[String],
        prefix: &str,
        methods: &[Method],
        conditions: Option<Arc<RequestMatch>>,
        value: T,
    ) -> Result<(), RouterError> {
        let conditions = conditions.as_ref();
        if !prefix.starts_with('/') || (prefix.len() > 1 && prefix.ends_with('/')) {
            return Err(RouterError::BadPrefix(prefix.into()));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = hosts.iter().find(|h| !seen.insert(h.as_str())) {
            return Err(RouterError::Duplicate(dup.clone()));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = methods.iter().find(|m| !seen.insert(*m)) {
            return Err(RouterError::Duplicate(dup.to_string()));
        }
        // Check every table first so a refused route leaves the router untouched.
        let conflict = |host: &str, method: String| RouterError::Conflict {
            host: host.into(),
            prefix: prefix.into(),
            method,
        };
        if hosts.is_empty()
            && let Some(m) = self.any_host.conflict(prefix, methods, conditions)
        {
            return Err(conflict("*", m));
        }
        for host in hosts {
            let table = match host.strip_prefix("*.") {
                Some(suffix) => self.wildcard.get(suffix),
                None => self.exact.get(host.as_str()),
            };
            if let Some(m) = table.and_then(|t| t.conflict(prefix, methods, conditions)) {
                return Err(conflict(host, m));
            }
        }
        let index = self.routes.len();
        if hosts.is_empty() {
            self.any_host.insert(prefix, methods, conditions, index);
        }
        for host in hosts {
            let table = match host.strip_prefix("*.") {
                Some(suffix) => self.wildcard.entry(suffix.into()).or_default(),
                None => self.exact.entry(host.as_str().into()).or_default(),
            };
            table.insert(prefix, methods, conditions, index);
        }
        self.routes.push(value);
        Ok(())
    }

    /// Finds the route for a request without headers or query (routes with
    /// conditions that need one do not match); see [`Router::find_matching`].
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> Option<&T> {
        let headers = HeaderMap::new();
        let input = MatchInput {
            headers: &headers,
            query: None,
        };
        self.find_matching(host, method, path, &input)
    }

    /// Finds the route for a request. `host` is the Host header without port,
    /// lower-case (see [`host_of`]); `path` is the normalised path; `input`
    /// what routes' conditions look at.
    pub fn find_matching(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
        input: &MatchInput<'_>,
    ) -> Option<&T> {
        self.find_index(host, method, path, input)
            .map(|i| &self.routes[i])
    }

    fn find_index(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
        input: &MatchInput<'_>,
    ) -> Option<usize> {
        if let Some(host) = host {
            if !self.exact.is_empty()
                && let Some(i) = self
                    .exact
                    .get(host)
                    .and_then(|t| t.find(method, path, input))
            {
                return Some(i);
            }
            if !self.wildcard.is_empty() {
                // "a.b.example.com" tries "b.example.com", "example.com", "com":
                // the longest (most specific) wildcard first, never the apex itself.
                let mut rest = host;
                while let Some(dot) = rest.find('.') {
                    rest = &rest[dot + 1..];
                    if let Some(i) = self
                        .wildcard
                        .get(rest)
                        .and_then(|t| t.find(method, path, input))
                    {
                        return Some(i);
                    }
                }
            }
        }
        self.any_host.find(method, path, input)
    }
}

/// Extracts the host name used for routing from a Host header or URI authority:
/// the port and a trailing dot are removed and the name is lower-cased (borrowed
/// when it already is). IPv6 literals keep their brackets.
pub fn host_of(authority: &str) -> std::borrow::Cow<'_, str> {
    // Byte scans: `str::rfind(char)` goes through the generic searcher, several
    // times the cost on a name this short, and this runs on every request.
    let bytes = authority.as_bytes();
    let end = if bytes.first() == Some(&b'[') {
        bytes
            .iter()
            .position(|&b| b == b']')
            .map_or(bytes.len(), |end| end + 1)
    } else {
        bytes
            .iter()
            .rposition(|&b| b == b':')
            .unwrap_or(bytes.len())
    };
    // Cut at an ASCII byte: a char boundary.
    let host = &authority[..end];
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

/// The part of `path` after a matched `prefix`, with the prefix replaced by
/// `rewrite`. `rewrite` follows the same rules as a prefix.
/// `/api/orders/7` with `/api/orders` → `/orders` gives `/orders/7`.
pub fn rewrite_path(path: &str, prefix: &str, rewrite: &str) -> String {
    // With prefix "/" the whole path is the remainder (it keeps its leading "/").
    let rest = if prefix == "/" {
        path
    } else {
        &path[prefix.len()..]
    };
    let mut out = String::with_capacity(rewrite.len() + rest.len());
    if rewrite == "/" {
        if rest.is_empty() {
            out.push('/');
        } else {
            out.push_str(rest);
        }
    } else {
        out.push_str(rewrite);
        out.push_str(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::{MatchMode, Matcher, RouteMatch};

    fn m(s: &str) -> Method {
        Method::from_bytes(s.as_bytes()).unwrap()
    }

    fn router(routes: &[(&str, &[&str], &str, &[&str])]) -> Router<String> {
        let mut r = Router::new();
        for (name, hosts, prefix, methods) in routes {
            let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            let methods: Vec<Method> = methods.iter().map(|x| m(x)).collect();
            r.insert(&hosts, prefix, &methods, name.to_string())
                .unwrap();
        }
        r
    }

    fn find<'a>(
        r: &'a Router<String>,
        host: Option<&str>,
        method: &str,
        path: &str,
    ) -> Option<&'a str> {
        r.find(host, &m(method), path).map(String::as_str)
    }

    #[test]
    fn prefix_matches_whole_segments_and_longest_wins() {
        let r = router(&[
            ("root", &[], "/", &[]),
            ("api", &[], "/api", &[]),
            ("orders", &[], "/api/orders", &[]),
        ]);
        assert_eq!(find(&r, None, "GET", "/api/orders"), Some("orders"));
        assert_eq!(find(&r, None, "GET", "/api/orders/"), Some("orders"));
        assert_eq!(find(&r, None, "GET", "/api/orders/7"), Some("orders"));
        assert_eq!(find(&r, None, "GET", "/api/orders/7/items"), Some("orders"));
        assert_eq!(find(&r, None, "GET", "/api/ordersx"), Some("api"));
        assert_eq!(find(&r, None, "GET", "/api/ordersx/1"), Some("api"));
        assert_eq!(find(&r, None, "GET", "/api"), Some("api"));
        assert_eq!(find(&r, None, "GET", "/apix"), Some("root"));
        assert_eq!(find(&r, None, "GET", "/"), Some("root"));
    }

    #[test]
    fn no_match_without_a_covering_prefix() {
        let r = router(&[("orders", &[], "/api/orders", &[])]);
        assert_eq!(find(&r, None, "GET", "/api/ordersx"), None);
        assert_eq!(find(&r, None, "GET", "/api"), None);
        assert_eq!(find(&r, None, "GET", "/"), None);
        assert_eq!(find(&r, None, "GET", "/other/api/orders"), None);
        let empty: Router<String> = Router::new();
        assert_eq!(find(&empty, None, "GET", "/"), None);
    }

    #[test]
    fn specific_method_beats_any_method_and_falls_back_to_shorter_prefix() {
        let r = router(&[
            ("auth", &[], "/auth", &[]),
            ("login", &[], "/auth/login", &["POST"]),
            ("items-get", &[], "/items", &["GET", "HEAD"]),
            ("items-any", &[], "/items", &[]),
        ]);
        assert_eq!(find(&r, None, "POST", "/auth/login"), Some("login"));
        assert_eq!(find(&r, None, "GET", "/auth/login"), Some("auth"));
        assert_eq!(find(&r, None, "GET", "/items/1"), Some("items-get"));
        assert_eq!(find(&r, None, "HEAD", "/items"), Some("items-get"));
        assert_eq!(find(&r, None, "DELETE", "/items/1"), Some("items-any"));
        let strict = router(&[("only-post", &[], "/x", &["POST"])]);
        assert_eq!(find(&strict, None, "GET", "/x"), None);
        assert_eq!(find(&strict, None, "PATCH", "/x/y"), None);
    }

    #[test]
    fn hosts_exact_wildcard_and_any() {
        let r = router(&[
            ("exact", &["api.example.com"], "/", &[]),
            ("wild", &["*.example.com"], "/", &[]),
            ("deeper-wild", &["*.eu.example.com"], "/", &[]),
            ("exact-orders", &["shop.test"], "/orders", &[]),
            ("fallback", &[], "/", &[]),
        ]);
        assert_eq!(
            find(&r, Some("api.example.com"), "GET", "/x"),
            Some("exact")
        );
        assert_eq!(find(&r, Some("www.example.com"), "GET", "/x"), Some("wild"));
        assert_eq!(find(&r, Some("a.b.example.com"), "GET", "/x"), Some("wild"));
        assert_eq!(
            find(&r, Some("x.eu.example.com"), "GET", "/"),
            Some("deeper-wild")
        );
        // The wildcard does not match its apex.
        assert_eq!(find(&r, Some("example.com"), "GET", "/"), Some("fallback"));
        assert_eq!(find(&r, Some("other.org"), "GET", "/"), Some("fallback"));
        assert_eq!(find(&r, None, "GET", "/"), Some("fallback"));
        // A host class without a matching prefix falls through to the next class.
        assert_eq!(
            find(&r, Some("shop.test"), "GET", "/orders/1"),
            Some("exact-orders")
        );
        assert_eq!(
            find(&r, Some("shop.test"), "GET", "/cart"),
            Some("fallback")
        );
        // Host-only routes do not answer other hosts.
        let only = router(&[("h", &["a.test"], "/", &[])]);
        assert_eq!(find(&only, Some("b.test"), "GET", "/"), None);
        assert_eq!(find(&only, None, "GET", "/"), None);
    }

    #[test]
    fn host_normalisation() {
        assert_eq!(host_of("Example.COM:8080"), "example.com");
        assert_eq!(host_of("example.com."), "example.com");
        assert_eq!(host_of("example.com"), "example.com");
        assert_eq!(host_of("[::1]:8080"), "[::1]");
        assert_eq!(host_of("127.0.0.1:80"), "127.0.0.1");
        assert!(matches!(
            host_of("lower.test"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn rewrite_replaces_the_matched_prefix() {
        assert_eq!(
            rewrite_path("/api/orders/7", "/api/orders", "/orders"),
            "/orders/7"
        );
        assert_eq!(
            rewrite_path("/api/orders", "/api/orders", "/orders"),
            "/orders"
        );
        assert_eq!(
            rewrite_path("/api/orders/", "/api/orders", "/orders"),
            "/orders/"
        );
        assert_eq!(rewrite_path("/api/x", "/api", "/"), "/x");
        assert_eq!(rewrite_path("/api", "/api", "/"), "/");
        assert_eq!(rewrite_path("/x/y", "/", "/v1"), "/v1/x/y");
        assert_eq!(rewrite_path("/", "/", "/v1"), "/v1/");
    }

    #[test]
    fn conflicts_are_refused() {
        let mut r: Router<u8> = Router::new();
        r.insert(&[], "/a", &[], 1).unwrap();
        assert!(matches!(
            r.insert(&[], "/a", &[], 2),
            Err(RouterError::Conflict { .. })
        ));
        r.insert(&[], "/a", &[m("GET")], 3).unwrap();
        assert!(r.insert(&[], "/a", &[m("GET")], 4).is_err());
        r.insert(&["h.test".into()], "/a", &[], 5).unwrap();
        assert!(matches!(
            r.insert(&[], "/a/", &[], 6),
            Err(RouterError::BadPrefix(_))
        ));
        assert!(matches!(
            r.insert(&[], "/b", &[m("GET"), m("GET")], 7),
            Err(RouterError::Duplicate(_))
        ));
        // Refused inserts left nothing behind.
        assert_eq!(r.len(), 3);
        assert_eq!(r.find(None, &m("GET"), "/b"), None);
        assert_eq!(r.find(None, &m("POST"), "/a"), Some(&1));
    }

    fn conditions(headers: &[(&str, &str, MatchMode)]) -> Option<Arc<RequestMatch>> {
        Some(Arc::new(RequestMatch::new(&RouteMatch {
            headers: headers
                .iter()
                .map(|(n, v, mode)| Matcher {
                    name: (*n).into(),
                    value: (*v).into(),
                    mode: *mode as i32,
                })
                .collect(),
            ..Default::default()
        })))
    }

    fn find_with<'a>(
        r: &'a Router<&'static str>,
        path: &str,
        h: &[(&str, &str)],
    ) -> Option<&'a str> {
        let mut headers = HeaderMap::new();
        for (k, v) in h {
            headers.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let input = MatchInput {
            headers: &headers,
            query: None,
        };
        r.find_matching(None, &Method::GET, path, &input).copied()
    }

    #[test]
    fn more_matchers_win_and_the_plain_route_takes_the_rest() {
        use MatchMode::{Absent, Exact};
        let mut r: Router<&'static str> = Router::new();
        r.insert(&[], "/orders", &[], "v1").unwrap();
        r.insert_matching(
            &[],
            "/orders",
            &[],
            conditions(&[("accept-version", "2", Exact)]),
            "v2",
        )
        .unwrap();
        r.insert_matching(
            &[],
            "/orders",
            &[],
            conditions(&[("accept-version", "2", Exact), ("x-tenant", "acme", Exact)]),
            "v2-acme",
        )
        .unwrap();
        r.insert_matching(
            &[],
            "/orders",
            &[],
            conditions(&[("accept-version", "3", Exact)]),
            "v3",
        )
        .unwrap();
        assert_eq!(find_with(&r, "/orders/1", &[]), Some("v1"));
        assert_eq!(
            find_with(&r, "/orders/1", &[("accept-version", "2")]),
            Some("v2")
        );
        assert_eq!(
            find_with(&r, "/orders/1", &[("accept-version", "3")]),
            Some("v3")
        );
        assert_eq!(
            find_with(
                &r,
                "/orders",
                &[("accept-version", "2"), ("x-tenant", "acme")]
            ),
            Some("v2-acme")
        );
        assert_eq!(
            find_with(&r, "/orders", &[("accept-version", "4")]),
            Some("v1")
        );
        // A tie that one request could satisfy is refused, and leaves nothing behind.
        let tie = r.insert_matching(
            &[],
            "/orders",
            &[],
            conditions(&[("x-beta", "", Absent)]),
            "t",
        );
        assert!(matches!(tie, Err(RouterError::Conflict { .. })));
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn a_slot_where_no_condition_holds_falls_through() {
        let mut r: Router<&'static str> = Router::new();
        r.insert(&[], "/", &[], "root").unwrap();
        r.insert_matching(
            &[],
            "/api",
            &[Method::GET],
            conditions(&[("x-beta", "1", MatchMode::Exact)]),
            "beta",
        )
        .unwrap();
        assert_eq!(find_with(&r, "/api/x", &[("x-beta", "1")]), Some("beta"));
        assert_eq!(find_with(&r, "/api/x", &[]), Some("root"));
    }

    #[test]
    fn lookup_cost_does_not_depend_on_table_size() {
        // Not a timing test: the number of map probes is bounded by path depth.
        let mut big: Router<usize> = Router::new();
        for i in 0..10_000 {
            big.insert(&[], &format!("/svc{i}/v1"), &[], i).unwrap();
        }
        assert_eq!(
            big.find(None, &Method::GET, "/svc9999/v1/items/1"),
            Some(&9999)
        );
        assert_eq!(big.find(None, &Method::GET, "/svc0/v1"), Some(&0));
        assert_eq!(big.find(None, &Method::GET, "/svc0/v2"), None);
    }
}
