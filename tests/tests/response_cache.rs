//! Response caching (issue 29, `Route.cache`) against real processes: what is
//! stored and for how long, the key, revalidation, eviction, purges, counted
//! at the mock (`GET /stats`) and read off `X-Cache` / `Age`. The mock's
//! caching hooks (`?cache_control=`, `?etag=`, `?expires_in=`, `?vary=`,
//! `?bytes=`) make the upstream's answers.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::Duration;

use anyhow::{Result, ensure};
use devstack::Stack;
use futures::future::join_all;
use gateway_proto::v1::{AuthMode, PurgeCacheRequest, Route, RouteCache};
use gateway_tests::{
    client, data_planes_without_auth, login, metric_sample, mock_requests, one_data_plane,
    open_route, poll, upsert_route_synced,
};

/// Deadline for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);

/// `/cached/users` → users (`/users`), cached for 60 s by default, keyed by
/// `Accept-Language` too, bodies up to 2048 bytes.
fn cached_route(name: &str, prefix: &str, auth: AuthMode, shared: bool) -> Route {
    Route {
        auth: auth as i32,
        cache: Some(RouteCache {
            ttl_seconds: 60,
            max_body_bytes: 2048,
            vary: vec!["accept-language".into()],
            shared,
            ..Default::default()
        }),
        ..open_route(name, prefix, "users", "/users")
    }
}

/// One answer as a test looks at it.
#[derive(Debug)]
struct Seen {
    status: u16,
    cache: String,
    age: Option<u64>,
    body: String,
}

async fn get(url: &str, headers: &[(&str, &str)]) -> Result<Seen> {
    let mut r = client().get(url);
    for (n, v) in headers {
        r = r.header(*n, *v);
    }
    let resp = r.send().await?;
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let cache = h("x-cache").unwrap_or_default();
    let age = h("age").and_then(|a| a.parse().ok());
    let status = resp.status().as_u16();
    Ok(Seen {
        status,
        cache,
        age,
        body: resp.text().await?,
    })
}

/// Asks `url` until its answer's `X-Cache` is `want` (within [`SOON`]).
async fn until_cache(url: &str, want: &str) -> Result<Seen> {
    poll(SOON, &format!("X-Cache: {want} from {url}"), || async {
        let seen = get(url, &[]).await.map_err(|e| e.to_string())?;
        if seen.cache == want {
            Ok(seen)
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_are_stored_kept_fresh_revalidated_and_purged_on_every_replica() -> Result<()> {
    let stack = data_planes_without_auth(2).await;
    upsert_route_synced(
        &stack,
        cached_route("cached", "/cached/users", AuthMode::AuthNone, false),
    )
    .await?;
    let gw = stack.gateways()[0].clone();
    let mock = stack.ports().users_1;
    let calls = || mock_requests(mock);
    let base = |q: &str| format!("{gw}/cached/users/1?{q}");

    // MISS, then HIT with Age; the upstream sees one request.
    let before = calls().await?;
    let first = get(&base("t=plain"), &[]).await?;
    ensure!(first.status == 200 && first.cache == "MISS", "{first:?}");
    let hit = get(&base("t=plain"), &[]).await?;
    ensure!(hit.cache == "HIT" && hit.age.is_some(), "{hit:?}");
    ensure!(hit.body == first.body, "a hit is the stored body");
    ensure!(
        calls().await? - before == 1,
        "one upstream call for MISS + HIT"
    );

    // private and no-store answers are never stored; neither are answers
    // with Set-Cookie, Vary: *, an uncacheable status or an oversized body.
    for q in [
        "cache_control=private",
        "cache_control=no-store",
        "set_cookie=a=b",
        "vary=*",
        "status=500",
        "bytes=4096",
    ] {
        let before = calls().await?;
        for _ in 0..2 {
            let seen = get(&base(q), &[]).await?;
            ensure!(seen.cache == "MISS", "{q}: {seen:?}");
        }
        ensure!(calls().await? - before == 2, "{q}: not stored");
    }
    // A request with no-store is not served from the cache (no X-Cache at all).
    let bypass = get(&base("t=plain"), &[("cache-control", "no-store")]).await?;
    ensure!(bypass.cache.is_empty(), "{bypass:?}");

    // max-age, s-maxage (wins over max-age) and Expires end freshness.
    for q in [
        "cache_control=max-age=1",
        "cache_control=max-age=600,s-maxage=1",
        "expires_in=1",
    ] {
        ensure!(get(&base(q), &[]).await?.cache == "MISS", "{q}");
        let again = get(&base(q), &[]).await?;
        ensure!(again.cache == "HIT", "{q}: {again:?}");
        until_cache(&base(q), "MISS").await?;
    }

    // The route's vary list and the answer's Vary keep separate entries.
    for (q, header) in [("t=lang", "accept-language"), ("vary=accept", "accept")] {
        for value in ["a", "b"] {
            let seen = get(&base(q), &[(header, value)]).await?;
            ensure!(seen.cache == "MISS", "{q} {value}: {seen:?}");
        }
        for value in ["a", "b"] {
            let seen = get(&base(q), &[(header, value)]).await?;
            ensure!(seen.cache == "HIT", "{q} {value}: {seen:?}");
        }
    }

    // A stale answer with an ETag is revalidated: the mock answers 304 to
    // If-None-Match, the stored body is served as STALE and fresh again.
    let etag = base("cache_control=max-age=1&etag=v1");
    let stored = get(&etag, &[]).await?;
    ensure!(stored.cache == "MISS");
    let before = calls().await?;
    let stale = until_cache(&etag, "STALE").await?;
    ensure!(
        stale.status == 200 && stale.body == stored.body,
        "{stale:?}"
    );
    ensure!(calls().await? - before == 1, "one revalidation call");
    ensure!(
        get(&etag, &[]).await?.cache == "HIT",
        "refreshed by the 304"
    );

    // A client's matching If-None-Match gets 304 from a fresh entry.
    let tagged = base("cache_control=max-age=60&etag=v2");
    get(&tagged, &[]).await?;
    let not_modified = get(&tagged, &[("if-none-match", "\"v2\"")]).await?;
    ensure!(
        not_modified.status == 304 && not_modified.cache == "HIT",
        "{not_modified:?}"
    );

    // Concurrent misses of one key make one upstream call.
    let slow = base("t=concurrent&delay_ms=1500");
    let before = calls().await?;
    let answers = join_all((0..20).map(|_| get(&slow, &[]))).await;
    for a in answers {
        let a = a?;
        ensure!(a.status == 200 && a.cache == "MISS", "{a:?}");
    }
    ensure!(
        calls().await? - before == 1,
        "20 concurrent misses, one call"
    );

    // PurgeCache reaches both data planes: a stored path is fetched again.
    let purged = |g: &str| format!("{g}/cached/users/2?t=purge");
    for g in stack.gateways() {
        get(&purged(&g), &[]).await?;
        ensure!(get(&purged(&g), &[]).await?.cache == "HIT");
    }
    let reached = stack
        .admin_client()
        .await
        .purge_cache(PurgeCacheRequest {
            route: "cached".into(),
            path_prefix: "/cached/users/2".into(),
        })
        .await?
        .into_inner()
        .data_planes;
    ensure!(reached == 2, "the purge reached {reached} data planes");
    for g in stack.gateways() {
        until_cache(&purged(&g), "MISS").await?;
    }
    ensure!(
        get(&base("t=plain"), &[]).await?.cache == "HIT",
        "other paths stay"
    );
    let refused = stack
        .admin_client()
        .await
        .purge_cache(PurgeCacheRequest {
            route: "cached".into(),
            path_prefix: "cached".into(),
        })
        .await
        .unwrap_err();
    ensure!(
        refused.code() == tonic::Code::InvalidArgument,
        "{refused:?}"
    );

    let ops = &stack.gateway_admins()[0];
    let (hits, misses, stale) = (
        metric_sample(ops, "gateway_cache_hits_total").await?,
        metric_sample(ops, "gateway_cache_misses_total").await?,
        metric_sample(ops, "gateway_cache_stale_total").await?,
    );
    eprintln!("data-plane-1: {hits} hits, {misses} misses, {stale} stale");
    ensure!(hits >= 10.0);
    ensure!(metric_sample(ops, "gateway_cache_stale_total").await? >= 1.0);
    ensure!(metric_sample(ops, "gateway_cache_purged_total").await? >= 1.0);
    ensure!(metric_sample(ops, "gateway_cache_bytes").await? > 0.0);
    stack.shutdown().await;
    Ok(())
}

/// Issue 41, items 2 and 3: a request with credentials the key does not hold
/// bypasses the cache (never stored, never served to others), and forwarding
/// fields from a client never reach a stored answer.
#[tokio::test(flavor = "multi_thread")]
async fn credentials_bypass_the_cache_and_client_forwarding_fields_never_poison_it() -> Result<()> {
    let stack = data_planes_without_auth(1).await;
    upsert_route_synced(
        &stack,
        cached_route("creds", "/creds/users", AuthMode::AuthNone, false),
    )
    .await?;
    let gw = stack.gateways()[0].clone();
    let mock = stack.ports().users_1;
    for (name, value) in [
        ("cookie", "session=alice-secret"),
        ("x-api-key", "alice-key"),
    ] {
        let url = format!("{gw}/creds/users/1?t={name}");
        let before = mock_requests(mock).await?;
        for _ in 0..2 {
            let seen = get(&url, &[(name, value)]).await?;
            ensure!(
                seen.status == 200 && seen.cache.is_empty(),
                "{name}: {seen:?}"
            );
        }
        ensure!(
            mock_requests(mock).await? - before == 2,
            "{name}: each credentialed request went upstream"
        );
        // Nothing was stored: the next caller's answer is fetched for it, without the credential.
        let next = get(&url, &[]).await?;
        ensure!(next.cache == "MISS", "{name}: {next:?}");
        ensure!(!next.body.contains(value), "{name}: {}", next.body);
        let hit = get(&url, &[]).await?;
        ensure!(hit.cache == "HIT", "{name}: {hit:?}");
    }
    // A client's forwarding fields are stripped (or replaced) before the
    // upstream and the cache: the stored answer never carries them.
    let poisoned = format!("{gw}/creds/users/2?t=poison");
    let first = get(
        &poisoned,
        &[
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-prefix", "/evil"),
            ("x-original-url", "/admin"),
            ("x-forwarded-proto", "https"),
        ],
    )
    .await?;
    ensure!(first.cache == "MISS", "{first:?}");
    for poison in ["evil.example", "/evil", "/admin"] {
        ensure!(
            !first.body.contains(poison),
            "{poison} reached the upstream: {}",
            first.body
        );
    }
    let next = get(&poisoned, &[]).await?;
    ensure!(next.cache == "HIT", "same key as a clean request: {next:?}");
    ensure!(next.body == first.body);
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn authenticated_callers_do_not_share_entries_unless_the_route_says_so() -> Result<()> {
    let stack = Stack::new()
        .data_planes(1)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"));
    upsert_route_synced(
        &stack,
        cached_route("mine", "/mine/users", AuthMode::AuthJwt, false),
    )
    .await?;
    upsert_route_synced(
        &stack,
        cached_route("ours", "/ours/users", AuthMode::AuthJwt, true),
    )
    .await?;
    let alice = login(&stack.auth_url(), "alice", "wonderland").await?;
    let bob = login(&stack.auth_url(), "bob", "builder").await?;
    let gw = stack.gateways()[0].clone();
    let as_user = |url: String, token: &str| {
        let bearer = format!("Bearer {token}");
        async move { get(&url, &[("authorization", &bearer)]).await }
    };
    let mine = format!("{gw}/mine/users/1");
    ensure!(as_user(mine.clone(), &alice).await?.cache == "MISS");
    ensure!(as_user(mine.clone(), &alice).await?.cache == "HIT");
    let bobs = as_user(mine.clone(), &bob).await?;
    ensure!(
        bobs.cache == "MISS",
        "bob must not get alice's entry: {bobs:?}"
    );
    ensure!(bobs.body.contains("\"x-user-id\":\"bob\""), "{}", bobs.body);
    let ours = format!("{gw}/ours/users/1");
    ensure!(as_user(ours.clone(), &alice).await?.cache == "MISS");
    ensure!(
        as_user(ours.clone(), &bob).await?.cache == "HIT",
        "shared: true"
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn least_recently_used_answers_are_evicted_under_a_small_budget() -> Result<()> {
    // One shard of 7500 bytes (about 2 KB per answer): three answers of 1500-byte bodies fit, not four.
    let stack = one_data_plane(&["--cache-max-bytes", "7500"]).await;
    upsert_route_synced(
        &stack,
        cached_route("cached", "/cached/users", AuthMode::AuthNone, false),
    )
    .await?;
    let gw = stack.gateways()[0].clone();
    let url = |k: &str| format!("{gw}/cached/users/1?bytes=1500&k={k}");
    for k in ["1", "2", "3"] {
        ensure!(get(&url(k), &[]).await?.cache == "MISS", "{k}");
    }
    ensure!(
        get(&url("1"), &[]).await?.cache == "HIT",
        "1 is now the most recent"
    );
    ensure!(get(&url("4"), &[]).await?.cache == "MISS");
    ensure!(get(&url("1"), &[]).await?.cache == "HIT", "1 stays");
    ensure!(
        get(&url("2"), &[]).await?.cache == "MISS",
        "2 was the least recent"
    );
    let ops = &stack.gateway_admins()[0];
    ensure!(metric_sample(ops, "gateway_cache_evictions_total").await? >= 1.0);
    ensure!(metric_sample(ops, "gateway_cache_bytes").await? <= 7500.0);
    stack.shutdown().await;
    Ok(())
}
