//! Validation rules of route policies: `ip_allow` / `ip_deny`, `request_headers` / `response_headers`.

use super::*;
use crate::v1::{HeaderTransform, Instance};

fn upstream() -> Upstream {
    Upstream {
        name: "users".into(),
        instances: vec![Instance {
            id: "i-1".into(),
            url: "http://127.0.0.1:8081".into(),
        }],
        ..Default::default()
    }
}

fn route() -> Route {
    Route {
        name: "users".into(),
        path_prefix: "/users".into(),
        upstream: "users".into(),
        ..Default::default()
    }
}

fn check(r: Route) -> Result<(), String> {
    validate_config(&[r], &[upstream()]).map_err(|e| e.to_string())
}

#[track_caller]
fn fails_with(r: Route, needle: &str) {
    match check(r) {
        Ok(()) => panic!("expected an error containing {needle:?}, got Ok"),
        Err(e) => assert!(e.contains(needle), "{e:?} does not contain {needle:?}"),
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn ip_lists_accept_networks_and_hosts_of_both_families() {
    let r = Route {
        ip_allow: strings(&["203.0.113.0/24", "2001:db8::/32", "192.0.2.7", "::1"]),
        ip_deny: strings(&["203.0.113.7", "2001:db8::bad/128", "0.0.0.0/0"]),
        ..route()
    };
    assert_eq!(check(r), Ok(()));
}

#[test]
fn ip_list_entries_must_parse() {
    for bad in ["10.0.0.0/33", "example.com", "10.0.0/8", "::/129", ""] {
        fails_with(
            Route {
                ip_allow: strings(&[bad]),
                ..route()
            },
            &format!("route \"users\": ip_allow: \"{bad}\" is not an IP address or network"),
        );
    }
    fails_with(
        Route {
            ip_deny: strings(&["nope"]),
            ..route()
        },
        "ip_deny: \"nope\" is not an IP address",
    );
}

#[test]
fn host_bits_are_refused_with_the_network_suggested() {
    fails_with(
        Route {
            ip_allow: strings(&["10.1.2.3/8"]),
            ..route()
        },
        "ip_allow: \"10.1.2.3/8\" has host bits set (did you mean 10.0.0.0/8?)",
    );
    fails_with(
        Route {
            ip_deny: strings(&["2001:db8::1/32"]),
            ..route()
        },
        "did you mean 2001:db8::/32?",
    );
}

#[test]
fn ipv4_mapped_networks_are_refused() {
    fails_with(
        Route {
            ip_deny: strings(&["::ffff:10.0.0.0/104"]),
            ..route()
        },
        "ip_deny: \"::ffff:10.0.0.0/104\" is an IPv4-mapped IPv6 network; write it as IPv4",
    );
}

#[test]
fn ip_lists_are_bounded() {
    let list: Vec<String> = (0..=MAX_IP_RULES)
        .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
        .collect();
    fails_with(
        Route {
            ip_allow: list.clone(),
            ..route()
        },
        "ip_allow lists 1001 entries, at most 1000 are allowed",
    );
    assert_eq!(
        check(Route {
            ip_allow: list[..MAX_IP_RULES].to_vec(),
            ..route()
        }),
        Ok(())
    );
}

fn transform(set: &[(&str, &str)], add: &[(&str, &str)], remove: &[&str]) -> HeaderTransform {
    let map = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    HeaderTransform {
        set: map(set),
        add: map(add),
        remove: strings(remove),
    }
}

#[test]
fn header_transforms_accept_ordinary_headers_both_ways() {
    let r = Route {
        request_headers: Some(transform(
            &[("X-Env", "prod"), ("accept", "application/json")],
            &[("x-tag", "gateway; v=1")],
            &["X-Debug", "cookie"],
        )),
        response_headers: Some(transform(
            &[("cache-control", "no-store")],
            &[("x-frame-options", "DENY")],
            &["server", "x-powered-by"],
        )),
        ..route()
    };
    assert_eq!(check(r), Ok(()));
}

#[test]
fn protected_headers_are_refused_in_every_operation_and_direction() {
    for name in [
        "X-User-Id",
        "x-user-role",
        "Host",
        "content-length",
        "Connection",
        "te",
        "Transfer-Encoding",
        "upgrade",
        "keep-alive",
        "proxy-authorization",
    ] {
        fails_with(
            Route {
                request_headers: Some(transform(&[(name, "v")], &[], &[])),
                ..route()
            },
            &format!("request_headers.set: \"{name}\" is a protected header"),
        );
        fails_with(
            Route {
                request_headers: Some(transform(&[], &[(name, "v")], &[])),
                ..route()
            },
            &format!("request_headers.add: \"{name}\" is a protected header"),
        );
        fails_with(
            Route {
                response_headers: Some(transform(&[], &[], &[name])),
                ..route()
            },
            &format!("response_headers.remove: \"{name}\" is a protected header"),
        );
    }
}

#[test]
fn header_names_and_values_must_be_valid_http() {
    fails_with(
        Route {
            request_headers: Some(transform(&[("bad name", "v")], &[], &[])),
            ..route()
        },
        "request_headers.set: \"bad name\" is not a valid header name",
    );
    fails_with(
        Route {
            response_headers: Some(transform(&[], &[], &[""])),
            ..route()
        },
        "response_headers.remove: \"\" is not a valid header name",
    );
    for bad in [
        "a\r\nx-injected: 1",
        "tab\u{0}",
        " lead",
        "trail ",
        "é",
        &"v".repeat(4097),
    ] {
        fails_with(
            Route {
                request_headers: Some(transform(&[], &[("x-a", bad)], &[])),
                ..route()
            },
            "request_headers.add: the value of \"x-a\" must be at most 4096 visible ASCII",
        );
    }
    assert_eq!(
        check(Route {
            request_headers: Some(transform(&[("x-a", "")], &[("x-b", "a\tb c")], &[])),
            ..route()
        }),
        Ok(()),
        "an empty value and inner whitespace are fine"
    );
}

#[test]
fn a_header_is_named_once_per_transform() {
    fails_with(
        Route {
            request_headers: Some(transform(&[("X-A", "1")], &[("x-a", "2")], &[])),
            ..route()
        },
        "request_headers.add: \"x-a\" is named more than once",
    );
    fails_with(
        Route {
            response_headers: Some(transform(&[("x-a", "1")], &[], &["X-A"])),
            ..route()
        },
        "response_headers.remove: \"X-A\" is named more than once",
    );
    // The two directions are independent.
    assert_eq!(
        check(Route {
            request_headers: Some(transform(&[("x-a", "1")], &[], &[])),
            response_headers: Some(transform(&[], &[], &["x-a"])),
            ..route()
        }),
        Ok(())
    );
}

#[test]
fn header_transforms_are_bounded() {
    let names: Vec<String> = (0..=MAX_HEADER_TRANSFORMS)
        .map(|i| format!("x-h{i}"))
        .collect();
    let r = Route {
        response_headers: Some(HeaderTransform {
            remove: names,
            ..HeaderTransform::default()
        }),
        ..route()
    };
    fails_with(r, "response_headers has 65 entries, at most 64 are allowed");
}

#[test]
fn request_transforms_are_refused_on_aggregate_routes() {
    use crate::v1::{Aggregate, AggregatePart};
    let r = Route {
        upstream: String::new(),
        aggregate: Some(Aggregate {
            parts: vec![AggregatePart {
                name: "u".into(),
                upstream: "users".into(),
                path: "/users/{rest}".into(),
                ..AggregatePart::default()
            }],
        }),
        request_headers: Some(transform(&[("x-a", "1")], &[], &[])),
        response_headers: Some(transform(&[("x-b", "1")], &[], &[])),
        ..route()
    };
    match check(r) {
        Err(e) => {
            assert!(
                e.contains("request_headers is not supported on an aggregate route"),
                "{e}"
            );
            assert!(!e.contains("response_headers"), "{e}");
        }
        Ok(()) => panic!("accepted"),
    }
}
