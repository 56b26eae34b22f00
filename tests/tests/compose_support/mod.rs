//! The compose stack as seen by the compose suite: lifecycle through the compose CLI, fault
//! injection through the docker CLI, a traffic generator through the edge, and helpers that
//! read state (ListDataPlanes via grpcurl, HAProxy's server table, a replica's /config).

mod spans;
mod state;
mod traffic;

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use tokio::process::Command;

pub(crate) use spans::SpanInfo;
pub(crate) use state::USERS;
pub(crate) use traffic::Traffic;

/// Services of docker-compose.yml that run several replicas (`--scale`).
const SCALABLE: [&str; 2] = ["data-plane", "orders"];

/// The Jaeger image docker-compose.yml names; without it the offline override is used.
const JAEGER_IMAGE_PREFIX: &str = "jaegertracing/all-in-one:";

/// One data plane as `ListDataPlanes` reports it.
#[derive(Debug, Clone)]
pub(crate) struct Plane {
    /// Node id (the container hostname in the compose stack).
    pub node_id: String,
    /// SYNCED, STALE, NACKED or DISCONNECTED.
    pub status: String,
    /// Last version the replica ACKed.
    pub acked_version: u64,
}

/// The secrets of the stack (control-channel tokens and Redis's password), generated per run and
/// written into the env file made from `.env.example`.
pub(crate) struct Tokens {
    /// `GATEWAY_ADMIN_TOKEN` (role admin, name compose-admin).
    pub admin: String,
    /// `GATEWAY_DATA_PLANE_TOKEN` (role data-plane).
    pub data_plane: String,
    /// `GATEWAY_VIEWER_TOKEN` (role viewer).
    pub viewer: String,
    /// `GATEWAY_REDIS_PASSWORD` (Redis's requirepass).
    pub redis_password: String,
    /// `GATEWAY_SECRETS_KEY` (encrypts certificates' private keys; empty: none).
    pub secrets_key: String,
}

/// 32 random bytes from the kernel, hex-encoded (what `openssl rand -hex 32` makes).
fn random_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(gateway_hex::encode(bytes))
}

/// `.env.example` with its secret lines set: the env file a user makes by following its
/// comments. Fails if the example holds anything but empty placeholders (no secret is ever
/// committed).
fn env_file_from_example(example: &str, tokens: &Tokens) -> Result<String> {
    let mut out = String::new();
    let mut set = 0;
    for line in example.lines() {
        let value = match line.split_once('=') {
            Some(("GATEWAY_ADMIN_TOKEN", v)) => Some((v, &tokens.admin)),
            Some(("GATEWAY_DATA_PLANE_TOKEN", v)) => Some((v, &tokens.data_plane)),
            Some(("GATEWAY_VIEWER_TOKEN", v)) => Some((v, &tokens.viewer)),
            Some(("GATEWAY_REDIS_PASSWORD", v)) => Some((v, &tokens.redis_password)),
            Some(("GATEWAY_SECRETS_KEY", v)) => Some((v, &tokens.secrets_key)),
            _ => None,
        };
        match value {
            Some((placeholder, token)) => {
                ensure!(
                    placeholder.trim().is_empty(),
                    ".env.example must not hold a secret: {line:?}"
                );
                let (name, _) = line.split_once('=').unwrap_or_default();
                out.push_str(&format!("{name}={token}\n"));
                set += 1;
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    ensure!(
        set == 5,
        ".env.example lacks some of the 3 GATEWAY_*_TOKEN lines, GATEWAY_REDIS_PASSWORD and GATEWAY_SECRETS_KEY"
    );
    Ok(out)
}

/// A compose project started by the suite; `down -v` when dropped.
pub(crate) struct Stack {
    compose_cmd: Vec<String>,
    project: String,
    files: Vec<PathBuf>,
    root: PathBuf,
    env: Vec<(String, String)>,
    edge_port: u16,
    /// The edge's TLS pass-through port (the data planes terminate TLS).
    edge_tls_port: u16,
    control_plane_port: u16,
    edge_net: String,
    state_net: String,
    image: String,
    http: reqwest::Client,
    spans: spans::Source,
    keep: bool,
    /// Anonymous volumes (data-plane caches) seen on this project's containers: `down -v` removes
    /// those of the containers still there, but replicas removed by a scale-down leave theirs.
    volumes: Mutex<BTreeSet<String>>,
    /// The run's tokens.
    tokens: Tokens,
    /// Directory of the env file (`--env-file`) made from `.env.example`.
    env_dir: PathBuf,
    /// Removes `env_dir` when dropped (unless GATEWAY_COMPOSE_KEEP=1 keeps it).
    env_guard: Option<tempfile::TempDir>,
}

impl Stack {
    /// `down -v`, then `up -d --scale data-plane=N` on free host ports, then waits until the edge
    /// has N replicas up.
    pub(crate) async fn up(data_planes: usize) -> Result<Stack> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("tests/ has no parent")?
            .to_path_buf();
        let compose_cmd = compose_command().await?;
        let project = std::env::var("GATEWAY_COMPOSE_PROJECT")
            .unwrap_or_else(|_| "gateway-compose-test".to_owned());
        let edge_net =
            std::env::var("GATEWAY_COMPOSE_EDGE_NET").unwrap_or_else(|_| "10.213.81".to_owned());
        // Not the file's default (10.213.82), so a stack started by hand can run beside the suite.
        let state_net =
            std::env::var("GATEWAY_COMPOSE_STATE_NET").unwrap_or_else(|_| "10.213.83".to_owned());
        let image = std::env::var("GATEWAY_IMAGE").unwrap_or_else(|_| "gateway:latest".to_owned());
        let compose_file = std::fs::read_to_string(root.join("docker-compose.yml"))?;
        let jaeger_image = compose_file
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image: "))
            .find(|i| i.starts_with(JAEGER_IMAGE_PREFIX))
            .context("docker-compose.yml names no Jaeger image")?
            .to_owned();
        let offline = match std::env::var("GATEWAY_COMPOSE_OFFLINE").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => !docker_ok(&["image", "inspect", &jaeger_image]).await,
        };
        let mut files = vec![root.join("docker-compose.yml")];
        let [edge_port, edge_tls_port, control_plane_port, jaeger_port] = free_ports()?;
        let mut env = vec![
            ("GATEWAY_EDGE_PORT".to_owned(), edge_port.to_string()),
            (
                "GATEWAY_EDGE_TLS_PORT".to_owned(),
                edge_tls_port.to_string(),
            ),
            (
                "GATEWAY_CONTROL_PLANE_PORT".to_owned(),
                control_plane_port.to_string(),
            ),
            ("GATEWAY_JAEGER_UI_PORT".to_owned(), jaeger_port.to_string()),
            ("GATEWAY_EDGE_NET".to_owned(), edge_net.clone()),
            ("GATEWAY_STATE_NET".to_owned(), state_net.clone()),
            ("GATEWAY_IMAGE".to_owned(), image.clone()),
        ];
        let spans = if offline {
            files.push(root.join("docker/compose.offline.yml"));
            let (source, sink) = spans::Source::start_receiver(&image).await?;
            eprintln!(
                "offline: {jaeger_image} is not here; Jaeger is replaced by a relay to the \
                 in-test OTLP receiver at {sink}"
            );
            env.push(("GATEWAY_OTLP_SINK".to_owned(), sink));
            source
        } else {
            eprintln!("{jaeger_image} is here: traces are checked through Jaeger's query API");
            spans::Source::jaeger(format!("http://127.0.0.1:{jaeger_port}"))
        };
        let keep = std::env::var("GATEWAY_COMPOSE_KEEP").as_deref() == Ok("1");
        let tokens = Tokens {
            admin: random_token()?,
            data_plane: random_token()?,
            viewer: random_token()?,
            redis_password: random_token()?,
            secrets_key: random_token()?,
        };
        let example =
            std::fs::read_to_string(root.join(".env.example")).context("reading .env.example")?;
        let env_dir = tempfile::Builder::new()
            .prefix("gateway-compose-env-")
            .tempdir()?;
        std::fs::write(
            env_dir.path().join("gateway.env"),
            env_file_from_example(&example, &tokens)?,
        )?;
        // The example as shipped (empty secrets) must make compose refuse, saying what to do; so
        // must an env file with the tokens but no Redis password.
        std::fs::write(env_dir.path().join("example.env"), &example)?;
        std::fs::write(
            env_dir.path().join("no-redis-password.env"),
            env_file_from_example(
                &example,
                &Tokens {
                    admin: tokens.admin.clone(),
                    data_plane: tokens.data_plane.clone(),
                    viewer: tokens.viewer.clone(),
                    redis_password: String::new(),
                    secrets_key: tokens.secrets_key.clone(),
                },
            )?,
        )?;
        let stack = Stack {
            compose_cmd,
            project,
            files,
            root,
            env,
            edge_port,
            edge_tls_port,
            control_plane_port,
            edge_net,
            state_net,
            image,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            spans,
            keep,
            volumes: Mutex::new(BTreeSet::new()),
            tokens,
            env_dir: env_dir.path().to_path_buf(),
            env_guard: Some(env_dir),
        };
        stack.refuses_the_unfilled_example().await?;
        eprintln!(
            "compose: {} -p {} ({} files); edge 127.0.0.1:{edge_port}, control plane \
             127.0.0.1:{control_plane_port}",
            stack.compose_cmd.join(" "),
            stack.project,
            stack.files.len()
        );
        stack.compose(&["down", "-v", "--remove-orphans"]).await?;
        let t = Instant::now();
        let scale = format!("data-plane={data_planes}");
        let started = async {
            stack.compose(&["up", "-d", "--scale", &scale]).await?;
            eprintln!("`up -d --scale {scale}` returned after {:.1?}", t.elapsed());
            wait_for(
                "the edge to see every replica up",
                Duration::from_secs(60),
                || async { Ok(stack.edge_servers_up().await?.len() == data_planes) },
            )
            .await
        };
        if let Err(e) = started.await {
            stack.dump_logs().await;
            return Err(e);
        }
        eprintln!("stack ready after {:.1?}", t.elapsed());
        // A fresh stack has no user: the suite adds its own as an operator would.
        let users = async {
            stack.ensure_no_users().await?;
            for (name, password, role) in USERS {
                stack.add_user(name, password, role).await?;
            }
            anyhow::Ok(())
        };
        if let Err(e) = users.await {
            stack.dump_logs().await;
            return Err(e);
        }
        Ok(stack)
    }

    /// The env file made from `.env.example` with this run's tokens.
    fn env_file(&self) -> PathBuf {
        self.env_dir.join("gateway.env")
    }

    /// The run's control-channel tokens.
    pub(crate) fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// `compose config` with `.env.example` as it is shipped (secrets empty) fails, and says
    /// which setting is missing and what to do; with the tokens but no Redis password too.
    async fn refuses_the_unfilled_example(&self) -> Result<()> {
        self.refuses_env_file("example.env", "GATEWAY_ADMIN_TOKEN")
            .await?;
        self.refuses_env_file("no-redis-password.env", "GATEWAY_REDIS_PASSWORD")
            .await?;
        eprintln!("compose refuses .env.example as shipped, and without a Redis password: ok");
        Ok(())
    }

    /// `compose config` with `env_file` (in the env directory) fails, naming `missing`.
    async fn refuses_env_file(&self, env_file: &str, missing: &str) -> Result<()> {
        let mut cmd = Command::new(&self.compose_cmd[0]);
        cmd.args(&self.compose_cmd[1..])
            .arg("--env-file")
            .arg(self.env_dir.join(env_file))
            .arg("-p")
            .arg(&self.project)
            .arg("--project-directory")
            .arg(&self.root);
        for f in &self.files {
            cmd.arg("-f").arg(f);
        }
        cmd.arg("config")
            .envs(self.env.iter().cloned())
            .env_remove("GATEWAY_ADMIN_TOKEN")
            .env_remove("GATEWAY_DATA_PLANE_TOKEN")
            .env_remove("GATEWAY_REDIS_PASSWORD")
            .stdin(Stdio::null());
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .context("`compose config` hung")??;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success(),
            "compose accepted {env_file} without {missing}"
        );
        ensure!(
            stderr.contains(missing) && stderr.contains("copy .env.example to .env"),
            "compose's refusal of {env_file} does not say what to do: {stderr}"
        );
        Ok(())
    }

    /// Runs the compose CLI with this project's files, env file and environment; returns stdout.
    pub(crate) async fn compose(&self, args: &[&str]) -> Result<String> {
        run(
            self.compose_cli(args),
            &format!("compose {}", args.join(" ")),
            Duration::from_secs(300),
        )
        .await
    }

    /// The compose CLI with this project's files, env file, environment and `args`.
    fn compose_cli(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.compose_cmd[0]);
        cmd.args(&self.compose_cmd[1..])
            .arg("--env-file")
            .arg(self.env_file())
            .arg("-p")
            .arg(&self.project)
            .arg("--project-directory")
            .arg(&self.root);
        for f in &self.files {
            cmd.arg("-f").arg(f);
        }
        cmd.args(args).envs(self.env.iter().cloned());
        cmd
    }

    /// Runs the docker CLI; returns stdout.
    pub(crate) async fn docker(&self, args: &[&str]) -> Result<String> {
        docker(args).await
    }

    /// A shared HTTP client (keep-alive, 10 s timeout).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `http://127.0.0.1:<edge port><path>`.
    pub(crate) fn edge_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.edge_port)
    }

    /// First three octets of the edge network.
    pub(crate) fn edge_net(&self) -> &str {
        &self.edge_net
    }

    /// First three octets of the state network (Redis, auth service, data planes).
    pub(crate) fn state_net(&self) -> &str {
        &self.state_net
    }

    /// Full Docker name of one of the compose file's networks.
    pub(crate) fn network(&self, name: &str) -> String {
        format!("{}_{name}", self.project.replace('.', ""))
    }

    /// Calls an AdminService RPC with grpcurl and the admin token, as an operator would.
    pub(crate) async fn grpc(&self, method: &str, json: &str) -> Result<Value> {
        let header = format!("authorization: Bearer {}", self.tokens.admin);
        let ca = self.control_plane_ca().await?;
        let mut cmd = Command::new("grpcurl");
        cmd.args(["-cacert", &ca, "-max-time", "10", "-H", &header, "-d", json])
            .arg(format!("127.0.0.1:{}", self.control_plane_port))
            .arg(format!("gateway.v1.AdminService/{method}"));
        let out = run(cmd, &format!("grpcurl {method}"), Duration::from_secs(20)).await?;
        serde_json::from_str(&out).with_context(|| format!("grpcurl {method} printed {out}"))
    }

    /// The CA certificate of the control plane's generated TLS certificate
    /// (`--tls-generate-ca` in docker-compose.yml), copied out of its container as
    /// README's Containers section does, into the env directory: the path grpcurl's
    /// `-cacert` takes. Fetched once.
    pub(crate) async fn control_plane_ca(&self) -> Result<String> {
        let path = self.env_dir.join("control-plane-ca.pem");
        if !path.exists() {
            let pem = self
                .compose(&[
                    "exec",
                    "-T",
                    "control-plane",
                    "cat",
                    "/var/lib/gateway-ca/ca.pem",
                ])
                .await
                .context("copying the control plane's CA certificate out of its container")?;
            ensure!(
                pem.contains("BEGIN CERTIFICATE"),
                "the control plane's CA file holds no certificate: {pem}"
            );
            std::fs::write(&path, pem)?;
        }
        Ok(path.to_str().context("a UTF-8 path")?.to_owned())
    }

    /// Runs `grpcurl [flags] CONTROL-PLANE what` (`what`: a method, or `list`) with `token` (or
    /// none); returns whether it succeeded, and stdout + stderr.
    pub(crate) async fn grpcurl_as(
        &self,
        token: Option<&str>,
        flags: &[&str],
        what: &str,
    ) -> Result<(bool, String)> {
        let mut cmd = Command::new("grpcurl");
        if !flags.contains(&"-plaintext") {
            cmd.arg("-cacert").arg(self.control_plane_ca().await?);
        }
        cmd.args(["-max-time", "10"]).args(flags);
        if let Some(token) = token {
            cmd.arg("-H").arg(format!("authorization: Bearer {token}"));
        }
        cmd.arg(format!("127.0.0.1:{}", self.control_plane_port))
            .arg(what)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
            .await
            .context("grpcurl hung")??;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    }

    /// Every container log of the project (`compose logs`), for the log-hygiene scan.
    pub(crate) async fn all_logs(&self) -> Result<String> {
        self.compose(&["logs", "--no-color"]).await
    }

    /// The control plane's current config version.
    pub(crate) async fn config_version(&self) -> Result<u64> {
        let config = self.grpc("GetConfig", "{}").await?;
        json_u64(&config["version"]).with_context(|| format!("GetConfig: {config}"))
    }

    /// `ListDataPlanes`.
    pub(crate) async fn list_data_planes(&self) -> Result<Vec<Plane>> {
        let listed = self.grpc("ListDataPlanes", "{}").await?;
        Ok(listed["dataPlanes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| Plane {
                node_id: d["nodeId"].as_str().unwrap_or_default().to_owned(),
                status: d["status"].as_str().unwrap_or_default().to_owned(),
                acked_version: json_u64(&d["ackedVersion"]).unwrap_or(0),
            })
            .collect())
    }

    /// Ids of the running data-plane containers, oldest first.
    pub(crate) async fn data_plane_ids(&self) -> Result<Vec<String>> {
        self.service_ids("data-plane").await
    }

    pub(crate) async fn service_ids(&self, service: &str) -> Result<Vec<String>> {
        let out = docker(&[
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
            "--filter",
            &format!("label=com.docker.compose.service={service}"),
        ])
        .await?;
        // `docker ps` lists newest first.
        Ok(out.lines().rev().map(str::to_owned).collect())
    }

    /// Hostnames (= node ids) of the running data-plane containers.
    pub(crate) async fn data_plane_hostnames(&self) -> Result<BTreeSet<String>> {
        let mut hosts = BTreeSet::new();
        for id in self.data_plane_ids().await? {
            hosts.insert(self.hostname_of(&id).await?);
        }
        Ok(hosts)
    }

    /// Ids of the running containers of the scalable `orders` service, oldest first.
    pub(crate) async fn orders_ids(&self) -> Result<Vec<String>> {
        self.service_ids("orders").await
    }

    /// Hostnames (= `X-Instance-Id`) of the running `orders` containers.
    pub(crate) async fn orders_hostnames(&self) -> Result<BTreeSet<String>> {
        let mut hosts = BTreeSet::new();
        for id in self.orders_ids().await? {
            hosts.insert(self.hostname_of(&id).await?);
        }
        Ok(hosts)
    }

    /// A container's hostname.
    pub(crate) async fn hostname_of(&self, id: &str) -> Result<String> {
        Ok(docker(&["inspect", "-f", "{{.Config.Hostname}}", id])
            .await?
            .trim()
            .to_owned())
    }

    /// Waits until every running replica is listed SYNCED at `version` or later; returns their
    /// hostnames.
    pub(crate) async fn wait_all_synced(
        &self,
        version: u64,
        within: Duration,
    ) -> Result<BTreeSet<String>> {
        let last = Mutex::new(Vec::new());
        let what = format!("every replica SYNCED at v{version}");
        wait_for(&what, within, || async {
            let hosts = self.data_plane_hostnames().await?;
            let planes = self.list_data_planes().await?;
            let synced: BTreeSet<&str> = planes
                .iter()
                .filter(|p| p.status == "SYNCED" && p.acked_version >= version)
                .map(|p| p.node_id.as_str())
                .collect();
            let done = !hosts.is_empty() && hosts.iter().all(|h| synced.contains(h.as_str()));
            *last.lock() = planes;
            Ok(done)
        })
        .await
        .with_context(|| format!("ListDataPlanes: {:?}", last.lock()))?;
        self.data_plane_hostnames().await
    }

    /// HAProxy's data-plane slots that are UP, with their addresses ("dp3" -> "10.213.81.130:8080").
    pub(crate) async fn edge_servers_up(&self) -> Result<Vec<(String, String)>> {
        let edge = self
            .service_ids("edge")
            .await?
            .pop()
            .context("no edge container")?;
        let csv = http_get_in(&edge, 8404, "/stats;csv").await?;
        let mut lines = csv.lines();
        let header: Vec<&str> = lines
            .next()
            .context("empty HAProxy stats")?
            .trim_start_matches("# ")
            .split(',')
            .collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (px, sv, status, addr) = (
            col("pxname").context("no pxname column")?,
            col("svname").context("no svname column")?,
            col("status").context("no status column")?,
            col("addr").context("no addr column")?,
        );
        Ok(lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > addr && f[px] == "data_planes" && f[status].starts_with("UP"))
            .filter(|f| f[sv] != "BACKEND")
            .map(|f| (f[sv].to_owned(), f[addr].to_owned()))
            .collect())
    }

    /// The HAProxy slot that currently points at a replica (waits until it is UP there).
    pub(crate) async fn edge_slot_of(&self, id: &str) -> Result<String> {
        let network = self.network("edge");
        let slot = Mutex::new(String::new());
        wait_for(
            "the edge to have the replica up",
            Duration::from_secs(30),
            || async {
                let ip = docker(&[
                    "inspect",
                    "-f",
                    &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
                    id,
                ])
                .await?;
                let prefix = format!("{}:", ip.trim());
                if let Some((name, _)) = self
                    .edge_servers_up()
                    .await?
                    .into_iter()
                    .find(|(_, addr)| addr.starts_with(&prefix))
                {
                    *slot.lock() = name;
                    return Ok(true);
                }
                Ok(false)
            },
        )
        .await?;
        Ok(slot.into_inner())
    }

    /// A replica's `/config` ({version, hash}) from its ops listener, read inside the container.
    pub(crate) async fn replica_config(&self, id: &str) -> Result<Value> {
        let body = http_get_in(id, 9901, "/config").await?;
        serde_json::from_str(&body).with_context(|| format!("/config answered {body}"))
    }

    /// Upstream `name` in a replica's `/health/load-balancer`, read inside the container.
    pub(crate) async fn replica_upstream(&self, id: &str, name: &str) -> Result<Value> {
        let body = http_get_in(id, 9901, "/health/load-balancer").await?;
        let view: Value = serde_json::from_str(&body)
            .with_context(|| format!("/health/load-balancer answered {body}"))?;
        view["upstreams"]
            .as_array()
            .and_then(|u| u.iter().find(|u| u["name"] == name))
            .cloned()
            .with_context(|| format!("no upstream {name} in {view}"))
    }

    /// Waits until a container's healthcheck says healthy.
    pub(crate) async fn wait_healthy(&self, id: &str, within: Duration) -> Result<()> {
        wait_for(
            &format!("container {} healthy", short(id)),
            within,
            || async {
                let health = docker(&["inspect", "-f", "{{.State.Health.Status}}", id]).await?;
                Ok(health.trim() == "healthy")
            },
        )
        .await
    }

    /// Waits until every container of a service is healthy.
    pub(crate) async fn wait_healthy_service(&self, service: &str, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let ids = self.service_ids(service).await?;
        ensure!(!ids.is_empty(), "no running container for {service}");
        for id in ids {
            self.wait_healthy(&id, deadline.saturating_duration_since(Instant::now()))
                .await?;
        }
        Ok(())
    }

    /// `up -d --no-recreate --scale SERVICE=N`: adds or removes replicas, touching nothing else.
    /// Compose v1 brings every service back to the scale in the file on `up`, so the other
    /// scalable services are passed their current counts.
    pub(crate) async fn scale(&self, service: &str, n: usize) -> Result<()> {
        self.remember_volumes().await?;
        let scale = format!("{service}={n}");
        let mut args = vec![
            "up".to_owned(),
            "-d".to_owned(),
            "--no-recreate".to_owned(),
            "--scale".to_owned(),
            scale.clone(),
        ];
        for other in SCALABLE.iter().filter(|s| **s != service) {
            let count = self.service_ids(other).await?.len();
            args.extend(["--scale".to_owned(), format!("{other}={count}")]);
        }
        let t = Instant::now();
        self.compose(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await?;
        eprintln!("`up -d --scale {scale}` returned after {:.1?}", t.elapsed());
        Ok(())
    }

    /// Records the anonymous volumes of every container of the project (see `volumes`).
    async fn remember_volumes(&self) -> Result<()> {
        let ids = docker(&[
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
        ])
        .await?;
        for id in ids.lines() {
            let names = docker(&[
                "inspect",
                "-f",
                "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}",
                id,
            ])
            .await?;
            let mut volumes = self.volumes.lock();
            // Named volumes carry the project prefix and go with `down -v`.
            volumes.extend(
                names
                    .split_whitespace()
                    .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(str::to_owned),
            );
        }
        Ok(())
    }

    /// Logs in through the edge; returns the access token.
    pub(crate) async fn login(&self, user: &str, password: &str) -> Result<String> {
        let resp = self
            .http
            .post(self.edge_url("/auth/login"))
            .json(&serde_json::json!({"username": user, "password": password}))
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        ensure!(status == 200, "login {user}: {status} {body}");
        body["access_token"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("login {user}: no access_token in {body}"))
    }

    /// Status of one failing login sent from a throwaway container on the edge network: a client
    /// whose address differs from the host's.
    pub(crate) async fn login_status_from_edge_network(&self) -> Result<u16> {
        let body = r#"{"username":"nobody","password":"wrong"}"#;
        let script = format!(
            "exec 3<>/dev/tcp/edge/8080 && printf 'POST /auth/login HTTP/1.1\\r\\nHost: edge\\r\\n\
             Content-Type: application/json\\r\\nContent-Length: {}\\r\\nConnection: close\\r\\n\\r\\n%s' \
             '{body}' >&3 && read -r _ status _ <&3 && echo \"$status\"",
            body.len()
        );
        let network = self.network("edge");
        let out = docker(&[
            "run",
            "--rm",
            "--network",
            &network,
            "--entrypoint",
            "bash",
            &self.image,
            "-c",
            &script,
        ])
        .await?;
        out.trim()
            .parse()
            .with_context(|| format!("login from the edge network printed {out:?}"))
    }

    /// The checkout the compose file is in.
    pub(crate) fn root(&self) -> &std::path::Path {
        &self.root
    }

    /// The gateway image the services run.
    pub(crate) fn image(&self) -> &str {
        &self.image
    }

    /// The edge's TLS port on the host (passed through to the data planes).
    pub(crate) fn edge_tls_port(&self) -> u16 {
        self.edge_tls_port
    }

    /// One GET on the probe route through the edge: (status, X-Served-By, body).
    pub(crate) async fn probe_get(&self) -> Result<(u16, String, Value)> {
        let resp = self
            .http
            .get(self.edge_url("/compose/orders/1"))
            .send()
            .await?;
        let status = resp.status().as_u16();
        let served_by = header(&resp, "x-served-by");
        let body = resp.json().await.unwrap_or(Value::Null);
        Ok((status, served_by, body))
    }

    /// Spans of one trace, from Jaeger or from the in-test OTLP receiver, once a data-plane span
    /// and a backend span have arrived (or the deadline passed).
    pub(crate) async fn collected_spans(&self, trace_id: &str) -> Result<Vec<SpanInfo>> {
        self.spans.collect(&self.http, trace_id).await
    }

    /// Prints the tail of every container's log (for a failed run).
    pub(crate) async fn dump_logs(&self) {
        let ids = docker(&[
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
        ])
        .await
        .unwrap_or_default();
        for id in ids.lines() {
            let name = docker(&["inspect", "-f", "{{.Name}}", id])
                .await
                .unwrap_or_default();
            let mut cmd = Command::new("docker");
            cmd.args(["logs", "--tail", "40", id]);
            let logs = match tokio::time::timeout(Duration::from_secs(20), cmd.output()).await {
                Ok(Ok(out)) => format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                _ => "(could not read the log)".to_owned(),
            };
            eprintln!("---- last log lines of {} ----\n{logs}", name.trim());
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.keep {
            // The env file stays too: compose needs it for any later command on the project.
            if let Some(dir) = self.env_guard.take() {
                let _ = dir.keep();
            }
            eprintln!(
                "GATEWAY_COMPOSE_KEEP=1: leaving project {} up (edge 127.0.0.1:{}); its env file \
                 (with this run's tokens) is {}",
                self.project,
                self.edge_port,
                self.env_file().display()
            );
            return;
        }
        let mut cmd = std::process::Command::new(&self.compose_cmd[0]);
        cmd.args(&self.compose_cmd[1..])
            .arg("--env-file")
            .arg(self.env_file())
            .arg("-p")
            .arg(&self.project)
            .arg("--project-directory")
            .arg(&self.root);
        for f in &self.files {
            cmd.arg("-f").arg(f);
        }
        cmd.args(["down", "-v", "--remove-orphans", "-t", "5"])
            .envs(self.env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match cmd.status() {
            Ok(s) if s.success() => eprintln!("compose project {} removed (down -v)", self.project),
            other => eprintln!("`down -v` of {} failed: {other:?}", self.project),
        }
        let volumes = std::mem::take(&mut *self.volumes.lock());
        if !volumes.is_empty() {
            // Those of scaled-down replicas; the ones `down -v` already removed are just absent.
            let _ = std::process::Command::new("docker")
                .args(["volume", "rm", "-f"])
                .args(&volumes)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Polls `check` every 250 ms until it returns true; errors count as "not yet" (the stack is
/// being disturbed on purpose), and the last one is reported when the deadline passes.
pub(crate) async fn wait_for<F, Fut>(what: &str, within: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + within;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {within:?} waiting for {what} (last error: {e:#})")
                }
                None => bail!("timed out after {within:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `docker compose` when the plugin works, else Debian's `docker-compose`; `GATEWAY_COMPOSE`
/// overrides.
async fn compose_command() -> Result<Vec<String>> {
    if let Ok(cmd) = std::env::var("GATEWAY_COMPOSE") {
        return Ok(cmd.split_whitespace().map(str::to_owned).collect());
    }
    if docker_ok(&["compose", "version"]).await {
        return Ok(vec!["docker".to_owned(), "compose".to_owned()]);
    }
    let v1 = Command::new("docker-compose")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    ensure!(
        v1.is_ok_and(|s| s.success()),
        "neither `docker compose` nor `docker-compose` works (apt-get install docker-compose)"
    );
    Ok(vec!["docker-compose".to_owned()])
}

async fn docker_ok(args: &[&str]) -> bool {
    Command::new("docker")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

async fn docker(args: &[&str]) -> Result<String> {
    let mut cmd = Command::new("docker");
    cmd.args(args);
    run(
        cmd,
        &format!("docker {}", args.join(" ")),
        Duration::from_secs(120),
    )
    .await
}

async fn run(mut cmd: Command, what: &str, within: Duration) -> Result<String> {
    cmd.stdin(Stdio::null());
    run_with_stdin(cmd, what, within, None).await
}

/// [`run`], writing `stdin` (when given) to the command's standard input.
async fn run_with_stdin(
    mut cmd: Command,
    what: &str,
    within: Duration,
    stdin: Option<&str>,
) -> Result<String> {
    cmd.kill_on_drop(true)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run `{what}`"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use tokio::io::AsyncWriteExt as _;
        pipe.write_all(text.as_bytes())
            .await
            .with_context(|| format!("writing to the stdin of `{what}`"))?;
    }
    let out = tokio::time::timeout(within, child.wait_with_output())
        .await
        .with_context(|| format!("`{what}` did not finish within {within:?}"))?
        .with_context(|| format!("cannot run `{what}`"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "`{what}` failed ({}): {}{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// `GET path` on 127.0.0.1:port inside a container (bash /dev/tcp: the images have no curl);
/// returns the body of a 2xx answer.
async fn http_get_in(container: &str, port: u16, path: &str) -> Result<String> {
    // A data plane's ops listener is bound to its edge-network address only, which its
    // entrypoint wrote to /tmp/ops-address; other containers listen on loopback too.
    let script = format!(
        "host=$(cat /tmp/ops-address 2>/dev/null || echo 127.0.0.1) && exec 3<>/dev/tcp/$host/{port} && printf 'GET {path} HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && cat <&3"
    );
    let raw = docker(&["exec", container, "bash", "-c", &script]).await?;
    let (head, body) = raw.split_once("\r\n\r\n").with_context(|| {
        format!(
            "GET {path} in {}: no HTTP answer: {raw:?}",
            short(container)
        )
    })?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body).with_context(|| format!("GET {path}: bad chunked body {body:?}"))?
    } else {
        body.to_owned()
    };
    ensure!(
        status.starts_with('2'),
        "GET {path} in {} answered {status}: {body}",
        short(container)
    );
    Ok(body)
}

/// Decodes an HTTP/1.1 chunked body (HAProxy answers chunked even to HTTP/1.0).
fn dechunk(mut raw: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size_line, rest) = raw.split_once("\r\n")?;
        let size = usize::from_str_radix(size_line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        raw = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// `N` free ports, all different: every listener is held until all the ports
/// are known. (Taken one at a time, the kernel could hand out a port just
/// released again, and two published ports of the stack then collided: docker
/// refused the second with "port is already allocated".)
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A response header as a string ("" when absent).
pub(crate) fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// proto3 JSON encodes uint64 as a string; an absent field is 0.
pub(crate) fn json_u64(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        Value::Null => Some(0),
        _ => None,
    }
}
