//! Data planes and control planes on one Postgres (issue 28): a control
//! plane killed with SIGKILL while traffic flows. Its data planes move to
//! the survivor (`--control-plane A,B`), a route change made there reaches
//! every one of them, and no request fails. The data-plane registry is
//! shared: `ListDataPlanes` on either replica lists every data plane, and one
//! whose control plane died reads DISCONNECTED within the heartbeat timeout
//! until it reconnects, and is forgotten once it has been gone for an hour.
//!
//! Needs the workspace binaries built (`cargo build --workspace --bins`) and
//! Postgres (`initdb`, `pg_ctl`); `scripts/test` installs it.

#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod postgres;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use devstack::stack::AdminClient;
use gateway_proto::v1::{DataPlaneState, ListDataPlanesRequest, UpsertRouteRequest};
use gateway_tests::{client, open_route, poll};
use postgres::{ALICE, BOB, ControlPlane, DataPlane, Mock, PgServer, SOON, work_dir};

/// What the control plane promises (`control_plane::nodes::HEARTBEAT_TIMEOUT`,
/// 10 s), plus the heartbeat interval and room for a loaded machine.
const DISCONNECTED_WITHIN: Duration = Duration::from_secs(30);

/// The upstream `orders` at the mock, and `/orders` routed to it; returns the version.
async fn seed(admin: &mut AdminClient, mock: &Mock) -> anyhow::Result<u64> {
    admin.upsert_upstream(mock.orders_upstream()).await?;
    Ok(admin
        .upsert_route(UpsertRouteRequest {
            route: Some(open_route("orders", "/orders", "orders", "/orders")),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version)
}

/// Waits until `admin`'s ListDataPlanes shows each node in `expected` in its state (at `version`).
async fn wait_states(
    admin: &AdminClient,
    expected: &[(&str, DataPlaneState)],
    version: u64,
    within: Duration,
) -> anyhow::Result<()> {
    poll(within, "data-plane states", || {
        let mut admin = admin.clone();
        async move {
            let list = admin
                .list_data_planes(ListDataPlanesRequest {})
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            for (node, state) in expected {
                let Some(dp) = list.data_planes.iter().find(|d| d.node_id == *node) else {
                    return Err(format!("{node} not listed: {:?}", list.data_planes));
                };
                let synced_ok = *state != DataPlaneState::Synced || dp.acked_version == version;
                if dp.status != *state as i32
                    || !synced_ok
                    || dp.connected != (*state != DataPlaneState::Disconnected)
                {
                    return Err(format!("{node}: {dp:?}, want {state:?} at {version}"));
                }
            }
            Ok(())
        }
    })
    .await
}

/// Sends requests to every gateway in turn until `stop`; counts them and the failures.
fn traffic(
    gateways: Vec<String>,
    stop: Arc<AtomicBool>,
) -> (
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    tokio::task::JoinHandle<Vec<String>>,
) {
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, f) = (sent.clone(), failed.clone());
    let task = tokio::spawn(async move {
        let http = client();
        let mut errors = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for gw in &gateways {
                s.fetch_add(1, Ordering::Relaxed);
                match http.get(format!("{gw}/orders/1")).send().await {
                    Ok(r) if r.status() == 200 => {}
                    other => {
                        f.fetch_add(1, Ordering::Relaxed);
                        errors.push(format!("{gw}: {other:?}"));
                    }
                }
            }
        }
        errors
    });
    (sent, failed, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_planes_leave_a_killed_control_plane_for_the_survivor_without_a_failed_request()
-> anyhow::Result<()> {
    let pg = PgServer::start().await?;
    let dir = work_dir()?;
    let mock = Mock::start("orders", dir.path()).await?;
    let a = ControlPlane::start("cp-a", &pg.url(), dir.path(), None).await?;
    let version = seed(&mut a.admin(ALICE), &mock).await?;

    // B is not up yet, so every data plane settles on A whichever endpoint it tries first.
    let b_port = devstack::ports::free_port()?;
    let endpoints = [a.url(), format!("http://127.0.0.1:{b_port}")];
    let mut planes = Vec::new();
    for i in 1..=3 {
        planes.push(DataPlane::start(&format!("dp-{i}"), &endpoints, dir.path()).await?);
    }
    let mut a = a;
    let b = ControlPlane::start("cp-b", &pg.url(), dir.path(), Some(b_port)).await?;
    let on_b = b.admin(BOB);
    let names: Vec<String> = planes.iter().map(|p| p.node_id.clone()).collect();
    let synced: Vec<(&str, DataPlaneState)> = names
        .iter()
        .map(|n| (n.as_str(), DataPlaneState::Synced))
        .collect();
    // B lists the data planes connected to A.
    wait_states(&on_b, &synced, version, SOON).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let gateways: Vec<String> = planes.iter().map(DataPlane::url).collect();
    let (sent, failed, task) = traffic(gateways.clone(), stop.clone());
    poll(SOON, "traffic flowing", || {
        let sent = sent.load(Ordering::Relaxed);
        async move {
            if sent >= 30 {
                Ok(())
            } else {
                Err(format!("{sent} sent"))
            }
        }
    })
    .await?;

    a.proc.kill9().await?;

    // The route change is made on the survivor, and reaches every data plane.
    let moved = on_b
        .clone()
        .upsert_route(UpsertRouteRequest {
            route: Some(open_route("moved", "/moved", "orders", "/orders")),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    let http = client();
    for gw in &gateways {
        poll(SOON, &format!("{gw} serving /moved"), || {
            let url = format!("{gw}/moved/1");
            let http = http.clone();
            async move {
                match http.get(&url).send().await {
                    Ok(r) if r.status() == 200 => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await?;
    }
    wait_states(&on_b, &synced, moved, SOON).await?;

    stop.store(true, Ordering::Relaxed);
    let errors = task.await?;
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("failover: {sent} requests across the kill, {failed} failed");
    assert_eq!(failed, 0, "requests failed across the failover: {errors:?}");
    for p in &planes {
        assert!(
            p.proc
                .log_tail(400)
                .contains(&format!("config stream open url=http://127.0.0.1:{b_port}")),
            "{} never reached B:\n{}",
            p.node_id,
            p.proc.log_tail(20)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_lists_every_data_plane_and_a_dead_replicas_ones_turn_disconnected()
-> anyhow::Result<()> {
    let pg = PgServer::start().await?;
    let dir = work_dir()?;
    let mock = Mock::start("orders", dir.path()).await?;
    let mut a = ControlPlane::start("cp-a", &pg.url(), dir.path(), None).await?;
    let b = ControlPlane::start("cp-b", &pg.url(), dir.path(), None).await?;
    let version = seed(&mut a.admin(ALICE), &mock).await?;
    // Each data plane knows one replica only.
    let _on_a = DataPlane::start("dp-a", &[a.url()], dir.path()).await?;
    let _on_b = DataPlane::start("dp-b", &[b.url()], dir.path()).await?;
    let both = [
        ("dp-a", DataPlaneState::Synced),
        ("dp-b", DataPlaneState::Synced),
    ];
    for cp in [&a, &b] {
        wait_states(&cp.admin(ALICE), &both, version, SOON).await?;
    }

    // A dies without a word: its data plane reads DISCONNECTED on B once A's heartbeat is stale.
    let a_port = a.addr.port();
    a.proc.kill9().await?;
    let on_b = b.admin(BOB);
    wait_states(
        &on_b,
        &[
            ("dp-a", DataPlaneState::Disconnected),
            ("dp-b", DataPlaneState::Synced),
        ],
        version,
        DISCONNECTED_WITHIN,
    )
    .await?;

    // A comes back on its address: its data plane reconnects and reads SYNCED again on B.
    let a = ControlPlane::start("cp-a2", &pg.url(), dir.path(), Some(a_port)).await?;
    wait_states(&on_b, &both, version, Duration::from_secs(60)).await?;

    // A clean stop says so at once: no heartbeat timeout to wait out.
    let mut a = a;
    a.proc.terminate().await?;
    wait_states(
        &on_b,
        &[
            ("dp-a", DataPlaneState::Disconnected),
            ("dp-b", DataPlaneState::Synced),
        ],
        version,
        Duration::from_secs(8),
    )
    .await?;

    // A data plane gone for longer than FORGET_AFTER (an hour) is forgotten;
    // the connected one stays, however long ago its row was written.
    pg.psql("UPDATE data_planes SET updated_at = now() - interval '2 hours'")
        .await?;
    poll(SOON, "dp-a forgotten, dp-b kept", || {
        let mut on_b = on_b.clone();
        async move {
            let names: Vec<String> = on_b
                .list_data_planes(ListDataPlanesRequest {})
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
                .data_planes
                .into_iter()
                .map(|d| d.node_id)
                .collect();
            if names == ["dp-b"] {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        }
    })
    .await?;
    Ok(())
}
