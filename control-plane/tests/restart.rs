//! Restarting the real process (gracefully or with kill -9) keeps every route,
//! upstream and version; the seed file is applied only to an empty database.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use gateway_proto::v1::{
    ApplyConfigRequest, ConfigSnapshot, GetConfigRequest, Instance, ListConfigVersionsRequest,
    ListRoutesRequest, ListUpstreamsRequest, Route, UpsertRouteRequest, Upstream,
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

fn route(name: &str, upstream: &str) -> Route {
    Route {
        name: name.into(),
        path_prefix: format!("/api/{name}"),
        upstream: upstream.into(),
        ..Default::default()
    }
}

/// Everything observable about the stored configuration.
async fn state(cp: &CpProcess) -> (ConfigSnapshot, Vec<ConfigSnapshot>, String) {
    let mut admin = cp.admin().await;
    let current = admin
        .get_config(GetConfigRequest { version: None })
        .await
        .unwrap()
        .into_inner();
    let mut all = Vec::new();
    for v in 1..=current.version {
        all.push(
            admin
                .get_config(GetConfigRequest { version: Some(v) })
                .await
                .unwrap()
                .into_inner(),
        );
    }
    let versions = admin
        .list_config_versions(ListConfigVersionsRequest { limit: Some(1000) })
        .await
        .unwrap()
        .into_inner();
    (current, all, format!("{versions:?}"))
}

async fn make_history(cp: &CpProcess) {
    let mut admin = cp.admin().await;
    admin
        .apply_config(ApplyConfigRequest {
            routes: vec![route("users", "users"), route("orders", "orders")],
            upstreams: vec![upstream("users"), upstream("orders")],
            dry_run: false,
            expected_version: None,
            certificates: vec![],
            clear_certificates: false,
            jwt_issuers: Vec::new(),
        })
        .await
        .unwrap();
    for i in 0..5 {
        admin
            .upsert_route(UpsertRouteRequest {
                route: Some(route(&format!("extra-{i}"), "users")),
                expected_version: None,
            })
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_restart_keeps_every_route_upstream_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cp.db");
    let mut cp = CpProcess::start(&db, &[]).await;
    make_history(&cp).await;
    let before = state(&cp).await;
    assert_eq!(before.0.version, 6);
    assert_eq!(before.0.routes.len(), 7);
    let status = cp.terminate().await;
    assert!(
        status.success(),
        "exit status {status}; logs:\n{}",
        cp.logs()
    );

    let cp = CpProcess::start(&db, &[]).await;
    assert_eq!(state(&cp).await, before);
    let mut admin = cp.admin().await;
    let routes = admin
        .list_routes(ListRoutesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(routes.version, 6);
    let names: Vec<_> = routes.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "extra-0", "extra-1", "extra-2", "extra-3", "extra-4", "orders", "users"
        ]
    );
    let upstreams = admin
        .list_upstreams(ListUpstreamsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(upstreams.upstreams.len(), 2);
    // Numbering continues without a gap.
    let v = admin
        .upsert_route(UpsertRouteRequest {
            route: Some(route("after", "users")),
            expected_version: Some(6),
        })
        .await
        .unwrap()
        .into_inner()
        .version;
    assert_eq!(v, 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_keeps_every_committed_version() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cp.db");
    let mut cp = CpProcess::start(&db, &[]).await;
    make_history(&cp).await;
    let before = state(&cp).await;
    cp.kill().await;
    let cp = CpProcess::start(&db, &[]).await;
    assert_eq!(state(&cp).await, before);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_stream_of_commits_leaves_a_consistent_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cp.db");
    let mut cp = CpProcess::start(&db, &[]).await;
    let mut admin = cp.admin().await;
    admin
        .apply_config(ApplyConfigRequest {
            routes: vec![],
            upstreams: vec![upstream("users")],
            dry_run: false,
            expected_version: None,
            certificates: vec![],
            clear_certificates: false,
            jwt_issuers: Vec::new(),
        })
        .await
        .unwrap();
    // Writers keep committing while the process is killed.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let mut admin = admin.clone();
            tokio::spawn(async move {
                let mut acknowledged = 0u64;
                for i in 0.. {
                    let r = admin
                        .upsert_route(UpsertRouteRequest {
                            route: Some(route(&format!("w{w}-{i}"), "users")),
                            expected_version: None,
                        })
                        .await;
                    match r {
                        Ok(r) => acknowledged = acknowledged.max(r.into_inner().version),
                        Err(_) => break,
                    }
                }
                acknowledged
            })
        })
        .collect();
    eventually("some commits", || async {
        let v = cp
            .admin()
            .await
            .get_config(GetConfigRequest { version: None })
            .await
            .ok()?
            .into_inner()
            .version;
        (v >= 20).then_some(())
    })
    .await;
    cp.kill().await;
    let mut acknowledged = 0;
    for w in writers {
        acknowledged = acknowledged.max(w.await.unwrap());
    }

    let cp = CpProcess::start(&db, &[]).await;
    let (current, all, _) = state(&cp).await;
    // Every version an operator was told about survived, with no gap, and each
    // version holds exactly one more route than the one before.
    assert!(
        current.version >= acknowledged,
        "version {acknowledged} was acknowledged but the database has only {}",
        current.version
    );
    for (i, s) in all.iter().enumerate() {
        assert_eq!(s.version, i as u64 + 1);
        assert_eq!(s.routes.len(), i, "version {}", s.version);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seed_is_applied_to_an_empty_database_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cp.db");
    let seed = dir.path().join("seed.json");
    std::fs::write(
        &seed,
        r#"{
          "upstreams": [{"name": "users", "instances": [{"id": "users-1", "url": "http://127.0.0.1:9001"}]}],
          "routes": [{"name": "users", "pathPrefix": "/api/users", "rewritePrefix": "/users",
                      "upstream": "users", "auth": "AUTH_JWT",
                      "rateLimit": {"policy": "api", "algorithm": "TOKEN_BUCKET", "key": "KEY_USER", "limit": 20, "windowSeconds": 60}}]
        }"#,
    )
    .unwrap();
    let seed_arg = seed.to_str().unwrap();
    let mut cp = CpProcess::start(&db, &["--seed", seed_arg]).await;
    let (current, _, versions) = state(&cp).await;
    assert_eq!(current.version, 1);
    assert_eq!(current.routes[0].rewrite_prefix, "/users");
    assert_eq!(current.routes[0].rate_limit.as_ref().unwrap().limit, 20);
    assert!(versions.contains("author: \"seed\""), "{versions}");
    cp.admin()
        .await
        .upsert_route(UpsertRouteRequest {
            route: Some(route("other", "users")),
            expected_version: None,
        })
        .await
        .unwrap();
    assert!(cp.terminate().await.success());
    let cp = CpProcess::start(&db, &["--seed", seed_arg]).await;
    assert_eq!(state(&cp).await.0.version, 2, "seed re-applied");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_seed_file_stops_startup_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(
        &seed,
        r#"{"routes": [{"name": "x", "pathPrefix": "x", "upstream": "nope"}]}"#,
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_control-plane"))
        .args(["--listen", "127.0.0.1:0", "--insecure-open", "--database"])
        .arg(dir.path().join("cp.db"))
        .arg("--seed")
        .arg(&seed)
        .output();
    let out = tokio::time::timeout(DEADLINE, out).await.unwrap().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("seed file"), "{stderr}");
    assert!(
        stderr.contains("route \"x\": path_prefix must start with"),
        "{stderr}"
    );
    assert!(
        stderr.contains("upstream \"nope\" does not exist"),
        "{stderr}"
    );
}
