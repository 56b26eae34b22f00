//! Validation rules of the forwarding settings: `websocket`,
//! `websocket_idle_timeout_ms` and `retry`.

use super::*;
use crate::v1::{Aggregate, AggregatePart, Instance, Retry, RetryOn};

fn upstream() -> Upstream {
    Upstream {
        name: "orders".into(),
        instances: vec![Instance {
            id: "o-1".into(),
            url: "http://127.0.0.1:8082".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn route() -> Route {
    Route {
        name: "orders".into(),
        path_prefix: "/orders".into(),
        upstream: "orders".into(),
        ..Default::default()
    }
}

fn aggregate_route() -> Route {
    Route {
        name: "overview".into(),
        path_prefix: "/overview".into(),
        aggregate: Some(Aggregate {
            parts: vec![AggregatePart {
                name: "orders".into(),
                upstream: "orders".into(),
                path: "/orders/{rest}".into(),
                ..Default::default()
            }],
        }),
        ..Default::default()
    }
}

fn retry(attempts: u32, on: &[RetryOn], per_try_timeout_ms: u32) -> Option<Retry> {
    Some(Retry {
        attempts,
        on: on.iter().map(|o| *o as i32).collect(),
        per_try_timeout_ms,
    })
}

fn check(r: Route) -> Result<(), String> {
    valid(&[r], &[upstream()]).map_err(|e| e.to_string())
}

#[track_caller]
fn fails_with(r: Route, needle: &str) {
    match check(r) {
        Ok(()) => panic!("expected an error containing {needle:?}, got Ok"),
        Err(e) => assert!(e.contains(needle), "{e:?} does not contain {needle:?}"),
    }
}

#[test]
fn websocket_routes_with_and_without_an_idle_timeout_are_valid() {
    for idle in [
        0,
        1,
        crate::defaults::WEBSOCKET_IDLE_TIMEOUT_MS,
        MAX_WEBSOCKET_IDLE_TIMEOUT_MS,
    ] {
        let r = Route {
            websocket: true,
            websocket_idle_timeout_ms: idle,
            ..route()
        };
        assert_eq!(check(r), Ok(()), "idle {idle}");
    }
}

#[test]
fn websocket_idle_timeout_is_bounded_and_needs_websocket() {
    fails_with(
        Route {
            websocket: true,
            websocket_idle_timeout_ms: MAX_WEBSOCKET_IDLE_TIMEOUT_MS + 1,
            ..route()
        },
        "route \"orders\": websocket_idle_timeout_ms must be at most 86400000",
    );
    fails_with(
        Route {
            websocket_idle_timeout_ms: 1000,
            ..route()
        },
        "websocket_idle_timeout_ms is set but websocket is false",
    );
}

#[test]
fn websocket_is_refused_on_aggregate_and_coalesce_routes() {
    fails_with(
        Route {
            websocket: true,
            ..aggregate_route()
        },
        "route \"overview\": websocket is not supported on an aggregate route",
    );
    fails_with(
        Route {
            websocket: true,
            coalesce: true,
            ..route()
        },
        "route \"orders\": websocket is not supported on a coalesce route",
    );
}

#[test]
fn a_complete_retry_is_valid() {
    let r = Route {
        retry: retry(
            MAX_RETRY_ATTEMPTS,
            &[
                RetryOn::ConnectFailure,
                RetryOn::Status5xx,
                RetryOn::Timeout,
            ],
            15_000,
        ),
        ..route()
    };
    assert_eq!(check(r), Ok(()));
    let r = Route {
        timeout_ms: 2_000,
        retry: retry(1, &[RetryOn::Status5xx], 0),
        ..route()
    };
    assert_eq!(check(r), Ok(()));
}

#[test]
fn retry_attempts_are_one_to_five() {
    for bad in [0, MAX_RETRY_ATTEMPTS + 1] {
        fails_with(
            Route {
                retry: retry(bad, &[RetryOn::Status5xx], 0),
                ..route()
            },
            &format!("route \"orders\": retry.attempts must be 1 to 5 (got {bad})"),
        );
    }
}

#[test]
fn retry_conditions_must_be_known_listed_once_and_not_unspecified() {
    fails_with(
        Route {
            retry: retry(1, &[], 0),
            ..route()
        },
        "retry.on must list at least one",
    );
    fails_with(
        Route {
            retry: retry(1, &[RetryOn::Unspecified], 0),
            ..route()
        },
        "retry.on: RETRY_ON_UNSPECIFIED is not a retry condition",
    );
    fails_with(
        Route {
            retry: retry(1, &[RetryOn::Timeout, RetryOn::Timeout], 0),
            ..route()
        },
        "retry.on: value 3 is listed twice",
    );
    let mut r = route();
    r.retry = retry(1, &[], 0);
    r.retry.as_mut().unwrap().on.push(42);
    fails_with(r, "retry.on: unknown value 42");
}

#[test]
fn per_try_timeout_is_at_most_the_route_timeout() {
    fails_with(
        Route {
            retry: retry(1, &[RetryOn::Timeout], 15_001),
            ..route()
        },
        "retry.per_try_timeout_ms must be at most the route timeout, 15000 ms (got 15001)",
    );
    fails_with(
        Route {
            timeout_ms: 500,
            retry: retry(1, &[RetryOn::Timeout], 501),
            ..route()
        },
        "at most the route timeout, 500 ms (got 501)",
    );
}

#[test]
fn retry_is_refused_on_an_aggregate_route() {
    fails_with(
        Route {
            retry: retry(1, &[RetryOn::Status5xx], 0),
            ..aggregate_route()
        },
        "route \"overview\": retry is not supported on an aggregate route",
    );
}
