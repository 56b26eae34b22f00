//! Black-box suite of traffic mirroring (`Route.mirror`) and outlier
//! detection (`Upstream.outlier_detection`), issue 29, against real
//! processes started by the devstack library. Shadow and extra instances are
//! mock-service servers started in the test process on their own ports.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use devstack::Stack;
use gateway_proto::v1::{
    AuthMode, CircuitBreaker, GetUpstreamRequest, HeaderTransform, Instance, Mirror,
    OutlierDetection, Route, Upstream,
};
use gateway_telemetry::Tracer;
use gateway_tests::{
    client, create_api_key_synced, header, metric_sample, mock_requests, one_data_plane,
    open_route, poll, upsert_route_synced, upsert_upstream_synced,
};
use mock_service::config::{MockConfig, Service};
use serde_json::Value;
use tokio::sync::oneshot;

/// Deadline for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);

/// A mock-service `orders` instance served from this test process.
struct LocalMock {
    port: u16,
    _stop: oneshot::Sender<()>,
}

impl LocalMock {
    async fn start(id: &str, fail_rate: f64, delay: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let config = MockConfig::new(Service::Orders, id, fail_rate)
            .unwrap()
            .with_delay(delay);
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(mock_service::server::serve(
            listener,
            config,
            Tracer::disabled(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self { port, _stop: stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The mock's `GET /stats`: requests counted, and the last ones kept.
async fn stats(port: u16) -> Value {
    client()
        .get(format!("http://127.0.0.1:{port}/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Upstream `name` with one instance per `(id, url)`.
fn upstream(name: &str, instances: &[(&str, String)]) -> Upstream {
    Upstream {
        name: name.into(),
        instances: instances
            .iter()
            .map(|(id, url)| Instance {
                id: (*id).into(),
                url: url.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Route `name` on `/{name}` to the demo `orders` upstream (rewritten to
/// `/orders`), mirrored to `shadow` at `percent`.
fn mirrored(name: &str, percent: u32) -> Route {
    Route {
        mirror: Some(Mirror {
            upstream: "shadow".into(),
            percent,
            include_body: true,
            ..Default::default()
        }),
        ..open_route(name, &format!("/{name}"), "orders", "/orders")
    }
}

async fn mirror_count(ops: &str, route: &str, outcome: &str) -> f64 {
    let series =
        format!("gateway_mirror_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}}");
    metric_sample(ops, &series).await.unwrap()
}

/// Waits until the mirror counter of `route` for `outcome` is `want`.
async fn wait_mirror_count(ops: &str, route: &str, outcome: &str, want: f64) {
    poll(
        SOON,
        &format!("{outcome} copies of {route} = {want}"),
        || async {
            let n = mirror_count(ops, route, outcome).await;
            if n == want {
                Ok(())
            } else {
                Err(format!("{n}"))
            }
        },
    )
    .await
    .unwrap();
}

/// Issue 41, item 4: by default a copy carries no credential and no body, and
/// the route's deny list goes too; the primary gets everything.
#[tokio::test(flavor = "multi_thread")]
async fn copies_carry_no_credentials_no_body_by_default_and_no_denied_header() {
    let stack = one_data_plane(&[]).await;
    let ops = &stack.gateway_admins()[0];
    let shadow = LocalMock::start("shadow-1", 0.0, Duration::ZERO).await;
    upsert_upstream_synced(&stack, upstream("shadow", &[("shadow-1", shadow.url())]))
        .await
        .unwrap();
    let mut route = mirrored("bare", 100);
    let m = route.mirror.as_mut().unwrap();
    m.include_body = false;
    m.deny_headers = vec!["X-Trace-Secret".into()];
    upsert_route_synced(&stack, route).await.unwrap();
    let url = format!("{}/bare/7/notes", stack.gateways()[0]);
    let posted = client()
        .post(&url)
        .header("authorization", "Bearer user-token")
        .header("cookie", "session=s3cret")
        .header("x-api-key", "k3y")
        .header("x-trace-secret", "t0p")
        .header("x-kept", "yes")
        .body(vec![b'x'; 1000])
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 200);
    let primary: Value = posted.json().await.unwrap();
    assert_eq!(primary["received_bytes"], 1000, "{primary}");
    assert_eq!(primary["headers"]["cookie"], "session=s3cret", "{primary}");
    wait_mirror_count(ops, "bare", "sent", 1.0).await;
    let seen = stats(shadow.port).await;
    let copy = &seen["recent"][0];
    assert_eq!(copy["method"], "POST", "{copy}");
    assert_eq!(
        copy["body_bytes"], 0,
        "no body without include_body: {copy}"
    );
    let h = &copy["headers"];
    for gone in ["authorization", "cookie", "x-api-key", "x-trace-secret"] {
        assert!(h.get(gone).is_none(), "{gone} reached the shadow: {copy}");
    }
    assert_eq!(h["x-kept"], "yes", "{copy}");
    assert_eq!(h["x-gateway-mirror"], "1", "{copy}");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mirror_at_100_percent_copies_every_request_with_identity_body_and_marker() {
    let stack = one_data_plane(&[]).await;
    let ops = &stack.gateway_admins()[0];
    let shadow = LocalMock::start("shadow-1", 0.0, Duration::ZERO).await;
    upsert_upstream_synced(&stack, upstream("shadow", &[("shadow-1", shadow.url())]))
        .await
        .unwrap();
    let key = create_api_key_synced(&stack, "mirror-key", "user-42", "admin")
        .await
        .unwrap()
        .key;
    let route = Route {
        auth: AuthMode::AuthApiKey as i32,
        request_headers: Some(HeaderTransform {
            set: [("x-transformed".to_owned(), "yes".to_owned())].into(),
            ..Default::default()
        }),
        ..mirrored("shadowed", 100)
    };
    upsert_route_synced(&stack, route).await.unwrap();
    let url = format!("{}/shadowed", stack.gateways()[0]);
    let http = client();

    // Every caller gets the primary's answer; a client's own marker never passes.
    for i in 0..20 {
        let r = http
            .get(format!("{url}/{i}"))
            .header("x-api-key", &key)
            .header("x-gateway-mirror", "forged")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let who = header(&r, "x-instance-id").unwrap().to_owned();
        assert!(who.starts_with("orders-"), "answered by {who}");
        let body: Value = r.json().await.unwrap();
        assert!(body["headers"].get("x-gateway-mirror").is_none(), "{body}");
    }
    // A body under the cap is copied with the request.
    let posted = http
        .post(format!("{url}/7/notes"))
        .header("x-api-key", &key)
        .body(vec![b'x'; 1000])
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 200);
    assert_eq!(
        posted.json::<Value>().await.unwrap()["received_bytes"],
        1000
    );
    // A body over the cap (64 KiB) is not: the caller is served, the copy is counted as too large.
    let big = http
        .post(format!("{url}/8/notes"))
        .header("x-api-key", &key)
        .body(vec![b'y'; 100 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 200);
    assert_eq!(
        big.json::<Value>().await.unwrap()["received_bytes"],
        100 * 1024
    );

    wait_mirror_count(ops, "shadowed", "sent", 21.0).await;
    assert_eq!(mirror_count(ops, "shadowed", "body_too_large").await, 1.0);
    assert_eq!(mirror_count(ops, "shadowed", "shed").await, 0.0);
    assert_eq!(mirror_count(ops, "shadowed", "failed").await, 0.0);

    let seen = stats(shadow.port).await;
    assert_eq!(seen["requests"], 21, "{seen}");
    let recent = seen["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 21);
    for r in recent {
        let h = &r["headers"];
        assert_eq!(h["x-gateway-mirror"], "1", "{r}");
        assert_eq!(h["x-user-id"], "user-42", "{r}");
        assert_eq!(h["x-user-role"], "admin", "{r}");
        assert_eq!(h["x-api-key-name"], "mirror-key", "{r}");
        assert_eq!(h["x-transformed"], "yes", "{r}");
        assert!(
            h.get("x-api-key").is_none(),
            "the key itself is never copied: {r}"
        );
    }
    // Copies run in tasks of their own: they may arrive in any order.
    let mut gets: Vec<&str> = recent
        .iter()
        .filter(|r| r["method"] == "GET")
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    gets.sort_unstable();
    let mut want: Vec<String> = (0..20).map(|i| format!("/orders/{i}")).collect();
    want.sort_unstable();
    assert_eq!(gets, want, "rewritten like the primary's");
    let posts: Vec<&Value> = recent.iter().filter(|r| r["method"] == "POST").collect();
    assert_eq!(posts.len(), 1, "{recent:?}");
    assert_eq!(posts[0]["path"], "/orders/7/notes");
    assert_eq!(posts[0]["body_bytes"], 1000, "{:?}", posts[0]);
    // The primaries saw each request once, without the marker.
    let primaries = mock_requests(stack.ports().orders_1).await.unwrap()
        + mock_requests(stack.ports().orders_2).await.unwrap();
    assert_eq!(primaries, 22);
    stack.shutdown().await;
}

/// A chunked request body (no Content-Length) of `chunks` × `size` bytes.
fn chunked(chunks: usize, size: usize) -> reqwest::Body {
    let parts = (0..chunks).map(move |_| Ok::<_, std::io::Error>(vec![b'z'; size]));
    reqwest::Body::wrap_stream(futures::stream::iter(parts))
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_bodies_are_teed_up_to_the_cap_and_larger_ones_are_not_mirrored() {
    let stack = one_data_plane(&[]).await;
    let ops = &stack.gateway_admins()[0];
    let shadow = LocalMock::start("shadow-1", 0.0, Duration::ZERO).await;
    upsert_upstream_synced(&stack, upstream("shadow", &[("shadow-1", shadow.url())]))
        .await
        .unwrap();
    upsert_route_synced(&stack, mirrored("chunked", 100))
        .await
        .unwrap();
    let url = format!("{}/chunked/1/notes", stack.gateways()[0]);
    let http = client();
    // 3 KiB in three chunks: the size is known only at the end, the copy leaves then.
    let small = http.post(&url).body(chunked(3, 1024)).send().await.unwrap();
    assert_eq!(
        small.json::<Value>().await.unwrap()["received_bytes"],
        3 * 1024
    );
    // 160 KiB: the tee gives up past 64 KiB while the primary gets every byte.
    let large = http
        .post(&url)
        .body(chunked(20, 8192))
        .send()
        .await
        .unwrap();
    assert_eq!(
        large.json::<Value>().await.unwrap()["received_bytes"],
        20 * 8192
    );
    wait_mirror_count(ops, "chunked", "sent", 1.0).await;
    wait_mirror_count(ops, "chunked", "body_too_large", 1.0).await;
    let seen = stats(shadow.port).await;
    assert_eq!(seen["requests"], 1, "{seen}");
    assert_eq!(seen["recent"][0]["body_bytes"], 3 * 1024, "{seen}");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mirror_at_50_percent_copies_about_half() {
    let stack = one_data_plane(&[]).await;
    let ops = &stack.gateway_admins()[0];
    let shadow = LocalMock::start("shadow-1", 0.0, Duration::ZERO).await;
    upsert_upstream_synced(&stack, upstream("shadow", &[("shadow-1", shadow.url())]))
        .await
        .unwrap();
    upsert_route_synced(&stack, mirrored("half", 50))
        .await
        .unwrap();
    let url = format!("{}/half/1", stack.gateways()[0]);
    let http = client();
    const N: u32 = 400;
    for _ in 0..N {
        assert_eq!(http.get(&url).send().await.unwrap().status(), 200);
    }
    // Binomial(400, 0.5): sd 10; the tolerance, ±15 points (±60), is 6 sd.
    let sent = poll(SOON, "copies settled", || async {
        let n = mirror_count(ops, "half", "sent").await;
        let at_shadow = stats(shadow.port).await["requests"].as_f64().unwrap();
        if n == at_shadow {
            Ok(n)
        } else {
            Err(format!("{n} counted, {at_shadow} at the shadow"))
        }
    })
    .await
    .unwrap();
    let share = sent / f64::from(N);
    println!("mirrored {sent} of {N} ({share:.3}) at percent 50");
    assert!((0.35..=0.65).contains(&share), "{sent} of {N}");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_mirror_never_slows_the_caller_and_is_shed_past_the_cap() {
    let stack = one_data_plane(&["--mirror-max-in-flight", "4"]).await;
    let ops = &stack.gateway_admins()[0];
    // The shadow answers after a minute: a copy holds its slot until the route timeout.
    let shadow = LocalMock::start("shadow-1", 0.0, Duration::from_secs(60)).await;
    upsert_upstream_synced(&stack, upstream("shadow", &[("shadow-1", shadow.url())]))
        .await
        .unwrap();
    let route = Route {
        timeout_ms: 50_000,
        ..mirrored("hang", 100)
    };
    upsert_route_synced(&stack, route).await.unwrap();
    let url = format!("{}/hang/1", stack.gateways()[0]);
    let http = client();
    let started = tokio::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(http.get(&url).send().await.unwrap().status(), 200);
    }
    // Not a timing budget: one copy's answer takes 60 s, so callers that waited
    // for even one of them could not all be done before it.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the callers waited for the mirror: {:?}",
        started.elapsed()
    );
    wait_mirror_count(ops, "hang", "shed", 16.0).await;
    assert_eq!(
        metric_sample(ops, "gateway_mirror_in_flight")
            .await
            .unwrap(),
        4.0
    );
    assert_eq!(mirror_count(ops, "hang", "sent").await, 0.0);
    poll(SOON, "4 copies at the shadow", || async {
        let n = stats(shadow.port).await["requests"].as_u64().unwrap();
        if n == 4 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await
    .unwrap();
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_mirror_never_opens_the_primarys_breakers() {
    let stack = one_data_plane(&[]).await;
    let ops = &stack.gateway_admins()[0];
    let shadow = LocalMock::start("shadow-1", 1.0, Duration::ZERO).await;
    // Its 500s count as breaker failures only with count_5xx (issue 41).
    let shadow_upstream = Upstream {
        circuit_breaker: Some(CircuitBreaker {
            failure_threshold: 5,
            reset_timeout_ms: 10_000,
            half_open_max_requests: 1,
            count_5xx: true,
            ..Default::default()
        }),
        ..upstream("shadow", &[("shadow-1", shadow.url())])
    };
    upsert_upstream_synced(&stack, shadow_upstream)
        .await
        .unwrap();
    upsert_route_synced(&stack, mirrored("broken", 100))
        .await
        .unwrap();
    let url = format!("{}/broken/1", stack.gateways()[0]);
    let http = client();
    for _ in 0..30 {
        assert_eq!(http.get(&url).send().await.unwrap().status(), 200);
    }
    wait_mirror_count(ops, "broken", "failed", 30.0).await;
    let breakers: Value = http
        .get(format!("{ops}/health/circuit-breakers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let by_upstream: BTreeMap<String, Value> = breakers["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["name"].as_str().unwrap().to_owned(), u.clone()))
        .collect();
    for i in by_upstream["orders"]["instances"].as_array().unwrap() {
        assert_eq!(i["state"], "closed", "{i}");
        assert_eq!(i["consecutive_failures"], 0, "{i}");
    }
    // The shadow's own breaker did see the failures (5 in a row open it).
    assert_eq!(
        by_upstream["shadow"]["instances"][0]["state"], "open",
        "{breakers}"
    );
    stack.shutdown().await;
}

/// The `/health/load-balancer` instances of upstream `name`, by id.
async fn balancer_view(ops: &str, name: &str) -> BTreeMap<String, Value> {
    let view: Value = client()
        .get(format!("{ops}/health/load-balancer"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let u = view["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .unwrap()
        .clone();
    u["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["id"].as_str().unwrap().to_owned(), i.clone()))
        .collect()
}

fn ejected(view: &BTreeMap<String, Value>) -> Vec<String> {
    view.iter()
        .filter(|(_, i)| !i["ejected_for_ms"].is_null())
        .map(|(id, _)| id.clone())
        .collect()
}

/// An upstream over `instances` with outlier detection (30 % of at least 10
/// attempts in 10 s; `ejection_ms`; 50 %) and a breaker that stays out of the way.
fn flaky(name: &str, instances: &[(&str, String)], ejection_ms: u32) -> Upstream {
    Upstream {
        circuit_breaker: Some(CircuitBreaker {
            failure_threshold: 1000,
            reset_timeout_ms: 1000,
            half_open_max_requests: 1,
            ..Default::default()
        }),
        outlier_detection: Some(OutlierDetection {
            failure_rate_percent: 30,
            min_requests: 10,
            window_ms: 10_000,
            ejection_ms,
            max_ejection_percent: 50,
        }),
        ..upstream(name, instances)
    }
}

/// Sends GETs to `url` in batches of 10 until `done` holds for the
/// upstream's balancer view; returns that view.
async fn drive_until(
    url: &str,
    ops: &str,
    upstream: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> BTreeMap<String, Value> {
    let http = client();
    poll(SOON, what, || async {
        for _ in 0..10 {
            http.get(url).send().await.map_err(|e| e.to_string())?;
        }
        let view = balancer_view(ops, upstream).await;
        if done(&view) {
            Ok(view)
        } else {
            Err(format!("{view:?}"))
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_failing_half_its_requests_is_ejected_comes_back_and_is_ejected_for_longer() {
    // orders-1 (devstack) fails half of its requests; orders-2 never does.
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .env("orders-1", "FAIL_RATE", "0.5")
        .start()
        .await
        .unwrap();
    let ops = &stack.gateway_admins()[0];
    let p = stack.ports();
    let instances = [
        ("orders-1", format!("http://127.0.0.1:{}", p.orders_1)),
        ("orders-2", format!("http://127.0.0.1:{}", p.orders_2)),
    ];
    upsert_upstream_synced(&stack, flaky("flaky", &instances, 3_000))
        .await
        .unwrap();
    upsert_route_synced(&stack, open_route("flaky", "/flaky", "flaky", "/orders"))
        .await
        .unwrap();
    let url = format!("{}/flaky/1", stack.gateways()[0]);

    let view = drive_until(&url, ops, "flaky", "orders-1 ejected", |v| {
        ejected(v) == ["orders-1"]
    })
    .await;
    assert_eq!(view["orders-1"]["available"], false);
    assert_eq!(view["orders-1"]["ejections"], 1);
    assert!(view["orders-1"]["ejected_for_ms"].as_u64().unwrap() <= 3_000);
    // While it is out, every request goes to orders-2 (and none fails).
    let http = client();
    let mut answered = 0;
    for _ in 0..20 {
        let r = http.get(&url).send().await.unwrap();
        if balancer_view(ops, "flaky").await["orders-1"]["ejected_for_ms"].is_null() {
            break; // back already: the rest proves nothing
        }
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-instance-id"), Some("orders-2"));
        answered += 1;
    }
    assert!(answered >= 10, "only {answered} requests while ejected");
    let labels = "upstream=\"flaky\",instance=\"orders-1\"";
    assert_eq!(
        metric_sample(ops, &format!("gateway_outlier_ejections_total{{{labels}}}"))
            .await
            .unwrap(),
        1.0
    );

    // Back after ejection_ms.
    poll(SOON, "orders-1 back in service", || async {
        let v = balancer_view(ops, "flaky").await;
        if ejected(&v).is_empty() {
            Ok(())
        } else {
            Err(format!("{v:?}"))
        }
    })
    .await
    .unwrap();
    assert_eq!(
        metric_sample(ops, &format!("gateway_outlier_ejected{{{labels}}}"))
            .await
            .unwrap(),
        0.0
    );
    // Failing again at once: ejected again, for twice as long (6 s).
    let view = drive_until(&url, ops, "flaky", "orders-1 ejected again", |v| {
        v["orders-1"]["ejections"] == 2
    })
    .await;
    let left = view["orders-1"]["ejected_for_ms"].as_u64().unwrap();
    assert!(
        left > 3_000 && left <= 6_000,
        "second ejection: {left} ms left"
    );
    assert_eq!(
        metric_sample(ops, &format!("gateway_outlier_ejected{{{labels}}}"))
            .await
            .unwrap(),
        1.0
    );
    // The log line is written by a non-blocking writer: wait for it, with a deadline.
    poll(
        SOON,
        "the second ejection logged with its length",
        || async {
            let log = stack.log_tail("data-plane-1", 400);
            if log.contains("ejection_ms=6000") || log.contains("\"ejection_ms\":6000") {
                Ok(())
            } else {
                Err("not in the last 400 lines yet".to_owned())
            }
        },
    )
    .await
    .unwrap();
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_ejection_percent_keeps_a_second_failing_instance_in_service() {
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .env("orders-1", "FAIL_RATE", "0.5")
        .start()
        .await
        .unwrap();
    let ops = &stack.gateway_admins()[0];
    let p = stack.ports();
    let third = LocalMock::start("orders-3", 0.5, Duration::ZERO).await;
    // Two failing instances of three, at most 50 % ejected: 1.5 rounds down to one.
    let instances = [
        ("orders-1", format!("http://127.0.0.1:{}", p.orders_1)),
        ("orders-2", format!("http://127.0.0.1:{}", p.orders_2)),
        ("orders-3", third.url()),
    ];
    upsert_upstream_synced(&stack, flaky("flaky3", &instances, 600_000))
        .await
        .unwrap();
    upsert_route_synced(&stack, open_route("flaky3", "/flaky3", "flaky3", "/orders"))
        .await
        .unwrap();
    let url = format!("{}/flaky3/1", stack.gateways()[0]);
    let view = drive_until(&url, ops, "flaky3", "one failing instance ejected", |v| {
        ejected(v).len() == 1
    })
    .await;
    let out = ejected(&view).remove(0);
    assert_ne!(out, "orders-2", "the healthy one is never ejected");
    let other = if out == "orders-1" {
        "orders-3"
    } else {
        "orders-1"
    };
    // Long after the other failing instance passed the threshold too, it stays in service.
    let http = client();
    let mut by = BTreeMap::<String, u32>::new();
    for _ in 0..100 {
        let r = http.get(&url).send().await.unwrap();
        *by.entry(header(&r, "x-instance-id").unwrap().to_owned())
            .or_default() += 1;
    }
    let view = balancer_view(ops, "flaky3").await;
    assert_eq!(ejected(&view), std::slice::from_ref(&out), "{view:?}");
    assert_eq!(view[other]["available"], true);
    assert!(
        !by.contains_key(&out),
        "the ejected one got traffic: {by:?}"
    );
    assert!(by.get(other).is_some_and(|n| *n >= 30), "{by:?}");
    assert!(by.get("orders-2").is_some_and(|n| *n >= 30), "{by:?}");
    let labels = format!("upstream=\"flaky3\",instance=\"{other}\"");
    assert_eq!(
        metric_sample(ops, &format!("gateway_outlier_ejections_total{{{labels}}}"))
            .await
            .unwrap(),
        0.0
    );
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_mirror_and_outlier_settings_are_refused_with_their_reason() {
    let stack = one_data_plane(&[]).await;
    let admin = stack.admin_client().await;
    let mut orders = admin
        .clone()
        .get_upstream(GetUpstreamRequest {
            name: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    orders.outlier_detection = Some(OutlierDetection {
        failure_rate_percent: 0,
        min_requests: 10,
        window_ms: 10_000,
        ejection_ms: 1_000,
        max_ejection_percent: 50,
    });
    let err = upsert_upstream_synced(&stack, orders).await.unwrap_err();
    let err = format!("{err:#}");
    assert!(err.contains("invalid argument"), "{err}");
    assert!(
        err.contains("outlier_detection.failure_rate_percent must be 1 to 100 (got 0)"),
        "{err}"
    );
    let err = upsert_route_synced(&stack, mirrored("nowhere", 10))
        .await
        .unwrap_err();
    let err = format!("{err:#}");
    assert!(err.contains("invalid argument"), "{err}");
    assert!(
        err.contains("nowhere") && err.contains("mirror.upstream"),
        "{err}"
    );
    assert!(err.contains("does not exist"), "{err}");
    stack.shutdown().await;
}
