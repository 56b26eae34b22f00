//! The auth service's own defences and administration, against real processes started by
//! devstack (issue 25, items 1 and 12):
//!
//! * `auth-service users add|list|delete` on the database of a running service: a user added
//!   from the command line logs in at once, a deleted one no longer does, bad input is refused
//!   with a clear message and a non-zero exit;
//! * the failed-login throttle: per user name and per client address, 429 problem+json with
//!   `Retry-After`, counted in Redis before the password is checked (concurrent guesses cannot
//!   overshoot), a success does not reset an address's failures, and `X-Forwarded-For` is
//!   believed only from `--trusted-proxies`.
//!
//! Logins go to the auth service directly (the gateway's `/auth/login` route has its own
//! per-IP rate limit, which would answer first). Needs every binary built in one target
//! directory and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, Result, ensure};
use devstack::Stack;
use gateway_tests::client;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

async fn start(builder: devstack::StackBuilder) -> Stack {
    builder
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"))
}

fn auth_binary() -> PathBuf {
    devstack::binaries::find_binary("auth-service", &devstack::binaries::search_dirs(None))
        .expect("the auth-service binary is built next to the tests")
}

/// What one `auth-service users ...` run printed.
#[derive(Debug)]
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `auth-service --database DB users ARGS` with `stdin` piped in and `env` set.
async fn users(db: &Path, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Result<Ran> {
    let mut child = Command::new(auth_binary())
        .arg("--database")
        .arg(db)
        .arg("users")
        .args(args)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("spawning auth-service users")?;
    let mut pipe = child.stdin.take().context("stdin")?;
    pipe.write_all(stdin.as_bytes()).await?;
    drop(pipe);
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .context("auth-service users did not finish within 60 s")??;
    Ok(Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// What a login answered.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<u64>,
    content_type: Option<String>,
    body: Value,
}

/// `POST /auth/login` at the auth service, with `X-Forwarded-For: xff` when given.
async fn login(stack: &Stack, user: &str, password: &str, xff: Option<&str>) -> Result<Answer> {
    let mut request = client()
        .post(format!("{}/auth/login", stack.auth_url()))
        .json(&json!({"username": user, "password": password}));
    if let Some(xff) = xff {
        request = request.header("x-forwarded-for", xff);
    }
    let response = request.send().await?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    let content_type = header("content-type");
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    Ok(Answer {
        status,
        retry_after,
        content_type,
        body,
    })
}

/// A 429 as the README describes it.
fn ensure_throttled(a: &Answer, window_secs: u64) -> Result<()> {
    ensure!(a.status == StatusCode::TOO_MANY_REQUESTS, "{a:?}");
    ensure!(
        a.retry_after
            .is_some_and(|r| (1..=window_secs).contains(&r)),
        "Retry-After within the window: {a:?}"
    );
    ensure!(
        a.content_type.as_deref() == Some("application/problem+json"),
        "{a:?}"
    );
    ensure!(
        a.body["type"] == "urn:gateway:problem:too-many-failed-logins" && a.body["status"] == 429,
        "{a:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn users_added_to_a_running_service_log_in_at_once() -> Result<()> {
    let stack = start(Stack::new().data_planes(1)).await;
    let db = stack.dir().join("auth.db");
    let refused = login(&stack, "carol", "tea-party", None).await?;
    ensure!(refused.status == StatusCode::UNAUTHORIZED, "{refused:?}");

    // Piped in on stdin.
    let ran = users(
        &db,
        &["add", "carol", "--role", "admin"],
        "tea-party\n",
        &[],
    )
    .await?;
    ensure!(
        ran.ok && ran.stderr.contains("\"carol\" created"),
        "{ran:?}"
    );
    let pair = login(&stack, "carol", "tea-party", None).await?;
    ensure!(pair.status == StatusCode::OK, "{pair:?}");
    let claims = jwt_claims(pair.body["access_token"].as_str().context("access_token")?)?;
    ensure!(
        claims["sub"] == "carol" && claims["role"] == "admin",
        "{claims}"
    );

    // From a named variable; stdin is then not read.
    let ran = users(
        &db,
        &["add", "dodo", "--role", "user", "--password-env", "DODO_PW"],
        "not-this\n",
        &[("DODO_PW", "caucus-race")],
    )
    .await?;
    ensure!(ran.ok, "{ran:?}");
    ensure!(
        login(&stack, "dodo", "caucus-race", None).await?.status == StatusCode::OK,
        "dodo logs in with the password from the variable"
    );

    let ran = users(&db, &["list"], "", &[]).await?;
    ensure!(
        ran.ok && ran.stdout == "alice user\nbob admin\ncarol admin\ndodo user\n",
        "{ran:?}"
    );

    // Clear refusals, nothing changed.
    for (args, stdin, env, says) in [
        (
            &["add", "carol", "--role", "user"][..],
            "other\n",
            &[][..],
            "already exists (use --replace",
        ),
        (
            &["add", "mad hatter", "--role", "user"],
            "x\n",
            &[],
            "must be 1-64 characters",
        ),
        (
            &["add", "hatter", "--role", "Admin"],
            "x\n",
            &[],
            "role \"Admin\"",
        ),
        (
            &["add", "hatter", "--role", "user"],
            "",
            &[],
            "no password on stdin",
        ),
        (
            &[
                "add",
                "hatter",
                "--role",
                "user",
                "--password-env",
                "UNSET_PW_VAR_91",
            ],
            "x\n",
            &[],
            "UNSET_PW_VAR_91: the variable is not set",
        ),
        (&["delete", "hatter"], "", &[], "no user \"hatter\""),
    ] {
        let ran = users(&db, args, stdin, env).await?;
        ensure!(!ran.ok && ran.stderr.contains(says), "{args:?}: {ran:?}");
    }
    ensure!(
        login(&stack, "carol", "tea-party", None).await?.status == StatusCode::OK,
        "a refused add changed carol"
    );

    // --replace changes the password; delete stops logins at once.
    let ran = users(
        &db,
        &["add", "carol", "--role", "user", "--replace"],
        "new-pw",
        &[],
    )
    .await?;
    ensure!(ran.ok && ran.stderr.contains("updated"), "{ran:?}");
    ensure!(login(&stack, "carol", "tea-party", None).await?.status == StatusCode::UNAUTHORIZED);
    ensure!(login(&stack, "carol", "new-pw", None).await?.status == StatusCode::OK);
    let ran = users(&db, &["delete", "carol"], "", &[]).await?;
    ensure!(ran.ok && ran.stderr.contains("deleted"), "{ran:?}");
    ensure!(login(&stack, "carol", "new-pw", None).await?.status == StatusCode::UNAUTHORIZED);
    stack.shutdown().await;
    Ok(())
}

fn jwt_claims(token: &str) -> Result<Value> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).context("not a JWT")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload)?;
    Ok(serde_json::from_slice(&bytes)?)
}

const WINDOW_SECS: u64 = 120;
/// `--login-slowdown-ms` of the throttled stack.
const SLOT_MS: u64 = 300;

/// Throttle settings small enough to reach in a test, and the auth service trusting
/// `X-Forwarded-For` from loopback (where the data planes, and this test, connect from).
fn throttled_stack(trust_loopback: bool) -> devstack::StackBuilder {
    let mut builder = Stack::new()
        .data_planes(1)
        .env("auth-service", "AUTH_LOGIN_USER_FAILURES", "3")
        .env("auth-service", "AUTH_LOGIN_IP_FAILURES", "5")
        .env("auth-service", "AUTH_LOGIN_NAME_FAILURES", "4")
        .env(
            "auth-service",
            "AUTH_LOGIN_SLOWDOWN_MS",
            SLOT_MS.to_string(),
        )
        .env(
            "auth-service",
            "AUTH_LOGIN_FAILURE_WINDOW_SECS",
            WINDOW_SECS.to_string(),
        );
    if trust_loopback {
        builder = builder.env(
            "auth-service",
            "AUTH_TRUSTED_PROXIES",
            "127.0.0.1/32,::1/128",
        );
    }
    builder
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_logins_are_throttled_per_name_and_per_address() -> Result<()> {
    let stack = start(throttled_stack(true)).await;

    // Per (name, address): 3 failures from one address, then alice is refused from there,
    // even with her right password; from another address she logs in (issue 41: wrong
    // passwords never lock an account for everyone), and bob logs in from the first.
    for i in 1..=3 {
        let a = login(&stack, "alice", "queen", Some("192.0.2.1")).await?;
        ensure!(a.status == StatusCode::UNAUTHORIZED, "failure {i}: {a:?}");
    }
    let a = login(&stack, "alice", "wonderland", Some("192.0.2.1")).await?;
    ensure_throttled(&a, WINDOW_SECS)?;
    let a = login(&stack, "alice", "wonderland", Some("198.51.100.200")).await?;
    ensure!(
        a.status == StatusCode::OK,
        "not locked from elsewhere: {a:?}"
    );
    ensure!(
        login(&stack, "bob", "builder", Some("192.0.2.1"))
            .await?
            .status
            == StatusCode::OK,
        "another name is not throttled"
    );

    // Per address: failure, failure, success, failure, failure, failure (5 failures): the
    // success in between gives back only its own attempt, so the address is now refused, for
    // bob's right password too; another address is not.
    let ip = Some("203.0.113.50");
    for (user, password, want) in [
        ("u1", "x", StatusCode::UNAUTHORIZED),
        ("u2", "x", StatusCode::UNAUTHORIZED),
        ("bob", "builder", StatusCode::OK),
        ("u3", "x", StatusCode::UNAUTHORIZED),
        ("u4", "x", StatusCode::UNAUTHORIZED),
        ("u5", "x", StatusCode::UNAUTHORIZED),
    ] {
        let a = login(&stack, user, password, ip).await?;
        ensure!(a.status == want, "{user} from {ip:?}: {a:?}");
    }
    ensure_throttled(&login(&stack, "bob", "builder", ip).await?, WINDOW_SECS)?;
    ensure!(
        login(&stack, "bob", "builder", Some("203.0.113.51"))
            .await?
            .status
            == StatusCode::OK,
        "another address is not throttled"
    );

    // Concurrent guesses on one name from many addresses: the first 4 (the name's bound) are
    // checked at once, then one per slot, all in their turn; then the owner's right password
    // still gets in: the name is slowed, never locked.
    let started = std::time::Instant::now();
    let guesses = (0..12).map(|i| {
        let stack = &stack;
        async move { login(stack, "bob", "guess", Some(&format!("198.51.100.{i}"))).await }
    });
    let answers = futures::future::try_join_all(guesses).await?;
    let elapsed = started.elapsed();
    ensure!(
        answers.iter().all(|a| a.status == StatusCode::UNAUTHORIZED),
        "every slowed guess is checked in its turn: {answers:?}"
    );
    ensure!(
        elapsed >= std::time::Duration::from_millis(7 * SLOT_MS),
        "8 guesses past the bound take at least 7 slots after the first: {elapsed:?}"
    );
    let a = login(&stack, "bob", "builder", Some("198.51.100.99")).await?;
    ensure!(
        a.status == StatusCode::OK,
        "the right password gets in: {a:?}"
    );

    // The counters are in Redis, under the documented keys.
    let mut redis = stack
        .redis_target()
        .client()?
        .get_multiplexed_async_connection()
        .await?;
    let count: Option<u32> = redis::cmd("GET")
        .arg("auth:{login}:ip:203.0.113.50")
        .query_async(&mut redis)
        .await?;
    ensure!(
        count == Some(5),
        "auth:{{login}}:ip:203.0.113.50 = {count:?}"
    );
    let ttl: i64 = redis::cmd("TTL")
        .arg("auth:{login}:user:alice")
        .query_async(&mut redis)
        .await?;
    ensure!(
        (1..=WINDOW_SECS as i64).contains(&ttl),
        "auth:{{login}}:user:alice TTL {ttl}"
    );
    let pair: Option<u32> = redis::cmd("GET")
        .arg("auth:{login}:pair:alice|192.0.2.1")
        .query_async(&mut redis)
        .await?;
    ensure!(
        pair == Some(3),
        "auth:{{login}}:pair:alice|192.0.2.1 = {pair:?}"
    );
    stack.shutdown().await;
    Ok(())
}

/// Without `--trusted-proxies` a client cannot pick the address it is counted as.
#[tokio::test(flavor = "multi_thread")]
async fn a_spoofed_forwarded_for_does_not_escape_the_address_limit() -> Result<()> {
    let stack = start(throttled_stack(false)).await;
    for i in 0..5 {
        let a = login(&stack, &format!("v{i}"), "x", Some(&format!("192.0.2.{i}"))).await?;
        ensure!(a.status == StatusCode::UNAUTHORIZED, "failure {i}: {a:?}");
    }
    let a = login(&stack, "bob", "builder", Some("192.0.2.77")).await?;
    ensure_throttled(&a, WINDOW_SECS)?;
    stack.shutdown().await;
    Ok(())
}
