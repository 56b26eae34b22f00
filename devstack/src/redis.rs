//! `redis-server`: the arguments every Redis devstack starts gets, and a
//! standalone server ([`RedisServer`]) for the crates' own tests and benches.
//!
//! The stack's Redis and a [`RedisServer`] are started the same way
//! ([`server_args`]): loopback only, no persistence, the password (if any) in
//! a mode-0600 config file rather than on the command line, TLS only (no
//! plain-text port) when asked for.
//!
//! ```no_run
//! # async fn demo() -> Result<(), devstack::StackError> {
//! let redis = devstack::RedisServer::builder().password("pw").start().await?;
//! let client = redis.target().client().expect("a valid target");
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gateway_redis::RedisTarget;
use tokio::process::Child;

use crate::error::StackError;
use crate::pki::Pki;
use crate::process::{ProcessSpec, Readiness, log_tail};
use crate::readiness::redis_ping;
use crate::{ports, secrets, sys};

/// How long a standalone server may take to answer `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Fresh ports tried when the one drawn was taken before Redis bound it.
const PORT_ATTEMPTS: usize = 3;

/// The `redis-server` binary: the first on `PATH`, else `/usr/bin/redis-server`.
pub fn redis_server_binary() -> Result<PathBuf, StackError> {
    crate::binaries::which("redis-server")
        .or_else(|| {
            let debian = PathBuf::from("/usr/bin/redis-server");
            debian.is_file().then_some(debian)
        })
        .ok_or_else(|| StackError::ToolMissing {
            tool: "redis-server".into(),
            install: crate::prereq::redis_install_hint(),
        })
}

/// The arguments of a devstack `redis-server` on 127.0.0.1:`port`, keeping
/// its files in `dir`: `conf` (a config file, e.g. holding `requirepass`)
/// first, as redis-server wants it, and with `tls`, TLS on `port` and no
/// plain-text port at all (clients need not present certificates).
pub(crate) fn server_args(
    port: u16,
    dir: &Path,
    conf: Option<&Path>,
    tls: Option<&Pki>,
) -> Vec<String> {
    let mut args: Vec<String> = conf.map(|c| c.display().to_string()).into_iter().collect();
    let port = port.to_string();
    match tls {
        Some(pki) => args.extend([
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port,
            "--tls-cert-file".into(),
            pki.server_cert.display().to_string(),
            "--tls-key-file".into(),
            pki.server_key.display().to_string(),
            "--tls-ca-cert-file".into(),
            pki.ca.display().to_string(),
            "--tls-auth-clients".into(),
            "no".into(),
        ]),
        None => args.extend(["--port".into(), port]),
    }
    args.extend([
        "--bind".into(),
        "127.0.0.1".into(),
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
        "--dir".into(),
        dir.display().to_string(),
    ]);
    args
}

/// Writes `requirepass` into `dir/redis.conf` (mode 0600) and returns its path.
pub(crate) fn password_conf(dir: &Path, password: &str) -> Result<PathBuf, StackError> {
    let conf = dir.join("redis.conf");
    secrets::write_private(&conf, &format!("requirepass {password}\n"))?;
    Ok(conf)
}

/// The URL of a devstack Redis on 127.0.0.1:`port` (as [`RedisServer::url`]).
fn url_of(port: u16, password: Option<&str>, tls: bool) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    let auth = password.map_or_else(String::new, |p| format!(":{p}@"));
    format!("{scheme}://{auth}127.0.0.1:{port}")
}

/// [`url_of`] with the CA to trust.
fn target_of(port: u16, password: Option<&str>, pki: Option<&Pki>) -> RedisTarget {
    let url = url_of(port, password, pki.is_some())
        .parse()
        .unwrap_or_else(|e| unreachable!("devstack's Redis URL is valid: {e}"));
    RedisTarget::new(url, pki.map(|p| p.ca.as_path()))
        .unwrap_or_else(|e| unreachable!("devstack's Redis target is valid: {e}"))
}

/// Options of a [`RedisServer`]; see [`RedisServer::builder`].
#[derive(Debug, Default, Clone)]
pub struct RedisBuilder {
    password: Option<String>,
    tls: bool,
    port: Option<u16>,
    args: Vec<String>,
}

impl RedisBuilder {
    /// Requires this password (`requirepass`) of every client.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Serves TLS only, with a throwaway CA ([`RedisServer::pki`]) whose
    /// server certificate names `localhost` and `127.0.0.1`.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Listens on this port instead of a free one drawn at random.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// One more `redis-server` argument, after devstack's own.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Starts the server and waits until it answers `PING` (with the
    /// password, over TLS). Without a fixed port, a port taken between its
    /// draw and Redis's bind is replaced by another, up to three times.
    pub async fn start(self) -> Result<RedisServer, StackError> {
        let program = redis_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("devstack-redis-")
            .tempdir()
            .map_err(StackError::io("creating Redis's directory"))?;
        let pki = if self.tls {
            Some(Pki::generate(&dir.path().join("pki"))?)
        } else {
            None
        };
        let conf = match &self.password {
            Some(password) => Some(password_conf(dir.path(), password)?),
            None => None,
        };
        let mut dir = dir;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = match self.port {
                Some(port) => port,
                None => ports::free_port()?,
            };
            let mut args = server_args(port, dir.path(), conf.as_deref(), pki.as_ref());
            args.extend(self.args.iter().cloned());
            let target = target_of(port, self.password.as_deref(), pki.as_ref());
            let mut server = RedisServer {
                spec: ProcessSpec {
                    name: "redis".into(),
                    program: program.clone(),
                    args,
                    env: Vec::new(),
                    env_remove: Vec::new(),
                    log: dir.path().join("redis.log"),
                    readiness: Readiness::Redis(target),
                },
                child: None,
                port,
                password: self.password.clone(),
                pki: pki.clone(),
                dir,
            };
            match server.spawn_and_wait().await {
                Ok(()) => return Ok(server),
                Err(StackError::EarlyExit { .. })
                    if self.port.is_none() && attempt < PORT_ATTEMPTS =>
                {
                    dir = server.into_dir();
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A `redis-server` child on 127.0.0.1, in a temporary directory of its own
/// (its log: [`RedisServer::log_path`]). Killed when dropped, and when the
/// process that started it dies.
#[derive(Debug)]
pub struct RedisServer {
    spec: ProcessSpec,
    child: Option<Child>,
    port: u16,
    password: Option<String>,
    pki: Option<Pki>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A server to configure: password, TLS, fixed port, extra arguments.
    pub fn builder() -> RedisBuilder {
        RedisBuilder::default()
    }

    /// A plain server (no password, no TLS) on a free port, answering `PING`.
    pub async fn start() -> Result<Self, StackError> {
        Self::builder().start().await
    }

    /// The port it listens on (the TLS port with TLS).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:P`, with `:PASSWORD@` when it has one and
    /// `rediss://` with TLS.
    pub fn url(&self) -> String {
        url_of(self.port, self.password.as_deref(), self.pki.is_some())
    }

    /// The throwaway CA and server certificate, with TLS.
    pub fn pki(&self) -> Option<&Pki> {
        self.pki.as_ref()
    }

    /// [`RedisServer::url`] with the CA to trust, as the services take it.
    pub fn target(&self) -> RedisTarget {
        target_of(self.port, self.password.as_deref(), self.pki.as_ref())
    }

    /// A fresh connection (password and TLS included).
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let client = self
            .target()
            .client()
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e.to_string())))?;
        client.get_multiplexed_async_connection().await
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Its log file (standard output and error, across restarts).
    pub fn log_path(&self) -> &Path {
        &self.spec.log
    }

    /// Freezes it (SIGSTOP): connections stay open and nothing is answered,
    /// like a server stuck in a long command.
    pub fn suspend(&self) -> Result<(), StackError> {
        self.signal(sys::Signal::Stop)
    }

    /// Lets a [`suspend`](RedisServer::suspend)ed server go on (SIGCONT).
    pub fn resume(&self) -> Result<(), StackError> {
        self.signal(sys::Signal::Continue)
    }

    fn signal(&self, signal: sys::Signal) -> Result<(), StackError> {
        let pid = self.pid().ok_or_else(|| StackError::Io {
            context: format!("signalling redis-server ({signal:?})"),
            source: std::io::Error::other("it is not running"),
        })?;
        sys::send_signal(pid, signal).map_err(StackError::io(format!(
            "signalling redis-server ({signal:?})"
        )))
    }

    /// Kills it (SIGKILL: no goodbye to clients) and reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Already gone is fine: either way it no longer runs.
            let _ = child.kill().await;
        }
    }

    /// Starts it again, empty, on the same port with the same options (after
    /// [`kill`](RedisServer::kill)), and waits until it answers `PING`.
    pub async fn restart(&mut self) -> Result<(), StackError> {
        self.kill().await;
        self.spawn_and_wait().await
    }

    fn into_dir(self) -> tempfile::TempDir {
        self.dir
    }

    async fn spawn_and_wait(&mut self) -> Result<(), StackError> {
        self.child = Some(self.spec.spawn()?);
        let Readiness::Redis(target) = &self.spec.readiness else {
            unreachable!("a RedisServer's readiness is a PING")
        };
        let target = target.clone();
        let started = Instant::now();
        loop {
            let exited = self
                .child
                .as_mut()
                .map(Child::try_wait)
                .and_then(Result::ok)
                .flatten();
            if let Some(status) = exited {
                self.child = None;
                return Err(StackError::EarlyExit {
                    name: "redis".into(),
                    status: status.to_string(),
                    log: self.spec.log.clone(),
                    tail: log_tail(&self.spec.log, 20),
                });
            }
            match redis_ping(&target).await {
                Ok(()) => return Ok(()),
                Err(last) if started.elapsed() >= STARTUP_TIMEOUT => {
                    self.kill().await;
                    return Err(StackError::Timeout {
                        what: "redis-server to answer PING".into(),
                        waited: started.elapsed(),
                        last: format!("{last}\n{}", log_tail(&self.spec.log, 20)),
                    });
                }
                Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_servers_have_no_plain_text_port_and_the_config_file_comes_first() {
        let dir = Path::new("/tmp/r");
        let plain = server_args(7000, dir, Some(Path::new("/tmp/r/redis.conf")), None);
        assert_eq!(plain[..3], ["/tmp/r/redis.conf", "--port", "7000"]);
        assert!(plain.windows(2).any(|w| w == ["--save", ""]));
        let pki = Pki {
            ca: "ca.pem".into(),
            server_cert: "server.pem".into(),
            server_key: "server-key.pem".into(),
            client_cert: "client.pem".into(),
            client_key: "client-key.pem".into(),
        };
        let tls = server_args(7000, dir, None, Some(&pki));
        assert_eq!(tls[..4], ["--port", "0", "--tls-port", "7000"]);
    }

    #[tokio::test]
    async fn a_password_and_tls_server_answers_only_with_both() {
        let mut redis = RedisServer::builder()
            .password("devstack-test-pw")
            .tls(true)
            .start()
            .await
            .unwrap();
        assert!(
            redis
                .url()
                .starts_with("rediss://:devstack-test-pw@127.0.0.1:")
        );
        redis_ping(&redis.target()).await.unwrap();
        let plain: gateway_redis::RedisUrl = format!("redis://127.0.0.1:{}", redis.port())
            .parse()
            .unwrap();
        let plain = RedisTarget::new(plain, None).unwrap();
        assert!(redis_ping(&plain).await.is_err());
        let conf = std::fs::read_to_string(redis.dir.path().join("redis.conf")).unwrap();
        assert_eq!(conf, "requirepass devstack-test-pw\n");

        redis.suspend().unwrap();
        assert!(
            redis_ping(&redis.target()).await.is_err(),
            "a suspended server answers nothing"
        );
        redis.resume().unwrap();
        redis_ping(&redis.target()).await.unwrap();

        let port = redis.port();
        redis.restart().await.unwrap();
        assert_eq!(redis.port(), port);
        redis_ping(&redis.target()).await.unwrap();
        redis.kill().await;
        assert!(redis_ping(&redis.target()).await.is_err());
    }
}
