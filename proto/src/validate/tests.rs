use super::*;
use crate::v1::{
    CircuitBreaker, DnsDiscovery, HashOn, HealthCheck, Instance, LbPolicy, RateLimitAlgorithm,
    RateLimitKey,
};

fn upstream(name: &str) -> Upstream {
    Upstream {
        name: name.into(),
        instances: vec![Instance {
            id: "i-1".into(),
            url: "http://127.0.0.1:8081".into(),
            ..Default::default()
        }],
        health_check: Some(HealthCheck {
            path: "/health".into(),
            interval_ms: 5000,
            timeout_ms: 2000,
            unhealthy_threshold: 2,
            healthy_threshold: 1,
        }),
        circuit_breaker: Some(CircuitBreaker {
            failure_threshold: 3,
            reset_timeout_ms: 10_000,
            half_open_max_requests: 1,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn route(name: &str, prefix: &str) -> Route {
    Route {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: "users".into(),
        ..Default::default()
    }
}

fn limit(policy: &str, n: u32) -> RateLimit {
    RateLimit {
        policy: policy.into(),
        algorithm: RateLimitAlgorithm::TokenBucket as i32,
        key: RateLimitKey::KeyIp as i32,
        limit: n,
        window_seconds: 60,
        key_header: String::new(),
    }
}

/// Validates one route against the `users` upstream and returns the joined error text.
fn check_route(r: Route) -> Result<(), String> {
    valid(&[r], &[upstream("users")]).map_err(|e| e.to_string())
}

fn check_upstream(u: Upstream) -> Result<(), String> {
    valid(&[], &[u]).map_err(|e| e.to_string())
}

#[track_caller]
fn fails_with(res: Result<(), String>, needle: &str) {
    match res {
        Ok(()) => panic!("expected an error containing {needle:?}, got Ok"),
        Err(e) => assert!(e.contains(needle), "{e:?} does not contain {needle:?}"),
    }
}

#[test]
fn a_complete_valid_config_passes() {
    let mut users = route("users", "/api/users");
    users.auth = AuthMode::AuthJwt as i32;
    users.rate_limit = Some(RateLimit {
        key: RateLimitKey::KeyUser as i32,
        ..limit("api", 20)
    });
    users.hosts = vec!["api.example.com".into(), "*.example.org".into()];
    users.methods = vec!["GET".into(), "POST".into()];
    users.rewrite_prefix = "/users".into();
    users.timeout_ms = 2000;
    assert_eq!(
        valid(&[users, route("root", "/")], &[upstream("users")]),
        Ok(())
    );
}

#[test]
fn names() {
    assert!(check_route(route("orders-2", "/a")).is_ok());
    fails_with(
        check_route(route("Orders", "/a")),
        "route \"Orders\": name must match",
    );
    fails_with(check_route(route("-x", "/a")), "name must match");
    fails_with(check_route(route("", "/a")), "name must match");
    fails_with(check_route(route(&"a".repeat(64), "/a")), "at most 63");
    fails_with(check_route(route("a_b", "/a")), "name must match");
}

#[test]
fn duplicate_names() {
    let err = valid(&[route("a", "/a"), route("a", "/b")], &[upstream("users")]);
    fails_with(
        err.map_err(|e| e.to_string()),
        "route \"a\": duplicate name",
    );
    let err = valid(&[], &[upstream("u"), upstream("u")]);
    fails_with(
        err.map_err(|e| e.to_string()),
        "upstream \"u\": duplicate name",
    );
}

#[test]
fn path_prefix() {
    assert!(check_route(route("a", "/")).is_ok());
    assert!(check_route(route("a", "/api/v1")).is_ok());
    fails_with(
        check_route(route("orders", "api")),
        "route \"orders\": path_prefix must start with \"/\"",
    );
    fails_with(check_route(route("a", "/api/")), "must not end with");
    fails_with(check_route(route("a", "/a/../b")), "segments");
    fails_with(check_route(route("a", "/a//b")), "segments");
    fails_with(check_route(route("a", "/a?x=1")), "must not contain");
    fails_with(check_route(route("a", "/a%2Fb")), "must not contain");
}

#[test]
fn rewrite_prefix() {
    let mut r = route("a", "/api");
    r.rewrite_prefix = "/".into();
    assert!(check_route(r.clone()).is_ok());
    r.rewrite_prefix = "users".into();
    fails_with(check_route(r), "rewrite_prefix must start with");
}

#[test]
fn hosts() {
    let mut r = route("a", "/");
    r.hosts = vec![
        "example.com".into(),
        "*.example.com".into(),
        "10.0.0.1".into(),
    ];
    assert!(check_route(r.clone()).is_ok());
    for bad in [
        "Example.com",
        "exa mple.com",
        "*",
        "a.*.com",
        "-a.com",
        "a..com",
        "",
    ] {
        r.hosts = vec![bad.into()];
        fails_with(check_route(r.clone()), "is not a lower-case host name");
    }
    r.hosts = vec!["a.com".into(), "a.com".into()];
    fails_with(check_route(r), "listed twice");
}

#[test]
fn methods() {
    let mut r = route("a", "/");
    r.methods = vec!["GET".into()];
    assert!(check_route(r.clone()).is_ok());
    r.methods = vec!["get".into()];
    fails_with(check_route(r.clone()), "not an upper-case HTTP method");
    r.methods = vec!["GET".into(), "GET".into()];
    fails_with(check_route(r), "listed twice");
}

#[test]
fn route_upstream_must_exist() {
    let mut r = route("a", "/");
    r.upstream = "nope".into();
    fails_with(
        check_route(r.clone()),
        "route \"a\": upstream \"nope\" does not exist",
    );
    r.upstream = String::new();
    fails_with(check_route(r), "upstream is required");
}

#[test]
fn deleting_a_used_upstream_is_refused() {
    // Whole-config validation is what catches a delete of an upstream in use.
    let err = valid(&[route("a", "/")], &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("upstream \"users\" does not exist")
    );
}

#[test]
fn enums_and_timeout() {
    let mut r = route("a", "/");
    r.auth = 42;
    fails_with(check_route(r), "auth: unknown value 42");
    let mut r = route("a", "/");
    r.timeout_ms = MAX_TIMEOUT_MS + 1;
    fails_with(check_route(r.clone()), "timeout_ms must be at most");
    r.timeout_ms = MAX_TIMEOUT_MS;
    assert!(check_route(r).is_ok());
}

#[test]
fn rate_limits() {
    let mut r = route("login", "/auth/login");
    r.rate_limit = Some(limit("login", 5));
    assert!(check_route(r.clone()).is_ok());
    r.rate_limit = Some(limit("login", 0));
    fails_with(
        check_route(r.clone()),
        "rate_limit.limit must be greater than 0",
    );
    r.rate_limit = Some(RateLimit {
        window_seconds: 0,
        ..limit("login", 5)
    });
    fails_with(check_route(r.clone()), "rate_limit.window_seconds must be");
    // limit × window in ms over 2^53 cannot be counted exactly; the largest that fit pass.
    r.rate_limit = Some(RateLimit {
        window_seconds: 86_400,
        ..limit("login", u32::MAX)
    });
    fails_with(check_route(r.clone()), "is too large to count exactly");
    r.rate_limit = Some(RateLimit {
        window_seconds: 86_400,
        ..limit("login", 100_000_000)
    });
    assert!(check_route(r.clone()).is_ok());
    r.rate_limit = Some(limit("Bad Policy", 5));
    fails_with(check_route(r.clone()), "rate_limit.policy must match");
    r.rate_limit = Some(RateLimit {
        algorithm: 9,
        ..limit("login", 5)
    });
    fails_with(
        check_route(r.clone()),
        "rate_limit.algorithm: unknown value 9",
    );
    // KEY_USER needs a verified user.
    r.rate_limit = Some(RateLimit {
        key: RateLimitKey::KeyUser as i32,
        ..limit("login", 5)
    });
    fails_with(check_route(r.clone()), "KEY_USER needs auth AUTH_JWT");
    r.auth = AuthMode::AuthJwt as i32;
    assert!(check_route(r).is_ok());
}

#[test]
fn shared_policies_must_agree() {
    let mut a = route("a", "/a");
    a.rate_limit = Some(limit("api", 20));
    let mut b = route("b", "/b");
    b.rate_limit = Some(limit("api", 20));
    assert!(valid(&[a.clone(), b.clone()], &[upstream("users")]).is_ok());
    b.rate_limit = Some(limit("api", 21));
    let err = valid(&[a, b], &[upstream("users")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("is already defined differently by route \"a\"")
    );
}

#[test]
fn identical_matchers_are_refused() {
    let a = route("a", "/x");
    let b = route("b", "/x");
    let err = valid(&[a.clone(), b.clone()], &[upstream("users")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("same hosts, path_prefix and methods as route \"a\"")
    );
    // Different methods, or a specific method next to "any", are fine.
    let mut get = b.clone();
    get.methods = vec!["GET".into()];
    assert!(valid(&[a.clone(), get.clone()], &[upstream("users")]).is_ok());
    let mut get_post = route("c", "/x");
    get_post.methods = vec!["POST".into(), "GET".into()];
    let err = valid(&[get, get_post], &[upstream("users")]).unwrap_err();
    assert!(err.to_string().contains("route \"c\""));
    // Different hosts are fine too; host order does not matter.
    let mut h1 = route("h1", "/x");
    h1.hosts = vec!["a.com".into(), "b.com".into()];
    let mut h2 = route("h2", "/x");
    h2.hosts = vec!["b.com".into(), "a.com".into()];
    assert!(valid(&[a.clone(), h1.clone()], &[upstream("users")]).is_ok());
    assert!(valid(&[h1, h2], &[upstream("users")]).is_err());
}

#[test]
fn instances() {
    let mut u = upstream("users");
    assert!(check_upstream(u.clone()).is_ok());
    for good in [
        "http://localhost:80",
        "http://[::1]:8080",
        "http://orders-1:9000",
        "https://orders-1:9443",
    ] {
        u.instances[0].url = good.into();
        assert!(check_upstream(u.clone()).is_ok(), "{good}");
    }
    for bad in [
        "https://a",
        "http://a",
        "http://a:0",
        "http://a:70000",
        "http://a:80/path",
        "http://user@a:80",
        "http://a:80?x",
        "http://[zz]:80",
        "ftp://a:1",
    ] {
        u.instances[0].url = bad.into();
        let res = check_upstream(u.clone());
        assert!(res.is_err(), "{bad} should be refused");
    }
    u.instances[0].url = "http://a:80/x".into();
    fails_with(
        check_upstream(u.clone()),
        "upstream \"users\": instance \"i-1\": url",
    );
    u.instances.clear();
    fails_with(check_upstream(u.clone()), "instances must not be empty");
    u.instances = vec![
        Instance {
            id: "a".into(),
            url: "http://a:1".into(),
            ..Default::default()
        },
        Instance {
            id: "a".into(),
            url: "http://b:1".into(),
            ..Default::default()
        },
    ];
    fails_with(check_upstream(u.clone()), "instance \"a\": duplicate id");
    u.instances = vec![Instance {
        id: "A".into(),
        url: "http://a:1".into(),
        ..Default::default()
    }];
    fails_with(check_upstream(u), "id must match");
}

#[test]
fn health_check_ranges() {
    let ok = upstream("u");
    let hc = ok.health_check.clone().unwrap();
    let with = |hc: HealthCheck| Upstream {
        health_check: Some(hc),
        ..ok.clone()
    };
    assert!(check_upstream(with(hc.clone())).is_ok());
    fails_with(
        check_upstream(with(HealthCheck {
            interval_ms: 0,
            ..hc.clone()
        })),
        "health_check.interval_ms must be 100 to 3600000 (got 0)",
    );
    fails_with(
        check_upstream(with(HealthCheck {
            timeout_ms: 0,
            ..hc.clone()
        })),
        "health_check.timeout_ms must be",
    );
    fails_with(
        check_upstream(with(HealthCheck {
            timeout_ms: 6000,
            ..hc.clone()
        })),
        "must not exceed interval_ms",
    );
    fails_with(
        check_upstream(with(HealthCheck {
            unhealthy_threshold: 0,
            ..hc.clone()
        })),
        "health_check.unhealthy_threshold",
    );
    fails_with(
        check_upstream(with(HealthCheck {
            healthy_threshold: 101,
            ..hc.clone()
        })),
        "health_check.healthy_threshold",
    );
    fails_with(
        check_upstream(with(HealthCheck {
            path: "health".into(),
            ..hc
        })),
        "health_check.path must start with",
    );
}

#[test]
fn circuit_breaker_ranges() {
    let ok = upstream("u");
    let cb = ok.circuit_breaker.unwrap();
    let with = |cb: CircuitBreaker| Upstream {
        circuit_breaker: Some(cb),
        ..ok.clone()
    };
    assert!(check_upstream(with(cb)).is_ok());
    fails_with(
        check_upstream(with(CircuitBreaker {
            failure_threshold: 0,
            ..cb
        })),
        "circuit_breaker.failure_threshold",
    );
    fails_with(
        check_upstream(with(CircuitBreaker {
            reset_timeout_ms: 50,
            ..cb
        })),
        "circuit_breaker.reset_timeout_ms",
    );
    fails_with(
        check_upstream(with(CircuitBreaker {
            half_open_max_requests: 0,
            ..cb
        })),
        "circuit_breaker.half_open_max_requests",
    );
    fails_with(
        check_upstream(with(CircuitBreaker {
            max_open_percent: 101,
            ..cb
        })),
        "circuit_breaker.max_open_percent",
    );
    assert!(
        check_upstream(with(CircuitBreaker {
            max_open_percent: 0,
            count_5xx: true,
            ..cb
        }))
        .is_ok()
    );
}

#[test]
fn every_problem_is_reported() {
    let mut r = route("Bad", "nope");
    r.upstream = "missing".into();
    let err = valid(&[r], &[]).unwrap_err();
    assert_eq!(err.problems.len(), 3, "{err}");
}

#[test]
fn seed_json_uses_proto3_json_names() {
    let json = r#"{"name":"users","pathPrefix":"/api/users","upstream":"users","auth":"AUTH_JWT",
        "rateLimit":{"policy":"api","algorithm":"TOKEN_BUCKET","key":"KEY_USER","limit":20,"windowSeconds":60}}"#;
    let r: Route = serde_json::from_str(json).unwrap();
    assert_eq!(r.auth, AuthMode::AuthJwt as i32);
    assert_eq!(r.rate_limit.unwrap().limit, 20);
    // grpcurl also accepts the original snake_case field names.
    let r: Route = serde_json::from_str(r#"{"name":"a","path_prefix":"/a"}"#).unwrap();
    assert_eq!(r.path_prefix, "/a");
}

fn balanced(policy: LbPolicy, hash_on: HashOn, header: &str) -> Upstream {
    Upstream {
        lb_policy: policy as i32,
        hash_on: hash_on as i32,
        hash_header: header.into(),
        ..upstream("u")
    }
}

#[test]
fn balancing_policies_that_are_accepted() {
    for u in [
        balanced(LbPolicy::RoundRobin, HashOn::Unspecified, ""),
        balanced(LbPolicy::LeastRequest, HashOn::Unspecified, ""),
        balanced(LbPolicy::ConsistentHash, HashOn::User, ""),
        balanced(LbPolicy::ConsistentHash, HashOn::Ip, ""),
        balanced(LbPolicy::ConsistentHash, HashOn::Header, "x-tenant-id"),
        balanced(LbPolicy::ConsistentHash, HashOn::Header, "X-Tenant_ID.v2"),
    ] {
        let desc = format!("{u:?}");
        assert!(check_upstream(u).is_ok(), "{desc}");
    }
}

#[test]
fn hash_on_goes_with_consistent_hash_only() {
    fails_with(
        check_upstream(balanced(LbPolicy::ConsistentHash, HashOn::Unspecified, "")),
        "upstream \"u\": hash_on is required with lb_policy CONSISTENT_HASH",
    );
    fails_with(
        check_upstream(balanced(LbPolicy::RoundRobin, HashOn::User, "")),
        "upstream \"u\": hash_on is only used with lb_policy CONSISTENT_HASH",
    );
    fails_with(
        check_upstream(balanced(LbPolicy::LeastRequest, HashOn::Ip, "")),
        "hash_on is only used with lb_policy CONSISTENT_HASH",
    );
    let mut u = upstream("u");
    u.lb_policy = 7;
    fails_with(check_upstream(u), "lb_policy: unknown value 7");
    let mut u = balanced(LbPolicy::ConsistentHash, HashOn::User, "");
    u.hash_on = 9;
    fails_with(check_upstream(u), "hash_on: unknown value 9");
}

#[test]
fn hash_header_is_a_valid_name_required_with_header_only() {
    fails_with(
        check_upstream(balanced(LbPolicy::ConsistentHash, HashOn::Header, "")),
        "hash_header is required with hash_on HASH_ON_HEADER",
    );
    for bad in ["x tenant", "x-tenant:", "tenant\u{e9}", &"x".repeat(129)] {
        fails_with(
            check_upstream(balanced(LbPolicy::ConsistentHash, HashOn::Header, bad)),
            "is not a valid header name",
        );
    }
    fails_with(
        check_upstream(balanced(
            LbPolicy::ConsistentHash,
            HashOn::Header,
            "Connection",
        )),
        "hash_header \"Connection\" is a hop-by-hop header",
    );
    fails_with(
        check_upstream(balanced(LbPolicy::ConsistentHash, HashOn::User, "x-tenant")),
        "hash_header is only used with hash_on HASH_ON_HEADER",
    );
    fails_with(
        check_upstream(balanced(
            LbPolicy::RoundRobin,
            HashOn::Unspecified,
            "x-tenant",
        )),
        "hash_header is only used with hash_on HASH_ON_HEADER",
    );
}

fn discovered(dns_name: &str, port: u32, refresh_ms: u32) -> Upstream {
    Upstream {
        instances: vec![],
        discovery: Some(DnsDiscovery {
            dns_name: dns_name.into(),
            port,
            refresh_ms,
        }),
        ..upstream("u")
    }
}

#[test]
fn discovery_that_is_accepted() {
    for u in [
        discovered("orders", 7002, 0),
        discovered("orders.svc.cluster.local", 1, 100),
        discovered("localhost", 65_535, 3_600_000),
        discovered("127.0.0.1", 8080, 1000),
    ] {
        let desc = format!("{u:?}");
        assert!(check_upstream(u).is_ok(), "{desc}");
    }
    let mut u = discovered("orders", 7002, 0);
    u.lb_policy = LbPolicy::LeastRequest as i32;
    assert!(check_upstream(u).is_ok());
}

#[test]
fn discovery_or_instances_not_both_not_neither() {
    let mut both = discovered("orders", 7002, 0);
    both.instances = upstream("u").instances;
    fails_with(
        check_upstream(both),
        "upstream \"u\": set either instances or discovery, not both",
    );
    let mut neither = upstream("u");
    neither.instances.clear();
    fails_with(
        check_upstream(neither),
        "instances must not be empty (or set discovery",
    );
}

#[test]
fn discovery_fields_are_checked() {
    fails_with(
        check_upstream(discovered("", 7002, 0)),
        "discovery.dns_name \"\" is not a lower-case host name",
    );
    fails_with(
        check_upstream(discovered("Orders_1", 7002, 0)),
        "discovery.dns_name \"Orders_1\"",
    );
    fails_with(
        check_upstream(discovered("orders", 0, 0)),
        "discovery.port must be 1 to 65535 (got 0)",
    );
    fails_with(
        check_upstream(discovered("orders", 70_000, 0)),
        "discovery.port must be 1 to 65535",
    );
    fails_with(
        check_upstream(discovered("orders", 7002, 99)),
        "discovery.refresh_ms must be 100 to 3600000 (got 99)",
    );
    fails_with(
        check_upstream(discovered("orders", 7002, 3_600_001)),
        "discovery.refresh_ms must be 100 to 3600000",
    );
}

#[test]
fn upstream_protocol_is_http1_or_http2_and_websocket_needs_http1() {
    let h2 = Upstream {
        protocol: crate::v1::UpstreamProtocol::Http2 as i32,
        ..upstream("users")
    };
    assert_eq!(check_upstream(h2.clone()), Ok(()));
    fails_with(
        check_upstream(Upstream {
            protocol: 7,
            ..upstream("users")
        }),
        "protocol: unknown value 7",
    );
    let ws = Route {
        websocket: true,
        ..route("ws", "/ws")
    };
    let err = valid(std::slice::from_ref(&ws), &[h2]).unwrap_err();
    assert!(
        err.to_string()
            .contains("websocket needs an HTTP1 upstream; upstream \"users\" has protocol HTTP2"),
        "{err}"
    );
    assert!(valid(&[ws], &[upstream("users")]).is_ok());
}
