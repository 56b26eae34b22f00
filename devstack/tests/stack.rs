//! The devstack library's process control against real binaries: early
//! exits are reported with the process's log, processes can be killed,
//! stopped and restarted by name, and dropping the stack kills everything.
//!
//! Needs every gateway binary built next to the test executable's target
//! directory (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::Duration;

use devstack::{Stack, StackError};

/// Whether `pid` is a live process (a zombie counts as dead).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_that_dies_at_start_is_named_with_its_log() {
    let err = Stack::new()
        .data_planes(1)
        .auth(false)
        .data_plane_arg("--no-such-flag")
        .start()
        .await
        .expect_err("a data plane with a bad flag cannot start");
    match &err {
        StackError::EarlyExit { name, tail, .. } => {
            assert_eq!(name, "data-plane-1");
            assert!(tail.contains("--no-such-flag"), "log tail: {tail}");
        }
        other => panic!("expected EarlyExit, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn processes_are_killed_stopped_and_restarted_by_name() {
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .start()
        .await
        .unwrap();
    assert!(stack.seeded_version() >= 1);
    let health = format!("http://127.0.0.1:{}/health", stack.ports().users_1);

    // kill: a crash; the name stays known and can be started again.
    let pid = stack.pid("users-1").unwrap();
    stack.kill("users-1").await.unwrap();
    assert_eq!(stack.pid("users-1"), None);
    assert!(!alive(pid));
    assert!(http().get(&health).send().await.is_err());
    stack.kill("users-1").await.unwrap(); // killing a dead process is a no-op

    stack.start_process("users-1").await.unwrap();
    let new_pid = stack.pid("users-1").unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(http().get(&health).send().await.unwrap().status(), 200);
    assert!(matches!(
        stack.start_process("users-1").await,
        Err(StackError::AlreadyRunning(_))
    ));

    // stop: SIGTERM, and the mock exits cleanly.
    let status = stack.stop("orders-2").await.unwrap();
    assert_eq!(status.as_deref(), Some("exit status: 0"));
    assert_eq!(stack.stop("orders-2").await.unwrap(), None);

    assert!(matches!(
        stack.kill("nobody").await,
        Err(StackError::UnknownProcess(_))
    ));
    // The restarted process logs into the same file, after a separator.
    let log = std::fs::read_to_string(stack.log_path("users-1")).unwrap();
    assert_eq!(log.matches("---- devstack: starting").count(), 2, "{log}");

    // A process that dies by itself is reported once.
    let orders_1 = stack.pid("orders-1").unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &orders_1.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let gone = stack.reap_exited();
            if !gone.is_empty() {
                return gone;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the dead process is noticed");
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].name, "orders-1");
    assert!(gone[0].status.contains("signal: 9"), "{}", gone[0].status);
    assert!(stack.reap_exited().is_empty());

    // Dropping the stack kills every process and removes its directory.
    let pids: Vec<u32> = stack
        .process_names()
        .iter()
        .filter_map(|n| stack.pid(n))
        .collect();
    assert!(!pids.is_empty());
    let dir = stack.dir().to_path_buf();
    drop(stack);
    for pid in pids {
        assert!(!alive(pid), "pid {pid} survived the drop");
    }
    assert!(!dir.exists());
}
