//! Validation of a route's response cache (`Route.cache`).

use std::collections::HashSet;

use super::Validator;
use crate::v1::Route;

/// Largest `cache.ttl_seconds`: a year.
pub const MAX_CACHE_TTL_SECONDS: u32 = 31_536_000;
/// `cache.max_body_bytes` when left 0: 1 MiB.
pub const DEFAULT_CACHE_MAX_BODY_BYTES: u32 = 1 << 20;
/// Largest `cache.max_body_bytes`: 64 MiB.
pub const MAX_CACHE_MAX_BODY_BYTES: u32 = 64 << 20;
/// Most header names in `cache.vary`.
pub const MAX_CACHE_VARY: usize = 16;

impl Validator {
    /// The `cache` field of route `r` (`who` names it in messages).
    pub(super) fn cache(&mut self, who: &str, r: &Route) {
        let Some(c) = &r.cache else { return };
        if r.aggregate.is_some() {
            self.push(format!(
                "{who}: cache is not supported on an aggregate route"
            ));
        }
        if r.websocket {
            self.push(format!(
                "{who}: cache is not supported on a websocket route"
            ));
        }
        if c.ttl_seconds == 0 || c.ttl_seconds > MAX_CACHE_TTL_SECONDS {
            self.push(format!(
                "{who}: cache.ttl_seconds must be 1 to {MAX_CACHE_TTL_SECONDS} (got {})",
                c.ttl_seconds
            ));
        }
        if c.max_body_bytes > MAX_CACHE_MAX_BODY_BYTES {
            self.push(format!(
                "{who}: cache.max_body_bytes must be at most {MAX_CACHE_MAX_BODY_BYTES} (got {}; 0: {DEFAULT_CACHE_MAX_BODY_BYTES})",
                c.max_body_bytes
            ));
        }
        self.header_names(&format!("{who}: cache.vary"), &c.vary, MAX_CACHE_VARY);
    }

    /// A list of header names (`field` names it in messages, e.g.
    /// `route "x": cache.vary`): at most `max`, each a valid header name, no
    /// name twice (case-insensitive).
    pub(super) fn header_names(&mut self, field: &str, names: &[String], max: usize) {
        if names.len() > max {
            self.push(format!(
                "{field} lists at most {max} header names (got {})",
                names.len()
            ));
        }
        let mut seen = HashSet::new();
        for name in names {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                self.push(format!("{field}: {name:?} is not a valid header name"));
            } else if !seen.insert(name.to_ascii_lowercase()) {
                self.push(format!("{field}: duplicate header name {name:?}"));
            }
        }
    }
}

/// `cache.max_body_bytes` with its default applied.
pub fn cache_max_body_bytes(configured: u32) -> u32 {
    if configured == 0 {
        DEFAULT_CACHE_MAX_BODY_BYTES
    } else {
        configured
    }
}

#[cfg(test)]
mod tests {
    use super::super::valid;
    use crate::v1::{Aggregate, AggregatePart, Route, RouteCache, Upstream};

    fn orders(cache: RouteCache) -> (Vec<Route>, Vec<Upstream>) {
        let route = Route {
            name: "orders".into(),
            path_prefix: "/orders".into(),
            upstream: "orders".into(),
            cache: Some(cache),
            ..Default::default()
        };
        let upstream = Upstream {
            name: "orders".into(),
            instances: vec![crate::v1::Instance {
                id: "o1".into(),
                url: "http://127.0.0.1:9".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        (vec![route], vec![upstream])
    }

    fn refusal(cache: RouteCache) -> String {
        let (routes, upstreams) = orders(cache);
        valid(&routes, &upstreams).unwrap_err().to_string()
    }

    fn ttl(seconds: u32) -> RouteCache {
        RouteCache {
            ttl_seconds: seconds,
            ..Default::default()
        }
    }

    #[test]
    fn a_plain_cache_is_accepted() {
        let (routes, upstreams) = orders(RouteCache {
            ttl_seconds: 60,
            max_body_bytes: 4096,
            vary: vec!["Accept-Language".into(), "x-tenant".into()],
            shared: true,
            shared_with_credentials: true,
        });
        valid(&routes, &upstreams).unwrap();
    }

    #[test]
    fn ttl_must_be_set_and_at_most_a_year() {
        assert!(refusal(ttl(0)).contains("route \"orders\": cache.ttl_seconds must be 1 to"));
        assert!(refusal(ttl(super::MAX_CACHE_TTL_SECONDS + 1)).contains("cache.ttl_seconds"));
    }

    #[test]
    fn body_cap_is_bounded() {
        let e = refusal(RouteCache {
            max_body_bytes: super::MAX_CACHE_MAX_BODY_BYTES + 1,
            ..ttl(5)
        });
        assert!(e.contains("cache.max_body_bytes must be at most"), "{e}");
        assert_eq!(super::cache_max_body_bytes(0), 1 << 20);
        assert_eq!(super::cache_max_body_bytes(7), 7);
    }

    #[test]
    fn vary_names_are_valid_unique_and_few() {
        let e = refusal(RouteCache {
            vary: vec!["bad name".into()],
            ..ttl(5)
        });
        assert!(e.contains("\"bad name\" is not a valid header name"), "{e}");
        let e = refusal(RouteCache {
            vary: vec!["Accept".into(), "accept".into()],
            ..ttl(5)
        });
        assert!(e.contains("duplicate header name \"accept\""), "{e}");
        let e = refusal(RouteCache {
            vary: (0..17).map(|i| format!("x-h{i}")).collect(),
            ..ttl(5)
        });
        assert!(e.contains("at most 16 header names"), "{e}");
    }

    #[test]
    fn not_on_aggregate_or_websocket_routes() {
        let (mut routes, upstreams) = orders(ttl(5));
        routes[0].websocket = true;
        let e = valid(&routes, &upstreams).unwrap_err().to_string();
        assert!(
            e.contains("cache is not supported on a websocket route"),
            "{e}"
        );
        routes[0].websocket = false;
        routes[0].upstream.clear();
        routes[0].aggregate = Some(Aggregate {
            parts: vec![AggregatePart {
                name: "a".into(),
                upstream: "orders".into(),
                path: "/a".into(),
                ..Default::default()
            }],
        });
        let e = valid(&routes, &upstreams).unwrap_err().to_string();
        assert!(
            e.contains("cache is not supported on an aggregate route"),
            "{e}"
        );
    }
}
