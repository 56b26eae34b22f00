//! Log hygiene (issue 9): a stack with control-channel tokens runs logins,
//! refreshes, logouts, authenticated and refused admin calls, a data-plane
//! reconnect; then no log file of any process may contain a secret the run
//! created: the admin and data-plane tokens, the demo passwords, the issued
//! access and refresh tokens, or any part of the auth service's private keys.
//!
//! Needs the binaries built (`cargo build --bins -p control-plane -p data-plane
//! -p mock-service -p auth-service -p devstack`), plus `redis-server` and
//! `grpcurl` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::{ListRoutesRequest, Route, UpsertRouteRequest};
use serde_json::{Value, json};

async fn post(http: &reqwest::Client, url: &str, body: Value) -> Result<(u16, Value)> {
    let response = http.post(url).json(&body).send().await?;
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    Ok((status, body))
}

/// Runs grpcurl against the stack's control plane with an authorization header.
async fn grpcurl(stack: &Stack, token: &str, method: &str) -> Result<std::process::Output> {
    let header = format!("authorization: Bearer {token}");
    let run = tokio::process::Command::new("grpcurl")
        .args(["-plaintext", "-H", &header, &stack.control_plane(), method])
        .output();
    Ok(tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .context("grpcurl hung")??)
}

/// The base64 lines of every PEM file under `dir` (each long enough to be unmistakable).
fn private_key_lines(dir: &Path) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "pem") {
            let text = std::fs::read_to_string(&path)?;
            ensure!(
                text.contains("PRIVATE KEY"),
                "{} is no private key",
                path.display()
            );
            lines.extend(
                text.lines()
                    .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                    .map(str::to_owned),
            );
        }
    }
    Ok(lines)
}

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_reaches_any_log() -> Result<()> {
    let stack = Stack::new().data_planes(2).start().await?;
    let http = reqwest::Client::new();
    let gateway = &stack.gateways()[0];
    let mut secrets: Vec<(String, String)> = vec![
        ("admin token".into(), stack.admin_token().to_owned()),
        (
            "data-plane token".into(),
            stack.data_plane_token().to_owned(),
        ),
    ];
    for (user, _, password) in devstack::DEMO_USERS {
        secrets.push((format!("{user}'s password"), password.to_owned()));
    }

    // Logins through the gateway, an authenticated call, a refresh, a logout,
    // a wrong password.
    for (user, _, password) in devstack::DEMO_USERS {
        let (status, pair) = post(
            &http,
            &format!("{gateway}/auth/login"),
            json!({"username": user, "password": password}),
        )
        .await?;
        ensure!(status == 200, "login {user}: {status} {pair}");
        let access = pair["access_token"]
            .as_str()
            .context("access_token")?
            .to_owned();
        let refresh = pair["refresh_token"]
            .as_str()
            .context("refresh_token")?
            .to_owned();
        let status = http
            .get(format!("{gateway}/api/users/1"))
            .bearer_auth(&access)
            .send()
            .await?
            .status();
        ensure!(status == 200, "GET /api/users/1 as {user}: {status}");
        let (status, next) = post(
            &http,
            &format!("{gateway}/auth/refresh"),
            json!({"refresh_token": refresh}),
        )
        .await?;
        ensure!(status == 200, "refresh {user}: {status} {next}");
        let next_refresh = next["refresh_token"].as_str().context("refresh_token")?;
        let next_access = next["access_token"].as_str().context("access_token")?;
        let (status, _) = post(
            &http,
            &format!("{gateway}/auth/logout"),
            json!({"refresh_token": next_refresh}),
        )
        .await?;
        ensure!(status < 300, "logout {user}: {status}");
        secrets.push((format!("{user}'s access token"), access));
        secrets.push((format!("{user}'s refresh token"), refresh));
        secrets.push((
            format!("{user}'s second access token"),
            next_access.to_owned(),
        ));
        secrets.push((
            format!("{user}'s second refresh token"),
            next_refresh.to_owned(),
        ));
    }
    let wrong = "not-the-password-Xq81";
    let (status, _) = post(
        &http,
        &format!("{gateway}/auth/login"),
        json!({"username": "alice", "password": wrong}),
    )
    .await?;
    ensure!(status == 401, "a wrong password got {status}");
    secrets.push(("a wrong password".into(), wrong.into()));

    // Admin calls: authenticated (tonic and grpcurl) and refused.
    let mut admin = stack.admin_client().await;
    let mut route = admin
        .list_routes(ListRoutesRequest {})
        .await?
        .into_inner()
        .routes
        .into_iter()
        .next()
        .context("the demo configuration has routes")?;
    route = Route {
        name: "hygiene".into(),
        path_prefix: "/hygiene".into(),
        ..route
    };
    let version = admin
        .upsert_route(UpsertRouteRequest {
            route: Some(route),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;
    let out = grpcurl(
        &stack,
        stack.admin_token(),
        "gateway.v1.AdminService/ListConfigVersions",
    )
    .await?;
    ensure!(out.status.success(), "grpcurl as admin: {out:?}");
    ensure!(
        String::from_utf8_lossy(&out.stdout).contains("devstack-admin"),
        "the change is not attributed to the admin token's name: {out:?}"
    );
    let guessed = "guessed-admin-token-8Kd2";
    secrets.push(("a guessed token".into(), guessed.into()));
    let out = grpcurl(&stack, guessed, "gateway.v1.AdminService/ListRoutes").await?;
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains("Unauthenticated"),
        "a guessed token was not refused: {out:?}"
    );
    let out = grpcurl(
        &stack,
        stack.data_plane_token(),
        "gateway.v1.AdminService/ListRoutes",
    )
    .await?;
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains("PermissionDenied"),
        "the data-plane token could call the admin API: {out:?}"
    );

    // A data plane reconnects (sending its token again) after a control-plane restart.
    stack.kill("control-plane").await?;
    stack.start_process("control-plane").await?;
    stack.wait_synced(version).await?;

    for (i, line) in private_key_lines(&stack.dir().join("auth-keys"))?
        .into_iter()
        .enumerate()
    {
        secrets.push((format!("private key line {i}"), line));
    }
    ensure!(
        secrets
            .iter()
            .any(|(what, _)| what.starts_with("private key")),
        "no private key found under {}",
        stack.dir().join("auth-keys").display()
    );

    let (scanned, leaks) = gateway_tests::secrets_in_logs(&stack.log_dir(), &secrets)?;
    // The scan reads real logs: the commit is logged with its author's name.
    let attributed = std::fs::read_to_string(stack.log_path("control-plane"))?
        .lines()
        .any(|l| l.contains("committed configuration") && l.contains("devstack-admin"));
    ensure!(
        scanned >= 8,
        "only {scanned} log files in {}",
        stack.log_dir().display()
    );
    ensure!(attributed, "no log line shows the commit by devstack-admin");
    ensure!(
        leaks.is_empty(),
        "secrets in the logs:\n{}",
        leaks.join("\n")
    );
    stack.shutdown().await;
    Ok(())
}

/// `Stack::new().tls(true)`: the control plane serves TLS with a throwaway CA
/// and requires client certificates; data planes sync by mTLS alone; grpcurl
/// works with `-cacert -cert -key` and the admin token, and fails in plaintext
/// or without a client certificate.
#[tokio::test(flavor = "multi_thread")]
async fn tls_stack_syncs_by_client_certificate_and_grpcurl_needs_the_flags() -> Result<()> {
    let stack = Stack::new().data_planes(1).tls(true).start().await?;
    ensure!(stack.control_plane_url().starts_with("https://127.0.0.1:"));
    let pki = stack.pki().context("a TLS stack has a PKI")?.clone();
    let info: Value = serde_json::from_str(&stack.info().to_json_line())?;
    ensure!(info["ca"] == pki.ca.display().to_string(), "{info}");
    ensure!(info["admin_token"] == stack.admin_token(), "{info}");

    // Data planes got no token: they synced (start() waited for SYNCED) with their certificate.
    let pid = stack.pid("data-plane-1").context("data-plane-1 runs")?;
    let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
    ensure!(
        !String::from_utf8_lossy(&environ).contains("DP_CONTROL_PLANE_TOKEN"),
        "a TLS stack's data plane was given a token"
    );
    // Changes still reach them.
    let mut admin = stack.admin_client().await;
    let route = admin
        .list_routes(ListRoutesRequest {})
        .await?
        .into_inner()
        .routes
        .into_iter()
        .next()
        .context("demo routes")?;
    let version = admin
        .upsert_route(UpsertRouteRequest {
            route: Some(Route {
                name: "over-tls".into(),
                path_prefix: "/over-tls".into(),
                ..route
            }),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;

    let header = format!("authorization: Bearer {}", stack.admin_token());
    let (ca, cert, key) = (
        pki.ca.display().to_string(),
        pki.client_cert.display().to_string(),
        pki.client_key.display().to_string(),
    );
    let run = |args: Vec<String>| async move {
        let out = tokio::process::Command::new("grpcurl").args(args).output();
        tokio::time::timeout(Duration::from_secs(30), out)
            .await
            .context("grpcurl hung")?
            .context("grpcurl runs")
    };
    let method = "gateway.v1.AdminService/ListConfigVersions".to_owned();
    let cp = stack.control_plane();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let out = run(s(&[
        "-cacert", &ca, "-cert", &cert, "-key", &key, "-H", &header, &cp, &method,
    ]))
    .await?;
    ensure!(out.status.success(), "grpcurl over mTLS: {out:?}");
    ensure!(
        String::from_utf8_lossy(&out.stdout).contains("over-tls"),
        "{out:?}"
    );
    // grpcurl keeps redialling a refused handshake until its connect timeout.
    let out = run(s(&[
        "-connect-timeout",
        "2",
        "-plaintext",
        "-H",
        &header,
        &cp,
        &method,
    ]))
    .await?;
    ensure!(!out.status.success(), "plaintext was accepted: {out:?}");
    let out = run(s(&[
        "-connect-timeout",
        "2",
        "-cacert",
        &ca,
        "-H",
        &header,
        &cp,
        &method,
    ]))
    .await?;
    ensure!(
        !out.status.success(),
        "no client certificate was accepted: {out:?}"
    );
    stack.shutdown().await;
    Ok(())
}
