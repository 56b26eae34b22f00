//! Two auth services on one Postgres database (issue 28): users and signing
//! keys are the database's, so a token signed by either verifies with the
//! other's JWKS and at every data plane (one fetching its JWKS from each),
//! both publish the same keys, and a rotation happens once (one successor in
//! the database) and is seen by both.
//!
//! Needs the workspace binaries built (`cargo build --workspace --bins`),
//! Postgres (`initdb`, `pg_ctl`) and `redis-server`; `scripts/test` installs them.

#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod postgres;

use anyhow::Context;
use devstack::RedisServer;
use gateway_proto::v1::{AuthMode, UpsertRouteRequest};
use gateway_tests::{client, login, open_route, poll};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use postgres::{
    ALICE, AUDIENCE, AuthService, ControlPlane, DataPlane, ISSUER, Mock, PgServer, SOON, add_user,
    kids, work_dir,
};

/// A data plane checking JWTs with the JWKS of `auth`.
async fn gateway(
    name: &str,
    cp: &ControlPlane,
    auth: &AuthService,
    dir: &std::path::Path,
) -> anyhow::Result<DataPlane> {
    let jwt = [
        "--jwks-url".to_owned(),
        format!("{}/.well-known/jwks.json", auth.url()),
        "--jwt-issuer".to_owned(),
        ISSUER.to_owned(),
        "--jwt-audience".to_owned(),
        AUDIENCE.to_owned(),
    ];
    DataPlane::start_with(name, &[cp.url()], dir, &jwt).await
}

/// Waits until every gateway answers 200 to `/jwt/orders/1` with `token`.
async fn accepted_everywhere(gateways: &[&DataPlane], token: &str) -> anyhow::Result<()> {
    let http = client();
    for dp in gateways {
        let url = format!("{}/jwt/orders/1", dp.url());
        poll(
            SOON,
            &format!("{} accepting the token", dp.node_id),
            || async {
                match http.get(&url).bearer_auth(token).send().await {
                    Ok(r) if r.status() == 200 => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Verifies `token` with the key its header names in `jwks`; returns the subject.
fn verify(token: &str, jwks: &serde_json::Value) -> anyhow::Result<String> {
    let kid = jsonwebtoken::decode_header(token)?
        .kid
        .context("token without kid")?;
    let jwk = jwks["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["kid"] == kid.as_str()))
        .with_context(|| format!("kid {kid} not in {jwks}"))?;
    let key = DecodingKey::from_ed_components(jwk["x"].as_str().context("no x")?)?;
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.set_issuer(&[ISSUER]);
    validation.set_audience(&[AUDIENCE]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)?.claims;
    Ok(claims["sub"].as_str().unwrap_or_default().to_owned())
}

fn kid_of(token: &str) -> String {
    jsonwebtoken::decode_header(token).unwrap().kid.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_auth_services_share_users_and_keys_and_rotate_once() -> anyhow::Result<()> {
    let pg = PgServer::start().await?;
    let redis = RedisServer::start().await?;
    let dir = work_dir()?;
    // Short rotation: a successor 4 s into a key's 8 s interval, signing 4 s later.
    let rotation = [
        "--key-rotation-interval-secs",
        "8",
        "--key-publish-lead-secs",
        "4",
    ];
    let a = AuthService::start("auth-a", &pg.url(), &redis.url(), dir.path(), &rotation).await?;
    let b = AuthService::start("auth-b", &pg.url(), &redis.url(), dir.path(), &rotation).await?;
    // A user added once, in the database, logs in at either.
    add_user(&pg.url(), "alice", "alice-pw-28").await?;

    let first = kids(&a.jwks().await?);
    assert_eq!(first.len(), 1, "one key to start with: {first:?}");
    assert_eq!(kids(&b.jwks().await?), first, "both publish the same key");

    // Two data planes, one checking tokens with A's JWKS, the other with B's.
    let mock = Mock::start("orders", dir.path()).await?;
    let cp = ControlPlane::start("cp", &pg.url(), dir.path(), None).await?;
    let mut admin = cp.admin(ALICE);
    admin.upsert_upstream(mock.orders_upstream()).await?;
    let mut jwt_route = open_route("jwt-orders", "/jwt/orders", "orders", "/orders");
    jwt_route.auth = AuthMode::AuthJwt as i32;
    admin
        .upsert_route(UpsertRouteRequest {
            route: Some(jwt_route),
            expected_version: None,
        })
        .await?;
    let dp_a = gateway("dp-jwks-a", &cp, &a, dir.path()).await?;
    let dp_b = gateway("dp-jwks-b", &cp, &b, dir.path()).await?;
    let gateways = [&dp_a, &dp_b];

    let from_a = login(&a.url(), "alice", "alice-pw-28").await?;
    let from_b = login(&b.url(), "alice", "alice-pw-28").await?;
    assert_eq!(kid_of(&from_a), first[0]);
    assert_eq!(kid_of(&from_b), first[0], "both sign with the current key");
    assert_eq!(verify(&from_a, &b.jwks().await?)?, "alice");
    assert_eq!(verify(&from_b, &a.jwks().await?)?, "alice");
    accepted_everywhere(&gateways, &from_a).await?;
    accepted_everywhere(&gateways, &from_b).await?;

    // The successor appears in both JWKS, made once.
    let both = poll(SOON, "a successor published by both", || async {
        let (ka, kb) = (
            kids(&a.jwks().await.map_err(|e| e.to_string())?),
            kids(&b.jwks().await.map_err(|e| e.to_string())?),
        );
        if ka.len() >= 2 && ka == kb {
            Ok(ka)
        } else {
            Err(format!("A {ka:?}, B {kb:?}"))
        }
    })
    .await?;
    let stored = pg
        .psql("SELECT count(*) || ' ' || count(DISTINCT activates_at) FROM signing_keys")
        .await?;
    let (keys, activations) = stored.trim().split_once(' ').context("psql output")?;
    assert_eq!(
        keys, activations,
        "two keys for one activation: a rotation ran twice"
    );
    let sealed = pg
        .psql("SELECT encode(sealed_key, 'escape') FROM signing_keys")
        .await?;
    assert!(
        !sealed.contains("PRIVATE KEY"),
        "a private key in the clear"
    );

    // Once it signs, tokens from either carry it and verify at the other.
    let successor = both
        .iter()
        .find(|k| **k != first[0])
        .cloned()
        .context("a new kid")?;
    let token = poll(SOON, "B signing with the successor", || async {
        let token = login(&b.url(), "alice", "alice-pw-28")
            .await
            .map_err(|e| e.to_string())?;
        if kid_of(&token) == successor {
            Ok(token)
        } else {
            Err(format!("still {}", kid_of(&token)))
        }
    })
    .await?;
    assert_eq!(verify(&token, &a.jwks().await?)?, "alice");
    let from_a = login(&a.url(), "alice", "alice-pw-28").await?;
    assert_eq!(kid_of(&from_a), successor, "A signs with the same key as B");
    accepted_everywhere(&gateways, &token).await?;
    accepted_everywhere(&gateways, &from_a).await?;
    // And a token without a valid signature is refused, so the 200s above mean something.
    // The signature's first character changed (all six of its bits are signature bits).
    let (signed, signature) = from_a.rsplit_once('.').context("a JWS")?;
    let changed = if signature.starts_with('A') { 'B' } else { 'A' };
    let forged = format!("{signed}.{changed}{}", &signature[1..]);
    let refused = client()
        .get(format!("{}/jwt/orders/1", dp_a.url()))
        .bearer_auth(&forged)
        .send()
        .await?
        .status();
    assert_eq!(refused, 401);
    Ok(())
}
