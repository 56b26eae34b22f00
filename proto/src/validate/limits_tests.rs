//! Validation rules of stacked rate limits, the new keys and the sliding window.

use super::*;
use crate::v1::{AuthMode, Instance, RateLimitAlgorithm, RateLimitKey};

fn upstream() -> Upstream {
    Upstream {
        name: "users".into(),
        instances: vec![Instance {
            id: "i-1".into(),
            url: "http://127.0.0.1:8081".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn route(name: &str) -> Route {
    Route {
        name: name.into(),
        path_prefix: format!("/{name}"),
        upstream: "users".into(),
        ..Default::default()
    }
}

fn limit(policy: &str, key: RateLimitKey) -> RateLimit {
    RateLimit {
        policy: policy.into(),
        algorithm: RateLimitAlgorithm::SlidingWindow as i32,
        key: key as i32,
        limit: 10,
        window_seconds: 60,
        key_header: if key == RateLimitKey::KeyHeader {
            "X-Client".into()
        } else {
            String::new()
        },
    }
}

fn check(routes: &[Route]) -> Result<(), String> {
    valid(routes, &[upstream()]).map_err(|e| e.to_string())
}

#[track_caller]
fn fails_with(routes: &[Route], needle: &str) {
    match check(routes) {
        Ok(()) => panic!("expected an error containing {needle:?}, got Ok"),
        Err(e) => assert!(e.contains(needle), "{e:?} does not contain {needle:?}"),
    }
}

#[test]
fn stacked_limits_with_every_key_kind_are_accepted() {
    let r = Route {
        rate_limit: Some(limit("per-ip", RateLimitKey::KeyIp)),
        rate_limits: vec![
            limit("whole-route", RateLimitKey::KeyRoute),
            limit("per-client", RateLimitKey::KeyHeader),
        ],
        ..route("a")
    };
    assert_eq!(check(&[r]), Ok(()));
    // rate_limits alone, without rate_limit, works too.
    let r = Route {
        rate_limits: vec![limit("whole-route", RateLimitKey::KeyRoute)],
        ..route("b")
    };
    assert_eq!(check(&[r]), Ok(()));
}

#[test]
fn at_most_eight_limits_per_route() {
    let many = |n: usize| Route {
        rate_limit: Some(limit("first", RateLimitKey::KeyIp)),
        rate_limits: (0..n)
            .map(|i| limit(&format!("p{i}"), RateLimitKey::KeyRoute))
            .collect(),
        ..route("a")
    };
    assert_eq!(check(&[many(7)]), Ok(()));
    fails_with(
        &[many(8)],
        "route \"a\": rate_limits: at most 8 rate limits per route, rate_limit included (got 9)",
    );
}

#[test]
fn policy_names_are_distinct_within_a_route() {
    let r = Route {
        rate_limit: Some(limit("api", RateLimitKey::KeyIp)),
        rate_limits: vec![limit("api", RateLimitKey::KeyRoute)],
        ..route("a")
    };
    fails_with(
        &[r],
        "route \"a\": rate_limits[0].policy \"api\" is used twice on this route",
    );
}

#[test]
fn each_stacked_limit_follows_the_single_limit_rules() {
    let bad = |rl: RateLimit| Route {
        rate_limits: vec![limit("ok", RateLimitKey::KeyIp), rl],
        ..route("a")
    };
    fails_with(
        &[bad(RateLimit {
            limit: 0,
            ..limit("x", RateLimitKey::KeyIp)
        })],
        "rate_limits[1].limit must be greater than 0",
    );
    fails_with(
        &[bad(RateLimit {
            window_seconds: 86_401,
            ..limit("x", RateLimitKey::KeyIp)
        })],
        "rate_limits[1].window_seconds must be 1 to 86400",
    );
    fails_with(
        &[bad(limit("Bad", RateLimitKey::KeyIp))],
        "rate_limits[1].policy must match",
    );
    fails_with(
        &[bad(RateLimit {
            algorithm: 3,
            ..limit("x", RateLimitKey::KeyIp)
        })],
        "rate_limits[1].algorithm: unknown value 3",
    );
    fails_with(
        &[bad(RateLimit {
            key: 5,
            ..limit("x", RateLimitKey::KeyIp)
        })],
        "rate_limits[1].key: unknown value 5",
    );
}

#[test]
fn identity_keys_need_the_matching_authentication() {
    let with = |auth: AuthMode, key: RateLimitKey| Route {
        auth: auth as i32,
        rate_limits: vec![limit("p", key)],
        ..route("a")
    };
    fails_with(
        &[with(AuthMode::AuthNone, RateLimitKey::KeyApiKey)],
        "rate_limits[0].key KEY_API_KEY needs auth AUTH_API_KEY",
    );
    fails_with(
        &[with(AuthMode::AuthJwt, RateLimitKey::KeyApiKey)],
        "KEY_API_KEY needs auth AUTH_API_KEY",
    );
    assert_eq!(
        check(&[with(AuthMode::AuthApiKey, RateLimitKey::KeyApiKey)]),
        Ok(())
    );
    // An API key sets a subject too: per-user budgets work with either.
    fails_with(
        &[with(AuthMode::AuthNone, RateLimitKey::KeyUser)],
        "KEY_USER needs auth AUTH_JWT, AUTH_API_KEY or AUTH_MTLS",
    );
    assert_eq!(
        check(&[with(AuthMode::AuthJwt, RateLimitKey::KeyUser)]),
        Ok(())
    );
    assert_eq!(
        check(&[with(AuthMode::AuthApiKey, RateLimitKey::KeyUser)]),
        Ok(())
    );
    assert_eq!(
        check(&[with(AuthMode::AuthMtls, RateLimitKey::KeyUser)]),
        Ok(())
    );
}

#[test]
fn key_header_is_required_valid_and_only_with_key_header() {
    let with = |key: RateLimitKey, header: &str| Route {
        rate_limits: vec![RateLimit {
            key_header: header.into(),
            ..limit("p", key)
        }],
        ..route("a")
    };
    fails_with(
        &[with(RateLimitKey::KeyHeader, "")],
        "rate_limits[0].key_header is required with key KEY_HEADER",
    );
    fails_with(
        &[with(RateLimitKey::KeyHeader, "x client")],
        "rate_limits[0].key_header \"x client\" is not a valid header name",
    );
    fails_with(
        &[with(RateLimitKey::KeyHeader, "Connection")],
        "key_header \"Connection\" is a hop-by-hop header",
    );
    fails_with(
        &[with(RateLimitKey::KeyRoute, "x-client")],
        "rate_limits[0].key_header is only used with key KEY_HEADER",
    );
    assert_eq!(check(&[with(RateLimitKey::KeyHeader, "X-Tenant")]), Ok(()));
}

#[test]
fn a_shared_policy_must_agree_across_fields_and_routes() {
    let a = Route {
        rate_limit: Some(limit("api", RateLimitKey::KeyHeader)),
        ..route("a")
    };
    let same = Route {
        rate_limits: vec![RateLimit {
            key_header: "x-client".into(),
            ..limit("api", RateLimitKey::KeyHeader)
        }],
        ..route("b")
    };
    assert_eq!(
        check(&[a.clone(), same]),
        Ok(()),
        "header names are case-insensitive"
    );
    let other_header = Route {
        rate_limits: vec![RateLimit {
            key_header: "x-tenant".into(),
            ..limit("api", RateLimitKey::KeyHeader)
        }],
        ..route("b")
    };
    fails_with(
        &[a.clone(), other_header],
        "route \"b\": rate_limits[0].policy \"api\" is already defined differently by route \"a\"",
    );
    let other_algorithm = Route {
        rate_limits: vec![RateLimit {
            algorithm: RateLimitAlgorithm::FixedWindow as i32,
            ..limit("api", RateLimitKey::KeyHeader)
        }],
        ..route("b")
    };
    fails_with(&[a, other_algorithm], "is already defined differently");
}
