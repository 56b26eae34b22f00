//! RFC 9111 as a shared cache applies it: the `Cache-Control` directives of
//! requests and answers, whether an answer may be stored, and how long it
//! stays fresh. Pure functions of header values and times, tested below.

use std::time::{Duration, SystemTime};

use http::StatusCode;

/// Statuses whose answers are stored: those RFC 9110 §15.1 calls
/// heuristically cacheable (an answer of another status is passed through).
pub const CACHEABLE_STATUSES: [u16; 11] = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];

/// Whether answers with `status` may be stored.
pub fn cacheable_status(status: StatusCode) -> bool {
    CACHEABLE_STATUSES.contains(&status.as_u16())
}

/// The `Cache-Control` directives the cache acts on (others are ignored).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Directives {
    /// `no-store`: never stored (request: neither served from nor stored in the cache).
    pub no_store: bool,
    /// `no-cache`: a request's asks for a fresh answer from the upstream; an
    /// answer's may be stored but must be revalidated before each use.
    pub no_cache: bool,
    /// `private`: an answer for one user, which a shared cache must not store.
    pub private: bool,
    /// `max-age=N`, in seconds.
    pub max_age: Option<u64>,
    /// `s-maxage=N`, in seconds (shared caches: wins over max-age).
    pub s_maxage: Option<u64>,
    /// `public`: an answer any cache may store, a credentialed request's included.
    pub public: bool,
    /// `must-revalidate`: stale answers must be revalidated (RFC 9111 §3.5: it
    /// also lets a shared cache store an answer to a credentialed request).
    pub must_revalidate: bool,
}

impl Directives {
    /// Whether an answer to a request that carried credentials may be stored
    /// by a shared cache (RFC 9111 §3.5).
    pub fn allows_shared_with_credentials(&self) -> bool {
        self.public || self.s_maxage.is_some() || self.must_revalidate
    }
}

impl Directives {
    /// The directives of every `Cache-Control` field value in `values`
    /// (comma-separated, names case-insensitive, arguments bare or quoted). A
    /// `max-age` or `s-maxage` whose argument is not a number counts as 0
    /// (RFC 9111 §4.2.1: an invalid freshness means stale).
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut d = Self::default();
        for value in values {
            let Ok(value) = std::str::from_utf8(value) else {
                continue;
            };
            for directive in value.split(',') {
                let (name, arg) = match directive.split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (directive.trim(), None),
                };
                let seconds = || arg.and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
                if name.eq_ignore_ascii_case("no-store") {
                    d.no_store = true;
                } else if name.eq_ignore_ascii_case("no-cache") {
                    d.no_cache = true;
                } else if name.eq_ignore_ascii_case("private") {
                    d.private = true;
                } else if name.eq_ignore_ascii_case("max-age") {
                    d.max_age = Some(seconds());
                } else if name.eq_ignore_ascii_case("s-maxage") {
                    d.s_maxage = Some(seconds());
                } else if name.eq_ignore_ascii_case("public") {
                    d.public = true;
                } else if name.eq_ignore_ascii_case("must-revalidate") {
                    d.must_revalidate = true;
                }
            }
        }
        d
    }

    /// A request's directives: whether it must skip stored answers (`no-cache`,
    /// `max-age=0`, or a bare `Pragma: no-cache` without `Cache-Control`).
    pub fn wants_upstream(&self) -> bool {
        self.no_cache || self.max_age == Some(0)
    }
}

/// How long an answer stays fresh in a shared cache (RFC 9111 §4.2.1):
/// `s-maxage`, else `max-age`, else `Expires` minus `Date` (or minus `now`
/// without a `Date`; an `Expires` that does not parse is in the past), else
/// `default` (the route's `ttl_seconds`). An answer with `no-cache` is stale
/// at once (stored only to be revalidated).
pub fn freshness_lifetime(
    d: &Directives,
    date: Option<&[u8]>,
    expires: Option<&[u8]>,
    now: SystemTime,
    default: Duration,
) -> Duration {
    if d.no_cache {
        return Duration::ZERO;
    }
    if let Some(s) = d.s_maxage.or(d.max_age) {
        return Duration::from_secs(s);
    }
    if let Some(expires) = expires {
        let Some(expires) = http_date(expires) else {
            return Duration::ZERO;
        };
        let base = date.and_then(http_date).unwrap_or(now);
        return expires.duration_since(base).unwrap_or(Duration::ZERO);
    }
    default
}

/// An HTTP-date (IMF-fixdate, or the two obsolete forms).
fn http_date(value: &[u8]) -> Option<SystemTime> {
    httpdate::parse_http_date(std::str::from_utf8(value).ok()?.trim()).ok()
}

/// The `Age` an answer arrived with, in seconds (a value that does not parse: 0).
///
/// The apparent age (now minus `Date`) is not added: upstream clocks that run
/// a second ahead or behind would age short-lived answers for nothing.
pub fn initial_age(age: Option<&[u8]>) -> Duration {
    let secs = age
        .and_then(|a| std::str::from_utf8(a).ok())
        .and_then(|a| a.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Duration::from_secs(secs)
}

/// Whether an `If-None-Match` field value matches the entity tag `etag`
/// (weak comparison, RFC 9110 §13.1.2: `W/` prefixes ignored; `*` matches any).
pub fn none_match(if_none_match: &[u8], etag: &[u8]) -> bool {
    let strip = |t: &[u8]| -> Vec<u8> {
        let t = t.trim_ascii();
        t.strip_prefix(b"W/").unwrap_or(t).to_vec()
    };
    let etag = strip(etag);
    if_none_match
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .any(|t| t == b"*" || strip(t) == etag)
}

/// Whether a `Vary` field value names `*` (the answer varies on more than
/// request fields: it is not stored).
pub fn varies_on_everything(vary: &[u8]) -> bool {
    vary.split(|&b| b == b',').any(|n| n.trim_ascii() == b"*")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Directives {
        Directives::parse([v.as_bytes()])
    }

    #[test]
    fn directives_are_parsed_case_insensitively_with_quoted_arguments() {
        let d = parse("Public, MAX-AGE=\"60\", s-maxage=120");
        assert_eq!(d.max_age, Some(60));
        assert_eq!(d.s_maxage, Some(120));
        assert!(!d.no_store && !d.private && !d.no_cache);
        let d = Directives::parse([b"no-store".as_slice(), b"private=\"set-cookie\"".as_slice()]);
        assert!(d.no_store && d.private);
        assert_eq!(parse("max-age=soon").max_age, Some(0), "invalid: stale");
        assert_eq!(parse("").max_age, None);
        assert!(parse("no-cache").wants_upstream());
        assert!(parse("max-age=0").wants_upstream());
        assert!(!parse("max-age=5").wants_upstream());
    }

    #[test]
    fn freshness_prefers_s_maxage_then_max_age_then_expires_then_the_ttl() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let ttl = Duration::from_secs(30);
        let date = httpdate::fmt_http_date(now);
        let in_90 = httpdate::fmt_http_date(now + Duration::from_secs(90));
        let fresh = |cc: &str, date: Option<&str>, expires: Option<&str>| {
            freshness_lifetime(
                &parse(cc),
                date.map(str::as_bytes),
                expires.map(str::as_bytes),
                now,
                ttl,
            )
            .as_secs()
        };
        assert_eq!(fresh("max-age=10, s-maxage=20", None, Some(&in_90)), 20);
        assert_eq!(fresh("max-age=10", None, Some(&in_90)), 10);
        assert_eq!(fresh("", Some(&date), Some(&in_90)), 90);
        assert_eq!(fresh("", None, Some(&in_90)), 90, "no Date: from now");
        assert_eq!(
            fresh("", Some(&in_90), Some(&date)),
            0,
            "Expires before Date"
        );
        assert_eq!(fresh("", None, Some("0")), 0, "invalid Expires: expired");
        assert_eq!(fresh("", None, None), 30, "nothing: the route's ttl");
        assert_eq!(fresh("public", None, None), 30);
        assert_eq!(fresh("no-cache, max-age=60", None, None), 0);
    }

    #[test]
    fn statuses_ages_validators_and_vary() {
        assert!(cacheable_status(StatusCode::OK));
        assert!(cacheable_status(StatusCode::NOT_FOUND));
        assert!(!cacheable_status(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!cacheable_status(StatusCode::PARTIAL_CONTENT));
        assert_eq!(initial_age(Some(b" 12")).as_secs(), 12);
        assert_eq!(initial_age(Some(b"x")).as_secs(), 0);
        assert_eq!(initial_age(None).as_secs(), 0);
        assert!(none_match(b"\"a\", \"b\"", b"\"b\""));
        assert!(none_match(b"W/\"b\"", b"\"b\""));
        assert!(none_match(b"*", b"\"b\""));
        assert!(!none_match(b"\"a\"", b"\"b\""));
        assert!(varies_on_everything(b"accept, *"));
        assert!(!varies_on_everything(b"accept-language"));
    }
}
