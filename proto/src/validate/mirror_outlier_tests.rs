//! Validation rules of `Route.mirror` and `Upstream.outlier_detection`.

use super::*;
use crate::v1::{AggregatePart, Instance, Mirror, OutlierDetection};

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

fn route(mirror: Option<Mirror>) -> Route {
    Route {
        name: "orders".into(),
        path_prefix: "/orders".into(),
        upstream: "orders".into(),
        mirror,
        ..Default::default()
    }
}

fn mirror(upstream: &str, percent: u32) -> Option<Mirror> {
    Some(Mirror {
        upstream: upstream.into(),
        percent,
        ..Default::default()
    })
}

fn check(routes: &[Route], upstreams: &[Upstream]) -> Result<(), String> {
    valid(routes, upstreams).map_err(|e| e.to_string())
}

#[track_caller]
fn fails_with(result: Result<(), String>, needle: &str) {
    match result {
        Ok(()) => panic!("expected an error containing {needle:?}, got Ok"),
        Err(e) => assert!(e.contains(needle), "{e:?} does not contain {needle:?}"),
    }
}

fn both() -> [Upstream; 2] {
    [upstream("orders"), upstream("shadow")]
}

#[test]
fn a_mirror_to_another_upstream_with_a_percent_is_valid() {
    for percent in [1, 50, 100] {
        assert_eq!(
            check(&[route(mirror("shadow", percent))], &both()),
            Ok(()),
            "{percent}"
        );
    }
}

/// Issue 41, item 4: the deny list is header names, each once, at most 32.
#[test]
fn mirror_deny_headers_are_valid_distinct_header_names() {
    let with = |deny: Vec<String>| {
        let mut m = mirror("shadow", 100).unwrap();
        m.include_body = true;
        m.deny_headers = deny;
        route(Some(m))
    };
    assert_eq!(
        check(&[with(vec!["X-Trace".into(), "x-tenant".into()])], &both()),
        Ok(())
    );
    fails_with(
        check(&[with(vec!["bad name".into()])], &both()),
        "route \"orders\": mirror.deny_headers: \"bad name\" is not a valid header name",
    );
    fails_with(
        check(&[with(vec!["X-Trace".into(), "x-trace".into()])], &both()),
        "mirror.deny_headers: duplicate header name \"x-trace\"",
    );
    fails_with(
        check(
            &[with((0..33).map(|i| format!("x-h{i}")).collect())],
            &both(),
        ),
        "mirror.deny_headers lists at most 32 header names (got 33)",
    );
}

#[test]
fn mirror_percent_must_be_1_to_100() {
    for percent in [0, 101] {
        fails_with(
            check(&[route(mirror("shadow", percent))], &both()),
            &format!("route \"orders\": mirror.percent must be 1 to 100 (got {percent}"),
        );
    }
}

#[test]
fn the_mirror_upstream_must_exist_and_differ_from_the_primary() {
    fails_with(
        check(&[route(mirror("ghost", 10))], &both()),
        "route \"orders\": mirror.upstream \"ghost\" does not exist",
    );
    fails_with(
        check(&[route(mirror("", 10))], &both()),
        "route \"orders\": mirror.upstream is required",
    );
    fails_with(
        check(&[route(mirror("orders", 10))], &both()),
        "mirror.upstream must differ from the route's upstream \"orders\"",
    );
}

#[test]
fn no_mirror_on_websocket_or_aggregate_routes() {
    let ws = Route {
        websocket: true,
        ..route(mirror("shadow", 10))
    };
    fails_with(
        check(&[ws], &both()),
        "route \"orders\": mirror: not supported on a websocket route",
    );
    let agg = Route {
        upstream: String::new(),
        aggregate: Some(crate::v1::Aggregate {
            parts: vec![AggregatePart {
                name: "o".into(),
                upstream: "orders".into(),
                path: "/orders".into(),
                ..Default::default()
            }],
        }),
        ..route(mirror("shadow", 10))
    };
    fails_with(
        check(&[agg], &both()),
        "route \"orders\": mirror: not supported on an aggregate route",
    );
}

fn outlier() -> OutlierDetection {
    OutlierDetection {
        failure_rate_percent: 50,
        min_requests: 10,
        window_ms: 10_000,
        ejection_ms: 30_000,
        max_ejection_percent: 50,
    }
}

fn with_outlier(o: OutlierDetection) -> Result<(), String> {
    let u = Upstream {
        outlier_detection: Some(o),
        ..upstream("orders")
    };
    check(&[route(None)], &[u])
}

#[test]
fn outlier_detection_in_range_is_valid() {
    assert_eq!(with_outlier(outlier()), Ok(()));
    let edges = OutlierDetection {
        failure_rate_percent: 100,
        min_requests: MAX_OUTLIER_MIN_REQUESTS,
        window_ms: MIN_OUTLIER_WINDOW_MS,
        ejection_ms: MIN_OUTLIER_EJECTION_MS,
        max_ejection_percent: 1,
    };
    assert_eq!(with_outlier(edges), Ok(()));
}

#[test]
fn outlier_detection_fields_out_of_range_are_refused_with_their_range() {
    let cases: [(OutlierDetection, &str); 8] = [
        (
            OutlierDetection {
                failure_rate_percent: 0,
                ..outlier()
            },
            "outlier_detection.failure_rate_percent must be 1 to 100 (got 0)",
        ),
        (
            OutlierDetection {
                failure_rate_percent: 101,
                ..outlier()
            },
            "outlier_detection.failure_rate_percent must be 1 to 100 (got 101)",
        ),
        (
            OutlierDetection {
                min_requests: 0,
                ..outlier()
            },
            "outlier_detection.min_requests must be 1 to 100000 (got 0)",
        ),
        (
            OutlierDetection {
                window_ms: 999,
                ..outlier()
            },
            "outlier_detection.window_ms must be 1000 to 3600000 (got 999)",
        ),
        (
            OutlierDetection {
                window_ms: 3_600_001,
                ..outlier()
            },
            "outlier_detection.window_ms must be 1000 to 3600000",
        ),
        (
            OutlierDetection {
                ejection_ms: 99,
                ..outlier()
            },
            "outlier_detection.ejection_ms must be 100 to 3600000 (got 99)",
        ),
        (
            OutlierDetection {
                max_ejection_percent: 0,
                ..outlier()
            },
            "outlier_detection.max_ejection_percent must be 1 to 100 (got 0)",
        ),
        (
            OutlierDetection {
                max_ejection_percent: 101,
                ..outlier()
            },
            "outlier_detection.max_ejection_percent must be 1 to 100 (got 101)",
        ),
    ];
    for (o, needle) in cases {
        fails_with(with_outlier(o), &format!("upstream \"orders\": {needle}"));
    }
}
