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
//! Methods match exactly (a route listing `GET` does not answer `HEAD`).

use std::collections::HashMap;

use http::Method;

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

#[derive(Debug, Default)]
struct MethodSet {
    /// Routes listing specific methods: (method, route index). Short: linear scan.
    by_method: Vec<(Method, usize)>,
    /// The any-method route, if one.
    any: Option<usize>,
}

impl MethodSet {
    fn find(&self, method: &Method) -> Option<usize> {
        self.by_method
            .iter()
            .find(|(m, _)| m == method)
            .map(|&(_, i)| i)
            .or(self.any)
    }
}

#[derive(Debug, Default)]
struct PrefixTable {
    prefixes: FastMap<Box<str>, MethodSet>,
    /// Longest prefix in the table: longer candidates are skipped without hashing.
    max_len: usize,
}

impl PrefixTable {
    /// The method (or `any`) that another route already takes at `prefix`.
    fn conflict(&self, prefix: &str, methods: &[Method]) -> Option<String> {
        let set = self.prefixes.get(prefix)?;
        if methods.is_empty() {
            return set.any.is_some().then(|| "any".to_string());
        }
        methods
            .iter()
            .find(|m| set.by_method.iter().any(|(have, _)| have == *m))
            .map(Method::to_string)
    }

    fn insert(&mut self, prefix: &str, methods: &[Method], index: usize) {
        let set = self.prefixes.entry(prefix.into()).or_default();
        self.max_len = self.max_len.max(prefix.len());
        if methods.is_empty() {
            set.any = Some(index);
        }
        for m in methods {
            set.by_method.push((m.clone(), index));
        }
    }

    /// Longest prefix of `path` (on a segment boundary) with a route for `method`.
    fn find(&self, method: &Method, path: &str) -> Option<usize> {
        if self.prefixes.is_empty() {
            return None;
        }
        let mut end = path.len();
        loop {
            let candidate = if end == 0 { "/" } else { &path[..end] };
            if candidate.len() <= self.max_len
                && let Some(i) = self.prefixes.get(candidate).and_then(|s| s.find(method))
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

    /// Adds a route. `hosts` are lower-case names or `*.suffix` (empty: any host);
    /// `prefix` starts with `/` and has no trailing `/` (except `/` itself);
    /// `methods` empty means any method.
    pub fn insert(
        &mut self,
        hosts: &[String],
        prefix: &str,
        methods: &[Method],
        value: T,
    ) -> Result<(), RouterError> {
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
            && let Some(m) = self.any_host.conflict(prefix, methods)
        {
            return Err(conflict("*", m));
        }
        for host in hosts {
            let table = match host.strip_prefix("*.") {
                Some(suffix) => self.wildcard.get(suffix),
                None => self.exact.get(host.as_str()),
            };
            if let Some(m) = table.and_then(|t| t.conflict(prefix, methods)) {
                return Err(conflict(host, m));
            }
        }
        let index = self.routes.len();
        if hosts.is_empty() {
            self.any_host.insert(prefix, methods, index);
        }
        for host in hosts {
            let table = match host.strip_prefix("*.") {
                Some(suffix) => self.wildcard.entry(suffix.into()).or_default(),
                None => self.exact.entry(host.as_str().into()).or_default(),
            };
            table.insert(prefix, methods, index);
        }
        self.routes.push(value);
        Ok(())
    }

    /// Finds the route for a request. `host` is the Host header without port,
    /// lower-case (see [`host_of`]); `path` is the normalised path.
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> Option<&T> {
        self.find_index(host, method, path).map(|i| &self.routes[i])
    }

    fn find_index(&self, host: Option<&str>, method: &Method, path: &str) -> Option<usize> {
        if let Some(host) = host {
            if !self.exact.is_empty()
                && let Some(i) = self.exact.get(host).and_then(|t| t.find(method, path))
            {
                return Some(i);
            }
            if !self.wildcard.is_empty() {
                // "a.b.example.com" tries "b.example.com", "example.com", "com":
                // the longest (most specific) wildcard first, never the apex itself.
                let mut rest = host;
                while let Some(dot) = rest.find('.') {
                    rest = &rest[dot + 1..];
                    if let Some(i) = self.wildcard.get(rest).and_then(|t| t.find(method, path)) {
                        return Some(i);
                    }
                }
            }
        }
        self.any_host.find(method, path)
    }
}

/// Extracts the host name used for routing from a Host header or URI authority:
/// the port and a trailing dot are removed and the name is lower-cased (borrowed
/// when it already is). IPv6 literals keep their brackets.
pub fn host_of(authority: &str) -> std::borrow::Cow<'_, str> {
    let host = if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        }
    } else {
        match authority.rfind(':') {
            Some(colon) => &authority[..colon],
            None => authority,
        }
    };
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
