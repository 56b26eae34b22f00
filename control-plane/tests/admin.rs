//! AdminService over gRPC against the real process: concurrent writers.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use gateway_proto::v1::{
    GetConfigRequest, Instance, ListConfigVersionsRequest, Route, UpsertRouteRequest,
    UpsertUpstreamRequest, Upstream,
};
use std::collections::BTreeSet;

#[tokio::test(flavor = "multi_thread")]
async fn twenty_concurrent_upserts_get_twenty_consecutive_versions_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    let mut admin = cp.admin().await;
    admin
        .upsert_upstream(UpsertUpstreamRequest {
            upstream: Some(Upstream {
                name: "users".into(),
                instances: vec![Instance {
                    id: "users-1".into(),
                    url: "http://127.0.0.1:9001".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            expected_version: None,
        })
        .await
        .unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let mut admin = admin.clone();
            tokio::spawn(async move {
                admin
                    .upsert_route(UpsertRouteRequest {
                        route: Some(Route {
                            name: format!("r{i}"),
                            path_prefix: format!("/r{i}"),
                            upstream: "users".into(),
                            ..Default::default()
                        }),
                        expected_version: None,
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .version
            })
        })
        .collect();
    let mut versions = BTreeSet::new();
    for t in tasks {
        versions.insert(t.await.unwrap());
    }
    assert_eq!(versions, (2..=21).collect::<BTreeSet<u64>>());
    let current = admin
        .get_config(GetConfigRequest { version: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(current.version, 21);
    assert_eq!(current.routes.len(), 20, "an update was lost");
    let history = admin
        .list_config_versions(ListConfigVersionsRequest { limit: Some(100) })
        .await
        .unwrap()
        .into_inner()
        .versions;
    let numbers: Vec<u64> = history.iter().map(|v| v.version).collect();
    assert_eq!(numbers, (1..=21).rev().collect::<Vec<u64>>());
}
