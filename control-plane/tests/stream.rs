//! StreamConfig and ListDataPlanes against the real control-plane process,
//! with tonic clients playing data planes.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use gateway_proto::v1::{
    ConfigRequest, DataPlaneState, GetConfigRequest, Instance, Route, UpsertRouteRequest,
    UpsertUpstreamRequest, Upstream,
};

fn upstream(name: &str) -> Upstream {
    Upstream {
        name: name.into(),
        instances: vec![Instance {
            id: format!("{name}-1"),
            url: "http://127.0.0.1:9001".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn route(name: &str) -> Route {
    Route {
        name: name.into(),
        path_prefix: format!("/api/{name}"),
        upstream: "users".into(),
        ..Default::default()
    }
}

async fn upsert_route(cp: &CpProcess, name: &str) -> u64 {
    cp.admin()
        .await
        .upsert_route(UpsertRouteRequest {
            route: Some(route(name)),
            expected_version: None,
        })
        .await
        .unwrap()
        .into_inner()
        .version
}

/// Version 1: upstream "users"; version 2: route "a".
async fn seeded(dir: &tempfile::TempDir) -> CpProcess {
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    let mut admin = cp.admin().await;
    admin
        .upsert_upstream(UpsertUpstreamRequest {
            upstream: Some(upstream("users")),
            expected_version: None,
        })
        .await
        .unwrap();
    assert_eq!(upsert_route(&cp, "a").await, 2);
    cp
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_gets_the_snapshot_on_connect_and_every_new_version() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded(&dir).await;
    let mut dp = FakeDataPlane::connect(&cp, "dp-1", "").await;

    let first = dp.next().await;
    assert_eq!(first.version, 2);
    assert_eq!(first.routes.len(), 1);
    assert_eq!(first.routes[0].name, "a");
    assert_eq!(first.upstreams[0].name, "users");
    assert!(!first.nonce.is_empty());
    let current = cp
        .admin()
        .await
        .get_config(GetConfigRequest { version: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.hash, current.hash);

    let status = wait_state(&cp, "dp-1", DataPlaneState::Stale).await;
    assert!(status.connected);
    assert_eq!(status.hostname, "test-host");
    assert_eq!(status.build_version, "test-1.0");

    assert_eq!(upsert_route(&cp, "b").await, 3);
    let second = dp.next().await;
    assert_eq!(second.version, 3);
    assert_eq!(second.routes.len(), 2);
    assert_ne!(second.nonce, first.nonce);
    assert_ne!(second.hash, first.hash);

    assert_eq!(upsert_route(&cp, "c").await, 4);
    assert_eq!(dp.next().await.version, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ack_makes_the_node_synced_until_the_next_version() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded(&dir).await;
    let mut dp = FakeDataPlane::connect(&cp, "dp-ack", "").await;
    let r = dp.next().await;
    dp.ack(&r).await;
    let s = wait_state(&cp, "dp-ack", DataPlaneState::Synced).await;
    assert_eq!(s.acked_version, 2);
    assert!(!s.last_seen.is_empty());

    upsert_route(&cp, "b").await;
    wait_state(&cp, "dp-ack", DataPlaneState::Stale).await;
    let r3 = dp.next().await;
    // An ACK quoting an old nonce is ignored; the right one counts.
    dp.send(ConfigRequest {
        version_info: "3".into(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    })
    .await;
    dp.ack(&r3).await;
    let s = wait_state(&cp, "dp-ack", DataPlaneState::Synced).await;
    assert_eq!(s.acked_version, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nack_is_recorded_and_that_version_is_never_resent() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded(&dir).await;
    let mut dp = FakeDataPlane::connect(&cp, "dp-nack", "").await;
    let v2 = dp.next().await;
    dp.ack(&v2).await;
    wait_state(&cp, "dp-nack", DataPlaneState::Synced).await;

    upsert_route(&cp, "b").await;
    let v3 = dp.next().await;
    assert_eq!(v3.version, 3);
    dp.nack(&v3, "2", "route \"b\": cannot compile").await;
    let s = wait_state(&cp, "dp-nack", DataPlaneState::Nacked).await;
    assert_eq!(s.last_nack_version, 3);
    assert_eq!(s.last_nack_error, "route \"b\": cannot compile");
    assert_eq!(s.acked_version, 2);

    // Reconnecting does not bring version 3 back either...
    drop(dp);
    wait_state(&cp, "dp-nack", DataPlaneState::Disconnected).await;
    let mut dp = FakeDataPlane::connect(&cp, "dp-nack", "2").await;
    wait_state(&cp, "dp-nack", DataPlaneState::Nacked).await;
    // ...but the next version is sent, and is the first thing the stream carries.
    assert_eq!(upsert_route(&cp, "c").await, 4);
    let v4 = dp.next().await;
    assert_eq!(v4.version, 4, "the NACKed version 3 was resent");
    dp.ack(&v4).await;
    let s = wait_state(&cp, "dp-nack", DataPlaneState::Synced).await;
    assert_eq!(s.last_nack_version, 3, "NACK history is kept");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_next_version_follows_a_nack_on_the_same_stream() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded(&dir).await;
    let mut dp = FakeDataPlane::connect(&cp, "dp-same", "").await;
    let v2 = dp.next().await;
    dp.nack(&v2, "", "bad").await;
    wait_state(&cp, "dp-same", DataPlaneState::Nacked).await;
    upsert_route(&cp, "b").await;
    assert_eq!(dp.next().await.version, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_stream_turns_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded(&dir).await;
    let mut dp = FakeDataPlane::connect(&cp, "dp-gone", "").await;
    let r = dp.next().await;
    dp.ack(&r).await;
    wait_state(&cp, "dp-gone", DataPlaneState::Synced).await;
    drop(dp);
    let s = wait_state(&cp, "dp-gone", DataPlaneState::Disconnected).await;
    assert!(!s.connected);
    assert_eq!(s.acked_version, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_already_serves_the_current_version_gets_only_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded(&dir).await;
    let mut dp = FakeDataPlane::connect(&cp, "dp-cached", "2").await;
    let s = wait_state(&cp, "dp-cached", DataPlaneState::Synced).await;
    assert_eq!(s.acked_version, 2);
    upsert_route(&cp, "b").await;
    assert_eq!(dp.next().await.version, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_control_plane_sends_version_zero_only_to_a_node_without_config() {
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    let mut fresh = FakeDataPlane::connect(&cp, "dp-fresh", "").await;
    let v0 = fresh.next().await;
    assert_eq!(v0.version, 0);
    assert!(v0.routes.is_empty() && v0.upstreams.is_empty());
    fresh.ack(&v0).await;
    wait_state(&cp, "dp-fresh", DataPlaneState::Synced).await;

    // A node serving a cached version 5 is not wiped by the empty config...
    let mut cached = FakeDataPlane::connect(&cp, "dp-cached", "5").await;
    wait_state(&cp, "dp-cached", DataPlaneState::Stale).await;
    // ...and gets the first real version.
    cp.admin()
        .await
        .upsert_upstream(UpsertUpstreamRequest {
            upstream: Some(upstream("users")),
            expected_version: None,
        })
        .await
        .unwrap();
    assert_eq!(cached.next().await.version, 1);
    assert_eq!(fresh.next().await.version, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_message_without_node_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(ConfigRequest::default()).await.unwrap();
    let mut stream = cp
        .discovery()
        .await
        .stream_config(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let err = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("node.id"), "{}", err.message());
}

#[tokio::test(flavor = "multi_thread")]
async fn many_streams_all_get_each_version() {
    let dir = tempfile::tempdir().unwrap();
    let cp = seeded(&dir).await;
    let mut dps = Vec::new();
    for i in 0..10 {
        let mut dp = FakeDataPlane::connect(&cp, &format!("dp-{i}"), "").await;
        assert_eq!(dp.next().await.version, 2);
        dps.push(dp);
    }
    upsert_route(&cp, "b").await;
    for dp in &mut dps {
        let r = dp.next().await;
        assert_eq!(r.version, 3);
        dp.ack(&r).await;
    }
    for i in 0..10 {
        wait_state(&cp, &format!("dp-{i}"), DataPlaneState::Synced).await;
    }
}
