//! Authentication and roles with `--auth-tokens-file`, through the real
//! `grpcurl` binary and tonic clients against the real control-plane process;
//! the audit trail; and the refusal to start open on a non-loopback address.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use gateway_proto::v1::config_discovery_service_client::ConfigDiscoveryServiceClient;
use gateway_proto::v1::{ConfigRequest, Node};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

const ADMIN: &str = "adm-Zq81vKx0TtokenA";
const OPS: &str = "ops-7yPp2Lw0TtokenB";
const VIEWER: &str = "view-3nR5cQ0TtokenC";
const DATA_PLANE: &str = "dp-Kk29sMv0TtokenD";

const USERS: &str = r#"{"upstream": {"name": "users", "instances": [{"id": "users-1", "url": "http://127.0.0.1:9001"}]}}"#;
const ROUTE: &str =
    r#"{"route": {"name": "users", "pathPrefix": "/api/users", "upstream": "users"}}"#;

/// A tokens file: two admins, a viewer stored as a SHA-256, a data plane.
fn tokens_file(dir: &Path) -> PathBuf {
    let viewer_hash = gateway_hex::encode(Sha256::digest(VIEWER.as_bytes()));
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!(
            "# name role token\nalice admin {ADMIN}\nops-bot admin {OPS}\n\n\
             grafana viewer sha256:{viewer_hash}\nedge-1 data-plane {DATA_PLANE}\n"
        ),
    )
    .unwrap();
    path
}

async fn with_tokens(dir: &tempfile::TempDir) -> CpProcess {
    let tokens = tokens_file(dir.path());
    CpProcess::start(
        &dir.path().join("cp.db"),
        &["--auth-tokens-file", tokens.to_str().unwrap()],
    )
    .await
}

/// `grpcurl -H "authorization: Bearer TOKEN" -d JSON ... gateway.v1.AdminService/METHOD`.
async fn call_as(
    cp: &CpProcess,
    token: Option<&str>,
    method: &str,
    json: &str,
) -> Result<serde_json::Value, String> {
    let full = format!("gateway.v1.AdminService/{method}");
    let header = token.map(|t| format!("authorization: Bearer {t}"));
    let mut args = vec!["-d", json];
    if let Some(h) = &header {
        args.extend(["-H", h.as_str()]);
    }
    let out = grpcurl_raw(cp, &args, &[&full]).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(serde_json::from_str(&stdout).unwrap())
    } else {
        Err(format!("{stdout}{stderr}"))
    }
}

async fn ok_as(cp: &CpProcess, token: &str, method: &str, json: &str) -> serde_json::Value {
    call_as(cp, Some(token), method, json)
        .await
        .unwrap_or_else(|e| panic!("{method} {json} failed:\n{e}"))
}

async fn err_as(cp: &CpProcess, token: Option<&str>, method: &str, json: &str) -> String {
    match call_as(cp, token, method, json).await {
        Ok(v) => panic!("{method} with {token:?} succeeded: {v}"),
        Err(e) => e,
    }
}

const READS: &[(&str, &str)] = &[
    ("ListRoutes", "{}"),
    ("GetRoute", r#"{"name": "users"}"#),
    ("ListUpstreams", "{}"),
    ("GetUpstream", r#"{"name": "users"}"#),
    ("GetConfig", "{}"),
    ("ListConfigVersions", "{}"),
    ("ListDataPlanes", "{}"),
];

const WRITES: &[(&str, &str)] = &[
    ("UpsertUpstream", USERS),
    ("UpsertRoute", ROUTE),
    ("DeleteRoute", r#"{"name": "users"}"#),
    ("DeleteUpstream", r#"{"name": "users"}"#),
    ("ApplyConfig", r#"{"dryRun": true}"#),
    ("RollbackConfig", r#"{"version": 1}"#),
];

#[tokio::test(flavor = "multi_thread")]
async fn no_or_unknown_token_is_unauthenticated_but_health_and_reflection_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_tokens(&dir).await;
    for (method, json) in READS.iter().chain(WRITES) {
        let e = err_as(&cp, None, method, json).await;
        assert!(e.contains("Code: Unauthenticated"), "{method}: {e}");
        let e = err_as(&cp, Some("not-a-token"), method, json).await;
        assert!(e.contains("Code: Unauthenticated"), "{method}: {e}");
    }
    // The hash of a token is not the token.
    let hash = gateway_hex::encode(Sha256::digest(VIEWER.as_bytes()));
    let e = err_as(&cp, Some(&hash), "ListRoutes", "{}").await;
    assert!(e.contains("Code: Unauthenticated"), "{e}");

    let health = ok(&cp, "grpc.health.v1.Health/Check", "{}").await;
    assert_eq!(health["status"], "SERVING");
    let out = grpcurl_raw(&cp, &[], &["list"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("gateway.v1.AdminService"));
    let out = grpcurl_raw(&cp, &[], &["describe", "gateway.v1.AdminService"]).await;
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn viewer_reads_but_cannot_mutate_admin_can_do_everything() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_tokens(&dir).await;
    assert_eq!(
        u64_field(&ok_as(&cp, ADMIN, "UpsertUpstream", USERS).await, "version"),
        1
    );
    assert_eq!(
        u64_field(&ok_as(&cp, ADMIN, "UpsertRoute", ROUTE).await, "version"),
        2
    );
    for (method, json) in READS {
        ok_as(&cp, VIEWER, method, json).await;
        ok_as(&cp, ADMIN, method, json).await;
    }
    for (method, json) in WRITES {
        let e = err_as(&cp, Some(VIEWER), method, json).await;
        assert!(e.contains("Code: PermissionDenied"), "{method}: {e}");
        assert!(e.contains("grafana (role viewer)"), "{method}: {e}");
    }
    // Nothing changed.
    assert_eq!(
        u64_field(&ok_as(&cp, VIEWER, "GetConfig", "{}").await, "version"),
        2
    );
    // Admin may call every mutation.
    ok_as(&cp, ADMIN, "ApplyConfig", r#"{"dryRun": true}"#).await;
    ok_as(&cp, ADMIN, "RollbackConfig", r#"{"version": 1}"#).await;
    ok_as(&cp, ADMIN, "DeleteUpstream", r#"{"name": "users"}"#).await;
    assert_eq!(
        u64_field(&ok_as(&cp, ADMIN, "GetConfig", "{}").await, "version"),
        4
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn data_plane_token_cannot_call_admin_rpcs() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_tokens(&dir).await;
    for (method, json) in READS.iter().chain(WRITES) {
        let e = err_as(&cp, Some(DATA_PLANE), method, json).await;
        assert!(e.contains("Code: PermissionDenied"), "{method}: {e}");
        assert!(e.contains("edge-1 (role data-plane)"), "{method}: {e}");
    }
}

async fn open_stream(
    cp: &CpProcess,
    token: Option<&str>,
) -> Result<tonic::Streaming<gateway_proto::v1::ConfigResponse>, tonic::Status> {
    let channel = Channel::from_shared(cp.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let header: Option<MetadataValue<_>> = token.map(|t| format!("Bearer {t}").parse().unwrap());
    let mut client =
        ConfigDiscoveryServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
            if let Some(h) = &header {
                r.metadata_mut().insert("authorization", h.clone());
            }
            Ok(r)
        });
    let first = ConfigRequest {
        node: Some(Node {
            id: "impostor".into(),
            hostname: "h".into(),
            build_version: "t".into(),
        }),
        ..Default::default()
    };
    client
        .stream_config(tokio_stream::iter(vec![first]))
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_data_plane_role_may_open_stream_config() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_tokens(&dir).await;
    ok_as(&cp, ADMIN, "UpsertUpstream", USERS).await;

    // An admin token must not pose as a data plane: refused.
    let e = open_stream(&cp, Some(ADMIN)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = open_stream(&cp, Some(VIEWER)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = open_stream(&cp, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = open_stream(&cp, Some("nope")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // The data-plane token gets the configuration.
    let mut stream = open_stream(&cp, Some(DATA_PLANE)).await.unwrap();
    let first = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("no snapshot in time")
        .unwrap()
        .expect("stream ended");
    assert_eq!(first.version, 1);
    // With grpcurl too (ConfigDiscoveryService is refused to the admin).
    let out = grpcurl_raw(
        &cp,
        &[
            "-H",
            &format!("authorization: Bearer {ADMIN}"),
            "-d",
            r#"{"node": {"id": "x"}}"#,
        ],
        &["gateway.v1.ConfigDiscoveryService/StreamConfig"],
    )
    .await;
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("Code: PermissionDenied"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_version_records_its_author_and_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_tokens(&dir).await;
    ok_as(&cp, ADMIN, "UpsertUpstream", USERS).await;
    ok_as(&cp, OPS, "UpsertRoute", ROUTE).await;
    ok_as(&cp, ADMIN, "DeleteRoute", r#"{"name": "users"}"#).await;
    ok_as(&cp, OPS, "RollbackConfig", r#"{"version": 2}"#).await;
    ok_as(
        &cp,
        ADMIN,
        "ApplyConfig",
        r#"{"upstreams": [{"name": "users", "instances": [{"id": "users-1", "url": "http://127.0.0.1:9009"}]}]}"#,
    )
    .await;
    // A dry run commits nothing.
    ok_as(&cp, OPS, "ApplyConfig", r#"{"dryRun": true}"#).await;

    let versions = ok_as(&cp, VIEWER, "ListConfigVersions", "{}").await;
    let got: Vec<(u64, String, String)> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                u64_field(v, "version"),
                v["author"].as_str().unwrap().to_owned(),
                v["summary"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let authors: Vec<(u64, &str)> = got.iter().map(|(v, a, _)| (*v, a.as_str())).collect();
    assert_eq!(
        authors,
        [
            (5, "alice"),
            (4, "ops-bot"),
            (3, "alice"),
            (2, "ops-bot"),
            (1, "alice")
        ],
        "{got:?}"
    );
    assert_eq!(got[2].2, r#"delete route "users""#);

    // Each mutation is logged with author, version and summary; no token is.
    let logs = eventually("5 commits logged", || async {
        let logs = cp.logs();
        (logs.matches("committed configuration").count() == 5).then_some(logs)
    })
    .await;
    let line = logs
        .lines()
        .find(|l| l.contains("committed configuration") && l.contains(r#""version":3"#))
        .unwrap_or_else(|| panic!("{logs}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["fields"]["author"], "alice");
    assert_eq!(v["fields"]["summary"], r#"delete route "users""#);
    for secret in [ADMIN, OPS, VIEWER, DATA_PLANE] {
        assert!(!logs.contains(secret), "a token was logged:\n{logs}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn insecure_open_accepts_anyone_and_authors_are_anonymous() {
    let dir = tempfile::tempdir().unwrap();
    // CpProcess::start adds --insecure-open without a tokens file.
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    ok(&cp, "UpsertUpstream", USERS).await;
    // A token is ignored when authentication is off.
    ok_as(&cp, ADMIN, "UpsertRoute", ROUTE).await;
    let versions = ok(&cp, "ListConfigVersions", "{}").await;
    for v in versions["versions"].as_array().unwrap() {
        assert_eq!(v["author"], "anonymous", "{v}");
    }
    let mut stream = open_stream(&cp, None).await.unwrap();
    let pushed = stream.message().await.unwrap().expect("a configuration");
    assert_eq!(pushed.upstreams.len(), 1);
}

const SIGNING_SECRET: &str = "signing-secret-0123456789abcdef0123456789";

/// UpsertUpstream of `users` with the signing secret `secret`.
fn signed_users(secret: &str) -> String {
    format!(
        r#"{{"upstream": {{"name": "users", "identitySigningSecret": "{secret}",
            "instances": [{{"id": "users-1", "url": "http://127.0.0.1:9001"}}]}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anonymous_stream_never_receives_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("secrets.key");
    std::fs::write(&key, "11".repeat(32)).unwrap();
    let cp = CpProcess::start(
        &dir.path().join("cp.db"),
        &["--secrets-key-file", key.to_str().unwrap()],
    )
    .await;
    let secret = SIGNING_SECRET;
    let users = signed_users(secret);
    ok(&cp, "UpsertUpstream", &users).await;
    let mut stream = open_stream(&cp, None).await.unwrap();
    let e = stream.message().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message()
            .contains("version 1 holds private keys or signing secrets")
            && e.message().contains("--control-plane-token"),
        "{e:?}"
    );
    // Once the secret is cleared, the same anonymous stream is served.
    ok(
        &cp,
        "UpsertUpstream",
        r#"{"upstream": {"name": "users", "clearIdentitySigningSecret": true,
            "instances": [{"id": "users-1", "url": "http://127.0.0.1:9001"}]}}"#,
    )
    .await;
    let mut stream = open_stream(&cp, None).await.unwrap();
    let pushed = stream.message().await.unwrap().expect("a configuration");
    assert_eq!(pushed.version, 2);
    assert!(!cp.logs().contains(secret));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_plane_token_receives_the_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("secrets.key");
    std::fs::write(&key, "22".repeat(32)).unwrap();
    let tokens = tokens_file(dir.path());
    let cp = CpProcess::start(
        &dir.path().join("cp.db"),
        &[
            "--auth-tokens-file",
            tokens.to_str().unwrap(),
            "--secrets-key-file",
            key.to_str().unwrap(),
        ],
    )
    .await;
    let secret = SIGNING_SECRET;
    let users = signed_users(secret);
    ok_as(&cp, ADMIN, "UpsertUpstream", &users).await;
    let mut stream = open_stream(&cp, Some(DATA_PLANE)).await.unwrap();
    let pushed = stream.message().await.unwrap().expect("a configuration");
    assert_eq!(pushed.upstreams[0].identity_signing_secret, secret);
}

/// Runs the binary with `args`, collecting stderr; returns (child, stderr lines receiver).
fn spawn(db: &Path, args: &[&str]) -> (tokio::process::Child, tokio::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_control-plane"))
        .arg("--database")
        .arg(db)
        .args(["--log-format", "json"])
        .args(args)
        .env_remove("CONTROL_PLANE_AUTH_TOKENS_FILE")
        .env_remove("CONTROL_PLANE_INSECURE_OPEN")
        .env_remove("CONTROL_PLANE_SEED")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let _ = tx.send(l).await;
        }
    });
    (child, rx)
}

/// Runs the binary with `args`, which it must refuse: everything it wrote to stderr.
async fn refused(db: &Path, args: &[&str]) -> String {
    let (mut child, mut rx) = spawn(db, args);
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .unwrap_or_else(|_| panic!("control-plane kept running with {args:?}"))
        .unwrap();
    assert!(!status.success());
    let mut stderr = String::new();
    while let Some(l) = rx.recv().await {
        stderr.push_str(&l);
        stderr.push('\n');
    }
    stderr
}

#[tokio::test(flavor = "multi_thread")]
async fn refuses_to_start_open_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = refused(&dir.path().join("cp.db"), &["--listen", "0.0.0.0:0"]).await;
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0")
            && stderr.contains("--auth-tokens-file")
            && stderr.contains("--insecure-open"),
        "{stderr}"
    );

    // On loopback too: any local process could otherwise rewrite every route.
    let stderr = refused(&dir.path().join("cp1.db"), &["--listen", "127.0.0.1:0"]).await;
    assert!(
        stderr.contains("refusing to listen on 127.0.0.1") && stderr.contains("--insecure-open"),
        "{stderr}"
    );

    // A malformed tokens file is a startup error naming the line.
    let bad = dir.path().join("bad-tokens");
    std::fs::write(&bad, "alice admin t0k3n-xyz\nbob superuser t0k3n-abc\n").unwrap();
    let stderr = refused(
        &dir.path().join("cp2.db"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--auth-tokens-file",
            bad.to_str().unwrap(),
        ],
    )
    .await;
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(stderr.contains("superuser"), "{stderr}");
    assert!(!stderr.contains("t0k3n"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn insecure_starts_on_a_non_loopback_address_with_a_loud_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, mut rx) = spawn(
        &dir.path().join("cp.db"),
        // `--insecure`: the old spelling of --insecure-open, still accepted.
        &["--listen", "0.0.0.0:0", "--insecure"],
    );
    let mut warned = false;
    let port = loop {
        let line = tokio::time::timeout(DEADLINE, rx.recv())
            .await
            .expect("no listening line")
            .expect("control-plane exited");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["level"] == "WARN"
            && v["fields"]["message"]
                .as_str()
                .unwrap()
                .contains("INSECURE")
        {
            warned = true;
        }
        if v["fields"]["message"] == "listening" {
            let addr: std::net::SocketAddr = v["fields"]["addr"].as_str().unwrap().parse().unwrap();
            break addr.port();
        }
    };
    assert!(warned, "no INSECURE warning before listening");
    // Reachable (over loopback) without a token.
    let url = format!("http://127.0.0.1:{port}");
    eventually("unauthenticated ListRoutes works", || {
        let url = url.clone();
        async move {
            let mut c = gateway_proto::v1::admin_service_client::AdminServiceClient::connect(url)
                .await
                .ok()?;
            c.list_routes(gateway_proto::v1::ListRoutesRequest {})
                .await
                .ok()
        }
    })
    .await;
}
