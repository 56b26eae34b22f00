//! Authentication as clients see it through the gateway (issue 4, docs/data-plane.md "Authenticate" and
//! docs/auth-service.md): login, identity forwarding and spoofing, hostile tokens, refresh rotation with family
//! revocation, logout, key rotation under traffic, auth-service restarts. Each scenario has its
//! own stack started by devstack with the demo configuration (`/api/users` and `/api/orders`
//! are `AUTH_JWT`; `/auth/login` is limited to 5 per 60 s per IP, so setup logins go to the
//! auth service directly).
//!
//! Needs every binary built in the same target directory:
//! `cargo build --bins -p control-plane -p data-plane -p mock-service -p auth-service -p devstack`,
//! plus `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use devstack::Stack;
use gateway_proto::v1::{GetRouteRequest, UpsertRouteRequest};
use gateway_tests::{client, open_route, poll, raw_request};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Deadline for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);

async fn start(data_planes: usize) -> Stack {
    start_with(Stack::new().data_planes(data_planes)).await
}

async fn start_with(builder: devstack::StackBuilder) -> Stack {
    builder
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Logs in at the auth service itself (not through the gateway's rate-limited login route)
/// and returns the whole token response.
async fn login_direct(stack: &Stack, user: &str, password: &str) -> Result<Value> {
    let url = format!("{}/auth/login", stack.auth_url());
    let response = client()
        .post(&url)
        .json(&json!({"username": user, "password": password}))
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let body: Value = response.json().await?;
    ensure!(status == StatusCode::OK, "login {user}: {status} {body}");
    Ok(body)
}

fn access(pair: &Value) -> &str {
    pair["access_token"].as_str().expect("access_token")
}

fn refresh_token(pair: &Value) -> &str {
    pair["refresh_token"].as_str().expect("refresh_token")
}

/// What a client saw.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn send(request: reqwest::RequestBuilder) -> Result<Seen> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await?;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok(Seen {
        status,
        headers,
        body,
    })
}

/// `GET {gateway}{path}` with an optional bearer token.
async fn get(gateway: &str, path: &str, token: Option<&str>) -> Result<Seen> {
    let mut request = client().get(format!("{gateway}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    send(request).await
}

/// `POST {base}{path}` with a JSON body.
async fn post(base: &str, path: &str, body: Value) -> Result<Seen> {
    send(client().post(format!("{base}{path}")).json(&body)).await
}

/// A 401 produced by the gateway itself: `WWW-Authenticate: Bearer`, problem+json, and no
/// trace of a backend (every mock response carries `X-Instance-Id`).
fn assert_refused_at_the_edge(seen: &Seen, what: &str) {
    assert_eq!(seen.status, StatusCode::UNAUTHORIZED, "{what}: {seen:?}");
    let challenge = seen.header("www-authenticate").unwrap_or_default();
    assert!(
        challenge.starts_with("Bearer"),
        "{what}: WWW-Authenticate {challenge:?}"
    );
    assert_eq!(
        seen.header("content-type"),
        Some("application/problem+json"),
        "{what}: {seen:?}"
    );
    assert!(
        seen.header("x-instance-id").is_none(),
        "{what}: the request reached a backend: {seen:?}"
    );
}

fn kid_of(token: &str) -> String {
    let header = token.split('.').next().expect("header segment");
    let header: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64 header"))
            .expect("JSON header");
    header["kid"].as_str().expect("kid").to_owned()
}

fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("payload segment");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64 payload"))
        .expect("JSON payload")
}

fn b64_json(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

/// The auth service's private key for `kid`, read from the stack's key directory, to mint
/// tokens that are correctly signed but carry bad claims.
fn private_key(stack: &Stack, kid: &str) -> EncodingKey {
    let path = stack.dir().join("auth-keys").join(format!("{kid}.pem"));
    let pem = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    EncodingKey::from_ed_pem(&pem).expect("PKCS#8 Ed25519 key")
}

fn sign(key: &EncodingKey, kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, key).expect("signing")
}

fn hs256(kid: &str, claims: &Value, secret: &[u8]) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_secret(secret).expect("hmac key"),
    )
    .expect("signing")
}

/// Every `AUTH_JWT` route of the demo configuration, without its rate limit, so a test can
/// send more than the `api` budget of 20 per minute and user.
async fn drop_api_rate_limits(stack: &Stack) {
    let mut admin = stack.admin_client().await;
    let mut version = 0;
    for name in ["users", "orders"] {
        let mut route = admin
            .get_route(GetRouteRequest { name: name.into() })
            .await
            .expect("get route")
            .into_inner();
        route.rate_limit = None;
        version = admin
            .upsert_route(UpsertRouteRequest {
                route: Some(route),
                expected_version: None,
            })
            .await
            .expect("upsert route")
            .into_inner()
            .version;
    }
    stack.wait_synced(version).await.expect("data planes sync");
}

#[tokio::test(flavor = "multi_thread")]
async fn login_through_the_gateway_and_bad_credentials() -> Result<()> {
    let stack = start(1).await;
    let gw = &stack.gateways()[0];

    let ok = post(
        gw,
        "/auth/login",
        json!({"username": "alice", "password": "wonderland"}),
    )
    .await?;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");
    assert_eq!(ok.body["token_type"], "Bearer");
    assert_eq!(ok.body["expires_in"], 900);
    let token = access(&ok.body);
    let claims = claims_of(token);
    assert_eq!(
        (claims["sub"].as_str(), claims["role"].as_str()),
        (Some("alice"), Some("user"))
    );
    assert_eq!(
        (claims["iss"].as_str(), claims["aud"].as_str()),
        (Some("gateway-auth"), Some("gateway"))
    );
    for claim in ["exp", "iat", "nbf", "jti"] {
        assert!(
            claims.get(claim).is_some(),
            "claim {claim} missing: {claims}"
        );
    }
    let header: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap())?)?;
    assert_eq!(header["alg"], "EdDSA");

    let wrong = post(
        gw,
        "/auth/login",
        json!({"username": "alice", "password": "queen"}),
    )
    .await?;
    let unknown = post(
        gw,
        "/auth/login",
        json!({"username": "mallory", "password": "queen"}),
    )
    .await?;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{wrong:?}");
    assert_eq!(
        wrong.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        (unknown.status, &unknown.body),
        (wrong.status, &wrong.body),
        "no user enumeration"
    );

    let bad_json = post(gw, "/auth/login", json!({"username": "alice"})).await?;
    assert_eq!(bad_json.status, StatusCode::BAD_REQUEST, "{bad_json:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn identity_is_forwarded_and_cannot_be_spoofed() -> Result<()> {
    let stack = start(1).await;
    let gw = &stack.gateways()[0];
    let bob = login_direct(&stack, "bob", "builder").await?;
    let token = access(&bob);

    // Verified identity reaches the backend; the token does not.
    let seen = get(gw, "/api/users/1", Some(token)).await?;
    assert_eq!(seen.status, StatusCode::OK, "{seen:?}");
    let headers = &seen.body["headers"];
    assert_eq!(headers["x-user-id"], "bob", "{headers}");
    assert_eq!(headers["x-user-role"], "admin", "{headers}");
    assert!(
        headers.get("authorization").is_none(),
        "Authorization forwarded: {headers}"
    );
    let orders = get(gw, "/api/orders/7", Some(token)).await?;
    assert_eq!(orders.status, StatusCode::OK, "{orders:?}");
    assert_eq!(orders.body["headers"]["x-user-id"], "bob");

    // Client-sent identity headers (any case) are replaced on a JWT route...
    let alice = login_direct(&stack, "alice", "wonderland").await?;
    let spoofed = send(
        client()
            .get(format!("{gw}/api/users/1"))
            .bearer_auth(access(&alice))
            .header("X-User-Id", "bob")
            .header("x-user-role", "admin")
            .header("X-USER-ROLE", "root"),
    )
    .await?;
    assert_eq!(spoofed.status, StatusCode::OK, "{spoofed:?}");
    assert_eq!(spoofed.body["headers"]["x-user-id"], "alice", "{spoofed:?}");
    assert_eq!(
        spoofed.body["headers"]["x-user-role"], "user",
        "{spoofed:?}"
    );

    // ...and dropped on a route without auth.
    let mut admin = stack.admin_client().await;
    let version = admin
        .upsert_route(UpsertRouteRequest {
            route: Some(open_route("open-users", "/open/users", "users", "/users")),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;
    let open = raw_request(
        gw,
        "GET /open/users/1 HTTP/1.1\r\nHost: gw\r\nX-User-Id: bob\r\nx-user-role: admin\r\n",
    )
    .await?;
    assert_eq!(open.status, 200, "{open:?}");
    let open_headers = &open.json()?["headers"];
    assert!(open_headers.get("x-user-id").is_none(), "{open_headers}");
    assert!(open_headers.get("x-user-role").is_none(), "{open_headers}");

    // `Connection: X-User-Id` cannot make the gateway drop the identity it injects, nor let a
    // spoofed value through.
    let head = format!(
        "GET /api/users/1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {}\r\n\
         Connection: X-User-Id, X-User-Role\r\nX-User-Id: bob\r\nX-User-Role: admin\r\n",
        access(&alice)
    );
    let hop = raw_request(gw, &head).await?;
    assert_eq!(hop.status, 200, "{hop:?}");
    let hop_headers = &hop.json()?["headers"];
    assert_eq!(hop_headers["x-user-id"], "alice", "{hop_headers}");
    assert_eq!(hop_headers["x-user-role"], "user", "{hop_headers}");
    assert!(hop_headers.get("authorization").is_none(), "{hop_headers}");

    let named = raw_request(
        gw,
        "GET /open/users/1 HTTP/1.1\r\nHost: gw\r\nConnection: X-User-Id, X-Custom\r\nX-User-Id: bob\r\nX-Custom: 1\r\n",
    )
    .await?;
    assert_eq!(named.status, 200, "{named:?}");
    let named_headers = &named.json()?["headers"];
    assert!(named_headers.get("x-user-id").is_none(), "{named_headers}");
    assert!(
        named_headers.get("x-custom").is_none(),
        "header named in Connection forwarded: {named_headers}"
    );

    // No token at all.
    let missing = get(gw, "/api/users/1", None).await?;
    assert_refused_at_the_edge(&missing, "missing token");
    let basic = send(
        client()
            .get(format!("{gw}/api/users/1"))
            .basic_auth("alice", Some("wonderland")),
    )
    .await?;
    assert_refused_at_the_edge(&basic, "Basic credentials");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_tokens_are_refused_at_the_edge() -> Result<()> {
    let stack = start(1).await;
    let gw = &stack.gateways()[0];
    let alice = login_direct(&stack, "alice", "wonderland").await?;
    let good = access(&alice).to_owned();
    let kid = kid_of(&good);
    let key = private_key(&stack, &kid);
    let jwks_text = client()
        .get(format!("{}/.well-known/jwks.json", stack.auth_url()))
        .send()
        .await?
        .text()
        .await?;
    let jwks: Value = serde_json::from_str(&jwks_text)?;
    let x = jwks["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["kid"] == kid.as_str()))
        .and_then(|k| k["x"].as_str())
        .context("the token's key is not in the JWKS")?
        .to_owned();
    let public_key = URL_SAFE_NO_PAD.decode(&x)?;

    let t = now();
    let base = json!({
        "sub": "alice", "role": "admin", "iss": "gateway-auth", "aud": "gateway",
        "exp": t + 600, "iat": t, "nbf": t, "jti": "hostile"
    });
    let with = |key_name: &str, value: Value| {
        let mut c = base.clone();
        c[key_name] = value;
        c
    };
    let [h, p, s]: [&str; 3] = good
        .split('.')
        .collect::<Vec<_>>()
        .try_into()
        .expect("three segments");
    let admin_payload = b64_json(&with("sub", json!("bob")));

    // Sanity: a well-signed token with good claims from the same key is accepted, so each
    // refusal below is about the one thing that is wrong with it.
    let control = get(gw, "/api/users/1", Some(&sign(&key, &kid, &base))).await?;
    assert_eq!(
        control.status,
        StatusCode::OK,
        "control token refused: {control:?}"
    );

    let hostile: Vec<(&str, String)> = vec![
        (
            "alg none",
            format!(
                "{}.{}.",
                b64_json(&json!({"alg": "none", "typ": "JWT"})),
                b64_json(&base)
            ),
        ),
        (
            "alg none with kid and a signature",
            format!(
                "{}.{}.{s}",
                b64_json(&json!({"alg": "none", "kid": kid})),
                b64_json(&base)
            ),
        ),
        (
            "HS256 keyed with the public key",
            hs256(&kid, &base, &public_key),
        ),
        ("HS256 keyed with x", hs256(&kid, &base, x.as_bytes())),
        (
            "HS256 keyed with the JWKS text",
            hs256(&kid, &base, jwks_text.as_bytes()),
        ),
        ("expired", sign(&key, &kid, &with("exp", json!(t - 3600)))),
        (
            "nbf in the future",
            sign(&key, &kid, &with("nbf", json!(t + 3600))),
        ),
        (
            "wrong iss",
            sign(&key, &kid, &with("iss", json!("evil-auth"))),
        ),
        (
            "wrong aud",
            sign(&key, &kid, &with("aud", json!("other-service"))),
        ),
        ("no exp", {
            let mut c = base.clone();
            c.as_object_mut().unwrap().remove("exp");
            sign(&key, &kid, &c)
        }),
        ("tampered payload", format!("{h}.{admin_payload}.{s}")),
        ("unknown kid", sign(&key, "no-such-key", &base)),
        ("truncated signature", good[..good.len() - 10].to_owned()),
        ("signature removed", format!("{h}.{p}")),
        ("non-base64 header", format!("!!!.{p}.{s}")),
        ("garbage", "not-a-jwt".to_owned()),
    ];
    for (what, token) in &hostile {
        let seen = get(gw, "/api/users/1", Some(token)).await?;
        assert_refused_at_the_edge(&seen, what);
    }
    // The genuine token still works afterwards (no poisoning of caches).
    let after = get(gw, "/api/users/1", Some(&good)).await?;
    assert_eq!(after.status, StatusCode::OK, "{after:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn refresh_rotates_and_a_replay_burns_the_family() -> Result<()> {
    let stack = start(1).await;
    let gw = &stack.gateways()[0];

    let first = login_direct(&stack, "alice", "wonderland").await?;
    let second = post(
        gw,
        "/auth/refresh",
        json!({"refresh_token": refresh_token(&first)}),
    )
    .await?;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    assert_ne!(refresh_token(&second.body), refresh_token(&first));
    assert_eq!(second.body["token_type"], "Bearer");
    assert_eq!(second.header("cache-control"), Some("no-store"));
    let api = get(gw, "/api/users/1", Some(access(&second.body))).await?;
    assert_eq!(
        api.status,
        StatusCode::OK,
        "refreshed access token refused: {api:?}"
    );
    let third = post(
        gw,
        "/auth/refresh",
        json!({"refresh_token": refresh_token(&second.body)}),
    )
    .await?;
    assert_eq!(third.status, StatusCode::OK, "{third:?}");

    // Replaying a consumed token is refused and revokes the whole family...
    let replay = post(
        gw,
        "/auth/refresh",
        json!({"refresh_token": refresh_token(&first)}),
    )
    .await?;
    assert_eq!(replay.status, StatusCode::UNAUTHORIZED, "{replay:?}");
    assert_eq!(
        replay.header("content-type"),
        Some("application/problem+json")
    );
    // ...so even the newest token of that family is dead now.
    let newest = post(
        gw,
        "/auth/refresh",
        json!({"refresh_token": refresh_token(&third.body)}),
    )
    .await?;
    assert_eq!(newest.status, StatusCode::UNAUTHORIZED, "{newest:?}");

    // Another login of the same user is a different family and unaffected.
    let other = login_direct(&stack, "alice", "wonderland").await?;
    let ok = post(
        gw,
        "/auth/refresh",
        json!({"refresh_token": refresh_token(&other)}),
    )
    .await?;
    assert_eq!(ok.status, StatusCode::OK, "{ok:?}");

    // Bad input is a 400, never a 500.
    let bad = post(gw, "/auth/refresh", json!({"token": "x"})).await?;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_refreshes_of_one_token_have_exactly_one_winner() -> Result<()> {
    let stack = start(2).await;
    let gateways = stack.gateways();
    for round in 0..3 {
        let pair = login_direct(&stack, "alice", "wonderland").await?;
        let token = refresh_token(&pair).to_owned();
        // Through two different data planes at once.
        let (a, b) = tokio::join!(
            post(
                &gateways[0],
                "/auth/refresh",
                json!({"refresh_token": token})
            ),
            post(
                &gateways[1],
                "/auth/refresh",
                json!({"refresh_token": token})
            ),
        );
        let statuses = [a?.status, b?.status];
        let wins = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        assert_eq!(wins, 1, "round {round}: {statuses:?}");
        assert!(
            statuses.contains(&StatusCode::UNAUTHORIZED),
            "round {round}: {statuses:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn logout_revokes_the_family() -> Result<()> {
    let stack = start(1).await;
    let gw = &stack.gateways()[0];
    let pair = login_direct(&stack, "bob", "builder").await?;
    let rotated = post(
        gw,
        "/auth/refresh",
        json!({"refresh_token": refresh_token(&pair)}),
    )
    .await?;
    assert_eq!(rotated.status, StatusCode::OK, "{rotated:?}");

    let out = post(
        gw,
        "/auth/logout",
        json!({"refresh_token": refresh_token(&rotated.body)}),
    )
    .await?;
    assert_eq!(out.status, StatusCode::NO_CONTENT, "{out:?}");
    for (what, token) in [
        ("current", refresh_token(&rotated.body)),
        ("older", refresh_token(&pair)),
    ] {
        let again = post(gw, "/auth/refresh", json!({"refresh_token": token})).await?;
        assert_eq!(
            again.status,
            StatusCode::UNAUTHORIZED,
            "{what} token after logout: {again:?}"
        );
    }
    let bad = post(gw, "/auth/logout", json!({})).await?;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn key_rotation_under_traffic_fails_no_request() -> Result<()> {
    // Every flag of the auth service is also an environment variable: a new key every 6 s,
    // published 3 s before it signs.
    let stack = start_with(Stack::new().data_planes(2).env(
        "auth-service",
        "AUTH_KEY_ROTATION_INTERVAL_SECS",
        "6",
    ))
    .await;
    drop_api_rate_limits(&stack).await;
    let gateways = stack.gateways();

    // Tokens from every key seen so far, oldest first.
    let mut tokens: Vec<(String, String)> = Vec::new();
    let (mut sent, mut failed) = (0u64, Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let pair = login_direct(&stack, "alice", "wonderland").await?;
        let token = access(&pair).to_owned();
        let kid = kid_of(&token);
        if tokens.last().is_none_or(|(k, _)| *k != kid) {
            tokens.push((kid, token));
        }
        // Every token seen so far, through every data plane, right after each login.
        for (kid, token) in &tokens {
            for (i, gw) in gateways.iter().enumerate() {
                let seen = get(gw, "/api/users/1", Some(token)).await?;
                sent += 1;
                if seen.status != StatusCode::OK {
                    failed.push(format!(
                        "gateway {i}, kid {kid}: {} {}",
                        seen.status, seen.body
                    ));
                }
            }
        }
        let kids: BTreeSet<&str> = tokens.iter().map(|(k, _)| k.as_str()).collect();
        if kids.len() >= 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "saw only {} signing keys in 90 s with a 6 s rotation",
            kids.len()
        );
    }
    assert!(
        failed.is_empty(),
        "{} of {sent} requests failed: {failed:#?}",
        failed.len()
    );

    // The first token (signed two rotations ago) is still accepted and still published.
    let (first_kid, first) = &tokens[0];
    let seen = get(&gateways[0], "/api/users/1", Some(first)).await?;
    assert_eq!(
        seen.status,
        StatusCode::OK,
        "token of retired key {first_kid}: {seen:?}"
    );
    let jwks: Value = client()
        .get(format!("{}/.well-known/jwks.json", stack.auth_url()))
        .send()
        .await?
        .json()
        .await?;
    let published: BTreeSet<&str> = jwks["keys"]
        .as_array()
        .context("keys")?
        .iter()
        .filter_map(|k| k["kid"].as_str())
        .collect();
    for (kid, _) in &tokens {
        assert!(
            published.contains(kid.as_str()),
            "kid {kid} unpublished while its tokens live"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn restarting_the_auth_service_keeps_issued_tokens_valid() -> Result<()> {
    let stack = start(1).await;
    let gw = &stack.gateways()[0];
    let before = login_direct(&stack, "alice", "wonderland").await?;
    let kid = kid_of(access(&before));
    assert_eq!(
        get(gw, "/api/users/1", Some(access(&before))).await?.status,
        StatusCode::OK
    );

    stack.kill("auth-service").await?;
    stack.start_process("auth-service").await?;

    // Same key published and signing after the restart.
    let after = poll(SOON, "login after restart", || async {
        login_direct(&stack, "alice", "wonderland")
            .await
            .map_err(|e| e.to_string())
    })
    .await?;
    assert_eq!(
        kid_of(access(&after)),
        kid,
        "the restart replaced the signing key"
    );
    let new_token = get(gw, "/api/users/1", Some(access(&after))).await?;
    assert_eq!(new_token.status, StatusCode::OK, "{new_token:?}");
    let old_token = get(gw, "/api/users/1", Some(access(&before))).await?;
    assert_eq!(
        old_token.status,
        StatusCode::OK,
        "token issued before the restart: {old_token:?}"
    );

    // Refresh families live in Redis and survive too.
    let refreshed = post(
        gw,
        "/auth/refresh",
        json!({"refresh_token": refresh_token(&before)}),
    )
    .await?;
    assert_eq!(refreshed.status, StatusCode::OK, "{refreshed:?}");
    Ok(())
}
