//! `gatewayctl` against a real control plane and data planes (devstack's
//! processes): the dump → apply round trip, diff, compare-and-swap, rollback
//! reaching every data plane, secrets from the environment, tokens, and
//! offline validation with line numbers.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// What one run of the binary printed, and how it ended.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `gatewayctl ARGS` against `stack` with `env` set (and `GATEWAY_TOKEN`
/// the admin token unless `env` sets it).
async fn ctl(stack: Option<&devstack::Stack>, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gatewayctl"));
    cmd.env_remove("GATEWAY_TOKEN").env_remove("GATEWAY_SERVER");
    if let Some(stack) = stack {
        cmd.env("GATEWAY_SERVER", stack.control_plane_url())
            .env("GATEWAY_TOKEN", stack.admin_token());
    }
    cmd.envs(env.iter().copied()).args(args);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("gatewayctl finished within 60 s")
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn ok(run: &Run) -> &str {
    assert_eq!(run.code, 0, "{run:?}");
    &run.stdout
}

async fn stack() -> devstack::Stack {
    devstack::Stack::new()
        .data_planes(2)
        .auth(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"))
}

/// Waits until `gatewayctl status` shows every data plane SYNCED at `version`.
async fn wait_status_synced(stack: &devstack::Stack, version: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = ctl(Some(stack), &[], &["status"]).await;
        let text = ok(&run).to_owned();
        let rows: Vec<&str> = text.lines().skip(2).collect();
        let synced = text.starts_with(&format!("current version {version}\n"))
            && rows.len() == 2
            && rows.iter().all(|r| {
                let cells: Vec<&str> = r.split_whitespace().collect();
                cells.get(1) == Some(&"SYNCED")
                    && cells.get(2) == Some(&version.to_string().as_str())
            });
        if synced {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "not synced at {version}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn dump_apply_diff_rollback_through_a_real_control_plane() {
    let stack = stack().await;
    let dir = tempfile::tempdir().unwrap();
    let v0 = stack.seeded_version();

    // dump → apply is a no-op.
    let dumped = ok(&ctl(Some(&stack), &[], &["dump"]).await).to_owned();
    assert!(
        dumped.starts_with(&format!("# gateway configuration version {v0} ")),
        "{dumped}"
    );
    let yaml = write(dir.path(), "gateway.yaml", &dumped);
    let run = ctl(Some(&stack), &[], &["apply", "-f", &yaml]).await;
    assert_eq!(ok(&run), format!("no changes: version {v0} is current\n"));
    let run = ctl(Some(&stack), &[], &["diff", "-f", &yaml, "--exit-code"]).await;
    assert_eq!(
        ok(&run),
        format!("no changes: version {v0} already is this file\n")
    );
    // The JSON dump reads back the same.
    let json = ok(&ctl(Some(&stack), &[], &["dump", "-o", "json"]).await).to_owned();
    let json_path = write(dir.path(), "gateway.json", &json);
    let run = ctl(Some(&stack), &[], &["apply", "-f", &json_path]).await;
    assert_eq!(ok(&run), format!("no changes: version {v0} is current\n"));

    // A renamed route is a removal and an addition, field by field.
    let mut doc: Value = serde_json::from_str(&json).unwrap();
    let old_name = doc["routes"][0]["name"].as_str().unwrap().to_owned();
    doc["routes"][0]["name"] = Value::String("renamed".into());
    let renamed = write(
        dir.path(),
        "renamed.json",
        &serde_json::to_string_pretty(&doc).unwrap(),
    );
    let run = ctl(Some(&stack), &[], &["diff", "-f", &renamed, "--exit-code"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("+ route \"renamed\"\n"), "{run:?}");
    assert!(run.stdout.contains("\n    name: \"renamed\"\n"), "{run:?}");
    assert!(
        run.stdout.contains(&format!("- route \"{old_name}\"\n")),
        "{run:?}"
    );
    assert!(
        run.stdout.ends_with(&format!(
            "2 change(s) against version {v0}; `gatewayctl apply` would commit version {}\n",
            v0 + 1
        )),
        "{run:?}"
    );
    // diff commits nothing.
    assert!(
        ok(&ctl(Some(&stack), &[], &["status"]).await)
            .starts_with(&format!("current version {v0}\n"))
    );

    // A stale compare-and-swap is refused; the right one commits.
    let stale = (v0 - 1).to_string();
    let run = ctl(
        Some(&stack),
        &[],
        &["apply", "-f", &renamed, "--expected-version", &stale],
    )
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("control plane: FAILED_PRECONDITION"),
        "{run:?}"
    );
    let current = v0.to_string();
    let run = ctl(
        Some(&stack),
        &[],
        &["apply", "-f", &renamed, "--expected-version", &current],
    )
    .await;
    let v1 = v0 + 1;
    assert_eq!(
        ok(&run),
        format!("removed route \"{old_name}\"\nadded route \"renamed\"\ncommitted version {v1}\n")
    );
    wait_status_synced(&stack, v1).await;

    // Rollback: a new version with the old content, on every data plane.
    let run = ctl(Some(&stack), &[], &["rollback", &v0.to_string()]).await;
    let v2 = v1 + 1;
    assert_eq!(
        ok(&run),
        format!("committed version {v2} (the content of version {v0})\n")
    );
    let status = wait_status_synced(&stack, v2).await;
    assert!(
        status.lines().nth(1).unwrap().starts_with("NODE"),
        "{status}"
    );
    // The original file is the configuration again.
    let run = ctl(Some(&stack), &[], &["diff", "-f", &yaml, "--exit-code"]).await;
    assert_eq!(
        ok(&run),
        format!("no changes: version {v2} already is this file\n")
    );
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_come_from_the_environment_and_never_go_back_out() {
    let stack = stack().await;
    let dir = tempfile::tempdir().unwrap();
    let json = ok(&ctl(Some(&stack), &[], &["dump", "-o", "json"]).await).to_owned();
    let mut doc: Value = serde_json::from_str(&json).unwrap();
    let upstream = doc["upstreams"][0]["name"].as_str().unwrap().to_owned();
    doc["upstreams"][0]["identitySigningSecret"] =
        Value::String("${GATEWAY_VAR_SIGNING_SECRET}".into());
    let path = write(
        dir.path(),
        "secret.json",
        &serde_json::to_string(&doc).unwrap(),
    );

    // Without the variable: refused before anything is sent, with the line.
    let run = ctl(Some(&stack), &[], &["apply", "-f", &path]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr
            .contains("environment variable GATEWAY_VAR_SIGNING_SECRET is not set"),
        "{run:?}"
    );

    let secret = "0123456789abcdef0123456789abcdef-signing";
    let env = [("GATEWAY_VAR_SIGNING_SECRET", secret)];
    let run = ctl(Some(&stack), &env, &["diff", "-f", &path]).await;
    assert!(
        ok(&run).contains(&format!(
            "~ upstream \"{upstream}\"\n    identitySigningSecret: (unset) → \"<secret>\"\n"
        )),
        "{run:?}"
    );
    assert!(!run.stdout.contains(secret));
    let run = ctl(Some(&stack), &env, &["apply", "-f", &path]).await;
    assert!(
        ok(&run).contains(&format!("updated upstream \"{upstream}\"")),
        "{run:?}"
    );

    let dumped = ok(&ctl(Some(&stack), &[], &["dump"]).await).to_owned();
    assert!(!dumped.contains(secret), "{dumped}");
    assert!(
        dumped.contains(&format!(
            "# upstream \"{upstream}\" has an identitySigningSecret (never returned)"
        )),
        "{dumped}"
    );
    // Issue 41, item 11: a file cannot read GATEWAY_TOKEN (nor any variable) into
    // another field, where diff would print it or the gateway send it upstream.
    let mut leak = doc.clone();
    leak["upstreams"][0]["identitySigningSecret"] = Value::String(String::new());
    leak["routes"][0]["requestHeaders"] =
        serde_json::json!({"set": {"x-leak": "${GATEWAY_TOKEN}"}});
    let leak = write(
        dir.path(),
        "leak.json",
        &serde_json::to_string(&leak).unwrap(),
    );
    let run = ctl(Some(&stack), &env, &["diff", "-f", &leak]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("only in secret fields"), "{run:?}");
    let token = stack.admin_token();
    assert!(
        !run.stderr.contains(token) && !run.stdout.contains(token),
        "{run:?}"
    );
    // The dump applied back keeps the secret (an empty one keeps it).
    let again = write(dir.path(), "again.yaml", &dumped);
    let run = ctl(Some(&stack), &[], &["apply", "-f", &again]).await;
    assert!(ok(&run).starts_with("no changes"), "{run:?}");

    // Tokens: none, and a data plane's, are refused by the control plane.
    let run = ctl(Some(&stack), &[("GATEWAY_TOKEN", "")], &["status"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("UNAUTHENTICATED"), "{run:?}");
    let token_file = write(
        dir.path(),
        "token",
        &format!("{}\n", stack.data_plane_token()),
    );
    let run = ctl(
        Some(&stack),
        &[("GATEWAY_TOKEN", "")],
        &["--token-file", &token_file, "apply", "-f", &again],
    )
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("PERMISSION_DENIED"), "{run:?}");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn validate_is_offline_and_names_lines() {
    let dir = tempfile::tempdir().unwrap();
    let good = "\
routes:
  - name: users
    pathPrefix: /api/users
    upstream: users
    auth: AUTH_NONE
upstreams:
  - name: users
    instances:
      - id: users-1
        url: http://127.0.0.1:7001
";
    // Nothing listens on the server given: validate does not connect.
    let offline = [("GATEWAY_SERVER", "http://127.0.0.1:1")];
    let path = write(dir.path(), "good.yaml", good);
    let run = ctl(None, &offline, &["validate", "-f", &path]).await;
    assert_eq!(ok(&run), format!("{path}: valid (1 routes, 1 upstreams)\n"));

    let bad = good
        .replace("    upstream: users", "    upstream: nope")
        .replace(
            "url: http://127.0.0.1:7001",
            "url: http://127.0.0.1:7001/path",
        );
    let path = write(dir.path(), "bad.yaml", &bad);
    let run = ctl(None, &offline, &["validate", "-f", &path]).await;
    assert_eq!(run.code, 1, "{run:?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "error: {path}:10: upstream \"users\": instance \"users-1\": url"
        )),
        "{run:?}"
    );
    assert_eq!(
        lines[1],
        format!("{path}:4: route \"users\": upstream \"nope\" does not exist"),
        "{run:?}"
    );

    let typo = write(
        dir.path(),
        "typo.yaml",
        &good.replace("pathPrefix", "pathPrefx"),
    );
    let run = ctl(None, &offline, &["validate", "-f", &typo]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.starts_with(&format!(
            "error: {typo}:3: routes[0].pathPrefx: unknown field `pathPrefx`"
        )),
        "{run:?}"
    );

    // Usage errors exit 2.
    let run = ctl(None, &[("GATEWAY_SERVER", "ftp://x")], &["status"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("give http://HOST:PORT or https://HOST:PORT"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_and_client_certificates_as_grpcurl_takes_them() {
    let stack = devstack::Stack::new()
        .data_planes(1)
        .auth(false)
        .tls(true)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"));
    let pki = stack.pki().unwrap();
    assert!(stack.control_plane_url().starts_with("https://"));
    let (ca, cert, key) = (
        pki.ca.display().to_string(),
        pki.client_cert.display().to_string(),
        pki.client_key.display().to_string(),
    );
    let run = ctl(
        Some(&stack),
        &[],
        &["--cacert", &ca, "--cert", &cert, "--key", &key, "status"],
    )
    .await;
    assert!(
        ok(&run).starts_with(&format!("current version {}\n", stack.seeded_version())),
        "{run:?}"
    );
    // Without the CA the server's certificate is not trusted.
    let run = ctl(Some(&stack), &[], &["status"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("needs --cacert"), "{run:?}");
    // A certificate without its key is a usage error (clap).
    let run = ctl(
        Some(&stack),
        &[],
        &["--cacert", &ca, "--cert", &cert, "status"],
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    stack.shutdown().await;
}
