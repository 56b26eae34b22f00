//! The compose suite: issue 7's scenarios against the containerised stack (docker-compose.yml),
//! driven through the real Docker engine.
//!
//! It runs only with `GATEWAY_COMPOSE_TESTS=1` (`scripts/compose-test` sets it after building the
//! images); otherwise it prints why it skipped and passes. The test owns the stack: `down -v`,
//! `up -d --scale data-plane=3`, the scenarios in order, and `down -v` again when it ends, even
//! on failure (set `GATEWAY_COMPOSE_KEEP=1` to leave the stack up for a look).
//!
//! The control plane is authenticated: the suite makes an env file from `.env.example` with
//! fresh tokens and a Redis password (`--env-file`), checks that compose refuses the example as
//! shipped (and an env file without the Redis password), calls the admin API with the admin
//! token, and checks that a call without one is refused. A fresh stack has no users: the suite
//! checks that, then adds alice and bob with `compose exec auth-service auth-service users add`.
//!
//! Fault injection goes through `docker compose kill/stop/start`, `docker restart` and
//! `docker network disconnect/connect`. Traffic goes through the edge (HAProxy) on a free
//! 127.0.0.1 port; the edge names the replica that answered in `X-Served-By`.
//!
//! Environment: `GATEWAY_COMPOSE` (compose command, default `docker compose` if it works,
//! else `docker-compose`), `GATEWAY_COMPOSE_PROJECT` (default `gateway-compose-test`),
//! `GATEWAY_COMPOSE_EDGE_NET` (first three octets of the edge subnet, default `10.213.81`),
//! `GATEWAY_COMPOSE_STATE_NET` (the same for the state network, default `10.213.83`),
//! `GATEWAY_COMPOSE_OFFLINE` (1: use docker/compose.offline.yml; default: when the Jaeger
//! image is not present), `GATEWAY_COMPOSE_ONLY` (comma-separated words: run only the scenarios
//! whose names contain one).
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod compose_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use compose_support::{Stack, Traffic, json_u64, wait_for};

/// Path the scenarios add (a route with no auth and no rate limit, so traffic is never refused).
const PROBE_PREFIX: &str = "/compose/orders";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compose_stack_scenarios() -> Result<()> {
    if std::env::var("GATEWAY_COMPOSE_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "compose suite SKIPPED: set GATEWAY_COMPOSE_TESTS=1 to run it against Docker \
             (scripts/compose-test builds the images and does that)"
        );
        return Ok(());
    }
    let started = Instant::now();
    let stack = Stack::up(3).await?;
    let outcome = run_scenarios(&stack).await;
    match &outcome {
        Ok(timings) => {
            eprintln!("\ncompose suite timings:");
            for (name, took) in timings {
                eprintln!("  {took:>8.1?}  {name}");
            }
            eprintln!(
                "  {:>8.1?}  total, with up (down follows)",
                started.elapsed()
            );
        }
        Err(_) => stack.dump_logs().await,
    }
    drop(stack);
    outcome.map(|_| ())
}

/// The scenarios in order (each leaves the stack whole for the next); returns their durations.
async fn run_scenarios(stack: &Stack) -> Result<Vec<(&'static str, Duration)>> {
    let mut timings = Vec::new();
    // GATEWAY_COMPOSE_ONLY=word,word runs only the scenarios whose names contain one of them
    // (for working on one scenario); the default runs all.
    let only = std::env::var("GATEWAY_COMPOSE_ONLY").unwrap_or_default();
    let selected = |name: &str| only.is_empty() || only.split(',').any(|w| name.contains(w));
    macro_rules! scenario {
        ($name:expr, $body:expr) => {{
            if selected($name) {
                let t = Instant::now();
                eprintln!("\n=== scenario: {}", $name);
                let out = $body
                    .await
                    .with_context(|| format!("scenario '{}'", $name))?;
                eprintln!("=== passed in {:.1?}: {}", t.elapsed(), $name);
                timings.push(($name, t.elapsed()));
                Some(out)
            } else {
                eprintln!(
                    "\n=== scenario skipped (GATEWAY_COMPOSE_ONLY={only}): {}",
                    $name
                );
                None
            }
        }};
    }
    scenario!("3 replicas SYNCED", three_replicas_synced(stack));
    let token = scenario!("demo config: login, JWT routes", demo_config_works(stack));
    scenario!(
        "grpcurl route change served by every replica",
        route_change(stack)
    );
    scenario!(
        "HTTPS through the edge: TLS passed through, terminated by every replica",
        https_through_the_edge(stack)
    );
    scenario!(
        "Prometheus scrapes the stack with the shipped config",
        prometheus_scrapes_the_stack(stack)
    );
    scenario!(
        "admin API needs the admin token",
        admin_api_needs_a_token(stack)
    );
    scenario!(
        "redis needs its password and only the state network reaches it",
        redis_and_auth_are_private(stack)
    );
    scenario!("client address survives the edge", forwarded_for(stack));
    scenario!(
        "forwarding headers from clients are not believed behind the edge (HTTP and HTTPS)",
        forwarding_headers_not_believed(stack)
    );
    scenario!(
        "scale 3 -> 5 -> 2 under traffic",
        scale_under_traffic(stack)
    );
    scenario!(
        "kill an orders replica under traffic",
        kill_orders_replica(stack)
    );
    scenario!(
        "orders found in DNS: scale 2 -> 3 -> 1 under traffic",
        scale_orders_under_traffic(stack)
    );
    scenario!(
        "control plane down, replica restart from cache",
        control_plane_down(stack)
    );
    scenario!(
        "replica cut off from the control plane",
        partition_replica(stack)
    );
    scenario!("redis down", redis_down(stack, token));
    scenario!("tracing through the edge", tracing(stack));
    scenario!("no token in any container log", no_token_in_logs(stack));
    Ok(timings)
}

/// The compose stack's control plane is authenticated with the tokens from the env file:
/// reflection is open, a call without a token is Unauthenticated, the data-plane token cannot
/// use the admin API, the viewer token can read but not write, and changes made with the admin
/// token are recorded as `compose-admin`.
async fn admin_api_needs_a_token(stack: &Stack) -> Result<()> {
    let (ok, out) = stack.grpcurl_as(None, &[], "list").await?;
    ensure!(
        ok && out.contains("gateway.v1.AdminService"),
        "reflection must stay open: {out}"
    );
    // gRPC is served over TLS only (the config stream carries keys): cleartext gets nowhere.
    let (ok, out) = stack.grpcurl_as(None, &["-plaintext"], "list").await?;
    ensure!(!ok, "the control plane answered cleartext gRPC: {out}");
    // And Jaeger is not on the network the config stream crosses.
    let jaeger = stack.container_of("jaeger").await?;
    let networks = stack
        .docker(&[
            "inspect",
            "-f",
            "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}",
            &jaeger,
        ])
        .await?;
    ensure!(
        !networks
            .split_whitespace()
            .any(|n| n == stack.network("control")),
        "jaeger is on the control network: {networks}"
    );
    let list_routes = "gateway.v1.AdminService/ListRoutes";
    let (ok, out) = stack.grpcurl_as(None, &[], list_routes).await?;
    ensure!(
        !ok && out.contains("Unauthenticated"),
        "no token must be Unauthenticated: {out}"
    );
    let (ok, out) = stack
        .grpcurl_as(Some("not-a-token-of-this-stack-00000000"), &[], list_routes)
        .await?;
    ensure!(
        !ok && out.contains("Unauthenticated"),
        "an unknown token must be Unauthenticated: {out}"
    );
    let tokens = stack.tokens();
    let (ok, out) = stack
        .grpcurl_as(Some(&tokens.data_plane), &[], list_routes)
        .await?;
    ensure!(
        !ok && out.contains("PermissionDenied"),
        "the data-plane token must not read the admin API: {out}"
    );
    let (ok, out) = stack
        .grpcurl_as(Some(&tokens.viewer), &[], list_routes)
        .await?;
    ensure!(ok && out.contains("\"login\""), "viewer ListRoutes: {out}");
    let upsert = r#"{"route": {"name": "viewer-was-here", "pathPrefix": "/viewer",
        "upstream": "orders"}}"#;
    let (ok, out) = stack
        .grpcurl_as(
            Some(&tokens.viewer),
            &["-d", upsert],
            "gateway.v1.AdminService/UpsertRoute",
        )
        .await?;
    ensure!(
        !ok && out.contains("PermissionDenied"),
        "the viewer token must not change the configuration: {out}"
    );
    let change = stack
        .grpc(
            "UpsertRoute",
            r#"{"route": {"name": "compose-admin-probe", "pathPrefix": "/compose/admin-probe",
                "rewritePrefix": "/orders", "upstream": "orders"}}"#,
        )
        .await?;
    let version = json_u64(&change["version"]).context("UpsertRoute answer has no version")?;
    let versions = stack.grpc("ListConfigVersions", r#"{"limit": 1}"#).await?;
    let last = &versions["versions"][0];
    ensure!(
        json_u64(&last["version"]) == Some(version) && last["author"] == "compose-admin",
        "v{version}, made with the admin token, must be recorded as by compose-admin: {versions}"
    );
    Ok(())
}

/// No container log holds a token of the run (log hygiene, as tests/security.rs does for
/// devstack), while the control plane's log shows the authenticated start.
async fn no_token_in_logs(stack: &Stack) -> Result<()> {
    let logs = stack.all_logs().await?;
    ensure!(
        logs.contains("authentication required"),
        "the control plane's log does not show it requires tokens"
    );
    let tokens = stack.tokens();
    for (what, token) in [
        ("admin token", &tokens.admin),
        ("data-plane token", &tokens.data_plane),
        ("viewer token", &tokens.viewer),
        ("Redis password", &tokens.redis_password),
    ] {
        if let Some(line) = logs.lines().find(|l| l.contains(token.as_str())) {
            anyhow::bail!("the {what} is in a container log: {line}");
        }
    }
    eprintln!(
        "{} log lines scanned, no token and no Redis password",
        logs.lines().count()
    );
    Ok(())
}

/// `ListDataPlanes` shows every running replica SYNCED, named by its container hostname.
async fn three_replicas_synced(stack: &Stack) -> Result<()> {
    let version = stack.config_version().await?;
    let hosts = stack
        .wait_all_synced(version, Duration::from_secs(60))
        .await?;
    ensure!(
        hosts.len() == 3,
        "expected 3 data-plane containers, found {hosts:?}"
    );
    let listed = stack.grpc("ListDataPlanes", "{}").await?;
    let synced: BTreeSet<String> = listed["dataPlanes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["status"] == "SYNCED")
        .filter_map(|d| d["nodeId"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        hosts.iter().all(|h| synced.contains(h)),
        "node ids must be the container hostnames {hosts:?}; SYNCED: {synced:?}"
    );
    Ok(())
}

/// The seeded demo configuration works through the edge: login, JWT routes, 401 without a token.
/// Returns alice's access token (valid 15 minutes) for later scenarios: the login route allows only
/// 5 attempts per minute per client address, and the XFF scenario spends that budget.
async fn demo_config_works(stack: &Stack) -> Result<String> {
    let token = stack.login("alice", "wonderland").await?;
    let resp = stack
        .http()
        .get(stack.edge_url("/api/users/7"))
        .bearer_auth(&token)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await?;
    ensure!(
        status == 200,
        "GET /api/users/7 with a token: {status} {body}"
    );
    ensure!(
        body["instance"] == "users-1",
        "users route must reach users-1: {body}"
    );
    ensure!(
        body["headers"]["x-user-id"] == "alice",
        "X-User-Id must be forwarded: {body}"
    );
    ensure!(
        body["headers"].get("authorization").is_none(),
        "Authorization must not be forwarded: {body}"
    );
    let anon = stack
        .http()
        .get(stack.edge_url("/api/orders/1"))
        .send()
        .await?;
    ensure!(
        anon.status() == 401,
        "no token must give 401, got {}",
        anon.status()
    );
    Ok(token)
}

/// A route added with grpcurl reaches every replica, and each one serves it through the edge.
async fn route_change(stack: &Stack) -> Result<()> {
    let t = Instant::now();
    let change = stack
        .grpc(
            "UpsertRoute",
            &format!(
                r#"{{"route": {{"name": "compose-probe", "pathPrefix": "{PROBE_PREFIX}",
                    "rewritePrefix": "/orders", "upstream": "orders"}}}}"#
            ),
        )
        .await?;
    let version = json_u64(&change["version"]).context("UpsertRoute answer has no version")?;
    let hosts = stack
        .wait_all_synced(version, Duration::from_secs(30))
        .await?;
    eprintln!(
        "route change v{version} ACKed by {} replicas in {:.0?}",
        hosts.len(),
        t.elapsed()
    );
    let servers = stack.edge_servers_up().await?;
    let mut seen = BTreeSet::new();
    for _ in 0..(10 * servers.len()) {
        let (status, served_by, _) = stack.probe_get().await?;
        ensure!(
            status == 200,
            "after every replica ACKed, {served_by} answered {status}"
        );
        seen.insert(served_by);
        if seen.len() == hosts.len() {
            break;
        }
    }
    ensure!(
        seen.len() == hosts.len(),
        "new route served by {seen:?} only; replicas: {hosts:?}"
    );
    eprintln!("new route served through the edge by {seen:?}");
    Ok(())
}

/// HTTPS: a certificate committed with grpcurl (named `default`, for localhost) reaches every
/// replica; the edge passes TLS through (mode tcp), each replica terminates it: curl with the
/// CA gets the probe route over HTTP/2 (ALPN h2) and HTTP/1.1, connection after connection,
/// and the backend hears `X-Forwarded-Proto: https`.
async fn https_through_the_edge(stack: &Stack) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = devstack::pki::Pki::generate(dir.path())?;
    let cert = std::fs::read_to_string(&pki.server_cert)?;
    let key = std::fs::read_to_string(&pki.server_key)?;
    let body = serde_json::json!({"certificate": {
        "name": "default", "sniHosts": ["localhost"], "certChainPem": cert, "privateKeyPem": key,
    }});
    let change = stack.grpc("UpsertCertificate", &body.to_string()).await?;
    let version =
        json_u64(&change["version"]).context("UpsertCertificate answer has no version")?;
    // The key that sealed it is in memory (a tmpfs), not in the database's volume.
    let mounts = stack
        .compose(&[
            "exec",
            "-T",
            "control-plane",
            "sh",
            "-c",
            "test -s /run/gateway/secrets-key && ! test -e /var/lib/gateway/secrets-key \
             && grep ' /run/gateway tmpfs ' /proc/mounts",
        ])
        .await
        .context("the sealing key is not (only) on the control plane's tmpfs")?;
    ensure!(mounts.contains("tmpfs"), "{mounts}");
    let hosts = stack
        .wait_all_synced(version, Duration::from_secs(30))
        .await?;
    let port = stack.edge_tls_port();
    let ca = pki.ca.to_str().context("a UTF-8 temp path")?.to_owned();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let url = format!("https://localhost:{port}{PROBE_PREFIX}/1");
    let mut instances = BTreeSet::new();
    for (i, version) in ["--http2", "--http1.1"].iter().cycle().take(6).enumerate() {
        let out = tokio::process::Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "10",
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                version,
            ])
            .args(["-w", "\n%{http_code} %{http_version}", &url])
            .output()
            .await
            .context("curl runs (scripts/test installs it)")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, tail) = text
            .rsplit_once('\n')
            .context("curl printed no status line")?;
        let want = if *version == "--http2" {
            "200 2"
        } else {
            "200 1.1"
        };
        ensure!(tail == want, "request {i} ({version}): {tail:?} {body}");
        let doc: serde_json::Value = serde_json::from_str(body)?;
        ensure!(
            doc["headers"]["x-forwarded-proto"] == "https",
            "the backend did not hear https: {doc}"
        );
        instances.insert(doc["instance"].as_str().unwrap_or_default().to_owned());
    }
    ensure!(!instances.is_empty(), "no backend instance answered");
    eprintln!(
        "HTTPS through the edge: certificate v{version} on {} replicas, answered by {instances:?}",
        hosts.len()
    );
    Ok(())
}

/// Removes a container when dropped (`docker rm -f`), however the scenario ends.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The `observability` profile's Prometheus, as far as it can run here: its image cannot be
/// pulled, so Debian's `prometheus` binary runs in a container of the gateway image on the
/// stack's `control` and `edge` networks (where the profile puts it), with
/// `deploy/observability/prometheus` mounted as it ships (`prometheus.yml`, `alerts.yml`). Every data-plane replica, found through
/// Docker's DNS, the control plane and Prometheus itself must be up, and every alert rule must
/// evaluate.
async fn prometheus_scrapes_the_stack(stack: &Stack) -> Result<()> {
    let binary = std::path::Path::new("/usr/bin/prometheus");
    ensure!(
        binary.exists(),
        "Debian's prometheus is not installed (scripts/test installs it)"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let name = format!("gateway-compose-prometheus-check-{port}");
    let config = stack.root().join("deploy/observability/prometheus");
    let _ = stack.docker(&["rm", "-f", &name]).await;
    // Created on the control network (the control plane's metrics), joined to the edge network
    // (the only one where the data planes' ops listener is bound), then started.
    stack
        .docker(&[
            "create",
            "--name",
            &name,
            "--network",
            &stack.network("control"),
            "-p",
            &format!("127.0.0.1:{port}:9090"),
            "-v",
            "/usr/bin/prometheus:/bin/prometheus:ro",
            "-v",
            &format!("{}:/etc/prometheus:ro", config.display()),
            "--entrypoint",
            "/bin/prometheus",
            stack.image(),
            "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.path=/tmp/prometheus",
            "--web.listen-address=0.0.0.0:9090",
        ])
        .await?;
    let _container = Container(name.clone());
    stack
        .docker(&["network", "connect", &stack.network("edge"), &name])
        .await?;
    stack.docker(&["start", &name]).await?;
    let replicas = stack.service_ids("data-plane").await?.len();
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let seen = std::cell::RefCell::new(String::new());
    let targets_up = wait_for(
        "every target of the shipped scrape config up",
        Duration::from_secs(90),
        || async {
            let doc: serde_json::Value = stack
                .http()
                .get(format!("{api}/targets"))
                .send()
                .await?
                .json()
                .await?;
            let targets = doc["data"]["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let up = |job: &str| {
                targets
                    .iter()
                    .filter(|t| t["labels"]["job"] == job && t["health"] == "up")
                    .count()
            };
            *seen.borrow_mut() = format!(
                "data-plane {} of {replicas}, control-plane {}, prometheus {}",
                up("data-plane"),
                up("control-plane"),
                up("prometheus")
            );
            Ok(up("data-plane") == replicas && up("control-plane") == 1 && up("prometheus") == 1)
        },
    )
    .await;
    targets_up.with_context(|| format!("targets up: {}", seen.borrow()))?;
    wait_for(
        "every alert rule evaluated without error",
        Duration::from_secs(60),
        || async {
            let doc: serde_json::Value = stack
                .http()
                .get(format!("{api}/rules"))
                .send()
                .await?
                .json()
                .await?;
            let rules: Vec<serde_json::Value> = doc["data"]["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            Ok(!rules.is_empty() && rules.iter().all(|r| r["health"] == "ok"))
        },
    )
    .await?;
    eprintln!(
        "Prometheus (Debian's binary, shipped config) scraped: {}",
        seen.borrow()
    );
    Ok(())
}

/// Redis answers nothing without its password, also to a service on its own network; the auth
/// service and the data planes use the password (their keys are there); the backends' network
/// reaches neither Redis nor the auth service (no name, no route); the auth service has no host
/// port; and it counts failed logins against the real client (the address the edge saw), not a
/// data plane's and not a spoofed X-Forwarded-For.
async fn redis_and_auth_are_private(stack: &Stack) -> Result<()> {
    let auth = format!("AUTH {}", stack.tokens().redis_password);
    let anon = stack
        .redis_from("auth-service", "redis", &["PING", "SET auth:fam:forged x"])
        .await?;
    ensure!(
        anon.lines().filter(|l| l.starts_with("-NOAUTH")).count() == 2,
        "Redis without the password must refuse every command: {anon:?}"
    );
    let wrong = stack
        .redis_from("data-plane", "redis", &["AUTH not-the-password", "PING"])
        .await?;
    ensure!(
        wrong.contains("-WRONGPASS") && !wrong.contains("+PONG"),
        "a wrong password: {wrong:?}"
    );

    // Both users of Redis authenticate: a login through the edge leaves a refresh family (auth
    // service) and the login route's rate-limit budget (data plane).
    stack.login("bob", "builder").await?;
    let spoofed = stack
        .http()
        .post(stack.edge_url("/auth/login"))
        .header("x-forwarded-for", "198.51.100.77")
        .json(&serde_json::json!({"username": "nobody", "password": "wrong"}))
        .send()
        .await?
        .status()
        .as_u16();
    ensure!(spoofed == 401, "a failing login answered {spoofed}");
    let client = format!("auth:{{login}}:ip:{}.1", stack.edge_net());
    let keys = stack
        .redis_from(
            "auth-service",
            "redis",
            &[
                &auth,
                "SCAN 0 MATCH auth:*:fam:* COUNT 10000",
                "SCAN 0 MATCH rl:* COUNT 10000",
                &format!("EXISTS {client}"),
                "EXISTS auth:{login}:ip:198.51.100.77",
            ],
        )
        .await?;
    ensure!(
        keys.starts_with("+OK") && keys.contains(":fam:") && keys.contains("rl:"),
        "no refresh family or rate-limit budget in Redis: {keys:?}"
    );
    // The two EXISTS replies are the last two lines.
    let exists: Vec<&str> = keys.lines().rev().take(2).collect();
    ensure!(
        exists == [":0", ":1"],
        "failed logins must be counted as {client} (the client the edge saw), never as the          spoofed 198.51.100.77: {keys:?}"
    );

    // The backends' network reaches neither Redis nor the auth service (checked at once: a
    // name that is not there takes the lookup's whole timeout to fail).
    let lookups = ["users-1", "orders"].into_iter().flat_map(|service| {
        ["redis", "auth-service"].map(|name| async move {
            let resolved = stack.resolves_from(service, name).await?;
            ensure!(!resolved, "{service} resolves {name}");
            anyhow::Ok(())
        })
    });
    futures::future::try_join_all(lookups).await?;
    let redis = stack.container_of("redis").await?;
    let addresses = stack.addresses_of(&redis).await?;
    ensure!(
        addresses.len() == 1 && addresses[0].starts_with(&format!("{}.", stack.state_net())),
        "Redis must be on the state network only: {addresses:?}"
    );
    let reached = stack.redis_from("users-1", &addresses[0], &["PING"]).await;
    ensure!(
        reached.is_err(),
        "users-1 reached Redis at {}: {reached:?}",
        addresses[0]
    );
    ensure!(
        stack.resolves_from("data-plane", "redis").await?,
        "a data plane must reach Redis"
    );
    let auth_container = stack.container_of("auth-service").await?;
    let published = stack.docker(&["port", &auth_container]).await?;
    ensure!(
        published.trim().is_empty(),
        "the auth service must publish no port: {published}"
    );
    eprintln!(
        "Redis {} refuses without its password; backends reach neither Redis nor the auth \
         service; failed logins counted as {client}",
        addresses[0]
    );
    Ok(())
}

/// The edge adds X-Forwarded-For and the data planes trust it only from the edge: a client on the
/// host cannot escape the per-IP login limit by spoofing the header, while another real client
/// (a container on the edge network) still has its own budget.
async fn forwarded_for(stack: &Stack) -> Result<()> {
    let resp = stack
        .http()
        .get(stack.edge_url(&format!("{PROBE_PREFIX}/1")))
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await?;
    let body: serde_json::Value = resp.json().await?;
    let xff = body["headers"]["x-forwarded-for"]
        .as_str()
        .context("backend got no X-Forwarded-For")?
        .to_owned();
    let gateway_ip = format!("{}.1", stack.edge_net());
    ensure!(
        xff.contains(&gateway_ip),
        "X-Forwarded-For must carry the client address as the edge saw it ({gateway_ip}): {xff}"
    );
    // Spoofed addresses: the login limit (5 per 60 s per IP) still counts the real client.
    let mut codes = Vec::new();
    for i in 0..7 {
        let resp = stack
            .http()
            .post(stack.edge_url("/auth/login"))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .json(&serde_json::json!({"username": "nobody", "password": "wrong"}))
            .send()
            .await?;
        codes.push(resp.status().as_u16());
    }
    ensure!(
        codes.contains(&429),
        "spoofed X-Forwarded-For escaped the per-IP login limit: {codes:?}"
    );
    // Another real client, from inside the edge network, is not limited by the host's budget.
    let other = stack.login_status_from_edge_network().await?;
    ensure!(
        other != 429,
        "another client was limited by the host's budget: {other}"
    );
    eprintln!("login statuses from the host with spoofed XFF: {codes:?}; other client: {other}");
    Ok(())
}

/// Issue 41, item 1: the edge carries each client's address to the data planes in a PROXY v2
/// header (HTTPS passed through and HTTP alike), so through the edge over both, a spoofed
/// `X-Forwarded-For` (with `X-Real-IP` and `Forwarded`) neither passes an `ip_allow` nor
/// resets a per-IP limit, and a spoofed `X-Forwarded-Proto: https` does not pass `https_only`
/// over cleartext. The backend hears the address the edge saw (the host's bridge gateway),
/// never the edge's own and never the spoofed one as the client.
async fn forwarding_headers_not_believed(stack: &Stack) -> Result<()> {
    // A certificate of its own (any earlier scenario's may be gone or replaced).
    let dir = tempfile::tempdir()?;
    let pki = devstack::pki::Pki::generate(dir.path())?;
    let body = serde_json::json!({"certificate": {
        "name": "compose-forwarding", "sniHosts": [FORWARDING_HOST],
        "certChainPem": std::fs::read_to_string(&pki.server_cert)?,
        "privateKeyPem": std::fs::read_to_string(&pki.server_key)?,
    }});
    stack.grpc("UpsertCertificate", &body.to_string()).await?;
    let limit = |name: &str| {
        serde_json::json!({"policy": name, "algorithm": "FIXED_WINDOW", "key": "KEY_IP",
            "limit": 3, "windowSeconds": 60})
    };
    let routes = [
        serde_json::json!({"name": "compose-fwd-allow", "pathPrefix": "/compose/fwd/allow",
            "rewritePrefix": "/orders", "upstream": "orders", "ipAllow": ["203.0.113.0/24"]}),
        serde_json::json!({"name": "compose-fwd-limit-http", "pathPrefix": "/compose/fwd/limit-http",
            "rewritePrefix": "/orders", "upstream": "orders", "rateLimit": limit("fwd-http")}),
        serde_json::json!({"name": "compose-fwd-limit-https", "pathPrefix": "/compose/fwd/limit-https",
            "rewritePrefix": "/orders", "upstream": "orders", "rateLimit": limit("fwd-https")}),
        serde_json::json!({"name": "compose-fwd-secure", "pathPrefix": "/compose/fwd/secure",
            "rewritePrefix": "/orders", "upstream": "orders", "httpsOnly": true}),
    ];
    let mut version = 0;
    for route in routes {
        let change = stack
            .grpc(
                "UpsertRoute",
                &serde_json::json!({ "route": route }).to_string(),
            )
            .await?;
        version = json_u64(&change["version"]).context("UpsertRoute answer has no version")?;
    }
    stack
        .wait_all_synced(version, Duration::from_secs(30))
        .await?;
    let real = format!("{}.1", stack.edge_net());
    let edge = format!("{}.10", stack.edge_net());

    for tls in [false, true] {
        let over = if tls { "HTTPS" } else { "HTTP" };
        // The backend hears the client as the edge saw it.
        let (status, body) = edge_curl(stack, tls, "/compose/orders/1").await?;
        ensure!(
            status == 200,
            "{over}: probe route answered {status}: {body}"
        );
        let doc: serde_json::Value = serde_json::from_str(&body)?;
        let xff = doc["headers"]["x-forwarded-for"]
            .as_str()
            .unwrap_or_default();
        let last = xff.rsplit(',').next().unwrap_or_default().trim();
        ensure!(
            last == real && !xff.contains(&edge),
            "{over}: the backend heard X-Forwarded-For {xff:?}, not the client {real}"
        );
        ensure!(
            doc["headers"]["x-forwarded-proto"] == if tls { "https" } else { "http" },
            "{over}: the backend heard {doc}"
        );
        for spoofed in ["x-real-ip", "forwarded"] {
            ensure!(
                doc["headers"][spoofed].is_null(),
                "{over}: a client's {spoofed} reached the backend: {doc}"
            );
        }

        // ip_allow decides on the real client, whatever it claims.
        let (status, body) = edge_curl(stack, tls, "/compose/fwd/allow/1").await?;
        ensure!(
            status == 403,
            "{over}: a spoofed X-Forwarded-For passed ip_allow: {status} {body}"
        );

        // A new spoofed address per request does not reset the per-IP limit (3 a minute).
        let path = if tls {
            "/compose/fwd/limit-https/1"
        } else {
            "/compose/fwd/limit-http/1"
        };
        let mut codes = Vec::new();
        for i in 0..6 {
            let spoof = format!("198.51.100.{i}");
            codes.push(edge_curl_as(stack, tls, path, &spoof).await?.0);
        }
        ensure!(
            codes.iter().filter(|c| **c == 200).count() <= 3 && codes.contains(&429),
            "{over}: spoofed X-Forwarded-For escaped the per-IP limit: {codes:?}"
        );

        // https_only: a cleartext client's X-Forwarded-Proto: https is not believed.
        let (status, _) = edge_curl(stack, tls, "/compose/fwd/secure/1").await?;
        let want = if tls { 200 } else { 301 };
        ensure!(
            status == want,
            "{over}: https_only route answered {status}, want {want}"
        );
        eprintln!("{over} through the edge: X-Forwarded-For {xff:?}, limited {codes:?}");
    }
    Ok(())
}

/// The SNI name of [`forwarding_headers_not_believed`]'s certificate.
const FORWARDING_HOST: &str = "forwarding.test";

/// [`edge_curl_as`] claiming to come from 203.0.113.9 (inside the scenario's allow list).
async fn edge_curl(stack: &Stack, tls: bool, path: &str) -> Result<(u16, String)> {
    edge_curl_as(stack, tls, path, "203.0.113.9").await
}

/// GET `path` through the edge with curl (over TLS to [`FORWARDING_HOST`], certificate not
/// checked: this is about forwarding, not trust), with every forwarding field a client could
/// spoof claiming `spoof` and HTTPS; (status, body). Redirects are not followed.
async fn edge_curl_as(stack: &Stack, tls: bool, path: &str, spoof: &str) -> Result<(u16, String)> {
    let url = if tls {
        format!("https://{FORWARDING_HOST}:{}{path}", stack.edge_tls_port())
    } else {
        stack.edge_url(path)
    };
    let resolve = format!("{FORWARDING_HOST}:{}:127.0.0.1", stack.edge_tls_port());
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-k", "--max-time", "10", "--resolve", &resolve])
        .args(["-H", &format!("X-Forwarded-For: {spoof}")])
        .args(["-H", &format!("X-Real-IP: {spoof}")])
        .args(["-H", &format!("Forwarded: for={spoof};proto=https")])
        .args(["-H", "X-Forwarded-Proto: https"])
        .args(["-H", "X-Forwarded-Host: spoofed.example"])
        .args(["-w", "\n%{http_code}", &url])
        .output()
        .await
        .context("curl runs (scripts/test installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text
        .rsplit_once('\n')
        .with_context(|| format!("curl printed no status for {url}: {text:?}"))?;
    let status = code
        .trim()
        .parse()
        .with_context(|| format!("curl status {code:?} for {url}"))?;
    Ok((status, body.to_owned()))
}

/// Scaling out and back in under traffic loses no request; new replicas sync and take traffic.
async fn scale_under_traffic(stack: &Stack) -> Result<()> {
    let traffic = Traffic::start(stack, PROBE_PREFIX);
    traffic.wait_requests(50, Duration::from_secs(20)).await?;

    let t = Instant::now();
    stack.scale("data-plane", 5).await?;
    let version = stack.config_version().await?;
    let hosts = stack
        .wait_all_synced(version, Duration::from_secs(90))
        .await?;
    ensure!(hosts.len() == 5, "expected 5 replicas, got {hosts:?}");
    wait_for(
        "traffic to reach 5 replicas",
        Duration::from_secs(60),
        || async { Ok(traffic.servers_since(t).len() >= 5) },
    )
    .await?;
    eprintln!(
        "scaled to 5: all SYNCED and taking traffic after {:.1?}",
        t.elapsed()
    );

    let t = Instant::now();
    stack.scale("data-plane", 2).await?;
    let hosts = stack.data_plane_hostnames().await?;
    ensure!(hosts.len() == 2, "expected 2 replicas, got {hosts:?}");
    wait_for(
        "the edge to drop removed replicas",
        Duration::from_secs(30),
        || async { Ok(stack.edge_servers_up().await?.len() == 2) },
    )
    .await?;
    let mark = Instant::now();
    traffic
        .wait_requests_since(mark, 100, Duration::from_secs(30))
        .await?;
    eprintln!("scaled to 2 in {:.1?}", t.elapsed());
    let report = traffic.stop().await;
    eprintln!("{report}");
    ensure!(
        report.failed == 0,
        "failed requests while scaling: {report}"
    );
    Ok(())
}

/// Killing one orders replica under traffic costs no request: retries go to the other one until
/// health checks and DNS discovery have taken it out.
async fn kill_orders_replica(stack: &Stack) -> Result<()> {
    let replicas = stack.orders_ids().await?;
    ensure!(
        replicas.len() == 2,
        "expected 2 orders replicas: {replicas:?}"
    );
    let victim = replicas[0].clone();
    let victim_host = stack.hostname_of(&victim).await?;
    let other_host = stack.hostname_of(&replicas[1]).await?;
    let traffic = Traffic::start(stack, PROBE_PREFIX);
    traffic.wait_requests(50, Duration::from_secs(20)).await?;
    stack.docker(&["kill", &victim]).await?;
    let killed = Instant::now();
    // Until every replica has taken it out (DNS refresh every second, health checks every
    // second), and then some: all traffic lands on the other one.
    wait_for(
        "traffic only on the other orders replica",
        Duration::from_secs(60),
        || async {
            let recent = Instant::now() - Duration::from_secs(3);
            Ok(killed.elapsed() > Duration::from_secs(5)
                && recent > killed
                && traffic.instances_since(recent) == BTreeSet::from([other_host.clone()]))
        },
    )
    .await?;
    stack.docker(&["start", &victim]).await?;
    let started = Instant::now();
    wait_for(
        "the restarted replica back in rotation",
        Duration::from_secs(60),
        || async { Ok(traffic.instances_since(started).contains(&victim_host)) },
    )
    .await?;
    let report = traffic.stop().await;
    eprintln!("{report}");
    ensure!(
        report.failed == 0,
        "failed requests with an orders replica killed: {report}"
    );
    Ok(())
}

/// The orders upstream is found in DNS (`discovery` of "orders" in the seed): `--scale orders=3`
/// brings a third replica into service without a configuration change, and scaling back to 1
/// loses no request (a stopping replica drains: its /health fails first, then it stops).
async fn scale_orders_under_traffic(stack: &Stack) -> Result<()> {
    let version = stack.config_version().await?;
    let before = stack.orders_hostnames().await?;
    ensure!(before.len() == 2, "expected 2 orders replicas: {before:?}");
    let traffic = Traffic::start(stack, PROBE_PREFIX);
    traffic.wait_requests(50, Duration::from_secs(20)).await?;

    let planes = stack.data_plane_ids().await?;
    let t = Instant::now();
    stack.scale("orders", 3).await?;
    let after = stack.orders_hostnames().await?;
    let new: Vec<&String> = after.difference(&before).collect();
    ensure!(
        new.len() == 1,
        "expected one new orders replica: {before:?} -> {after:?}"
    );
    let new = new[0].clone();
    wait_for(
        "the third orders replica to take traffic",
        Duration::from_secs(60),
        || async { Ok(traffic.instances_since(t).contains(&new)) },
    )
    .await?;
    eprintln!(
        "third orders replica {new} took traffic {:.1?} after the scale-up",
        t.elapsed()
    );
    // Every data plane lists three discovered members.
    for replica in stack.data_plane_ids().await? {
        wait_for(
            "every data plane to list 3 orders members",
            Duration::from_secs(30),
            || async {
                let orders = stack.replica_upstream(&replica, "orders").await?;
                let members = orders["instances"].as_array().map_or(0, Vec::len);
                Ok(orders["discovery"]["dns_name"] == "orders" && members == 3)
            },
        )
        .await?;
    }
    ensure!(
        stack.config_version().await? == version,
        "scaling must not need a configuration change"
    );

    let t = Instant::now();
    stack.scale("orders", 1).await?;
    let left = stack.orders_hostnames().await?;
    ensure!(left.len() == 1, "expected 1 orders replica: {left:?}");
    wait_for(
        "traffic only on the remaining orders replica",
        Duration::from_secs(60),
        || async {
            let recent = Instant::now() - Duration::from_secs(2);
            Ok(recent > t && traffic.instances_since(recent) == left)
        },
    )
    .await?;
    traffic
        .wait_requests_since(Instant::now(), 100, Duration::from_secs(30))
        .await?;
    eprintln!("scaled orders to 1 in {:.1?}", t.elapsed());
    let report = traffic.stop().await;
    eprintln!("{report}");
    ensure!(
        report.failed == 0,
        "failed requests while scaling orders: {report}"
    );
    ensure!(
        stack.config_version().await? == version,
        "scaling must not need a configuration change"
    );

    ensure!(
        stack.data_plane_ids().await? == planes,
        "scaling orders must leave the data planes alone"
    );
    // Back to two for the scenarios that follow.
    stack.scale("orders", 2).await?;
    stack
        .wait_healthy_service("orders", Duration::from_secs(60))
        .await?;
    Ok(())
}

/// With the control plane stopped, traffic is unaffected, and a replica restarted meanwhile
/// serves its cached configuration.
async fn control_plane_down(stack: &Stack) -> Result<()> {
    let version = stack.config_version().await?;
    let traffic = Traffic::start(stack, PROBE_PREFIX);
    traffic.wait_requests(50, Duration::from_secs(20)).await?;
    stack.compose(&["stop", "control-plane"]).await?;
    let stopped = Instant::now();
    traffic
        .wait_requests_since(stopped, 200, Duration::from_secs(30))
        .await?;

    let replica = stack.data_plane_ids().await?.remove(0);
    eprintln!("restarting replica {replica} while the control plane is down");
    stack.docker(&["restart", &replica]).await?;
    let restarted = Instant::now();
    stack
        .wait_healthy(&replica, Duration::from_secs(60))
        .await?;
    let served = stack.replica_config(&replica).await?;
    ensure!(
        json_u64(&served["version"]) == Some(version),
        "restarted replica should serve cached v{version}, serves {served}"
    );
    let slot = stack.edge_slot_of(&replica).await?;
    wait_for(
        "the restarted replica to take traffic",
        Duration::from_secs(30),
        || async { Ok(traffic.servers_since(restarted).contains(&slot)) },
    )
    .await?;

    stack.compose(&["start", "control-plane"]).await?;
    stack
        .wait_all_synced(version, Duration::from_secs(90))
        .await?;
    let report = traffic.stop().await;
    eprintln!("{report}");
    ensure!(
        report.failed == 0,
        "failed requests with the control plane down: {report}"
    );
    Ok(())
}

/// A replica disconnected from the control plane's network keeps serving, misses a change, and
/// catches up after it is reconnected.
async fn partition_replica(stack: &Stack) -> Result<()> {
    let traffic = Traffic::start(stack, PROBE_PREFIX);
    traffic.wait_requests(50, Duration::from_secs(20)).await?;
    let replica = stack.data_plane_ids().await?.remove(0);
    let hostname = stack.hostname_of(&replica).await?;
    let slot = stack.edge_slot_of(&replica).await?;
    let network = stack.network("control");
    stack
        .docker(&["network", "disconnect", &network, &replica])
        .await?;
    let cut = Instant::now();

    let change = stack
        .grpc(
            "UpsertRoute",
            r#"{"route": {"name": "compose-partition", "pathPrefix": "/compose/partition",
                "rewritePrefix": "/users", "upstream": "users"}}"#,
        )
        .await?;
    let version = json_u64(&change["version"]).context("UpsertRoute answer has no version")?;
    wait_for(
        "the connected replicas to ACK",
        Duration::from_secs(30),
        || async {
            let planes = stack.list_data_planes().await?;
            let others_synced = planes
                .iter()
                .filter(|p| p.node_id != hostname)
                .filter(|p| p.acked_version >= version)
                .count();
            Ok(others_synced + 1 >= stack.data_plane_ids().await?.len())
        },
    )
    .await?;
    let cut_off = stack.replica_config(&replica).await?;
    ensure!(
        json_u64(&cut_off["version"]) < Some(version),
        "a replica cut off from the control plane cannot have v{version}: {cut_off}"
    );
    wait_for(
        "the cut-off replica to keep serving",
        Duration::from_secs(30),
        || async { Ok(traffic.servers_since(cut).contains(&slot)) },
    )
    .await?;
    let status = stack
        .list_data_planes()
        .await?
        .into_iter()
        .find(|p| p.node_id == hostname)
        .map(|p| p.status)
        .unwrap_or_default();
    ensure!(
        status != "SYNCED",
        "cut-off replica listed as SYNCED at v{version}"
    );

    stack
        .docker(&["network", "connect", &network, &replica])
        .await?;
    let t = Instant::now();
    wait_for(
        "the reconnected replica to resync",
        Duration::from_secs(90),
        || async {
            let served = stack.replica_config(&replica).await?;
            Ok(json_u64(&served["version"]) >= Some(version))
        },
    )
    .await?;
    eprintln!("reconnected replica resynced in {:.1?}", t.elapsed());
    stack
        .wait_all_synced(version, Duration::from_secs(30))
        .await?;
    let report = traffic.stop().await;
    eprintln!("{report}");
    ensure!(
        report.failed == 0,
        "failed requests during the partition: {report}"
    );
    Ok(())
}

/// With Redis stopped, rate-limited routes still answer (replica-local fallback).
async fn redis_down(stack: &Stack, token: Option<String>) -> Result<()> {
    let token = match token {
        Some(t) => t,
        None => stack.login("bob", "builder").await?,
    };
    stack.compose(&["stop", "redis"]).await?;
    for i in 0..5 {
        let t = Instant::now();
        let resp = stack
            .http()
            .get(stack.edge_url(&format!("/api/orders/{i}")))
            .bearer_auth(&token)
            .send()
            .await?;
        let status = resp.status().as_u16();
        ensure!(
            status == 200,
            "with Redis down, GET /api/orders/{i} answered {status}"
        );
        ensure!(
            t.elapsed() < Duration::from_secs(2),
            "with Redis down a request took {:.1?}",
            t.elapsed()
        );
    }
    stack.compose(&["start", "redis"]).await?;
    stack
        .wait_healthy_service("redis", Duration::from_secs(30))
        .await?;
    Ok(())
}

/// A request with a known traceparent yields a trace whose gateway span is the caller's child and
/// whose backend span is the gateway's child: in Jaeger when its image is there, otherwise in
/// the in-test OTLP receiver behind the offline relay.
async fn tracing(stack: &Stack) -> Result<()> {
    let trace_id = format!("{:032x}", rand_u128());
    let caller_span = format!("{:016x}", rand_u128() as u64 | 1);
    let traceparent = format!("00-{trace_id}-{caller_span}-01");
    let resp = stack
        .http()
        .get(stack.edge_url(&format!("{PROBE_PREFIX}/42")))
        .header("traceparent", &traceparent)
        .send()
        .await?;
    ensure!(resp.status() == 200, "traced request: {}", resp.status());
    let traceresponse = resp
        .headers()
        .get("traceresponse")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    ensure!(
        traceresponse
            .as_deref()
            .is_some_and(|t| t.starts_with(&format!("00-{trace_id}-"))),
        "traceresponse must continue trace {trace_id}: {traceresponse:?}"
    );
    let spans = stack.collected_spans(&trace_id).await?;
    let gateway = spans
        .iter()
        .find(|s| s.service == "data-plane" && s.parent == caller_span)
        .with_context(|| format!("no data-plane span with parent {caller_span}: {spans:#?}"))?;
    let backend = spans
        .iter()
        .find(|s| s.service == "orders")
        .with_context(|| format!("no span from the orders backend: {spans:#?}"))?;
    let gateway_ids: BTreeSet<&str> = spans
        .iter()
        .filter(|s| s.service == "data-plane")
        .map(|s| s.span_id.as_str())
        .collect();
    ensure!(
        gateway_ids.contains(backend.parent.as_str()),
        "the backend span's parent must be a gateway span: {spans:#?}"
    );
    eprintln!(
        "trace {trace_id}: gateway span {} {:?} (parent {caller_span}), backend span {} {:?} \
         (parent {})",
        gateway.span_id, gateway.name, backend.span_id, backend.name, backend.parent
    );
    Ok(())
}

/// Non-zero random bits for trace and span ids (std's randomly keyed hasher; no extra crate).
fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut out = 0u128;
    for i in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(i);
        out = (out << 64) | u128::from(h.finish());
    }
    out.max(1)
}
