//! [`Stack`]: the running processes, their addresses, and process control
//! (kill, stop, restart, wait for sync). Dropping it kills everything.

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gateway_proto::v1::admin_service_client::AdminServiceClient;
use gateway_proto::v1::{DataPlaneState, ListDataPlanesRequest};
use tokio::process::Child;
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::builder::{Options, StackBuilder};
use crate::error::StackError;
use crate::pki::{EdgeTls, Pki};
use crate::ports::Ports;
use crate::process::{ProcessSpec, Readiness, log_tail};
use crate::readiness::{PROBE_TIMEOUT, grpc_serving, http_ok, redis_ping};
use crate::secrets::Tokens;
use crate::summary::StackInfo;
use crate::sys;

/// Interval between two readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long a process may take to stop after SIGTERM before it is SIGKILLed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Log lines quoted when a process fails.
const TAIL_LINES: usize = 20;

/// One process slot: how to start it and, while it runs, the child.
pub(crate) struct Slot {
    pub(crate) spec: ProcessSpec,
    pub(crate) child: Option<Child>,
}

/// A process that exited by itself, as reported by [`Stack::reap_exited`].
#[derive(Debug, Clone)]
pub struct Exited {
    /// Its stack name.
    pub name: String,
    /// Its exit status.
    pub status: String,
    /// Its log file.
    pub log: PathBuf,
    /// The last lines of its log.
    pub tail: String,
}

/// A running gateway system: Redis, control plane, auth service, mocks
/// (`users-1`, `orders-1`, `orders-2`) and N data planes, all on 127.0.0.1.
///
/// ```no_run
/// # async fn demo() -> Result<(), devstack::StackError> {
/// let stack = devstack::Stack::new().data_planes(3).start().await?;
/// let gateway = &stack.gateways()[0];
/// stack.kill("orders-1").await?;
/// stack.start_process("orders-1").await?;
/// # Ok(()) }
/// ```
///
/// Dropping it SIGKILLs every process; [`Stack::shutdown`] stops them gracefully.
///
/// Children get `PR_SET_PDEATHSIG(SIGKILL)`, which Linux ties to the *thread*
/// that spawned them: start stacks (and call [`Stack::start_process`]) from
/// async code on a runtime that outlives the stack, never from a short-lived
/// thread such as `spawn_blocking`'s.
pub struct Stack {
    pub(crate) options: Options,
    pub(crate) ports: Ports,
    pub(crate) dir: PathBuf,
    pub(crate) temp: Option<tempfile::TempDir>,
    pub(crate) procs: Mutex<BTreeMap<String, Slot>>,
    pub(crate) order: Vec<String>,
    pub(crate) seeded_version: u64,
    pub(crate) http: reqwest::Client,
    pub(crate) auth_bin: Option<crate::binaries::Program>,
    pub(crate) tokens: Tokens,
    pub(crate) pki: Option<Pki>,
    /// The edge certificate every data plane's HTTPS listener offers.
    pub(crate) edge: EdgeTls,
    /// With `.redis_password(true)`: Redis's `requirepass`.
    pub(crate) redis_password: Option<String>,
    /// With `.redis_tls(true)`: the CA and server certificate of the TLS-only Redis.
    pub(crate) redis_pki: Option<Pki>,
}

/// The AdminService client of [`Stack::admin_client`]: every call carries the admin token.
pub type AdminClient = AdminServiceClient<InterceptedService<Channel, BearerToken>>;

/// A tonic interceptor adding `authorization: Bearer TOKEN` to every call.
#[derive(Clone)]
pub struct BearerToken(MetadataValue<Ascii>);

impl BearerToken {
    /// Sends `token` (hex, so always a valid header value).
    pub fn new(token: &str) -> Self {
        let mut value: MetadataValue<Ascii> = format!("Bearer {token}")
            .parse()
            .expect("a hex token is a valid header value");
        value.set_sensitive(true);
        BearerToken(value)
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("dir", &self.dir)
            .field("ports", &self.ports)
            .field("seeded_version", &self.seeded_version)
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// A builder with the defaults (see [`StackBuilder::default`]).
    #[allow(clippy::new_ret_no_self)] // The contract reads `Stack::new().data_planes(3).start()`.
    pub fn new() -> StackBuilder {
        StackBuilder::default()
    }

    // ---- addresses -------------------------------------------------------

    /// Proxy URL of each data plane, `"http://127.0.0.1:P"`, in order.
    pub fn gateways(&self) -> Vec<String> {
        self.ports
            .gateways
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    /// HTTPS URL of each data plane, `"https://localhost:P"` (the name the
    /// edge certificate is for), in order.
    pub fn gateways_tls(&self) -> Vec<String> {
        self.ports
            .gateways_tls
            .iter()
            .map(|p| format!("https://localhost:{p}"))
            .collect()
    }

    /// The CA that signed the edge certificate (`curl --cacert`).
    pub fn edge_ca(&self) -> &std::path::Path {
        &self.edge.ca
    }

    /// The edge certificate, as committed (named `default`).
    pub fn edge_certificate(&self) -> &EdgeTls {
        &self.edge
    }

    /// Ops URL of each data plane, `"http://127.0.0.1:P"`, in order.
    pub fn gateway_admins(&self) -> Vec<String> {
        self.ports
            .gateway_admins
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    /// Control-plane gRPC address, `"127.0.0.1:P"` (what grpcurl takes).
    pub fn control_plane(&self) -> String {
        format!("127.0.0.1:{}", self.ports.control_plane)
    }

    /// Control-plane gRPC URL, `"http://127.0.0.1:P"`.
    pub fn control_plane_url(&self) -> String {
        let scheme = if self.options.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.control_plane())
    }

    /// The control plane's web console, `"http://127.0.0.1:P"` (`https://localhost:P`
    /// with `.tls(true)`: the name the control plane's certificate is for).
    pub fn console_url(&self) -> String {
        if self.options.tls {
            format!("https://localhost:{}", self.ports.console)
        } else {
            format!("http://127.0.0.1:{}", self.ports.console)
        }
    }

    /// Auth service URL, `"http://127.0.0.1:P"` (nothing listens there with `.auth(false)`).
    pub fn auth_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.auth)
    }

    /// Redis URL as the services get it: `"redis://127.0.0.1:P"`, with
    /// `:PASSWORD@` after `.redis_password(true)` and `rediss://` after
    /// `.redis_tls(true)` (nothing listens there with `.redis(false)`).
    /// It may hold the password: print [`Stack::redis_url_redacted`] instead.
    pub fn redis_url(&self) -> String {
        let scheme = if self.redis_pki.is_some() {
            "rediss"
        } else {
            "redis"
        };
        let auth = self
            .redis_password
            .as_ref()
            .map_or_else(String::new, |p| format!(":{p}@"));
        format!("{scheme}://{auth}127.0.0.1:{}", self.ports.redis)
    }

    /// [`Stack::redis_url`] with the password hidden (`redis://:***@127.0.0.1:P`).
    pub fn redis_url_redacted(&self) -> String {
        gateway_redis::redact(&self.redis_url())
    }

    /// Redis's password, with `.redis_password(true)`.
    pub fn redis_password(&self) -> Option<&str> {
        self.redis_password.as_deref()
    }

    /// The CA of the TLS-only Redis (`--redis-ca`), with `.redis_tls(true)`.
    pub fn redis_ca(&self) -> Option<&Path> {
        self.redis_pki.as_ref().map(|p| p.ca.as_path())
    }

    /// How the services reach Redis (URL and CA), for clients of a test's own.
    pub fn redis_target(&self) -> gateway_redis::RedisTarget {
        let url = self
            .redis_url()
            .parse()
            .expect("devstack's Redis URL is always valid");
        gateway_redis::RedisTarget::new(url, self.redis_ca())
            .expect("devstack's Redis CA was written at start")
    }

    /// Every port of the stack.
    pub fn ports(&self) -> &Ports {
        &self.ports
    }

    /// The configuration version seeded at start (or found in a persistent database).
    pub fn seeded_version(&self) -> u64 {
        self.seeded_version
    }

    /// The temporary directory holding logs, databases and caches.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Directory of the process logs (`NAME.log`).
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// Log file of process `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.log_dir().join(format!("{name}.log"))
    }

    /// The last `lines` lines of process `name`'s log.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        log_tail(&self.log_path(name), lines)
    }

    /// Names of every process, in start order.
    pub fn process_names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// Names of the data planes (`data-plane-1`, …), which are also their node ids.
    pub fn data_plane_names(&self) -> Vec<String> {
        (1..=self.options.data_planes)
            .map(|i| format!("data-plane-{i}"))
            .collect()
    }

    /// A client of the control plane's AdminService, sending the stack's admin
    /// token. The channel connects lazily and reconnects by itself, so it
    /// survives control-plane restarts.
    pub async fn admin_client(&self) -> AdminClient {
        let mut endpoint = Channel::from_shared(self.control_plane_url())
            .expect("a 127.0.0.1 URL is a valid URI")
            .connect_timeout(Duration::from_secs(2));
        if let Some(pki) = &self.pki {
            endpoint = endpoint
                .tls_config(pki.client_tls())
                .expect("an https URL accepts TLS settings");
        }
        let channel = endpoint.connect_lazy();
        AdminServiceClient::with_interceptor(channel, BearerToken::new(&self.tokens.admin))
    }

    /// The control plane's admin token (role `admin`), for
    /// `grpcurl -H "authorization: Bearer $TOKEN"`.
    pub fn admin_token(&self) -> &str {
        &self.tokens.admin
    }

    /// The control plane's viewer token (role `viewer`: read-only), for the
    /// console's sign-in or grpcurl.
    pub fn viewer_token(&self) -> &str {
        &self.tokens.viewer
    }

    /// The throwaway PKI of a `.tls(true)` stack.
    pub fn pki(&self) -> Option<&Pki> {
        self.pki.as_ref()
    }

    /// The data planes' control-plane token (role `data-plane`).
    pub fn data_plane_token(&self) -> &str {
        &self.tokens.data_plane
    }

    /// The one-line description printed by `devstack --json`.
    pub fn info(&self) -> StackInfo {
        let mut pids = BTreeMap::new();
        for name in &self.order {
            if let Some(pid) = self.pid(name) {
                pids.insert(name.clone(), pid);
            }
        }
        StackInfo {
            control_plane: self.control_plane(),
            console: self.console_url(),
            gateways: self.gateways(),
            gateway_admins: self.gateway_admins(),
            gateways_tls: self.gateways_tls(),
            edge_ca: self.edge.ca.display().to_string(),
            auth: self.auth_url(),
            // Redacted: the JSON line is printed, and may be logged by whoever runs devstack.
            redis: self.redis_url_redacted(),
            pids,
            log_dir: self.log_dir().display().to_string(),
            config_version: self.seeded_version,
            admin_token: self.tokens.admin.clone(),
            viewer_token: self.tokens.viewer.clone(),
            ca: self.pki.as_ref().map(|p| p.ca.display().to_string()),
        }
    }

    // ---- process control -------------------------------------------------

    /// Pid of process `name` while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.lock()
            .get(name)
            .and_then(|slot| slot.child.as_ref())
            .and_then(Child::id)
    }

    /// SIGKILLs process `name` (a crash, not a shutdown) and waits until it
    /// is gone. Killing a process that is not running does nothing.
    pub async fn kill(&self, name: &str) -> Result<(), StackError> {
        if let Some(mut child) = self.take_child(name)? {
            let _ = child.start_kill();
            child
                .wait()
                .await
                .map_err(StackError::io(format!("waiting for {name} to die")))?;
        }
        Ok(())
    }

    /// Stops process `name` gracefully: SIGTERM, then SIGKILL after
    /// [`STOP_GRACE`]. Returns its exit status, or `None` if it was not running.
    pub async fn stop(&self, name: &str) -> Result<Option<String>, StackError> {
        match self.take_child(name)? {
            Some(child) => Ok(Some(terminate(name, child).await)),
            None => Ok(None),
        }
    }

    /// Sets (or replaces) an environment variable of process `name` from its
    /// next start on ([`Stack::start_process`]); e.g. a wrong Redis URL to
    /// see how a service reports it.
    pub fn set_env(
        &self,
        name: &str,
        key: &str,
        value: impl Into<String>,
    ) -> Result<(), StackError> {
        let mut procs = self.lock();
        let slot = procs
            .get_mut(name)
            .ok_or_else(|| StackError::UnknownProcess(name.to_owned()))?;
        slot.spec.env.retain(|(k, _)| k != key);
        slot.spec.env.push((key.to_owned(), value.into()));
        Ok(())
    }

    /// Starts process `name` again with its original arguments and ports,
    /// and waits until it is ready.
    pub async fn start_process(&self, name: &str) -> Result<(), StackError> {
        self.spawn(name)?;
        self.wait_ready(name).await
    }

    /// Waits until every running data plane reports SYNCED with at least
    /// `version` in `ListDataPlanes`.
    pub async fn wait_synced(&self, version: u64) -> Result<(), StackError> {
        let started = Instant::now();
        let deadline = started + self.options.startup_timeout;
        let mut admin = self.admin_client().await;
        loop {
            let running: Vec<String> = self
                .data_plane_names()
                .into_iter()
                .filter(|n| self.pid(n).is_some())
                .collect();
            for name in &running {
                self.check_alive(name)?;
            }
            let call = admin.list_data_planes(ListDataPlanesRequest {});
            let last = match tokio::time::timeout(PROBE_TIMEOUT, call).await {
                Err(_) => "ListDataPlanes timed out".to_owned(),
                Ok(Err(status)) => format!("ListDataPlanes: {}", status.message()),
                Ok(Ok(response)) => {
                    let planes = response.into_inner().data_planes;
                    let lagging: Vec<String> = running
                        .iter()
                        .filter_map(|name| match planes.iter().find(|p| &p.node_id == name) {
                            Some(p)
                                if p.status() == DataPlaneState::Synced
                                    && p.acked_version >= version =>
                            {
                                None
                            }
                            Some(p) => Some(format!(
                                "{name} is {} at version {}{}",
                                p.status().as_str_name(),
                                p.acked_version,
                                if p.last_nack_error.is_empty() {
                                    String::new()
                                } else {
                                    format!(" (last NACK: {})", p.last_nack_error)
                                }
                            )),
                            None => Some(format!("{name} is not known yet")),
                        })
                        .collect();
                    if lagging.is_empty() {
                        return Ok(());
                    }
                    lagging.join("; ")
                }
            };
            if Instant::now() >= deadline {
                return Err(StackError::Timeout {
                    what: format!("every data plane to be SYNCED at version {version}"),
                    waited: started.elapsed(),
                    last,
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Processes that exited by themselves since the last call (their slot is
    /// cleared, so [`Stack::pid`] returns `None` and they can be restarted).
    pub fn reap_exited(&self) -> Vec<Exited> {
        let mut exited = Vec::new();
        let mut procs = self.lock();
        for (name, slot) in procs.iter_mut() {
            let status = match slot.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => status.to_string(),
                Some(Err(e)) => format!("unknown ({e})"),
                _ => continue,
            };
            slot.child = None;
            exited.push(Exited {
                name: name.clone(),
                status,
                log: slot.spec.log.clone(),
                tail: log_tail(&slot.spec.log, TAIL_LINES),
            });
        }
        exited
    }

    /// Stops everything gracefully: data planes first (they stop taking
    /// traffic), then the rest; each gets SIGTERM and, after [`STOP_GRACE`], SIGKILL.
    pub async fn shutdown(self) {
        let dps = self.data_plane_names();
        let (first, rest): (Vec<String>, Vec<String>) =
            self.order.iter().cloned().partition(|n| dps.contains(n));
        for group in [first, rest] {
            let stops = group.iter().filter_map(|name| {
                let child = self.take_child(name).ok().flatten()?;
                Some(async move {
                    let status = terminate(name, child).await;
                    tracing::info!(process = %name, %status, "stopped");
                })
            });
            futures::future::join_all(stops).await;
        }
    }

    // ---- internals -------------------------------------------------------

    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Slot>> {
        // A panic while holding the lock leaves the map consistent (every
        // update is a single assignment), so it stays usable after one.
        self.procs.lock()
    }

    fn take_child(&self, name: &str) -> Result<Option<Child>, StackError> {
        let mut procs = self.lock();
        let slot = procs
            .get_mut(name)
            .ok_or_else(|| StackError::UnknownProcess(name.to_owned()))?;
        Ok(slot.child.take())
    }

    pub(crate) fn spawn(&self, name: &str) -> Result<(), StackError> {
        let mut procs = self.lock();
        let slot = procs
            .get_mut(name)
            .ok_or_else(|| StackError::UnknownProcess(name.to_owned()))?;
        if let Some(child) = slot.child.as_mut()
            && matches!(child.try_wait(), Ok(None))
        {
            return Err(StackError::AlreadyRunning(name.to_owned()));
        }
        let child = slot.spec.spawn()?;
        tracing::debug!(process = name, pid = child.id(), "spawned");
        slot.child = Some(child);
        Ok(())
    }

    /// Fails with [`StackError::EarlyExit`] when `name` is not running.
    fn check_alive(&self, name: &str) -> Result<(), StackError> {
        let mut procs = self.lock();
        let slot = procs
            .get_mut(name)
            .ok_or_else(|| StackError::UnknownProcess(name.to_owned()))?;
        let status = match slot.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => return Ok(()),
            Some(Ok(Some(status))) => status.to_string(),
            Some(Err(e)) => format!("unknown ({e})"),
            None => "not running".to_owned(),
        };
        slot.child = None;
        Err(StackError::EarlyExit {
            name: name.to_owned(),
            status,
            log: slot.spec.log.clone(),
            tail: log_tail(&slot.spec.log, TAIL_LINES),
        })
    }

    /// Polls `name`'s readiness probe until it passes, the process exits, or the deadline.
    pub(crate) async fn wait_ready(&self, name: &str) -> Result<(), StackError> {
        let readiness = self
            .lock()
            .get(name)
            .map(|slot| slot.spec.readiness.clone())
            .ok_or_else(|| StackError::UnknownProcess(name.to_owned()))?;
        let started = Instant::now();
        let deadline = started + self.options.startup_timeout;
        loop {
            self.check_alive(name)?;
            let probe = match &readiness {
                Readiness::Http(url) => http_ok(&self.http, url).await,
                Readiness::Redis(target) => redis_ping(target).await,
                Readiness::GrpcHealth(url) => {
                    grpc_serving(url, self.pki.as_ref().map(Pki::client_tls)).await
                }
            };
            match probe {
                Ok(()) => {
                    tracing::debug!(process = name, waited = ?started.elapsed(), "ready");
                    return Ok(());
                }
                Err(last) if Instant::now() >= deadline => {
                    return Err(StackError::Timeout {
                        what: format!("{name} to be ready"),
                        waited: started.elapsed(),
                        last: format!(
                            "{last}\nlast lines of {}:\n{}",
                            self.log_path(name).display(),
                            self.log_tail(name, TAIL_LINES)
                        ),
                    });
                }
                Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
            }
        }
    }
}

impl Drop for Stack {
    /// SIGKILLs every process and reaps it (waiting at most two seconds),
    /// then removes the temporary directory unless asked to keep it.
    fn drop(&mut self) {
        let mut procs = self.lock();
        let mut children: Vec<&mut Child> = procs
            .values_mut()
            .filter_map(|s| s.child.as_mut())
            .collect();
        for child in &mut children {
            let _ = child.start_kill();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < deadline
            && children
                .iter_mut()
                .any(|c| matches!(c.try_wait(), Ok(None)))
        {
            // Drop cannot await: this polls the reaping, bounded by the deadline above.
            #[expect(
                clippy::disallowed_methods,
                reason = "a synchronous Drop polling with a deadline"
            )]
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(procs);
        if let Some(temp) = self.temp.take()
            && self.options.keep_temp_dir
        {
            let kept = temp.keep();
            eprintln!("devstack: kept {}", kept.display());
        }
    }
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`]; returns the exit status.
async fn terminate(name: &str, mut child: Child) -> String {
    if let Some(pid) = child.id()
        && let Err(e) = sys::send_sigterm(pid)
    {
        tracing::warn!(process = name, error = %e, "SIGTERM failed");
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => format!("unknown ({e})"),
        Err(_) => {
            tracing::warn!(
                process = name,
                "did not stop within {STOP_GRACE:?}; killing it"
            );
            let _ = child.start_kill();
            child
                .wait()
                .await
                .map_or_else(|e| format!("unknown ({e})"), |s| s.to_string())
        }
    }
}

/// Runs futures concurrently; the first error wins.
pub(crate) async fn try_join_all<F, E>(futures: impl IntoIterator<Item = F>) -> Result<(), E>
where
    F: Future<Output = Result<(), E>>,
{
    futures::future::try_join_all(futures).await.map(|_| ())
}
