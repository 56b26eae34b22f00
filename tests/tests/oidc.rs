//! Tokens from any OpenID Connect issuer (issue 29, feature 6;
//! docs/data-plane.md "Authenticate"): `JwtIssuer` entities pushed to a real
//! data plane, verified against in-test issuers (`gateway_tests::oidc`) that
//! publish discovery documents and JWKS with RSA and P-256 keys.
//!
//! Covers: several issuers on one route; the wrong issuer for a route, and
//! an unknown one; an RS256 token on an ES256-only issuer; key rotation at
//! the issuer (a new kid is picked up); an issuer that is down (the keys
//! already fetched keep working, a new kid cannot be learnt); identity
//! forwarded from `user_id_claim` / `role_claim` (nested, an array joined);
//! a route without `jwt_issuers` keeps the flag-configured behaviour;
//! deleting an issuer a route names is refused; grpcurl UpsertJwtIssuer
//! through reflection.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`), `redis-server` and `grpcurl` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::{
    AuthMode, DeleteJwtIssuerRequest, GetJwtIssuerRequest, JwtIssuer, ListJwtIssuersRequest, Route,
    UpsertJwtIssuerRequest,
};
use gateway_tests::oidc::{TestIssuer, TestKey};
use gateway_tests::{client, data_planes_without_auth, metric_sample, poll, upsert_route_synced};
use serde_json::{Value, json};
use tonic::Code;

const SOON: Duration = Duration::from_secs(20);

/// Creates or replaces `issuer` and waits until the data planes have it.
async fn upsert_issuer_synced(stack: &Stack, issuer: JwtIssuer) -> Result<u64> {
    let version = stack
        .admin_client()
        .await
        .upsert_jwt_issuer(UpsertJwtIssuerRequest {
            jwt_issuer: Some(issuer),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;
    Ok(version)
}

fn jwt_route(name: &str, prefix: &str, issuers: &[&str]) -> Route {
    Route {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: "orders".into(),
        rewrite_prefix: "/orders".into(),
        auth: AuthMode::AuthJwt as i32,
        jwt_issuers: issuers.iter().map(|s| (*s).to_owned()).collect(),
        ..Route::default()
    }
}

/// GET `path` on the gateway with `token`: the status and the JSON body
/// (the mock's echo, or the problem document).
async fn get(stack: &Stack, path: &str, token: &str) -> Result<(u16, Value)> {
    let r = client()
        .get(format!("{}{path}", stack.gateways()[0]))
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = r.status().as_u16();
    let body = r.json().await.unwrap_or(Value::Null);
    Ok((status, body))
}

/// Asserts a 200 whose forwarded identity is `user` / `role`.
async fn accepted(stack: &Stack, path: &str, token: &str, user: &str, role: &str) -> Result<()> {
    let (status, body) = get(stack, path, token).await?;
    ensure!(status == 200, "{path}: {status} {body}");
    let headers = &body["headers"];
    ensure!(
        headers["x-user-id"] == user && headers["x-user-role"] == role,
        "{path}: forwarded identity {headers}"
    );
    ensure!(
        headers.get("authorization").is_none(),
        "the token is not forwarded: {headers}"
    );
    Ok(())
}

/// Asserts a 401 with problem type `urn:gateway:problem:{kind}`.
async fn refused(stack: &Stack, path: &str, token: &str, kind: &str) -> Result<()> {
    let (status, body) = get(stack, path, token).await?;
    ensure!(
        status == 401 && body["type"] == format!("urn:gateway:problem:{kind}"),
        "{path}: want 401 {kind}, got {status} {body}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_from_several_oidc_issuers_rotation_outage_and_refusals() -> Result<()> {
    // Keycloak-like: RSA keys, discovery document, roles in realm_access.roles.
    let keycloak = TestIssuer::start("acme", &[TestKey::Rsa1]).await?;
    // Auth0-like: P-256 keys, JWKS URL, ES256 only, user id in a custom claim.
    let auth0 = TestIssuer::start("tenant", &[TestKey::P256a]).await?;
    // A third issuer, configured but named by no route that we call with it.
    let dex = TestIssuer::start("dex", &[TestKey::Rsa2]).await?;
    let stack = data_planes_without_auth(1).await;

    let kc = JwtIssuer {
        name: "keycloak".into(),
        issuer: keycloak.issuer().into(),
        discovery_url: keycloak.discovery_url(),
        audiences: vec!["gateway".into()],
        algorithms: vec!["RS256".into()],
        role_claim: "realm_access.roles".into(),
        ..JwtIssuer::default()
    };
    let a0 = JwtIssuer {
        name: "auth0".into(),
        issuer: auth0.issuer().into(),
        jwks_url: auth0.jwks_url(),
        audiences: vec!["gateway".into(), "other-api".into()],
        algorithms: vec!["ES256".into()],
        user_id_claim: "https://example.com/uid".into(),
        role_claim: "realm_access.roles".into(),
        required_claims: vec!["email".into()],
        ..JwtIssuer::default()
    };
    let dx = JwtIssuer {
        name: "dex".into(),
        issuer: dex.issuer().into(),
        jwks_url: dex.jwks_url(),
        audiences: vec!["gateway".into()],
        ..JwtIssuer::default()
    };
    for i in [kc, a0, dx] {
        upsert_issuer_synced(&stack, i).await?;
    }
    // A route naming an issuer that does not exist, or jwt_issuers on a
    // route without AUTH_JWT, is refused.
    let mut admin = stack.admin_client().await;
    for (route, want) in [
        (
            jwt_route("bad", "/bad", &["okta"]),
            "jwt issuer \"okta\" does not exist",
        ),
        (
            Route {
                auth: AuthMode::AuthNone as i32,
                ..jwt_route("bad", "/bad", &["keycloak"])
            },
            "only allowed with auth AUTH_JWT",
        ),
    ] {
        let err = admin
            .upsert_route(gateway_proto::v1::UpsertRouteRequest {
                route: Some(route),
                expected_version: None,
            })
            .await
            .unwrap_err();
        ensure!(
            err.code() == Code::InvalidArgument && err.message().contains(want),
            "{err:?}"
        );
    }
    upsert_route_synced(&stack, jwt_route("both", "/both", &["keycloak", "auth0"])).await?;
    upsert_route_synced(&stack, jwt_route("kc-only", "/kc", &["keycloak"])).await?;
    upsert_route_synced(&stack, jwt_route("dex-only", "/dex", &["dex"])).await?;

    // Several issuers on one route, each token verified by its own issuer,
    // identity from the configured claims (an array of roles joined by ",").
    let kc_token = keycloak.token(TestKey::Rsa1, "alice", &["admin", "user"], json!({}));
    let a0_token = auth0.token(
        TestKey::P256a,
        "auth0|42",
        &["reader"],
        json!({"https://example.com/uid": "bob@acme", "email": "bob@example.com", "aud": ["other-api"]}),
    );
    accepted(&stack, "/both/1", &kc_token, "alice", "admin,user").await?;
    accepted(&stack, "/both/1", &a0_token, "bob@acme", "reader").await?;
    // A second request is served from the verified-token cache alike.
    accepted(&stack, "/both/2", &kc_token, "alice", "admin,user").await?;
    ensure!(
        keycloak.discovery_fetches() >= 1,
        "keys were read through discovery"
    );

    // The wrong issuer for a route: auth0's token on the keycloak-only route,
    // even after it was verified (and cached) on the route that accepts it.
    refused(&stack, "/kc/1", &a0_token, "jwt-issuer-not-accepted").await?;
    // An issuer no JwtIssuer names.
    let stranger = TestIssuer::start("stranger", &[TestKey::Rsa1]).await?;
    let stranger_token = stranger.token(TestKey::Rsa1, "eve", &["admin"], json!({}));
    refused(&stack, "/both/1", &stranger_token, "jwt-issuer-unknown").await?;
    // A token claiming keycloak's iss but signed by another key: invalid.
    let forged = gateway_tests::oidc::sign(
        TestKey::Rsa2,
        &json!({"iss": keycloak.issuer(), "aud": "gateway", "sub": "mallory",
                "exp": 4_000_000_000u64, "realm_access": {"roles": ["admin"]}}),
    );
    refused(&stack, "/kc/1", &forged, "unauthorized").await?;
    // Required claim missing (auth0 requires email), wrong audience.
    let no_email = auth0.token(
        TestKey::P256a,
        "x",
        &["r"],
        json!({"https://example.com/uid": "x"}),
    );
    refused(&stack, "/both/1", &no_email, "unauthorized").await?;
    let wrong_aud = keycloak.token(TestKey::Rsa1, "alice", &["user"], json!({"aud": "billing"}));
    refused(&stack, "/kc/1", &wrong_aud, "unauthorized").await?;

    // An RS256 token on an ES256-only issuer: auth0 publishes an RSA key
    // too, yet a token signed with it (RS256) is refused; the algorithm is
    // the issuer's and the key's, not the token's.
    auth0.publish(&[TestKey::P256a, TestKey::Rsa1]);
    let rs256_on_es256 = gateway_tests::oidc::sign(
        TestKey::Rsa1,
        &json!({"iss": auth0.issuer(), "aud": "gateway", "sub": "x", "email": "x@y",
                "https://example.com/uid": "x", "exp": 4_000_000_000u64,
                "realm_access": {"roles": ["admin"]}}),
    );
    refused(&stack, "/both/1", &rs256_on_es256, "unauthorized").await?;

    // Key rotation at the issuer: a token with a new kid makes the data
    // plane fetch the keys again (once per cooldown) and is accepted.
    keycloak.publish(&[TestKey::Rsa1, TestKey::Rsa2]);
    let fetches = keycloak.jwks_fetches();
    let rotated = keycloak.token(TestKey::Rsa2, "carol", &["ops"], json!({}));
    poll(SOON, "the rotated key is picked up", || async {
        match get(&stack, "/kc/1", &rotated).await {
            Ok((200, _)) => Ok(()),
            Ok((status, body)) => Err(format!("{status} {body}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    ensure!(
        keycloak.jwks_fetches() > fetches,
        "the JWKS was fetched again"
    );
    accepted(&stack, "/kc/3", &rotated, "carol", "ops").await?;

    // dex's keys were fetched when the route naming it arrived; one token
    // makes sure of it before the outage.
    let warm = dex.token(
        TestKey::Rsa2,
        "frank",
        &["dev"],
        json!({"role": "dev", "jti": "warm"}),
    );
    accepted(&stack, "/dex/0", &warm, "frank", "dev").await?;

    // The issuer goes down: keys already fetched keep verifying new tokens
    // (not cached yet), while a kid it never published cannot be learnt.
    keycloak.set_down(true);
    dex.set_down(true);
    let fresh = keycloak.token(TestKey::Rsa1, "dave", &["user"], json!({"jti": "fresh"}));
    accepted(&stack, "/kc/4", &fresh, "dave", "user").await?;
    let fresh2 = keycloak.token(TestKey::Rsa2, "erin", &["user"], json!({"jti": "fresh2"}));
    accepted(&stack, "/kc/5", &fresh2, "erin", "user").await?;
    // A token of dex not seen before still verifies with the keys kept.
    let dex_token = dex.token(TestKey::Rsa2, "frank", &["dev"], json!({"role": "dev"}));
    accepted(&stack, "/dex/1", &dex_token, "frank", "dev").await?;
    let unknown_kid = gateway_tests::oidc::sign(
        TestKey::P256b,
        &json!({"iss": keycloak.issuer(), "aud": "gateway", "sub": "x",
                "exp": 4_000_000_000u64, "realm_access": {"roles": ["admin"]}}),
    );
    refused(&stack, "/kc/6", &unknown_kid, "unauthorized").await?;
    keycloak.set_down(false);
    dex.set_down(false);

    // Per-issuer counters in /metrics: keycloak's keys were fetched more
    // than once (rotation), both its keys are known, tokens were cached.
    let ops = &stack.gateway_admins()[0];
    let sample = |s: &'static str| metric_sample(ops, s);
    ensure!(sample("gateway_jwt_issuer_jwks_fetches_total{issuer=\"keycloak\"}").await? >= 2.0);
    ensure!(sample("gateway_jwt_issuer_keys{issuer=\"keycloak\"}").await? == 2.0);
    ensure!(sample("gateway_jwt_issuer_cache_hits_total{issuer=\"keycloak\"}").await? >= 1.0);

    // An issuer a route names cannot be deleted; one no route names can.
    let err = admin
        .delete_jwt_issuer(DeleteJwtIssuerRequest {
            name: "keycloak".into(),
            expected_version: None,
        })
        .await
        .unwrap_err();
    ensure!(
        err.code() == Code::InvalidArgument && err.message().contains("still named by route"),
        "{err:?}"
    );
    let listed = admin
        .list_jwt_issuers(ListJwtIssuersRequest {})
        .await?
        .into_inner();
    let names: Vec<&str> = listed.jwt_issuers.iter().map(|i| i.name.as_str()).collect();
    ensure!(names == ["auth0", "dex", "keycloak"], "{names:?}");
    let got = admin
        .get_jwt_issuer(GetJwtIssuerRequest {
            name: "auth0".into(),
        })
        .await?
        .into_inner();
    ensure!(got.required_claims == ["email"], "{got:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn grpcurl_upserts_an_issuer_and_a_route_without_jwt_issuers_keeps_the_flag_issuer()
-> Result<()> {
    let issuer = TestIssuer::start("grpcurl", &[TestKey::P256a]).await?;
    let stack = data_planes_without_auth(1).await;
    let authorization = format!("authorization: Bearer {}", stack.admin_token());
    let body = json!({"jwtIssuer": {
        "name": "dex",
        "issuer": issuer.issuer(),
        "jwksUrl": issuer.jwks_url(),
        "audiences": ["gateway"],
        "algorithms": ["ES256"],
        "roleClaim": "realm_access.roles",
    }})
    .to_string();
    let out = tokio::process::Command::new("grpcurl")
        .args([
            "-plaintext",
            "-H",
            &authorization,
            "-d",
            &body,
            &stack.control_plane(),
            "gateway.v1.AdminService/UpsertJwtIssuer",
        ])
        .output()
        .await
        .context("grpcurl runs")?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "grpcurl: {text}");
    let answer: Value = serde_json::from_str(&text).context(text.clone())?;
    let version: u64 = answer["version"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .context(text.clone())?;
    stack.wait_synced(version).await?;
    upsert_route_synced(&stack, jwt_route("dex", "/dex", &["dex"])).await?;
    upsert_route_synced(&stack, jwt_route("builtin", "/builtin", &[])).await?;

    let token = issuer.token(TestKey::P256a, "grace", &["admin"], json!({}));
    accepted(&stack, "/dex/1", &token, "grace", "admin").await?;
    // The route without jwt_issuers uses the data plane's flag-configured
    // issuer as before; this stack's data plane has no --jwks-url, so
    // every token there is refused exactly as before the feature.
    let (status, body) = get(&stack, "/builtin/1", &token).await?;
    ensure!(
        status == 401
            && body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("not configured")),
        "{status} {body}"
    );
    Ok(())
}
