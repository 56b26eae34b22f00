//! A Postgres restart under two control planes, an auth service and a data
//! plane (issue 28). While Postgres is down, writes answer `UNAVAILABLE`
//! (the admin API and the real grpcurl) and logins 503, promptly, not a hang;
//! the data plane keeps serving. Once Postgres is back on the same port,
//! every process recovers by itself: commits on either control plane reach
//! the other one and the data plane, and logins work again.
//!
//! Needs the workspace binaries built (`cargo build --workspace --bins`),
//! Postgres, `redis-server` and grpcurl; `scripts/test` installs them.

#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod postgres;

use std::time::Duration;

use devstack::RedisServer;
use devstack::stack::AdminClient;
use gateway_proto::v1::{ListRoutesRequest, UpsertRouteRequest};
use gateway_tests::{client, login, open_route, poll};
use postgres::{
    ALICE, AuthService, BOB, ControlPlane, DataPlane, Mock, PgServer, SOON, add_user, grpcurl,
    work_dir,
};

/// What "not a hang" means here: well above the control plane's 3 s acquire
/// timeout, far below anything an operator would take for a hang.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

fn route(name: &str) -> UpsertRouteRequest {
    UpsertRouteRequest {
        route: Some(open_route(name, &format!("/{name}"), "orders", "/orders")),
        expected_version: None,
    }
}

/// Waits until `path` answers 200 at `gateway`.
async fn served(gateway: &str, path: &str) -> anyhow::Result<()> {
    let url = format!("{gateway}{path}");
    let http = client();
    poll(SOON, &format!("{url} served"), || async {
        match http.get(&url).send().await {
            Ok(r) if r.status() == 200 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Waits until `admin` serves `version`.
async fn serves(admin: &AdminClient, version: u64) -> anyhow::Result<()> {
    poll(SOON, &format!("version {version} served"), || {
        let mut admin = admin.clone();
        async move {
            let v = admin
                .list_routes(ListRoutesRequest {})
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
                .version;
            if v == version {
                Ok(())
            } else {
                Err(format!("at {v}"))
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_answers_unavailable_then_everything_recovers_by_itself()
-> anyhow::Result<()> {
    let mut pg = PgServer::start().await?;
    let redis = RedisServer::start().await?;
    let dir = work_dir()?;
    let mock = Mock::start("orders", dir.path()).await?;
    let a = ControlPlane::start("cp-a", &pg.url(), dir.path(), None).await?;
    let b = ControlPlane::start("cp-b", &pg.url(), dir.path(), None).await?;
    let (on_a, on_b) = (a.admin(ALICE), b.admin(BOB));
    on_a.clone().upsert_upstream(mock.orders_upstream()).await?;
    on_a.clone().upsert_route(route("before")).await?;
    let dp = DataPlane::start("dp-1", &[a.url(), b.url()], dir.path()).await?;
    served(&dp.url(), "/before/1").await?;
    let auth = AuthService::start("auth", &pg.url(), &redis.url(), dir.path(), &[]).await?;
    add_user(&pg.url(), "alice", "alice-pw-28").await?;
    login(&auth.url(), "alice", "alice-pw-28").await?;

    pg.stop().await?;

    // Writes fail fast with UNAVAILABLE, through the admin API and through grpcurl.
    let refused = tokio::time::timeout(ANSWER_WITHIN, on_a.clone().upsert_route(route("down")))
        .await
        .expect("a write while Postgres is down answered")
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let body =
        r#"{"route":{"name":"down","pathPrefix":"/down","upstream":"orders","auth":"AUTH_NONE"}}"#;
    let out = tokio::time::timeout(ANSWER_WITHIN, grpcurl(b.addr, BOB, "UpsertRoute", body))
        .await
        .expect("grpcurl answered")?;
    assert!(
        !out.ok,
        "a write succeeded with Postgres down: {}",
        out.stdout
    );
    assert!(
        out.stdout.contains("Unavailable") || out.stderr.contains("Unavailable"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    // A login needs the users: 503, not a hang. The data plane serves on.
    let status = tokio::time::timeout(
        ANSWER_WITHIN,
        client()
            .post(format!("{}/auth/login", auth.url()))
            .json(&serde_json::json!({"username": "alice", "password": "alice-pw-28"}))
            .send(),
    )
    .await
    .expect("a login while Postgres is down answered")?
    .status();
    assert_eq!(status, 503);
    served(&dp.url(), "/before/1").await?;

    pg.start_again().await?;

    // No process restarted: a commit on B reaches A and the data plane…
    let after_b = poll(SOON, "a commit on B after the restart", || {
        let mut on_b = on_b.clone();
        async move {
            on_b.upsert_route(route("after-b"))
                .await
                .map(|r| r.into_inner().version)
                .map_err(|e| e.to_string())
        }
    })
    .await?;
    serves(&on_a, after_b).await?;
    served(&dp.url(), "/after-b/1").await?;
    // …and one on A reaches B.
    let after_a = on_a
        .clone()
        .upsert_route(route("after-a"))
        .await?
        .into_inner()
        .version;
    assert_eq!(
        after_a,
        after_b + 1,
        "versions stay gap-free across the outage"
    );
    serves(&on_b, after_a).await?;
    served(&dp.url(), "/after-a/1").await?;
    // Logins work again.
    poll(SOON, "login after the restart", || async {
        login(&auth.url(), "alice", "alice-pw-28")
            .await
            .map_err(|e| e.to_string())
    })
    .await?;
    assert!(a.proc.log_tail(200).contains("following the commits"));
    Ok(())
}
