//! Validation rules of composition settings: `Route.aggregate` and `Route.coalesce`.

use super::*;
use crate::v1::{Aggregate, AggregatePart, Instance};

fn upstream(name: &str) -> Upstream {
    Upstream {
        name: name.into(),
        instances: vec![Instance {
            id: "i-1".into(),
            url: "http://127.0.0.1:8081".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn part(name: &str, upstream: &str, path: &str) -> AggregatePart {
    AggregatePart {
        name: name.into(),
        upstream: upstream.into(),
        path: path.into(),
        required: false,
        timeout_ms: 0,
    }
}

/// `/api/overview` over users and orders, as in the demo configuration.
fn overview() -> Route {
    Route {
        name: "overview".into(),
        path_prefix: "/api/overview".into(),
        aggregate: Some(Aggregate {
            parts: vec![
                AggregatePart {
                    required: true,
                    ..part("user", "users", "/users/{rest}")
                },
                part("orders", "orders", "/orders/{rest}"),
            ],
        }),
        ..Default::default()
    }
}

fn check(r: Route) -> Result<(), String> {
    valid(&[r], &[upstream("users"), upstream("orders")]).map_err(|e| e.to_string())
}

#[track_caller]
fn fails_with(res: Result<(), String>, needle: &str) {
    match res {
        Ok(()) => panic!("expected an error containing {needle:?}, got Ok"),
        Err(e) => assert!(e.contains(needle), "{e:?} does not contain {needle:?}"),
    }
}

fn with_parts(parts: Vec<AggregatePart>) -> Route {
    Route {
        aggregate: Some(Aggregate { parts }),
        ..overview()
    }
}

#[test]
fn an_aggregate_route_needs_no_upstream_of_its_own() {
    assert_eq!(check(overview()), Ok(()));
    let mut r = overview();
    r.methods = vec!["GET".into()];
    r.timeout_ms = 2000;
    r.auth = AuthMode::AuthJwt as i32;
    assert_eq!(check(r), Ok(()));
}

#[test]
fn a_plain_route_still_needs_its_upstream() {
    let r = Route {
        aggregate: None,
        ..overview()
    };
    fails_with(check(r), "route \"overview\": upstream is required");
}

#[test]
fn route_upstream_and_rewrite_must_be_empty() {
    let mut r = overview();
    r.upstream = "users".into();
    fails_with(check(r), "upstream must be empty on an aggregate route");
    let mut r = overview();
    r.rewrite_prefix = "/users".into();
    fails_with(
        check(r),
        "rewrite_prefix must be empty on an aggregate route",
    );
}

#[test]
fn get_only() {
    for methods in [vec!["POST"], vec!["GET", "HEAD"]] {
        let mut r = overview();
        r.methods = methods.into_iter().map(String::from).collect();
        fails_with(check(r), "an aggregate route serves GET only");
    }
}

#[test]
fn an_empty_method_list_counts_as_get_when_matchers_collide() {
    let get_route = Route {
        name: "plain".into(),
        path_prefix: "/api/overview".into(),
        upstream: "users".into(),
        methods: vec!["GET".into()],
        ..Default::default()
    };
    let err = valid(
        &[overview(), get_route.clone()],
        &[upstream("users"), upstream("orders")],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("same hosts, path_prefix and methods"),
        "{err}"
    );
    // A POST route at the same prefix does not collide: the aggregate answers GET only.
    let post_route = Route {
        methods: vec!["POST".into()],
        ..get_route
    };
    assert_eq!(
        valid(
            &[overview(), post_route],
            &[upstream("users"), upstream("orders")]
        ),
        Ok(())
    );
}

#[test]
fn coalesce_is_refused_on_aggregate_routes_only() {
    let mut r = overview();
    r.coalesce = true;
    fails_with(check(r), "coalesce is not supported on an aggregate route");
    let plain = Route {
        name: "users".into(),
        path_prefix: "/api/users".into(),
        upstream: "users".into(),
        coalesce: true,
        ..Default::default()
    };
    assert_eq!(check(plain), Ok(()));
}

#[test]
fn part_count() {
    fails_with(
        check(with_parts(vec![])),
        "aggregate.parts must list 1 to 16 parts (got 0)",
    );
    let many: Vec<_> = (0..=MAX_AGGREGATE_PARTS)
        .map(|i| part(&format!("p{i}"), "users", "/users"))
        .collect();
    fails_with(check(with_parts(many.clone())), "(got 17)");
    assert_eq!(
        check(with_parts(many[..MAX_AGGREGATE_PARTS].to_vec())),
        Ok(())
    );
    assert_eq!(
        check(with_parts(vec![part("one", "users", "/users")])),
        Ok(())
    );
}

#[test]
fn part_names_are_unique_and_well_formed() {
    let r = with_parts(vec![
        part("user", "users", "/users/{rest}"),
        part("user", "orders", "/orders/{rest}"),
    ]);
    fails_with(
        check(r),
        "route \"overview\": aggregate.parts[1] \"user\": duplicate part name",
    );
    for bad in ["", "User", "a_b", "-a"] {
        fails_with(
            check(with_parts(vec![part(bad, "users", "/users")])),
            "name must match [a-z0-9][a-z0-9-]*",
        );
    }
}

#[test]
fn part_upstream_is_required_and_must_exist() {
    fails_with(
        check(with_parts(vec![part("a", "", "/users")])),
        "aggregate.parts[0] \"a\": upstream is required",
    );
    fails_with(
        check(with_parts(vec![part("a", "nope", "/users")])),
        "route \"overview\": aggregate.parts[0] \"a\": upstream \"nope\" does not exist",
    );
    // Deleting an upstream that only a part uses is refused by the same whole-config check.
    let err = valid(&[overview()], &[upstream("users")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("upstream \"orders\" does not exist"),
        "{err}"
    );
}

#[test]
fn part_paths() {
    for good in [
        "/",
        "/users/{rest}",
        "/users/{rest}/profile",
        "/v1/users:{rest}",
        "/orders?status=open&limit=5",
        "/orders/{rest}?fields=a,b",
        "/a%20b",
    ] {
        assert_eq!(
            check(with_parts(vec![part("a", "users", good)])),
            Ok(()),
            "{good}"
        );
    }
    for (bad, why) in [
        ("users/{rest}", "must start with \"/\""),
        ("", "must start with \"/\""),
        ("/users/{id}", "may use no placeholder but {rest}"),
        ("/users/{rest}/{rest}", "may use {rest} at most once"),
        ("/users/{rest", "may use no placeholder but {rest}"),
        (
            "/orders?user={rest}",
            "must not use a placeholder in the query",
        ),
        ("/a b", "must contain only URI path characters"),
        ("/a#frag", "must contain only URI path characters"),
        ("/a\\b", "must contain only URI path characters"),
        ("/a?x=1 2", "query must contain only URI query characters"),
        ("/a?x=%zz", "query must contain only URI query characters"),
        ("/a%2", "has a malformed percent-escape"),
        ("/a/../b", "must not contain \".\" or \"..\" segments"),
        ("/a/./b", "must not contain \".\" or \"..\" segments"),
    ] {
        fails_with(
            check(with_parts(vec![part("a", "users", bad)])),
            &format!("aggregate.parts[0] \"a\": path {why}"),
        );
    }
}

#[test]
fn part_timeout_bounds() {
    let mut p = part("a", "users", "/users");
    p.timeout_ms = MAX_TIMEOUT_MS;
    assert_eq!(check(with_parts(vec![p.clone()])), Ok(()));
    p.timeout_ms = MAX_TIMEOUT_MS + 1;
    fails_with(
        check(with_parts(vec![p])),
        "aggregate.parts[0] \"a\": timeout_ms must be at most 3600000",
    );
}

#[test]
fn seed_json_spells_the_composition_fields() {
    let json = r#"{"name":"overview","pathPrefix":"/api/overview","aggregate":{"parts":[
        {"name":"user","upstream":"users","path":"/users/{rest}","required":true,"timeoutMs":500},
        {"name":"orders","upstream":"orders","path":"/orders/{rest}"}]}}"#;
    let r: Route = serde_json::from_str(json).unwrap();
    let parts = &r.aggregate.as_ref().unwrap().parts;
    assert_eq!(parts.len(), 2);
    assert!(parts[0].required && !parts[1].required);
    assert_eq!(parts[0].timeout_ms, 500);
    assert_eq!(check(r), Ok(()));
    let r: Route = serde_json::from_str(
        r#"{"name":"a","pathPrefix":"/a","upstream":"users","coalesce":true}"#,
    )
    .unwrap();
    assert!(r.coalesce);
}
