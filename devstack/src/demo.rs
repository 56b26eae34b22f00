//! The demo configuration (docs/devstack.md, "Demo data"), kept as proto3 JSON of an
//! `ApplyConfigRequest` in `devstack/demo-config.json` so people can read
//! and reuse it. Instance addresses are `{{name}}` placeholders filled with
//! the stack's ports.

use gateway_proto::v1::ApplyConfigRequest;

use crate::error::StackError;
use crate::ports::Ports;

/// The template, as shipped.
pub const DEMO_CONFIG_TEMPLATE: &str = include_str!("../demo-config.json");

/// Name of the upstream served by the auth service.
const AUTH_UPSTREAM: &str = "auth";

/// The demo configuration for a stack on `ports`. With `with_auth` false the
/// `auth` upstream and the routes to it are left out (nothing would answer).
pub fn demo_config(ports: &Ports, with_auth: bool) -> Result<ApplyConfigRequest, StackError> {
    let addr = |port: u16| format!("127.0.0.1:{port}");
    let rendered = DEMO_CONFIG_TEMPLATE
        .replace("{{auth}}", &addr(ports.auth))
        .replace("{{users-1}}", &addr(ports.users_1))
        .replace("{{orders-1}}", &addr(ports.orders_1))
        .replace("{{orders-2}}", &addr(ports.orders_2));
    if let Some(pos) = rendered.find("{{") {
        let end = rendered[pos..]
            .find("}}")
            .map_or(rendered.len(), |e| pos + e + 2);
        return Err(StackError::DemoConfig(format!(
            "unknown placeholder {}",
            &rendered[pos..end]
        )));
    }
    let mut config: ApplyConfigRequest = serde_json::from_str(&rendered)
        .map_err(|e| StackError::DemoConfig(format!("demo-config.json does not parse: {e}")))?;
    if !with_auth {
        config.routes.retain(|r| r.upstream != AUTH_UPSTREAM);
        config.upstreams.retain(|u| u.name != AUTH_UPSTREAM);
    }
    gateway_proto::validate_config(&config.routes, &config.upstreams)
        .map_err(|e| StackError::DemoConfig(format!("demo-config.json is invalid: {e}")))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::{AuthMode, RateLimitAlgorithm, RateLimitKey};

    #[test]
    fn demo_config_matches_the_design() {
        let ports = Ports::fixed(2);
        let config = demo_config(&ports, true).unwrap();
        let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["login", "auth", "users", "orders", "overview"]);

        let login = &config.routes[0];
        assert_eq!(login.methods, ["POST"]);
        let limit = login.rate_limit.as_ref().unwrap();
        assert_eq!(limit.algorithm(), RateLimitAlgorithm::FixedWindow);
        assert_eq!(limit.key(), RateLimitKey::KeyIp);
        assert_eq!((limit.limit, limit.window_seconds), (5, 60));

        for route in &config.routes[2..] {
            assert_eq!(route.auth(), AuthMode::AuthJwt);
            let limit = route.rate_limit.as_ref().unwrap();
            assert_eq!(limit.policy, "api");
            assert_eq!(limit.algorithm(), RateLimitAlgorithm::TokenBucket);
            assert_eq!(limit.key(), RateLimitKey::KeyUser);
            assert_eq!((limit.limit, limit.window_seconds), (20, 60));
        }
        assert_eq!(config.routes[3].rewrite_prefix, "/orders");

        // `/api/overview/{id}`: the user (required) and the order of that id (optional).
        let overview = &config.routes[4];
        assert_eq!(overview.path_prefix, "/api/overview");
        let parts: Vec<_> = overview
            .aggregate
            .as_ref()
            .unwrap()
            .parts
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.upstream.as_str(),
                    p.path.as_str(),
                    p.required,
                )
            })
            .collect();
        assert_eq!(
            parts,
            [
                ("user", "users", "/users/{rest}", true),
                ("orders", "orders", "/orders/{rest}", false),
            ]
        );

        let orders = config
            .upstreams
            .iter()
            .find(|u| u.name == "orders")
            .unwrap();
        let urls: Vec<_> = orders.instances.iter().map(|i| i.url.as_str()).collect();
        assert_eq!(urls, ["http://127.0.0.1:7002", "http://127.0.0.1:7003"]);
        for upstream in &config.upstreams {
            let breaker = upstream.circuit_breaker.as_ref().unwrap();
            assert_eq!(breaker.failure_threshold, 3);
            assert_eq!(breaker.reset_timeout_ms, 10_000);
            let check = upstream.health_check.as_ref().unwrap();
            assert_eq!((check.interval_ms, check.timeout_ms), (5000, 2000));
        }
    }

    #[test]
    fn without_auth_the_auth_routes_go() {
        let config = demo_config(&Ports::fixed(1), false).unwrap();
        assert!(config.upstreams.iter().all(|u| u.name != "auth"));
        let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["users", "orders", "overview"]);
    }
}
