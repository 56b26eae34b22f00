//! Test support: a throwaway `redis-server` on a free loopback port.

use std::process::Stdio;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::process::{Child, Command};

/// A `redis-server` child process, killed on drop.
pub(crate) struct RedisServer {
    child: Child,
    url: String,
}

fn redis_server_binary() -> std::path::PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("redis-server"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    candidates
        .into_iter()
        .chain(std::iter::once("/usr/bin/redis-server".into()))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "redis-server not found on PATH or at /usr/bin/redis-server; these tests need a real Redis \
                 (install it with `apt-get install redis-server`)"
            )
        })
}

impl RedisServer {
    /// Starts Redis without persistence and waits until it answers PING.
    pub(crate) async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new(redis_server_binary())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawning redis-server");
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                let pong: Result<String, _> = redis::cmd("PING").query_async(&mut c).await;
                if pong.is_ok() {
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server on port {port} never answered PING"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self { child, url }
    }

    /// A connection manager configured like the service's.
    pub(crate) async fn connection_manager(&self) -> ConnectionManager {
        let target = gateway_redis::RedisTarget::new(self.url.parse().expect("redis url"), None)
            .expect("redis target");
        crate::redis_connection(&target).expect("redis client")
    }

    /// Kills the server and waits for it to exit.
    pub(crate) async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}
