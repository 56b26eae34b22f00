//! Black-box suite of traffic management (issue 29): weighted route splits
//! and canaries with stickiness and failover, instance weights, and routes
//! that match on headers, query parameters and cookies, against real
//! processes started by the devstack library.
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
    GetUpstreamRequest, HashOn, Instance, MatchMode, Matcher, Route, RouteMatch, SplitTarget,
    UpsertRouteRequest, Upstream,
};
use gateway_tests::{
    client, data_planes_without_auth, metric_sample, open_route, poll, upsert_route_synced,
    upsert_upstream_synced,
};

/// Deadline for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);

/// The demo configuration's `orders` upstream (instances orders-1 and orders-2).
async fn demo_orders(stack: &Stack) -> Upstream {
    stack
        .admin_client()
        .await
        .get_upstream(GetUpstreamRequest {
            name: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The demo's `orders` instances (orders-1, orders-2) as two upstreams of
/// one instance each, `stable` and `canary`, so the answering mock's
/// `X-Instance-Id` tells the side.
async fn stable_and_canary(stack: &Stack) {
    let orders = demo_orders(stack).await;
    for (name, instance) in [
        ("stable", &orders.instances[0]),
        ("canary", &orders.instances[1]),
    ] {
        let upstream = Upstream {
            name: name.into(),
            instances: vec![instance.clone()],
            ..Default::default()
        };
        upsert_upstream_synced(stack, upstream).await.unwrap();
    }
}

fn split_route(weights: [u32; 2]) -> Route {
    let mut r = open_route("shop", "/shop", "", "/orders");
    r.split = vec![
        SplitTarget {
            upstream: "stable".into(),
            weight: weights[0],
        },
        SplitTarget {
            upstream: "canary".into(),
            weight: weights[1],
        },
    ];
    r
}

/// Which mock instance answered (the mocks' `X-Instance-Id`): `orders-1`
/// is the stable side, `orders-2` the canary.
fn side(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-instance-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<none>")
        .to_owned()
}

/// Sends `total` GETs to `url` (each with `headers(i)`), 32 at a time;
/// returns how many each instance answered, by status.
async fn answers(
    url: &str,
    total: usize,
    headers: impl Fn(usize) -> Vec<(String, String)>,
) -> BTreeMap<(u16, String), usize> {
    let http = client();
    let got: Vec<(u16, String)> = futures::stream::iter(0..total)
        .map(|i| {
            let mut req = http.get(url);
            for (k, v) in headers(i) {
                req = req.header(k, v);
            }
            async move {
                let r = req.send().await.unwrap();
                (r.status().as_u16(), side(&r))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut counts = BTreeMap::new();
    for a in got {
        *counts.entry(a).or_default() += 1;
    }
    counts
}

fn ok(counts: &BTreeMap<(u16, String), usize>, who: &str) -> usize {
    counts.get(&(200, who.to_owned())).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_canary_split_follows_its_weights_on_every_replica() {
    let stack = data_planes_without_auth(2).await;
    stable_and_canary(&stack).await;

    // 95/5 over 10,000 requests through one replica: each replica walks the
    // weights in runs of 100, so the split is exact; the stated tolerance is
    // ±0.5 percentage points of the canary's share.
    upsert_route_synced(&stack, split_route([95, 5]))
        .await
        .unwrap();
    let url = format!("{}/shop/1", stack.gateways()[0]);
    let counts = answers(&url, 10_000, |_| Vec::new()).await;
    let canary = ok(&counts, "orders-2");
    assert_eq!(ok(&counts, "orders-1") + canary, 10_000, "{counts:?}");
    let share = canary as f64 / 10_000.0;
    println!("95/5 over 10,000 requests: canary share {share:.4} {counts:?}");
    assert!((share - 0.05).abs() <= 0.005, "{counts:?}");

    // 50/50, then 0/100: one UpsertRoute each, served by both replicas once synced.
    for (weights, want) in [([50, 50], 0.5), ([0, 100], 1.0)] {
        upsert_route_synced(&stack, split_route(weights))
            .await
            .unwrap();
        for gateway in stack.gateways() {
            let counts = answers(&format!("{gateway}/shop/1"), 1_000, |_| Vec::new()).await;
            let share = ok(&counts, "orders-2") as f64 / 1_000.0;
            println!("{weights:?} at {gateway}: canary share {share:.3}");
            assert!((share - want).abs() <= 0.01, "{weights:?}: {counts:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sticky_split_keeps_each_user_on_one_side() {
    let stack = data_planes_without_auth(2).await;
    stable_and_canary(&stack).await;
    let mut route = split_route([50, 50]);
    route.split_hash_on = HashOn::Header as i32;
    route.split_hash_header = "x-session".into();
    upsert_route_synced(&stack, route).await.unwrap();

    // 100 users, 5 requests each through each replica: one side per user, the same on both replicas.
    let mut sides: HashMap<String, String> = HashMap::new();
    for gateway in stack.gateways() {
        let http = client();
        for user in 0..100 {
            let session = format!("user-{user}");
            for _ in 0..5 {
                let r = http
                    .get(format!("{gateway}/shop/1"))
                    .header("x-session", &session)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let now = side(&r);
                let first = sides.entry(session.clone()).or_insert_with(|| now.clone());
                assert_eq!(*first, now, "{session} moved sides");
            }
        }
    }
    let on_canary = sides.values().filter(|s| *s == "orders-2").count();
    println!("sticky 50/50: {on_canary} of 100 users on the canary");
    assert!((25..=75).contains(&on_canary), "{on_canary}");

    // Moving weight to the canary moves users only onto it.
    let mut route = split_route([10, 90]);
    route.split_hash_on = HashOn::Header as i32;
    route.split_hash_header = "x-session".into();
    upsert_route_synced(&stack, route).await.unwrap();
    for (session, before) in &sides {
        let r = client()
            .get(format!("{}/shop/1", stack.gateways()[0]))
            .header("x-session", session)
            .send()
            .await
            .unwrap();
        if before == "orders-2" {
            assert_eq!(side(&r), "orders-2", "{session} left the canary");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_canary_with_every_breaker_open_hands_its_share_to_the_stable_side() {
    let stack = data_planes_without_auth(1).await;
    stable_and_canary(&stack).await;
    // The canary's one instance refuses connections; its breaker opens at the first failure.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let canary = Upstream {
        name: "canary".into(),
        instances: vec![Instance {
            id: "gone".into(),
            url: dead_url,
            ..Default::default()
        }],
        circuit_breaker: Some(gateway_proto::v1::CircuitBreaker {
            failure_threshold: 1,
            reset_timeout_ms: 600_000,
            half_open_max_requests: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    upsert_upstream_synced(&stack, canary).await.unwrap();
    upsert_route_synced(&stack, split_route([50, 50]))
        .await
        .unwrap();
    let gateway = &stack.gateways()[0];
    let url = format!("{gateway}/shop/1");

    // The first canary request fails (502) and opens its breaker.
    poll(SOON, "the canary's breaker to open", || {
        let url = url.clone();
        async move {
            let r = client().get(&url).send().await.map_err(|e| e.to_string())?;
            match r.status().as_u16() {
                502 => Ok(()),
                other => Err(format!("answered {other}")),
            }
        }
    })
    .await
    .unwrap();
    // From then on every request is served, by the stable side.
    let counts = answers(&url, 200, |_| Vec::new()).await;
    assert_eq!(ok(&counts, "orders-1"), 200, "{counts:?}");
    let ops = stack.gateway_admins()[0].clone();
    let failovers = metric_sample(&ops, "gateway_split_failovers_total{route=\"shop\"}")
        .await
        .unwrap();
    println!("failovers after 200 requests: {failovers}");
    assert!(failovers >= 90.0, "{failovers}");

    // split_fail_closed: the canary's share fails with 503 instead.
    let mut closed = split_route([50, 50]);
    closed.split_fail_closed = true;
    upsert_route_synced(&stack, closed).await.unwrap();
    let counts = answers(&url, 200, |_| Vec::new()).await;
    let refused = counts
        .iter()
        .filter(|((status, _), _)| *status == 503)
        .map(|(_, n)| n)
        .sum::<usize>();
    assert_eq!(refused, 100, "{counts:?}");
    assert_eq!(ok(&counts, "orders-1"), 100, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn instance_weights_share_an_upstream_unevenly() {
    let stack = data_planes_without_auth(1).await;
    let mut orders = demo_orders(&stack).await;
    orders.instances[0].weight = 3;
    orders.instances[1].weight = 1;
    upsert_upstream_synced(&stack, orders).await.unwrap();
    upsert_route_synced(
        &stack,
        open_route("open-orders", "/open/orders", "orders", "/orders"),
    )
    .await
    .unwrap();
    let url = format!("{}/open/orders/1", stack.gateways()[0]);
    let counts = answers(&url, 400, |_| Vec::new()).await;
    println!("weights 3:1 over 400 requests: {counts:?}");
    assert_eq!(ok(&counts, "orders-1"), 300, "{counts:?}");
    assert_eq!(ok(&counts, "orders-2"), 100, "{counts:?}");
}

fn matcher(name: &str, value: &str, mode: MatchMode) -> Matcher {
    Matcher {
        name: name.into(),
        value: value.into(),
        mode: mode as i32,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn routes_match_on_headers_query_and_cookies() {
    let stack = data_planes_without_auth(1).await;
    stable_and_canary(&stack).await;
    // API versioning by header: Accept-Version 2 → the canary ("orders-v2").
    upsert_route_synced(&stack, open_route("v1", "/api", "stable", "/orders"))
        .await
        .unwrap();
    let mut v2 = open_route("v2", "/api", "canary", "/orders");
    v2.r#match = Some(RouteMatch {
        headers: vec![matcher("Accept-Version", "2", MatchMode::Exact)],
        ..Default::default()
    });
    upsert_route_synced(&stack, v2).await.unwrap();
    // Per tenant, by query parameter and cookie together (two matchers beat one).
    let mut tenant = open_route("tenant-beta", "/api", "canary", "/orders");
    tenant.r#match = Some(RouteMatch {
        query: vec![matcher("tenant", "acme", MatchMode::Exact)],
        cookies: vec![matcher("beta", "", MatchMode::Present)],
        ..Default::default()
    });
    upsert_route_synced(&stack, tenant).await.unwrap();

    let gateway = &stack.gateways()[0];
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut req = client().get(format!("{gateway}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            side(&r)
        }
    };
    assert_eq!(get("/api/1", &[]).await, "orders-1");
    assert_eq!(get("/api/1", &[("accept-version", "2")]).await, "orders-2");
    assert_eq!(get("/api/1", &[("accept-version", "3")]).await, "orders-1");
    assert_eq!(
        get("/api/1?tenant=acme", &[("cookie", "a=1; beta=yes")]).await,
        "orders-2"
    );
    assert_eq!(get("/api/1?tenant=acme", &[]).await, "orders-1");
    assert_eq!(
        get("/api/1?tenant=other", &[("cookie", "beta=1")]).await,
        "orders-1"
    );

    // A tie one request could satisfy is refused with the reason.
    let mut tie = open_route("tie", "/api", "canary", "/orders");
    tie.r#match = Some(RouteMatch {
        headers: vec![matcher("x-debug", "", MatchMode::Present)],
        ..Default::default()
    });
    let refused = stack
        .admin_client()
        .await
        .upsert_route(UpsertRouteRequest {
            route: Some(tie),
            expected_version: None,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("with as many matchers (1)"),
        "{}",
        refused.message()
    );
}
