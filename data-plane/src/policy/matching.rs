//! A route's `match`: conditions on the request's headers, query parameters
//! and cookies (docs/data-plane.md, "Route"), compiled once per snapshot and
//! checked by the router at the slot (host, prefix, method) a request reaches.
//!
//! Each name has one value to compare, so that conditions which exclude each
//! other really do (validation relies on it, `gateway_proto::validate::can_both_match`):
//! a header sent several times is compared on its values joined with ",";
//! a repeated query parameter or cookie on its first occurrence. Query names
//! and values are percent-decoded (`+` is a space) before comparing; cookies
//! are compared as sent. Nothing is allocated unless a query parameter is
//! escaped or a matched header is repeated.
//!
//! Header conditions read the request's fields in one pass when there are
//! few of them for the matchers ([`SCAN_FIELDS_PER_MATCHER`]): a field's name
//! is compared only with the matchers' names of its length, and by its length
//! and first and last 8 bytes (`memcmp` only past 16 bytes). A `HeaderMap`
//! lookup per matcher hashes the name byte by byte and probes the map, about
//! 260 instructions under callgrind (BENCHMARKS.md, twenty-second session);
//! the pass costs a few dozen per field.

use std::borrow::Cow;

use gateway_hex::nibble as hex_value;
use gateway_proto::v1::{MatchMode, Matcher, RouteMatch};
use http::HeaderMap;
use http::header::{COOKIE, HeaderName};

/// What the conditions look at: the request's headers and raw query.
#[derive(Debug, Clone, Copy)]
pub struct MatchInput<'r> {
    /// Request headers (after sanitising: hop-by-hop and identity headers gone).
    pub headers: &'r HeaderMap,
    /// The query string, without `?`.
    pub query: Option<&'r str>,
}

/// A route's compiled conditions, all of which must hold.
#[derive(Debug, Clone)]
pub struct RequestMatch {
    headers: Box<[(HeaderName, Test)]>,
    /// The header matchers' names in the form the pass compares, in order.
    header_keys: Box<[NameKey]>,
    /// The header matchers are sorted by the length of their name; those whose
    /// name is `n` bytes long are `headers[by_length[n]..by_length[n + 1]]`
    /// (`n` of [`LONG_NAME`] or more: the last bucket).
    by_length: [u16; LONG_NAME + 2],
    query: Box<[(Box<str>, Test)]>,
    cookies: Box<[(Box<str>, Test)]>,
    /// The configuration's form, for the router's conflict check.
    proto: RouteMatch,
}

/// One comparison.
#[derive(Debug, Clone)]
enum Test {
    Exact(Box<str>),
    Prefix(Box<str>),
    Present,
    Absent,
}

impl Test {
    fn new(m: &Matcher) -> Self {
        match MatchMode::try_from(m.mode) {
            Ok(MatchMode::Prefix) => Test::Prefix(m.value.as_str().into()),
            Ok(MatchMode::Present) => Test::Present,
            Ok(MatchMode::Absent) => Test::Absent,
            // Validation refuses unknown modes.
            Ok(MatchMode::Exact) | Err(_) => Test::Exact(m.value.as_str().into()),
        }
    }

    /// Whether the name's value (`None`: the name is absent) passes.
    fn passes(&self, value: Option<&[u8]>) -> bool {
        match (self, value) {
            (Test::Absent, v) => v.is_none(),
            (_, None) => false,
            (Test::Present, Some(_)) => true,
            (Test::Exact(want), Some(v)) => v == want.as_bytes(),
            (Test::Prefix(want), Some(v)) => v.starts_with(want.as_bytes()),
        }
    }
}

impl RequestMatch {
    /// Compiles a validated `match`.
    pub fn new(m: &RouteMatch) -> Self {
        let mut headers: Vec<(HeaderName, Test)> = m
            .headers
            .iter()
            .filter_map(|h| {
                // Validation refuses names that are not header names.
                let name = HeaderName::from_bytes(h.name.to_ascii_lowercase().as_bytes());
                name.ok().map(|n| (n, Test::new(h)))
            })
            .collect();
        // Sorted by name length (stable): the order of conditions does not change
        // whether all hold.
        headers.sort_by_key(|(name, _)| bucket(name.as_str().len()));
        let mut by_length = [0u16; LONG_NAME + 2];
        // Counts, then where each length's matchers start (validation allows
        // 16 matchers; more are never scanned, `headers_hold`).
        for (name, _) in &headers {
            let count = &mut by_length[bucket(name.as_str().len()) + 1];
            *count = count.saturating_add(1);
        }
        for n in 1..by_length.len() {
            by_length[n] = by_length[n].saturating_add(by_length[n - 1]);
        }
        let header_keys = headers
            .iter()
            .map(|(name, _)| NameKey::of(name.as_str().as_bytes()))
            .collect();
        Self {
            headers: headers.into_boxed_slice(),
            header_keys,
            by_length,
            query: m
                .query
                .iter()
                .map(|q| (q.name.as_str().into(), Test::new(q)))
                .collect(),
            cookies: m
                .cookies
                .iter()
                .map(|c| (c.name.as_str().into(), Test::new(c)))
                .collect(),
            proto: m.clone(),
        }
    }

    /// Number of conditions: among routes at one slot, more wins.
    pub fn len(&self) -> usize {
        self.headers.len() + self.query.len() + self.cookies.len()
    }

    /// True when there is no condition (validation refuses an empty `match`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configuration's form.
    pub fn proto(&self) -> &RouteMatch {
        &self.proto
    }

    /// Whether every condition holds for the request.
    pub fn holds(&self, input: &MatchInput<'_>) -> bool {
        self.headers_hold(input.headers)
            && self.query.iter().all(|(name, test)| {
                match input.query.and_then(|q| query_value(q, name)) {
                    Some(v) => test.passes(Some(v.as_bytes())),
                    None => test.passes(None),
                }
            })
            && self
                .cookies
                .iter()
                .all(|(name, test)| test.passes(cookie_value(input.headers, name)))
    }
}

/// A pass over the request's fields is used while they number at most this
/// many per header matcher; with more, a lookup per matcher costs less.
pub const SCAN_FIELDS_PER_MATCHER: usize = 8;

/// Names this long or longer share one bucket of [`RequestMatch::by_length`].
const LONG_NAME: usize = 64;

/// The bucket of a name `len` bytes long in [`RequestMatch::by_length`].
fn bucket(len: usize) -> usize {
    len.min(LONG_NAME)
}

/// A header name's length and its first and last 8 bytes: equal keys are
/// equal names up to 16 bytes long, so most names are compared without
/// `memcmp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NameKey {
    len: usize,
    head: u64,
    tail: u64,
}

impl NameKey {
    fn of(name: &[u8]) -> Self {
        let len = name.len();
        let (head, tail) = match (name.first_chunk::<8>(), name.last_chunk::<8>()) {
            (Some(head), Some(tail)) => (u64::from_le_bytes(*head), u64::from_le_bytes(*tail)),
            _ => {
                let head = name
                    .iter()
                    .rev()
                    .fold(0u64, |word, &b| word << 8 | u64::from(b));
                (head, 0)
            }
        };
        Self { len, head, tail }
    }

    /// Whether `name`, whose key this is, is the name keyed by `want`.
    fn names(self, want: NameKey, name: &[u8], wanted: &HeaderName) -> bool {
        self == want && (self.len <= 16 || name == wanted.as_str().as_bytes())
    }
}

impl RequestMatch {
    /// Whether every header condition holds.
    fn headers_hold(&self, headers: &HeaderMap) -> bool {
        let wanted = &self.headers;
        if wanted.len() < 2
            || wanted.len() > MAX_SCANNED
            || headers.len() > SCAN_FIELDS_PER_MATCHER * wanted.len()
        {
            return wanted
                .iter()
                .all(|(name, test)| header_passes(headers, name, test));
        }
        // Each matcher's first value, and which names came more than once.
        let mut found: [Option<&[u8]>; MAX_SCANNED] = [None; MAX_SCANNED];
        let mut repeated = 0u16;
        // Without a repeated name in the request, the pass ends once every
        // matcher's name is found: the client's fields come first, the
        // gateway's (`X-Request-Id`, `X-Forwarded-*`) after them.
        let mut missing = if headers.len() == headers.keys_len() {
            wanted.len()
        } else {
            usize::MAX
        };
        for (name, value) in headers {
            let name = name.as_str().as_bytes();
            let b = bucket(name.len());
            let (from, to) = (self.by_length[b] as usize, self.by_length[b + 1] as usize);
            if from == to {
                continue;
            }
            let key = NameKey::of(name);
            for i in from..to {
                if key.names(self.header_keys[i], name, &wanted[i].0) {
                    match &mut found[i] {
                        Some(_) => repeated |= 1 << i,
                        slot => {
                            *slot = Some(value.as_bytes());
                            missing = missing.wrapping_sub(1);
                        }
                    }
                }
            }
            if missing == 0 {
                break;
            }
        }
        wanted
            .iter()
            .zip(&found)
            .enumerate()
            .all(|(i, ((name, test), value))| {
                if repeated & (1 << i) != 0 {
                    // Joined with ",": the lookup does it.
                    header_passes(headers, name, test)
                } else {
                    test.passes(*value)
                }
            })
    }
}

/// Most header matchers the pass handles: as many as validation allows in all.
const MAX_SCANNED: usize = gateway_proto::validate::MAX_MATCHERS;
// `repeated` is a bit per scanned matcher.
const _: () = assert!(MAX_SCANNED <= u16::BITS as usize);

fn header_passes(headers: &HeaderMap, name: &HeaderName, test: &Test) -> bool {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return test.passes(None);
    };
    let Some(second) = values.next() else {
        return test.passes(Some(first.as_bytes()));
    };
    // Repeated: compared on the values joined with "," (RFC 9110, 5.3).
    let mut joined = Vec::with_capacity(first.len() + second.len() + 1);
    joined.extend_from_slice(first.as_bytes());
    for v in std::iter::once(second).chain(values) {
        joined.push(b',');
        joined.extend_from_slice(v.as_bytes());
    }
    test.passes(Some(&joined))
}

/// The first value of query parameter `name`, percent-decoded; a parameter
/// without `=` has the empty value.
fn query_value<'q>(query: &'q str, name: &str) -> Option<Cow<'q, str>> {
    query.split('&').find_map(|pair| {
        if pair.is_empty() {
            return None;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k) == name).then(|| decode(v))
    })
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a
/// byte; a malformed escape is kept as it is; bytes that are not UTF-8 are
/// replaced (and then match nothing a matcher's ASCII value asks for). Also
/// what an aggregation part compares query parameter names by.
pub(crate) fn decode(s: &str) -> Cow<'_, str> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(s);
    }
    let raw = s.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                match (
                    raw.get(i + 1).copied().and_then(hex_value),
                    raw.get(i + 2).copied().and_then(hex_value),
                ) {
                    (Some(h), Some(l)) => {
                        out.push(h << 4 | l);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// The first value of cookie `name` among every `Cookie` header's
/// `name=value` pairs (separated by `;`, spaces around them ignored).
fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers.get_all(COOKIE).iter().find_map(|h| {
        h.as_bytes().split(|&b| b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(name: &str, value: &str, mode: MatchMode) -> Matcher {
        Matcher {
            name: name.into(),
            value: value.into(),
            mode: mode as i32,
        }
    }

    fn input<'r>(headers: &'r HeaderMap, query: Option<&'r str>) -> MatchInput<'r> {
        MatchInput { headers, query }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn header_modes() {
        let m = RequestMatch::new(&RouteMatch {
            headers: vec![
                matcher("Accept-Version", "2", MatchMode::Exact),
                matcher("x-tenant", "acme-", MatchMode::Prefix),
                matcher("x-debug", "", MatchMode::Absent),
            ],
            ..Default::default()
        });
        assert_eq!(m.len(), 3);
        let ok = headers(&[("accept-version", "2"), ("x-tenant", "acme-eu")]);
        assert!(m.holds(&input(&ok, None)));
        let debug = headers(&[
            ("accept-version", "2"),
            ("x-tenant", "acme-eu"),
            ("x-debug", "1"),
        ]);
        assert!(!m.holds(&input(&debug, None)));
        let other = headers(&[("accept-version", "3"), ("x-tenant", "acme-eu")]);
        assert!(!m.holds(&input(&other, None)));
        let missing = headers(&[("x-tenant", "acme-eu")]);
        assert!(!m.holds(&input(&missing, None)));
    }

    #[test]
    fn a_repeated_header_is_compared_joined() {
        let m = RequestMatch::new(&RouteMatch {
            headers: vec![matcher("accept-version", "2", MatchMode::Exact)],
            ..Default::default()
        });
        let twice = headers(&[("accept-version", "2"), ("accept-version", "3")]);
        assert!(!m.holds(&input(&twice, None)));
        let joined = RequestMatch::new(&RouteMatch {
            headers: vec![matcher("accept-version", "2,3", MatchMode::Exact)],
            ..Default::default()
        });
        assert!(joined.holds(&input(&twice, None)));
        // The same beside another matcher.
        let two = RequestMatch::new(&RouteMatch {
            headers: vec![
                matcher("accept-version", "2,3", MatchMode::Exact),
                matcher("x-tenant", "acme", MatchMode::Exact),
            ],
            ..Default::default()
        });
        let mut with_tenant = twice.clone();
        with_tenant.insert("x-tenant", "acme".parse().unwrap());
        assert!(two.holds(&input(&with_tenant, None)));
        with_tenant.append("x-tenant", "other".parse().unwrap());
        assert!(!two.holds(&input(&with_tenant, None)));
    }

    #[test]
    fn the_pass_and_the_lookups_agree() {
        let long = "x-".to_string() + &"l".repeat(70);
        let m = RequestMatch::new(&RouteMatch {
            headers: vec![
                matcher("Accept-Version", "2", MatchMode::Exact),
                matcher("x-tenant", "acme", MatchMode::Prefix),
                matcher("x-region", "", MatchMode::Absent),
                matcher(&long, "", MatchMode::Present),
            ],
            ..Default::default()
        });
        let few = headers(&[
            ("host", "gw"),
            ("accept-version", "2"),
            ("x-tenant", "acme-eu"),
            (&long, "1"),
        ]);
        let mut many = few.clone();
        // More fields than the pass takes for 4 matchers: each is looked up.
        for i in 0..(SCAN_FIELDS_PER_MATCHER * 4) {
            many.insert(
                HeaderName::from_bytes(format!("x-filler-{i}").as_bytes()).unwrap(),
                "v".parse().unwrap(),
            );
        }
        for h in [&few, &many] {
            assert!(m.holds(&input(h, None)));
            let mut region = h.clone();
            region.insert("x-region", "eu".parse().unwrap());
            assert!(!m.holds(&input(&region, None)));
            let mut no_long = h.clone();
            no_long.remove(long.as_str());
            assert!(!m.holds(&input(&no_long, None)));
            // Another name of the same length as a matcher's is not it.
            let mut other = h.clone();
            other.remove("x-tenant");
            other.insert("y-tenant", "acme".parse().unwrap());
            assert!(!m.holds(&input(&other, None)));
            // A repeated matched name is compared joined, in both ways.
            let mut twice = h.clone();
            twice.append("accept-version", "3".parse().unwrap());
            assert!(!m.holds(&input(&twice, None)));
        }
    }

    #[test]
    fn the_pass_ends_early_only_without_repeated_names() {
        let m = RequestMatch::new(&RouteMatch {
            headers: vec![
                matcher("x-tenant", "acme", MatchMode::Exact),
                matcher("x-plan", "gold", MatchMode::Exact),
            ],
            ..Default::default()
        });
        let mut h = headers(&[
            ("x-tenant", "acme"),
            ("x-plan", "gold"),
            ("x-request-id", "1"),
            ("x-forwarded-for", "10.0.0.1"),
        ]);
        assert!(m.holds(&input(&h, None)));
        // A second x-plan after the others: compared joined ("gold,silver").
        h.append("x-plan", "silver".parse().unwrap());
        assert!(!m.holds(&input(&h, None)));
        // A repeated name elsewhere does not change the answer.
        let mut other = headers(&[("x-tenant", "acme"), ("x-plan", "gold")]);
        other.append("accept", "a".parse().unwrap());
        other.append("accept", "b".parse().unwrap());
        assert!(m.holds(&input(&other, None)));
    }

    #[test]
    fn name_keys_tell_names_apart() {
        let names = [
            "a",
            "b",
            "ab",
            "ba",
            "x-plan",
            "x-tenant",
            "x-region",
            "accept-version",
            "x-sixteen-bytes!",
            "x-sixteen-bytes#",
            "x-seventeen-bytes",
            "x-seventeen-bytez",
            "x-seventeen-cytes",
            "x-seventaen-bytes",
            "y-seventeen-bytes",
        ];
        for a in names {
            for b in names {
                let wanted = HeaderName::from_bytes(b.as_bytes()).unwrap();
                let same = NameKey::of(a.as_bytes()).names(
                    NameKey::of(b.as_bytes()),
                    a.as_bytes(),
                    &wanted,
                );
                assert_eq!(same, a == b, "{a} against {b}");
            }
        }
        // Longer than 16 bytes, the same first and last 8: only memcmp tells.
        assert_eq!(
            NameKey::of(b"x-seventeen-bytes"),
            NameKey::of(b"x-seventaen-bytes")
        );
    }

    #[test]
    fn query_parameters_are_decoded_and_the_first_counts() {
        let m = RequestMatch::new(&RouteMatch {
            query: vec![
                matcher("tenant id", "a b/c", MatchMode::Exact),
                matcher("beta", "", MatchMode::Present),
            ],
            ..Default::default()
        });
        let h = HeaderMap::new();
        assert!(m.holds(&input(&h, Some("x=1&tenant+id=a%20b%2Fc&beta"))));
        assert!(!m.holds(&input(&h, Some("tenant+id=a%20b%2Fc"))));
        assert!(!m.holds(&input(&h, Some("tenant+id=other&tenant+id=a+b/c&beta="))));
        assert!(!m.holds(&input(&h, None)));
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz%4"), "%zz%4");
        assert_eq!(decode("%41%42"), "AB");
    }

    #[test]
    fn cookies_from_every_cookie_header() {
        let m = RequestMatch::new(&RouteMatch {
            cookies: vec![
                matcher("canary", "always", MatchMode::Exact),
                matcher("session", "", MatchMode::Present),
            ],
            ..Default::default()
        });
        let h = headers(&[("cookie", "a=1; canary=always"), ("cookie", "session=xyz")]);
        assert!(m.holds(&input(&h, None)));
        let h = headers(&[("cookie", "canary=never; canary=always; session=1")]);
        assert!(!m.holds(&input(&h, None)));
        let h = headers(&[("cookie", "xcanary=always; session=1")]);
        assert!(!m.holds(&input(&h, None)));
    }
}
