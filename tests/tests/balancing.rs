//! Black-box suite of the balancing policies and DNS discovery (issue 11)
//! against real processes started by the devstack library. Each scenario
//! has its own stack.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use devstack::Stack;
use futures::StreamExt;
use gateway_proto::v1::{
    AuthMode, DnsDiscovery, GetUpstreamRequest, HashOn, HealthCheck, Instance, LbPolicy, Route,
    Upstream,
};
use gateway_tests::{client, login, open_route, poll, upsert_route_synced, upsert_upstream_synced};
use serde_json::Value;

/// Deadline for anything that should happen "soon" (config propagation, discovery).
const SOON: Duration = Duration::from_secs(30);

/// A stack without the auth service (its Argon2 seeding costs seconds and
/// nothing here needs it), one data plane, `env` set on given processes.
async fn start_without_auth(env: &[(&str, &str, &str)]) -> Stack {
    let mut builder = Stack::new().data_planes(1).auth(false);
    for (process, key, value) in env {
        builder = builder.env(*process, *key, *value);
    }
    builder
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"))
}

/// The current definition of upstream `name`.
async fn get_upstream(stack: &Stack, name: &str) -> Upstream {
    stack
        .admin_client()
        .await
        .get_upstream(GetUpstreamRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}

fn instance_of(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("x-instance-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<none>")
        .to_owned()
}

/// Sends `total` GETs to `url`, `concurrency` at a time; returns how many
/// each instance answered (all must be 200).
async fn served_by(url: &str, total: usize, concurrency: usize) -> BTreeMap<String, usize> {
    let http = client();
    let answers: Vec<String> = futures::stream::iter(0..total)
        .map(|_| {
            let http = http.clone();
            async move {
                let r = http.get(url).send().await.unwrap();
                assert_eq!(r.status(), 200, "{url}");
                instance_of(&r)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut counts = BTreeMap::new();
    for who in answers {
        *counts.entry(who).or_default() += 1;
    }
    counts
}

fn share(counts: &BTreeMap<String, usize>, who: &str) -> f64 {
    let total: usize = counts.values().sum();
    counts.get(who).copied().unwrap_or(0) as f64 / total as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn least_request_sends_a_slow_instance_clearly_fewer_requests_than_round_robin() {
    // orders-2 answers every request 150 ms late; orders-1 at once.
    let stack = start_without_auth(&[("orders-2", "DELAY_MS", "150")]).await;
    upsert_route_synced(
        &stack,
        open_route("open-orders", "/open/orders", "orders", "/orders"),
    )
    .await
    .unwrap();
    let url = format!("{}/open/orders/1", stack.gateways()[0]);

    // Round-robin (the demo configuration): half the requests wait on orders-2.
    let rr = served_by(&url, 200, 16).await;
    let rr_slow = share(&rr, "orders-2");
    assert!(
        (0.4..=0.6).contains(&rr_slow),
        "round-robin should split evenly: {rr:?}"
    );

    let mut orders = get_upstream(&stack, "orders").await;
    orders.lb_policy = LbPolicy::LeastRequest as i32;
    upsert_upstream_synced(&stack, orders).await.unwrap();
    let lr = served_by(&url, 400, 16).await;
    let lr_slow = share(&lr, "orders-2");
    println!(
        "slow instance share: round-robin {rr_slow:.3} {rr:?}, least-request {lr_slow:.3} {lr:?}"
    );
    assert!(
        lr_slow < 0.15,
        "least-request must steer away from the slow instance: {lr:?}"
    );
    assert!(
        lr.get("orders-2").copied().unwrap_or(0) > 0,
        "the slow instance is not excluded, only less loaded: {lr:?}"
    );
}

/// An upstream over all three mocks (`users-1`, `orders-1`, `orders-2`) and a
/// route `/spread` → their `/health`, which each of them answers 200 with
/// its `X-Instance-Id`.
fn spread_upstream(stack: &Stack, instances: &[&str], policy: LbPolicy, on: HashOn) -> Upstream {
    let ports = stack.ports();
    let port = |id: &str| match id {
        "users-1" => ports.users_1,
        "orders-1" => ports.orders_1,
        "orders-2" => ports.orders_2,
        other => panic!("no mock {other}"),
    };
    Upstream {
        name: "spread".into(),
        instances: instances
            .iter()
            .map(|id| Instance {
                id: (*id).into(),
                url: format!("http://127.0.0.1:{}", port(id)),
                ..Default::default()
            })
            .collect(),
        lb_policy: policy as i32,
        hash_on: on as i32,
        hash_header: if on == HashOn::Header {
            "x-tenant".into()
        } else {
            String::new()
        },
        ..Default::default()
    }
}

/// Where each tenant's requests go (`X-Tenant: tenant`).
async fn owners(url: &str, tenants: &[String]) -> HashMap<String, String> {
    let http = client();
    futures::stream::iter(tenants)
        .map(|tenant| {
            let http = http.clone();
            async move {
                let r = http
                    .get(url)
                    .header("x-tenant", tenant)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                (tenant.clone(), instance_of(&r))
            }
        })
        .buffer_unordered(8)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn consistent_hash_pins_a_header_key_and_removing_an_instance_moves_only_its_keys() {
    let stack = start_without_auth(&[]).await;
    let all = ["users-1", "orders-1", "orders-2"];
    upsert_upstream_synced(
        &stack,
        spread_upstream(&stack, &all, LbPolicy::ConsistentHash, HashOn::Header),
    )
    .await
    .unwrap();
    upsert_route_synced(&stack, open_route("spread", "/spread", "spread", "/health"))
        .await
        .unwrap();
    let url = format!("{}/spread", stack.gateways()[0]);
    let http = client();

    // One tenant, many requests: always the same instance.
    let mut seen = BTreeMap::<String, usize>::new();
    for _ in 0..30 {
        let r = http
            .get(&url)
            .header("x-tenant", "acme")
            .send()
            .await
            .unwrap();
        *seen.entry(instance_of(&r)).or_default() += 1;
    }
    assert_eq!(seen.len(), 1, "one tenant, one instance: {seen:?}");

    // 300 tenants spread over all three; asking again changes nothing.
    let tenants: Vec<String> = (0..300).map(|i| format!("tenant-{i}")).collect();
    let before = owners(&url, &tenants).await;
    assert_eq!(before, owners(&url, &tenants).await);
    let mut per = BTreeMap::<&str, usize>::new();
    for o in before.values() {
        *per.entry(o.as_str()).or_default() += 1;
    }
    assert_eq!(per.len(), 3, "{per:?}");

    // Requests without the key are balanced round-robin over every instance.
    let keyless = served_by(&url, 30, 1).await;
    assert_eq!(keyless.len(), 3, "{keyless:?}");

    // Remove orders-2: only its tenants move, and all of them do.
    upsert_upstream_synced(
        &stack,
        spread_upstream(
            &stack,
            &["users-1", "orders-1"],
            LbPolicy::ConsistentHash,
            HashOn::Header,
        ),
    )
    .await
    .unwrap();
    let after = owners(&url, &tenants).await;
    let moved: Vec<&String> = tenants.iter().filter(|t| before[*t] != after[*t]).collect();
    assert!(
        moved.iter().all(|t| before[*t] == "orders-2"),
        "only orders-2's tenants may move"
    );
    assert_eq!(
        moved.len(),
        per["orders-2"],
        "every tenant of orders-2 moves"
    );
    println!(
        "{} of {} tenants moved after removing 1 of 3 instances ({per:?})",
        moved.len(),
        tenants.len()
    );
    assert!(
        (50..=150).contains(&moved.len()),
        "about a third of the keys move: {}",
        moved.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn consistent_hash_on_user_pins_each_user_to_one_instance() {
    let stack = Stack::new()
        .data_planes(1)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"));
    let mut orders = get_upstream(&stack, "orders").await;
    orders.lb_policy = LbPolicy::ConsistentHash as i32;
    orders.hash_on = HashOn::User as i32;
    upsert_upstream_synced(&stack, orders).await.unwrap();
    // The demo's /api/orders allows 20 requests a minute per user; this route has no limit.
    upsert_route_synced(
        &stack,
        Route {
            name: "pinned".into(),
            path_prefix: "/pinned/orders".into(),
            upstream: "orders".into(),
            rewrite_prefix: "/orders".into(),
            auth: AuthMode::AuthJwt as i32,
            ..Route::default()
        },
    )
    .await
    .unwrap();
    let gw = stack.gateways()[0].clone();
    let http = client();
    for (user, password) in [("alice", "wonderland"), ("bob", "builder")] {
        let token = login(&stack.auth_url(), user, password).await.unwrap();
        let mut seen = BTreeMap::<String, usize>::new();
        for i in 0..40 {
            let r = http
                .get(format!("{gw}/pinned/orders/{i}"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let who = instance_of(&r);
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["headers"]["x-user-id"], user);
            *seen.entry(who).or_default() += 1;
        }
        assert_eq!(seen.len(), 1, "{user} must stay on one instance: {seen:?}");
    }
    // Unauthenticated requests never reach the balancer on this route.
    let r = http
        .get(format!("{gw}/pinned/orders/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// The upstream `name` in the data plane's `/health/load-balancer`.
async fn load_balancer_view(admin: &str, name: &str) -> Result<Value, String> {
    let view: Value = client()
        .get(format!("{admin}/health/load-balancer"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    view["upstreams"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == name))
        .cloned()
        .ok_or_else(|| format!("no upstream {name} in {view}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn dns_discovery_brings_a_local_name_into_service() {
    let stack = start_without_auth(&[]).await;
    let port = stack.ports().orders_1;
    let member = format!("127.0.0.1:{port}");
    // `localhost` may also resolve to ::1, where nothing listens: health
    // checks take such a member out of service.
    let found = Upstream {
        name: "found".into(),
        discovery: Some(DnsDiscovery {
            dns_name: "localhost".into(),
            port: u32::from(port),
            refresh_ms: 500,
        }),
        health_check: Some(HealthCheck {
            path: "/health".into(),
            interval_ms: 500,
            timeout_ms: 400,
            unhealthy_threshold: 1,
            healthy_threshold: 1,
        }),
        lb_policy: LbPolicy::LeastRequest as i32,
        ..Default::default()
    };
    upsert_upstream_synced(&stack, found).await.unwrap();
    upsert_route_synced(&stack, open_route("found", "/found", "found", "/orders"))
        .await
        .unwrap();

    // The ops view lists the discovered member with its state.
    let admin = stack.gateway_admins()[0].clone();
    let view = poll(
        SOON,
        "the discovered member in /health/load-balancer",
        || {
            let admin = admin.clone();
            let member = member.clone();
            async move {
                let u = load_balancer_view(&admin, "found").await?;
                let listed = u["instances"].as_array().is_some_and(|i| {
                    i.iter()
                        .any(|i| i["id"] == member.as_str() && i["available"] == true)
                });
                if listed { Ok(u) } else { Err(u.to_string()) }
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(view["policy"], "least_request");
    assert_eq!(view["discovery"]["dns_name"], "localhost");
    assert_eq!(view["discovery"]["port"], u64::from(port));
    assert_eq!(view["discovery"]["refresh_ms"], 500);
    assert!(view["discovery"]["last_error"].is_null(), "{view}");
    let addresses = view["discovery"]["addresses"].as_array().unwrap();
    assert!(addresses.iter().any(|a| a == member.as_str()), "{view}");
    let instance = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == member.as_str())
        .unwrap();
    assert_eq!(instance["url"], format!("http://{member}"));
    assert_eq!(instance["breaker"], "closed");

    // And it takes traffic.
    let http = client();
    for i in 0..10 {
        let r = http
            .get(format!("{}/found/{i}", stack.gateways()[0]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(instance_of(&r), "orders-1");
    }

    // The member is in the metrics under its derived id.
    let metrics = client()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!("upstream=\"found\",instance=\"{member}\"")),
        "metrics must name the member"
    );
}
