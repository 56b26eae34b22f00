//! `PurgeCache` with two control planes on one Postgres (issue 29): a purge
//! called on one replica reaches the data planes connected to the other (by
//! `NOTIFY`, like commits), not only its own.
//!
//! Needs the workspace binaries built (`cargo build --workspace --bins`) and
//! Postgres (`initdb`, `pg_ctl`); `scripts/test` installs it.

#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod postgres;

use gateway_proto::v1::{PurgeCacheRequest, Route, RouteCache, UpsertRouteRequest};
use gateway_tests::{client, open_route, poll};
use postgres::{ALICE, ControlPlane, DataPlane, Mock, PgServer, SOON, work_dir};

/// Asks `url` until its `X-Cache` is `want`.
async fn until_cache(url: &str, want: &str) -> anyhow::Result<()> {
    let http = client();
    poll(SOON, &format!("X-Cache: {want} from {url}"), || {
        let http = http.clone();
        async move {
            let resp = http.get(url).send().await.map_err(|e| e.to_string())?;
            let got = resp
                .headers()
                .get("x-cache")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            if got == want {
                Ok(())
            } else {
                Err(format!("{} {got:?}", resp.status()))
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_one_control_plane_reaches_the_data_planes_of_the_other() -> anyhow::Result<()> {
    let pg = PgServer::start().await?;
    let dir = work_dir()?;
    let mock = Mock::start("orders", dir.path()).await?;
    let a = ControlPlane::start("cp-a", &pg.url(), dir.path(), None).await?;
    let b = ControlPlane::start("cp-b", &pg.url(), dir.path(), None).await?;
    let mut admin = a.admin(ALICE);
    admin.upsert_upstream(mock.orders_upstream()).await?;
    let route = Route {
        cache: Some(RouteCache {
            ttl_seconds: 600,
            ..Default::default()
        }),
        ..open_route("orders", "/orders", "orders", "/orders")
    };
    admin
        .upsert_route(UpsertRouteRequest {
            route: Some(route),
            expected_version: None,
        })
        .await?;
    let on_a = DataPlane::start("dp-a", &[a.url()], dir.path()).await?;
    let on_b = DataPlane::start("dp-b", &[b.url()], dir.path()).await?;
    let urls = [on_a.url(), on_b.url()].map(|u| format!("{u}/orders/1"));
    for url in &urls {
        until_cache(url, "HIT").await?;
    }

    let reached = admin
        .purge_cache(PurgeCacheRequest {
            route: "orders".into(),
            path_prefix: String::new(),
        })
        .await?
        .into_inner()
        .data_planes;
    assert_eq!(reached, 1, "A hands it to its own stream; B to its own");
    for url in &urls {
        until_cache(url, "MISS").await?;
    }
    Ok(())
}
