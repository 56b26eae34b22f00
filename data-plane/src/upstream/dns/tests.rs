//! Discovery with an injected resolver, under `tokio::time::pause`.

use super::*;
use crate::app::runtime::{Applied, Runtime};
use crate::upstream::InstanceState;
use gateway_proto::v1::{ConfigSnapshot, HealthCheck, Instance, Route};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Answers from a table the test edits; counts the questions.
#[derive(Default)]
struct FakeResolver {
    answers: Mutex<HashMap<String, Result<Vec<SocketAddr>, String>>>,
    calls: AtomicUsize,
}

impl FakeResolver {
    fn set(&self, host: &str, addrs: &[&str]) {
        let addrs = addrs.iter().map(|a| a.parse().unwrap()).collect();
        self.answers.lock().insert(host.to_owned(), Ok(addrs));
    }

    fn fail(&self, host: &str) {
        self.answers
            .lock()
            .insert(host.to_owned(), Err("SERVFAIL".into()));
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Resolver for FakeResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = self.answers.lock().get(host).cloned();
        Box::pin(async move {
            match answer {
                Some(Ok(addrs)) => Ok(addrs
                    .into_iter()
                    .map(|mut a: SocketAddr| {
                        a.set_port(port);
                        a
                    })
                    .collect()),
                Some(Err(e)) => Err(io::Error::other(e)),
                None => Err(io::Error::new(io::ErrorKind::NotFound, "NXDOMAIN")),
            }
        })
    }
}

const REFRESH: Duration = Duration::from_millis(1000);

fn discovering(name: &str, dns_name: &str) -> Upstream {
    Upstream {
        name: name.into(),
        discovery: Some(DnsDiscovery {
            dns_name: dns_name.into(),
            port: 7002,
            refresh_ms: REFRESH.as_millis() as u32,
        }),
        ..Default::default()
    }
}

fn snapshot(version: u64, upstreams: Vec<Upstream>) -> ConfigSnapshot {
    let routes = upstreams
        .iter()
        .map(|u| Route {
            name: u.name.clone(),
            path_prefix: format!("/{}", u.name),
            upstream: u.name.clone(),
            ..Default::default()
        })
        .collect();
    ConfigSnapshot {
        version,
        hash: format!("h{version}"),
        routes,
        upstreams,
        ..Default::default()
    }
}

fn runtime(resolver: &Arc<FakeResolver>) -> Arc<Runtime> {
    Arc::new(
        Runtime::new(None, gateway_transport::pool::PoolSettings::default())
            .with_resolver(resolver.clone()),
    )
}

/// Instance ids of `upstream` in the current snapshot.
fn ids(rt: &Runtime, upstream: &str) -> Vec<String> {
    instances(rt, upstream)
        .iter()
        .map(|i| i.id.to_string())
        .collect()
}

fn instances(rt: &Runtime, upstream: &str) -> Vec<Arc<InstanceState>> {
    let cfg = rt.config.load();
    let u = cfg.upstreams.iter().find(|u| &*u.name == upstream).unwrap();
    u.instances.clone()
}

/// Lets every ready task run (paused time does not move).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Advances paused time past one refresh and lets the follower recompile.
/// The recompile runs on the blocking pool; paused time does not advance
/// while it does, so a few 1 ms sleeps (far below the refresh) cover it.
async fn next_refresh() {
    tokio::time::sleep(REFRESH + Duration::from_millis(1)).await;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_name_is_resolved_before_its_snapshot_goes_live() {
    let resolver = Arc::new(FakeResolver::default());
    resolver.set("orders", &["10.0.0.2:1", "10.0.0.1:1", "10.0.0.1:1"]);
    let rt = runtime(&resolver);
    let applied = rt
        .apply(snapshot(1, vec![discovering("orders", "orders")]), false)
        .await
        .unwrap();
    assert_eq!(applied, Applied::Updated);
    // Sorted, without duplicates, with the configured port; id = ADDRESS:port.
    assert_eq!(ids(&rt, "orders"), ["10.0.0.1:7002", "10.0.0.2:7002"]);
    let i = &instances(&rt, "orders")[0];
    assert_eq!(&*i.key.url, "http://10.0.0.1:7002");
    assert_eq!(i.pool.authority(), "10.0.0.1:7002");
    assert_eq!(rt.discovery.task_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn members_are_added_and_removed_and_stayers_keep_their_state() {
    let resolver = Arc::new(FakeResolver::default());
    resolver.set("orders", &["10.0.0.1:0", "10.0.0.2:0"]);
    let rt = runtime(&resolver);
    let follower = tokio::spawn(rt.clone().follow_discovery());
    let mut up = discovering("orders", "orders");
    // The checks' first probes go to addresses nothing serves: depending on the
    // host's network they fail at once or hang. Two failures are needed to mark
    // an instance down and the next probe is an hour away, so health here is
    // only what the test sets.
    up.health_check = Some(HealthCheck {
        path: "/health".into(),
        interval_ms: 3_600_000,
        timeout_ms: 1000,
        unhealthy_threshold: 2,
        healthy_threshold: 1,
    });
    rt.apply(snapshot(1, vec![up]), false).await.unwrap();
    let before = instances(&rt, "orders");
    assert_eq!(rt.health.task_count(), 2);
    // State worth keeping: .2 is unhealthy and has a request in flight.
    before[1].set_healthy(false);
    let in_flight = before[1].start_request();

    // .1 vanishes, .3 appears, .2 stays.
    resolver.set("orders", &["10.0.0.3:0", "10.0.0.2:0"]);
    next_refresh().await;
    assert_eq!(ids(&rt, "orders"), ["10.0.0.2:7002", "10.0.0.3:7002"]);
    let after = instances(&rt, "orders");
    assert!(
        Arc::ptr_eq(&before[1], &after[0]),
        "the stayer keeps its state"
    );
    assert!(!after[0].is_healthy() && after[0].in_flight() == 1);
    assert!(
        after[1].is_healthy() && after[1].in_flight() == 0,
        "fresh state"
    );
    // Health checks follow the members: .1's task stopped, .3's started.
    assert_eq!(rt.health.task_count(), 2);
    // Same configuration version: only the members changed.
    assert_eq!(rt.config.load().version, 1);
    drop(in_flight);
    assert_eq!(after[0].in_flight(), 0);
    follower.abort();
}

#[tokio::test(start_paused = true)]
async fn a_vanished_member_drains() {
    let resolver = Arc::new(FakeResolver::default());
    resolver.set("orders", &["10.0.0.1:0", "10.0.0.2:0"]);
    let rt = runtime(&resolver);
    let follower = tokio::spawn(rt.clone().follow_discovery());
    rt.apply(snapshot(1, vec![discovering("orders", "orders")]), false)
        .await
        .unwrap();
    // A request in progress on .1 holds the snapshot it started with.
    let old = rt.config.load();
    let gone = old.upstreams[0].instances[0].clone();
    let guard = gone.start_request();

    resolver.set("orders", &["10.0.0.2:0"]);
    next_refresh().await;
    let now = rt.config.load();
    // New requests cannot reach .1 any more ...
    assert_eq!(ids(&rt, "orders"), ["10.0.0.2:7002"]);
    for _ in 0..10 {
        let p = crate::upstream::balancer::pick(
            &now.upstreams[0],
            crate::upstream::balancer::Affinity::NONE,
            None,
        );
        assert_eq!(&*p.unwrap().instance.id, "10.0.0.2:7002");
    }
    // ... while the one in flight still has its instance (pool and all).
    assert_eq!(gone.in_flight(), 1);
    assert_eq!(&*old.upstreams[0].instances[0].id, "10.0.0.1:7002");
    drop(guard);
    follower.abort();
}

#[tokio::test(start_paused = true)]
async fn a_resolution_failure_keeps_the_last_good_set() {
    let resolver = Arc::new(FakeResolver::default());
    resolver.set("orders", &["10.0.0.1:0", "10.0.0.2:0"]);
    let rt = runtime(&resolver);
    let follower = tokio::spawn(rt.clone().follow_discovery());
    rt.apply(snapshot(1, vec![discovering("orders", "orders")]), false)
        .await
        .unwrap();
    let before = instances(&rt, "orders");

    resolver.fail("orders");
    next_refresh().await;
    assert_eq!(ids(&rt, "orders"), ["10.0.0.1:7002", "10.0.0.2:7002"]);
    assert!(Arc::ptr_eq(&before[0], &instances(&rt, "orders")[0]));
    let m = rt.discovery.members();
    assert_eq!(
        m.get("orders").unwrap().last_error.as_deref(),
        Some("SERVFAIL")
    );
    assert_eq!(m.addrs("orders").len(), 2);

    // An empty answer is treated the same way.
    resolver.set("orders", &[]);
    next_refresh().await;
    assert_eq!(ids(&rt, "orders").len(), 2);
    assert!(
        rt.discovery
            .members()
            .get("orders")
            .unwrap()
            .last_error
            .as_deref()
            == Some("no usable A or AAAA records")
    );

    // Working again: the error clears and changes apply.
    resolver.set("orders", &["10.0.0.2:0"]);
    next_refresh().await;
    assert_eq!(ids(&rt, "orders"), ["10.0.0.2:7002"]);
    assert!(
        rt.discovery
            .members()
            .get("orders")
            .unwrap()
            .last_error
            .is_none()
    );
    follower.abort();
}

#[tokio::test(start_paused = true)]
async fn a_name_that_does_not_resolve_yet_joins_when_it_does() {
    let resolver = Arc::new(FakeResolver::default());
    let rt = runtime(&resolver);
    let follower = tokio::spawn(rt.clone().follow_discovery());
    rt.apply(snapshot(1, vec![discovering("orders", "orders")]), false)
        .await
        .unwrap();
    assert!(
        ids(&rt, "orders").is_empty(),
        "no members: requests get 503"
    );
    resolver.set("orders", &["10.0.0.9:0"]);
    next_refresh().await;
    assert_eq!(ids(&rt, "orders"), ["10.0.0.9:7002"]);
    follower.abort();
}

#[tokio::test(start_paused = true)]
async fn refreshing_stops_when_the_upstream_leaves_the_configuration() {
    let resolver = Arc::new(FakeResolver::default());
    resolver.set("orders", &["10.0.0.1:0"]);
    resolver.set("users", &["10.0.1.1:0"]);
    let rt = runtime(&resolver);
    rt.apply(
        snapshot(
            1,
            vec![
                discovering("orders", "orders"),
                discovering("users", "users"),
            ],
        ),
        false,
    )
    .await
    .unwrap();
    assert_eq!(rt.discovery.task_count(), 2);
    tokio::time::sleep(REFRESH * 3 + Duration::from_millis(1)).await;
    settle().await;
    // One priming question each, then one per refresh each.
    assert_eq!(resolver.calls(), 2 + 2 * 3);

    // orders goes (its route too); users stays.
    let mut next = snapshot(2, vec![discovering("users", "users")]);
    next.hash = "h2".into();
    rt.apply(next, false).await.unwrap();
    assert_eq!(rt.discovery.task_count(), 1);
    assert!(rt.discovery.members().get("orders").is_none());
    let asked = resolver.calls();
    assert_eq!(asked, 8, "a known name is not resolved again on apply");
    tokio::time::sleep(REFRESH * 3 + Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(resolver.calls(), asked + 3, "only users is still resolved");

    // Static instances instead of discovery: its task stops as well.
    let mut listed = snapshot(3, vec![]);
    listed.upstreams = vec![Upstream {
        name: "users".into(),
        instances: vec![Instance {
            id: "users-1".into(),
            url: "http://127.0.0.1:7001".into(),
            ..Default::default()
        }],
        ..Default::default()
    }];
    listed.routes = snapshot(3, vec![discovering("users", "users")]).routes;
    rt.apply(listed, false).await.unwrap();
    assert_eq!(rt.discovery.task_count(), 0);
    let asked = resolver.calls();
    tokio::time::sleep(REFRESH * 3).await;
    settle().await;
    assert_eq!(resolver.calls(), asked);
}

#[tokio::test(start_paused = true)]
async fn a_changed_name_starts_over_and_a_changed_interval_keeps_the_members() {
    let resolver = Arc::new(FakeResolver::default());
    resolver.set("orders", &["10.0.0.1:0"]);
    resolver.set("orders-v2", &["10.0.2.1:0"]);
    let rt = runtime(&resolver);
    rt.apply(snapshot(1, vec![discovering("orders", "orders")]), false)
        .await
        .unwrap();
    let first = instances(&rt, "orders");

    // Another interval: same members, same state, no new question.
    let mut slower = discovering("orders", "orders");
    slower.discovery.as_mut().unwrap().refresh_ms = 5000;
    let asked = resolver.calls();
    rt.apply(snapshot(2, vec![slower]), false).await.unwrap();
    assert_eq!(resolver.calls(), asked);
    assert!(Arc::ptr_eq(&first[0], &instances(&rt, "orders")[0]));
    let m = rt.discovery.members();
    assert_eq!(
        m.get("orders").unwrap().target.refresh,
        Duration::from_secs(5)
    );

    // Another name: resolved at once, members replaced.
    rt.apply(snapshot(3, vec![discovering("orders", "orders-v2")]), false)
        .await
        .unwrap();
    assert_eq!(ids(&rt, "orders"), ["10.0.2.1:7002"]);
    assert_eq!(rt.discovery.task_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_configuration_changes_nothing() {
    let resolver = Arc::new(FakeResolver::default());
    resolver.set("orders", &["10.0.0.1:0"]);
    resolver.set("other", &["10.0.9.9:0"]);
    let rt = runtime(&resolver);
    rt.apply(snapshot(1, vec![discovering("orders", "orders")]), false)
        .await
        .unwrap();
    // Valid discovery, invalid route: NACKed; discovery keeps following v1.
    let mut bad = snapshot(2, vec![discovering("orders", "other")]);
    bad.routes[0].path_prefix = "nope".into();
    assert!(rt.apply(bad, false).await.is_err());
    assert_eq!(ids(&rt, "orders"), ["10.0.0.1:7002"]);
    let m = rt.discovery.members();
    assert_eq!(&*m.get("orders").unwrap().target.dns_name, "orders");
}

#[test]
fn scoped_ipv6_addresses_are_dropped_and_ports_forced() {
    let addrs = vec![
        "[fe80::1%2]:1".parse().unwrap(),
        "[fd00::5]:1".parse().unwrap(),
        "10.0.0.1:9".parse().unwrap(),
    ];
    let got: Vec<String> = normalise(addrs, 80)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(got, ["10.0.0.1:80", "[fd00::5]:80"]);
}

#[tokio::test]
async fn the_system_resolver_finds_localhost() {
    let addrs = SystemResolver.resolve("localhost", 7002).await.unwrap();
    assert!(
        addrs
            .iter()
            .any(|a| a.ip().is_loopback() && a.port() == 7002),
        "{addrs:?}"
    );
}
