//! Validation rules of traffic management: `match`, `split` and instance weights.

use super::*;
use crate::v1::{Instance, MatchMode, Matcher, RouteMatch, SplitTarget};

fn upstream(name: &str) -> Upstream {
    Upstream {
        name: name.into(),
        instances: vec![Instance {
            id: "i-1".into(),
            url: "http://127.0.0.1:8082".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn route(name: &str) -> Route {
    Route {
        name: name.into(),
        path_prefix: "/orders".into(),
        upstream: "orders".into(),
        ..Default::default()
    }
}

fn header(name: &str, value: &str, mode: MatchMode) -> Matcher {
    Matcher {
        name: name.into(),
        value: value.into(),
        mode: mode as i32,
    }
}

fn with_headers(mut r: Route, headers: Vec<Matcher>) -> Route {
    r.r#match = Some(RouteMatch {
        headers,
        ..Default::default()
    });
    r
}

fn check(routes: &[Route]) -> Result<(), String> {
    valid(routes, &[upstream("orders"), upstream("orders-v2")]).map_err(|e| e.to_string())
}

#[track_caller]
fn fails_with(routes: &[Route], needle: &str) {
    match check(routes) {
        Ok(()) => panic!("expected an error containing {needle:?}, got Ok"),
        Err(e) => assert!(e.contains(needle), "{e:?} does not contain {needle:?}"),
    }
}

fn split(sides: &[(&str, u32)]) -> Route {
    let mut r = route("canary");
    r.upstream.clear();
    r.split = sides
        .iter()
        .map(|(u, w)| SplitTarget {
            upstream: (*u).into(),
            weight: *w,
        })
        .collect();
    r
}

#[test]
fn header_versioning_routes_share_a_prefix() {
    let v1 = route("v1");
    let mut v2 = with_headers(
        route("v2"),
        vec![header("Accept-Version", "2", MatchMode::Exact)],
    );
    v2.upstream = "orders-v2".into();
    let v3 = with_headers(
        route("v3"),
        vec![header("accept-version", "3", MatchMode::Exact)],
    );
    assert_eq!(check(&[v1.clone(), v2.clone(), v3]), Ok(()));
    // Two plain routes still collide.
    fails_with(
        &[v1.clone(), route("again")],
        "same hosts, path_prefix and methods",
    );
    // As many matchers, and one request could satisfy both: refused.
    let beta = with_headers(
        route("beta"),
        vec![header("x-beta", "", MatchMode::Present)],
    );
    fails_with(&[v1, v2, beta], "with as many matchers (1)");
}

/// Issue 41, item 13: match siblings must agree on the policies a client
/// could weaken by choosing a matched header, unless a route says otherwise.
#[test]
fn match_siblings_must_agree_on_auth_ip_rules_https_only_and_limits() {
    use crate::v1::{AuthMode, RateLimit, RateLimitAlgorithm, RateLimitKey};
    let strict = Route {
        auth: AuthMode::AuthJwt as i32,
        ..route("strict")
    };
    let beta = || with_headers(route("beta"), vec![header("x-beta", "1", MatchMode::Exact)]);
    let weaker: Vec<(Route, &str)> = vec![
        (beta(), "differs in auth"),
        (
            Route {
                auth: AuthMode::AuthJwt as i32,
                ip_allow: vec!["10.0.0.0/8".into()],
                ..beta()
            },
            "differs in ip_allow",
        ),
        (
            Route {
                auth: AuthMode::AuthJwt as i32,
                https_only: true,
                ..beta()
            },
            "differs in https_only",
        ),
        (
            Route {
                auth: AuthMode::AuthJwt as i32,
                rate_limit: Some(RateLimit {
                    policy: "p".into(),
                    algorithm: RateLimitAlgorithm::FixedWindow as i32,
                    key: RateLimitKey::KeyIp as i32,
                    limit: 5,
                    window_seconds: 60,
                    ..Default::default()
                }),
                ..beta()
            },
            "differs in rate limits",
        ),
    ];
    for (sibling, needle) in weaker {
        let got = check(&[strict.clone(), sibling.clone()]).unwrap_err();
        assert!(got.contains(needle), "{needle}: {got}");
        assert!(got.contains("policy_differs_from_siblings"), "{got}");
        // Said on purpose, on either route: accepted.
        let on_purpose = Route {
            policy_differs_from_siblings: true,
            ..sibling
        };
        assert_eq!(check(&[strict.clone(), on_purpose]), Ok(()));
    }
    // Agreeing siblings, and routes without any match, are not concerned.
    let agreeing = Route {
        auth: AuthMode::AuthJwt as i32,
        ..beta()
    };
    assert_eq!(check(&[strict.clone(), agreeing]), Ok(()));
    let other_prefix = Route {
        path_prefix: "/elsewhere".into(),
        ..beta()
    };
    assert_eq!(check(&[strict, other_prefix]), Ok(()));
}

#[test]
fn matcher_rules() {
    let cases = [
        (
            vec![header("connection", "x", MatchMode::Exact)],
            "hop-by-hop",
        ),
        (
            vec![header("x-user-id", "x", MatchMode::Exact)],
            "cannot be matched",
        ),
        (
            vec![header("bad name", "x", MatchMode::Exact)],
            "not a valid header name",
        ),
        (
            vec![header("x-a", "", MatchMode::Exact)],
            "value must be 1 to 1024",
        ),
        (
            vec![header("x-a", "1", MatchMode::Present)],
            "value must be empty with mode PRESENT",
        ),
        (
            vec![
                header("x-a", "1", MatchMode::Exact),
                header("X-A", "2", MatchMode::Exact),
            ],
            "is listed twice",
        ),
        (
            vec![Matcher {
                name: "x-a".into(),
                value: String::new(),
                mode: 9,
            }],
            "mode: unknown value 9",
        ),
    ];
    for (headers, needle) in cases {
        fails_with(&[with_headers(route("r"), headers)], needle);
    }
    let mut empty = route("r");
    empty.r#match = Some(RouteMatch::default());
    fails_with(&[empty], "match lists no matcher");
    let many = (0..17)
        .map(|i| header(&format!("x-{i}"), "1", MatchMode::Exact))
        .collect();
    fails_with(&[with_headers(route("r"), many)], "at most 16");
    let mut query = route("r");
    query.r#match = Some(RouteMatch {
        query: vec![header("a b", "1", MatchMode::Exact)],
        ..Default::default()
    });
    fails_with(&[query], "must be visible ASCII");
}

#[test]
fn split_rules() {
    assert_eq!(check(&[split(&[("orders", 95), ("orders-v2", 5)])]), Ok(()));
    assert_eq!(
        check(&[split(&[("orders", 0), ("orders-v2", 100)])]),
        Ok(())
    );
    fails_with(&[split(&[("orders", 0), ("orders-v2", 0)])], "add up to 0");
    fails_with(&[split(&[("orders", 1)])], "2 to 16 upstreams");
    fails_with(&[split(&[("orders", 1), ("orders", 2)])], "listed twice");
    fails_with(
        &[split(&[("orders", 1), ("nope", 2)])],
        "split[1]: upstream \"nope\" does not exist",
    );
    fails_with(
        &[split(&[("orders", 10_001), ("orders-v2", 1)])],
        "at most 10000",
    );
    let mut both = split(&[("orders", 1), ("orders-v2", 1)]);
    both.upstream = "orders".into();
    fails_with(&[both], "upstream must be empty when split is set");
    let mut header = split(&[("orders", 1), ("orders-v2", 1)]);
    header.split_hash_on = HashOn::Header as i32;
    fails_with(&[header.clone()], "split_hash_header is required");
    header.split_hash_header = "x-session".into();
    assert_eq!(check(&[header]), Ok(()));
    let mut stray = route("r");
    stray.split_fail_closed = true;
    fails_with(&[stray], "only used with split");
}

#[test]
fn instance_weights() {
    let mut u = upstream("orders");
    u.instances[0].weight = 1001;
    let e = valid(&[route("r")], &[u, upstream("orders-v2")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("weight must be at most 1000"), "{e}");
}
