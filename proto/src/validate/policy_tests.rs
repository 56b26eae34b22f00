//! Validation rules of route policies: `ip_allow` / `ip_deny`.

use super::*;
use crate::v1::Instance;

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
