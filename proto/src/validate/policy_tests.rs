//! Validation rules of route policies: `ip_allow` / `ip_deny`, `request_headers` / `response_headers`, `cors`.

use super::*;
use crate::v1::{HeaderTransform, Instance};

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

fn route() -> Route {
    Route {
        name: "users".into(),
        path_prefix: "/users".into(),
        upstream: "users".into(),
        ..Default::default()
    }
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
        allow_identity_and_host: false,
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
        "X-Gateway-Mirror",
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
fn allow_identity_and_host_opens_exactly_identity_set_remove_and_request_host_set() {
    let allowed = |mut t: HeaderTransform| {
        t.allow_identity_and_host = true;
        Some(t)
    };
    // Accepted: identity set/remove both ways, Host set on the request.
    let ok = Route {
        request_headers: allowed(transform(
            &[("Host", "backend.internal"), ("X-User-Role", "reader")],
            &[],
            &["x-user-id"],
        )),
        response_headers: allowed(transform(&[("x-user-id", "hidden")], &[], &["X-User-Role"])),
        ..route()
    };
    valid(&[ok], &[upstream()]).unwrap();
    // Still refused with the flag: adding identity, removing Host, Host on the
    // response, and every other protected header.
    for (r, needle) in [
        (
            Route {
                request_headers: allowed(transform(&[], &[("X-User-Id", "x")], &[])),
                ..route()
            },
            "request_headers.add: \"X-User-Id\" is a protected header",
        ),
        (
            Route {
                request_headers: allowed(transform(&[], &[], &["host"])),
                ..route()
            },
            "request_headers.remove: \"host\" is a protected header",
        ),
        (
            Route {
                response_headers: allowed(transform(&[("Host", "x")], &[], &[])),
                ..route()
            },
            "allow_identity_and_host permits only set and remove of X-User-Id and X-User-Role, and set of Host in request_headers",
        ),
        (
            Route {
                request_headers: allowed(transform(&[("Content-Length", "1")], &[], &[])),
                ..route()
            },
            "request_headers.set: \"Content-Length\" is a protected header",
        ),
        (
            Route {
                request_headers: allowed(transform(&[("X-Gateway-Signature", "x")], &[], &[])),
                ..route()
            },
            "request_headers.set: \"X-Gateway-Signature\" is a protected header",
        ),
        (
            Route {
                request_headers: allowed(transform(&[], &[], &["transfer-encoding"])),
                ..route()
            },
            "request_headers.remove: \"transfer-encoding\" is a protected header",
        ),
    ] {
        fails_with(r, needle);
    }
    // Without the flag, the message says how to opt in.
    fails_with(
        Route {
            request_headers: Some(transform(&[("Host", "x")], &[], &[])),
            ..route()
        },
        "set allow_identity_and_host to change Host, X-User-Id or X-User-Role on purpose",
    );
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

fn cors(origins: &[&str]) -> crate::v1::Cors {
    crate::v1::Cors {
        allow_origins: strings(origins),
        ..Default::default()
    }
}

fn with_cors(c: crate::v1::Cors) -> Route {
    Route {
        cors: Some(c),
        ..route()
    }
}

#[test]
fn cors_accepts_exact_origins_or_a_lone_star() {
    let full = crate::v1::Cors {
        allow_origins: strings(&[
            "https://app.example.com",
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "https://[::1]:8443",
        ]),
        allow_methods: strings(&["GET", "PUT", "DELETE"]),
        allow_headers: strings(&["Content-Type", "x-requested-with"]),
        expose_headers: strings(&["X-Request-Id"]),
        allow_credentials: true,
        max_age_seconds: 600,
    };
    assert_eq!(check(with_cors(full)), Ok(()));
    assert_eq!(check(with_cors(cors(&["*"]))), Ok(()));
}

#[test]
fn cors_star_with_credentials_is_refused() {
    fails_with(
        with_cors(crate::v1::Cors {
            allow_credentials: true,
            ..cors(&["*"])
        }),
        "cors: allow_origins \"*\" cannot be combined with allow_credentials",
    );
    fails_with(
        with_cors(cors(&["*", "https://a.example"])),
        "cors.allow_origins: \"*\" must be the only entry",
    );
}

#[test]
fn cors_origins_must_be_scheme_host_port() {
    for bad in [
        "app.example.com",
        "https://app.example.com/",
        "https://app.example.com/path",
        "ftp://app.example.com",
        "https://App.Example.com",
        "https://app.example.com:0",
        "https://app.example.com:65536",
        "https://app.example.com:",
        "https://user@app.example.com",
        "https://[::1",
        "null",
        "",
    ] {
        fails_with(
            with_cors(cors(&[bad])),
            &format!("cors.allow_origins: \"{bad}\" is not an origin"),
        );
    }
    fails_with(
        with_cors(cors(&[])),
        "cors.allow_origins must list 1 to 100 origins (got 0)",
    );
    fails_with(
        with_cors(cors(&["https://a.example", "https://a.example"])),
        "\"https://a.example\" is listed twice",
    );
}

#[test]
fn cors_methods_headers_and_max_age_are_checked() {
    fails_with(
        with_cors(crate::v1::Cors {
            allow_methods: strings(&["get"]),
            ..cors(&["*"])
        }),
        "cors.allow_methods: \"get\" is not an upper-case HTTP method",
    );
    fails_with(
        with_cors(crate::v1::Cors {
            allow_headers: strings(&["bad header"]),
            ..cors(&["*"])
        }),
        "cors.allow_headers: \"bad header\" is not a valid header name",
    );
    fails_with(
        with_cors(crate::v1::Cors {
            expose_headers: strings(&["x:y"]),
            ..cors(&["*"])
        }),
        "cors.expose_headers: \"x:y\" is not a valid header name",
    );
    fails_with(
        with_cors(crate::v1::Cors {
            max_age_seconds: 86_401,
            ..cors(&["*"])
        }),
        "cors.max_age_seconds must be at most 86400",
    );
}
