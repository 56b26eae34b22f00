//! A real Postgres for the `postgres_*.rs` suites, and the processes they run
//! on it: control planes (`--database postgres://…`), data planes given every
//! control plane (`--control-plane A,B`), a mock upstream, auth services.
//!
//! [`PgServer`] runs `initdb` and `pg_ctl` from `PATH` or
//! `/usr/lib/postgresql/*/bin` (Debian's `postgresql` package, which
//! `scripts/test` installs). Postgres refuses to run as root, so when the
//! tests run as root every Postgres command runs as `nobody` (`runuser`),
//! in a temporary directory it owns: data directory, log, and the Unix
//! socket directory. It listens on a free loopback port, with a password
//! (scram-sha-256) over TCP, and is stopped (immediate mode) when dropped.
//! Every wait polls a condition under a deadline.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use devstack::stack::{AdminClient, BearerToken};
use gateway_proto::v1::admin_service_client::AdminServiceClient;
use gateway_tests::poll;
use tokio::process::{Child, Command};
use tonic::transport::Channel;

/// The role, password and database every suite uses.
pub(crate) const PG_USER: &str = "gateway";
pub(crate) const PG_PASSWORD: &str = "pg-test-pw-28";
pub(crate) const PG_DATABASE: &str = "gateway";

/// The user Postgres runs as when the tests run as root.
const RUN_AS: &str = "nobody";

/// Deadline of every start and of anything that should happen "soon".
pub(crate) const SOON: Duration = Duration::from_secs(30);

/// One Postgres server in a temporary directory.
pub(crate) struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    running: bool,
}

/// The directory of `pg_ctl`: `PATH` first, else the newest Debian install.
fn pg_bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(pg_ctl) = devstack::binaries::which("pg_ctl") {
        // /usr/local/bin/pg_ctl may be a link into /usr/lib/postgresql/N/bin, where initdb also is.
        let real = std::fs::canonicalize(&pg_ctl).unwrap_or(pg_ctl);
        if let Some(dir) = real.parent() {
            return Ok(dir.to_path_buf());
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context(
            "no pg_ctl on PATH and no /usr/lib/postgresql: install postgresql (scripts/test does)",
        )?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("pg_ctl").exists())
        .collect();
    found.sort();
    found
        .pop()
        .context("no /usr/lib/postgresql/*/bin/pg_ctl: install postgresql (scripts/test does)")
}

impl PgServer {
    /// initdb, start on a free port, create the database.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let bin = pg_bin_dir()?;
        // Under /tmp: the user Postgres runs as must be able to reach the directory.
        let dir = tempfile::Builder::new()
            .prefix("gw-postgres-")
            .tempdir_in("/tmp")
            .context("creating the Postgres directory")?;
        std::fs::create_dir(dir.path().join("sock"))?;
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, PG_PASSWORD)?;
        if devstack::is_root() {
            let out = Command::new("chown")
                .arg("-R")
                .arg(format!("{RUN_AS}:"))
                .arg(dir.path())
                .output()
                .await?;
            ensure!(
                out.status.success(),
                "chown: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let port = devstack::ports::free_port()?;
        let mut server = Self {
            dir,
            bin,
            port,
            running: false,
        };
        let data = server.data_dir();
        server
            .run(
                "initdb",
                &[
                    "-D",
                    &data,
                    "-U",
                    PG_USER,
                    &format!("--pwfile={}", pwfile.display()),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
            )
            .await?;
        server.start_again().await?;
        server
            .run(
                "createdb",
                &[
                    "-h",
                    &server.socket_dir(),
                    "-p",
                    &port.to_string(),
                    "-U",
                    PG_USER,
                    PG_DATABASE,
                ],
            )
            .await?;
        Ok(server)
    }

    fn data_dir(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn socket_dir(&self) -> String {
        self.dir.path().join("sock").display().to_string()
    }

    /// The server's log file.
    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// `postgres://gateway:PASSWORD@127.0.0.1:PORT/gateway`.
    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{}/{PG_DATABASE}",
            self.port
        )
    }

    /// The TCP port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Runs a Postgres program (as [`RUN_AS`] when root) and fails with its output if it fails.
    async fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let exe = self.bin.join(program);
        let mut command = if devstack::is_root() {
            let mut c = Command::new("runuser");
            c.arg("-u").arg(RUN_AS).arg("--").arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = command
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("running {}", exe.display()))?;
        if !out.status.success() {
            bail!(
                "{program} {}: {}{}\nlog: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                devstack::log_tail(&self.log_path(), 20)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts the server (again) on the same port and data, and waits until it accepts connections.
    pub(crate) async fn start_again(&mut self) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
            self.port,
            self.socket_dir()
        );
        let log = self.log_path().display().to_string();
        let data = self.data_dir();
        self.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-o", &options, "-w", "-t", "60", "start",
            ],
        )
        .await?;
        self.running = true;
        Ok(())
    }

    /// Stops the server (fast mode: open sessions are ended) and waits until it is down.
    pub(crate) async fn stop(&mut self) -> anyhow::Result<()> {
        let data = self.data_dir();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"])
            .await?;
        self.running = false;
        Ok(())
    }

    /// Runs one SQL statement with psql over the socket; `Err` with psql's message when it fails.
    pub(crate) async fn psql(&self, sql: &str) -> anyhow::Result<String> {
        let port = self.port.to_string();
        let socket = self.socket_dir();
        self.run(
            "psql",
            &[
                "-h",
                &socket,
                "-p",
                &port,
                "-U",
                PG_USER,
                "-d",
                PG_DATABASE,
                "-v",
                "ON_ERROR_STOP=1",
                "-A",
                "-t",
                "-c",
                sql,
            ],
        )
        .await
    }
}

impl PgServer {
    /// Turns TLS on with `cert_pem` and `key_pem` (`ssl = on`, a reload, no
    /// restart; called again, it swaps the certificate) and waits until a new
    /// session sees them. Clients may still choose cleartext.
    pub(crate) async fn enable_tls(&self, cert_pem: &str, key_pem: &str) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        // New names each time: the reload is seen when SHOW names the new file.
        let cert = self.dir.path().join(format!("server-{serial}.crt"));
        let key = self.dir.path().join(format!("server-{serial}.key"));
        std::fs::write(&cert, cert_pem)?;
        std::fs::write(&key, key_pem)?;
        // Postgres refuses a key that group or others may read.
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        if devstack::is_root() {
            let out = Command::new("chown")
                .arg(format!("{RUN_AS}:"))
                .arg(&cert)
                .arg(&key)
                .output()
                .await?;
            ensure!(
                out.status.success(),
                "chown: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cert = cert.display().to_string();
        for sql in [
            format!("ALTER SYSTEM SET ssl_cert_file = '{cert}'"),
            format!("ALTER SYSTEM SET ssl_key_file = '{}'", key.display()),
            "ALTER SYSTEM SET ssl = on".to_owned(),
            "SELECT pg_reload_conf()".to_owned(),
        ] {
            self.psql(&sql).await?;
        }
        poll(SOON, "Postgres serving the new certificate", || async {
            match self
                .psql("SELECT current_setting('ssl') || ' ' || current_setting('ssl_cert_file')")
                .await
            {
                Ok(out) if out.trim() == format!("on {cert}") => Ok(()),
                Ok(out) => Err(out),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .with_context(|| devstack::log_tail(&self.log_path(), 20))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if !self.running {
            return;
        }
        let exe = self.bin.join("pg_ctl");
        let data = self.data_dir();
        let mut command = if devstack::is_root() {
            let mut c = std::process::Command::new("runuser");
            c.arg("-u").arg(RUN_AS).arg("--").arg(&exe);
            c
        } else {
            std::process::Command::new(&exe)
        };
        let _ = command
            .args(["-D", &data, "-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process of a suite, killed when dropped, logging to a file.
pub(crate) struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts the workspace binary `name` with `args` and `env`, output to `log`.
    pub(crate) fn spawn(
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let exe = devstack::binaries::find_binary(name, &devstack::binaries::search_dirs(None))?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let err = out.try_clone()?;
        let child = Command::new(&exe)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        Ok(Self { child, log })
    }

    /// The last lines of its log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        devstack::log_tail(&self.log, lines)
    }

    /// SIGKILL, and wait until it is gone.
    pub(crate) async fn kill9(&mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM (a graceful stop), and wait until it is gone.
    pub(crate) async fn terminate(&mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let status = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await?;
            ensure!(status.success(), "kill -TERM {pid} failed");
        }
        tokio::time::timeout(SOON, self.child.wait())
            .await
            .context("not stopped within 30 s of SIGTERM")??;
        Ok(())
    }

    /// Whether it is still running.
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// A directory for a suite's logs and files; kept (and named) when `KEEP_TEST_DIRS` is set.
pub(crate) fn work_dir() -> anyhow::Result<tempfile::TempDir> {
    let mut dir = tempfile::Builder::new().prefix("gw-pg-suite-").tempdir()?;
    if std::env::var_os("KEEP_TEST_DIRS").is_some() {
        dir.disable_cleanup(true);
        eprintln!("test files in {}", dir.path().display());
    }
    Ok(dir)
}

/// The 32-byte secrets key file every control plane of a suite shares.
pub(crate) fn secrets_key(dir: &Path) -> anyhow::Result<PathBuf> {
    use std::io::Read as _;
    let path = dir.join("secrets.key");
    if !path.exists() {
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
        std::fs::write(&path, gateway_hex::encode(key))?;
    }
    Ok(path)
}

/// Admin tokens of the suites' tokens file: two operators, so each
/// version's author says which one committed it, whichever replica they used.
pub(crate) const ALICE: &str = "a11ce0000000000000000000000000000000000000000000000000000000a11c";
pub(crate) const BOB: &str = "b0b0000000000000000000000000000000000000000000000000000000000b0b";
/// The data planes' token.
pub(crate) const DATA_PLANE_TOKEN: &str =
    "d000000000000000000000000000000000000000000000000000000000000d0d";

/// The tokens file every control plane of a suite shares.
pub(crate) fn tokens_file(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!("alice admin {ALICE}\nbob admin {BOB}\ndp data-plane {DATA_PLANE_TOKEN}\n"),
    )?;
    Ok(path)
}

/// A control plane process on a shared database.
pub(crate) struct ControlPlane {
    pub(crate) proc: Proc,
    pub(crate) addr: SocketAddr,
    pub(crate) name: String,
}

impl ControlPlane {
    /// Starts `control-plane --database URL` on a free port (or `port`) and waits until it answers.
    pub(crate) async fn start(
        name: &str,
        database: &str,
        dir: &Path,
        port: Option<u16>,
    ) -> anyhow::Result<Self> {
        let port = match port {
            Some(p) => p,
            None => devstack::ports::free_port()?,
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let args = vec![
            "--listen".to_owned(),
            addr.to_string(),
            "--secrets-key-file".to_owned(),
            secrets_key(dir)?.display().to_string(),
            "--auth-tokens-file".to_owned(),
            tokens_file(dir)?.display().to_string(),
        ];
        // The URL holds the password: environment, not command line.
        let proc = Proc::spawn(
            "control-plane",
            &args,
            &[("CONTROL_PLANE_DATABASE", database.to_owned())],
            dir.join(format!("{name}.log")),
        )?;
        let cp = Self {
            proc,
            addr,
            name: name.to_owned(),
        };
        poll(SOON, &format!("{name} answering"), || async {
            let mut admin = cp.admin(ALICE);
            admin
                .list_routes(gateway_proto::v1::ListRoutesRequest {})
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await
        .with_context(|| cp.proc.log_tail(30))?;
        Ok(cp)
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// An AdminService client sending `token`; it connects lazily and
    /// reconnects by itself.
    pub(crate) fn admin(&self, token: &str) -> AdminClient {
        let channel = Channel::from_shared(self.url())
            .expect("a 127.0.0.1 URL is a valid URI")
            .connect_timeout(Duration::from_secs(2))
            .connect_lazy();
        AdminServiceClient::with_interceptor(channel, BearerToken::new(token))
    }
}

/// A data plane process.
pub(crate) struct DataPlane {
    pub(crate) proc: Proc,
    pub(crate) node_id: String,
    pub(crate) port: u16,
    pub(crate) admin_port: u16,
}

impl DataPlane {
    /// Starts a data plane whose `--control-plane` lists `control_planes`, and waits until it is ready.
    pub(crate) async fn start(
        node_id: &str,
        control_planes: &[String],
        dir: &Path,
    ) -> anyhow::Result<Self> {
        Self::start_with(node_id, control_planes, dir, &[]).await
    }

    /// [`DataPlane::start`] with extra flags.
    pub(crate) async fn start_with(
        node_id: &str,
        control_planes: &[String],
        dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let port = devstack::ports::free_port()?;
        let admin_port = devstack::ports::free_port()?;
        let args = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--admin-listen".to_owned(),
            format!("127.0.0.1:{admin_port}"),
            "--control-plane".to_owned(),
            control_planes.join(","),
            "--node-id".to_owned(),
            node_id.to_owned(),
            "--cache-dir".to_owned(),
            dir.join(format!("{node_id}-cache")).display().to_string(),
            "--workers".to_owned(),
            "1".to_owned(),
        ]
        .into_iter()
        .chain(extra.iter().cloned())
        .collect::<Vec<_>>();
        let proc = Proc::spawn(
            "data-plane",
            &args,
            &[("DP_CONTROL_PLANE_TOKEN", DATA_PLANE_TOKEN.to_owned())],
            dir.join(format!("{node_id}.log")),
        )?;
        let dp = Self {
            proc,
            node_id: node_id.to_owned(),
            port,
            admin_port,
        };
        let ready = format!("http://127.0.0.1:{admin_port}/readyz");
        let http = gateway_tests::client();
        poll(SOON, &format!("{node_id} ready"), || async {
            match http.get(&ready).send().await {
                Ok(r) if r.status() == 200 => Ok(()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .with_context(|| dp.proc.log_tail(30))?;
        Ok(dp)
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// A mock upstream (`mock-service --service SERVICE`).
pub(crate) struct Mock {
    pub(crate) proc: Proc,
    pub(crate) port: u16,
}

impl Mock {
    /// Starts `mock-service` as `service` and waits for its `/health`.
    pub(crate) async fn start(service: &str, dir: &Path) -> anyhow::Result<Self> {
        let port = devstack::ports::free_port()?;
        let args = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--service".to_owned(),
            service.to_owned(),
            "--instance-id".to_owned(),
            format!("{service}-1"),
        ];
        let proc = Proc::spawn(
            "mock-service",
            &args,
            &[],
            dir.join(format!("{service}.log")),
        )?;
        let health = format!("http://127.0.0.1:{port}/health");
        let http = gateway_tests::client();
        poll(SOON, "mock upstream healthy", || async {
            match http.get(&health).send().await {
                Ok(r) if r.status() == 200 => Ok(()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
        Ok(Self { proc, port })
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The request that makes the upstream `orders` with this mock as its one
    /// instance (`orders-1`).
    pub(crate) fn orders_upstream(&self) -> gateway_proto::v1::UpsertUpstreamRequest {
        gateway_proto::v1::UpsertUpstreamRequest {
            upstream: Some(gateway_proto::v1::Upstream {
                name: "orders".into(),
                instances: vec![gateway_proto::v1::Instance {
                    id: "orders-1".into(),
                    url: self.url(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            expected_version: None,
        }
    }
}

/// What grpcurl did.
pub(crate) struct GrpcurlOutput {
    pub(crate) ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl GrpcurlOutput {
    /// The answer as JSON (fails with grpcurl's error when it failed).
    pub(crate) fn json(&self) -> anyhow::Result<serde_json::Value> {
        ensure!(self.ok, "grpcurl failed: {}{}", self.stdout, self.stderr);
        serde_json::from_str(&self.stdout)
            .with_context(|| format!("grpcurl answered no JSON: {}", self.stdout))
    }
}

/// Runs the real grpcurl (on PATH: `scripts/grpcurl.sh` installs it) against
/// `addr` with `token` and the request `json`.
pub(crate) async fn grpcurl(
    addr: SocketAddr,
    token: &str,
    method: &str,
    json: &str,
) -> anyhow::Result<GrpcurlOutput> {
    let authorization = format!("authorization: Bearer {token}");
    let out = Command::new("grpcurl")
        .args([
            "-plaintext",
            "-H",
            &authorization,
            "-d",
            json,
            &addr.to_string(),
        ])
        .arg(format!("gateway.v1.AdminService/{method}"))
        .output()
        .await
        .context("running grpcurl (on PATH? scripts/grpcurl.sh installs it)")?;
    Ok(GrpcurlOutput {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `iss` and `aud` of the suites' auth services.
pub(crate) const ISSUER: &str = "gateway-auth";
pub(crate) const AUDIENCE: &str = "gateway";

/// An auth service process on a shared database.
pub(crate) struct AuthService {
    pub(crate) proc: Proc,
    pub(crate) port: u16,
}

impl AuthService {
    /// Starts `auth-service --database URL` with the suite's keys secret file,
    /// the Redis at `redis_url` and extra `args`, and waits for `/healthz`.
    pub(crate) async fn start(
        name: &str,
        database: &str,
        redis_url: &str,
        dir: &Path,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let port = devstack::ports::free_port()?;
        let mut all = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--issuer".to_owned(),
            ISSUER.to_owned(),
            "--audience".to_owned(),
            AUDIENCE.to_owned(),
        ];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let proc = Proc::spawn(
            "auth-service",
            &all,
            &[
                ("AUTH_DATABASE", database.to_owned()),
                ("AUTH_REDIS_URL", redis_url.to_owned()),
                (
                    "AUTH_KEYS_SECRET_FILE",
                    secrets_key(dir)?.display().to_string(),
                ),
            ],
            dir.join(format!("{name}.log")),
        )?;
        let auth = Self { proc, port };
        let health = format!("{}/healthz", auth.url());
        let http = gateway_tests::client();
        poll(SOON, &format!("{name} healthy"), || async {
            match http.get(&health).send().await {
                Ok(r) if r.status() == 200 => Ok(()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .with_context(|| auth.proc.log_tail(30))?;
        Ok(auth)
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its JWKS document.
    pub(crate) async fn jwks(&self) -> anyhow::Result<serde_json::Value> {
        Ok(gateway_tests::client()
            .get(format!("{}/.well-known/jwks.json", self.url()))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }
}

/// `auth-service users add NAME --role user` on `database`, the password from the environment.
pub(crate) async fn add_user(database: &str, name: &str, password: &str) -> anyhow::Result<()> {
    let exe =
        devstack::binaries::find_binary("auth-service", &devstack::binaries::search_dirs(None))?;
    let out = Command::new(exe)
        .args([
            "users",
            "add",
            name,
            "--role",
            "user",
            "--password-env",
            "NEW_PASSWORD",
        ])
        .env("AUTH_DATABASE", database)
        .env("NEW_PASSWORD", password)
        .stdin(Stdio::null())
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "users add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The kids of a JWKS document, sorted.
pub(crate) fn kids(jwks: &serde_json::Value) -> Vec<String> {
    let mut kids: Vec<String> = jwks["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter_map(|k| k["kid"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    kids.sort();
    kids
}
