//! A real `redis-server` for tests and benches, on a free loopback port.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A `redis-server` child process, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

/// The `redis-server` binary: `$REDIS_SERVER`, else `/usr/bin/redis-server`, else from `PATH`.
fn redis_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(path);
    }
    let default = PathBuf::from("/usr/bin/redis-server");
    if default.exists() {
        return default;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("redis-server"))
                .find(|candidate| candidate.exists())
        })
        .unwrap_or_else(|| {
            panic!(
                "redis-server not found (looked at $REDIS_SERVER, /usr/bin/redis-server and PATH). \
                 These tests need a real Redis: install it with `sudo apt-get install -y redis-server` \
                 (Debian/Ubuntu) or `brew install redis` (macOS)."
            )
        })
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local addr")
        .port()
}

impl RedisServer {
    /// Starts Redis on a free port and waits until it answers `PING`.
    pub async fn start() -> Self {
        // A port picked this way can be taken by someone else before Redis
        // binds it; try a few.
        for _ in 0..5 {
            if let Some(server) = Self::try_start_on(free_port()).await {
                return server;
            }
        }
        panic!("redis-server failed to start on 5 different free ports");
    }

    /// Starts Redis on `port` (e.g. to restart it where clients expect it).
    pub async fn start_on(port: u16) -> Self {
        Self::try_start_on(port)
            .await
            .unwrap_or_else(|| panic!("redis-server failed to start on port {port}"))
    }

    async fn try_start_on(port: u16) -> Option<Self> {
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
                "--daemonize",
                "no",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn redis-server");
        let mut server = Self {
            child: Some(child),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if server.ping().await {
                return Some(server);
            }
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                server.kill().await;
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The port Redis listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A fresh connection for test commands.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis-server")
    }

    async fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let attempt = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(1), attempt).await,
            Ok(Ok(_))
        )
    }

    /// Sends `signal` (e.g. `-STOP`, `-CONT`) to Redis with kill(1).
    pub fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(|c| c.id())
            .expect("redis-server is running");
        let status = std::process::Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Kills Redis (SIGKILL: no goodbye to clients) and reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}
