//! The `devstack` binary as a script would use it: `--json` prints exactly
//! one line when ready; SIGTERM stops every process and exits 0; SIGKILL
//! leaves no orphan behind.
//!
//! Needs `redis-server` on PATH; the gateway programs run from the devstack
//! binary itself (`devstack serve <program>`).
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// Generous: a debug build on a busy 2-core machine.
const READY_WITHIN: Duration = Duration::from_secs(120);

struct Running {
    child: Child,
    stdout: BufReader<ChildStdout>,
    info: serde_json::Value,
}

async fn start_devstack() -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_devstack"))
        .args(["--json", "--data-planes", "2"])
        // Every program runs from the devstack binary itself (`devstack serve`).
        .env_remove("GATEWAY_BIN_DIR")
        .env("DEVSTACK_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("devstack starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(READY_WITHIN, stdout.read_line(&mut line))
        .await
        .expect("devstack printed its JSON line in time")
        .unwrap();
    let info: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
    Running {
        child,
        stdout,
        info,
    }
}

fn pids(info: &serde_json::Value) -> Vec<(String, u32)> {
    info["pids"]
        .as_object()
        .expect("pids object")
        .iter()
        .map(|(name, pid)| (name.clone(), pid.as_u64().unwrap() as u32))
        .collect()
}

/// Whether `pid` is a live process (a zombie counts as dead).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

async fn wait_all_dead(pids: &[(String, u32)], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let living: Vec<_> = pids.iter().filter(|(_, pid)| alive(*pid)).collect();
        if living.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running after {within:?}: {living:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread")]
async fn json_line_describes_the_stack_and_sigterm_stops_everything() {
    let mut devstack = start_devstack().await;
    let info = &devstack.info;
    for key in ["control_plane", "auth", "redis"] {
        assert!(info[key].is_string(), "{key} missing in {info}");
    }
    assert!(
        info["control_plane"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert!(
        info["auth"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    assert!(
        info["redis"]
            .as_str()
            .unwrap()
            .starts_with("redis://127.0.0.1:")
    );
    assert_eq!(info["gateways"].as_array().unwrap().len(), 2);
    assert_eq!(info["gateway_admins"].as_array().unwrap().len(), 2);
    let pids = pids(info);
    let mut names: Vec<_> = pids.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "auth-service",
            "control-plane",
            "data-plane-1",
            "data-plane-2",
            "orders-1",
            "orders-2",
            "redis",
            "users-1"
        ]
    );
    assert!(pids.iter().all(|(_, pid)| alive(*pid)), "{pids:?}");

    // The gateway answers through the seeded configuration.
    let gw = info["gateways"][0].as_str().unwrap();
    let anonymous = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{gw}/api/orders/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        anonymous.status(),
        401,
        "the demo orders route requires a JWT"
    );

    signal(devstack.child.id().unwrap(), "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), devstack.child.wait())
        .await
        .expect("devstack exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "devstack exit status {status}");
    wait_all_dead(&pids, Duration::from_secs(5)).await;

    // Exactly one line on stdout.
    let mut rest = String::new();
    devstack.stdout.read_to_string(&mut rest).await.unwrap();
    assert_eq!(rest, "", "stdout must hold only the JSON line");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_devstack_leaves_no_orphans() {
    let mut devstack = start_devstack().await;
    let pids = pids(&devstack.info);
    assert!(pids.iter().all(|(_, pid)| alive(*pid)), "{pids:?}");
    signal(devstack.child.id().unwrap(), "-KILL");
    let _ = devstack.child.wait().await;
    wait_all_dead(&pids, Duration::from_secs(5)).await;
    // Nobody was left to remove the temporary directory.
    let logs = std::path::PathBuf::from(devstack.info["log_dir"].as_str().unwrap());
    std::fs::remove_dir_all(logs.parent().unwrap()).unwrap();
}
