//! Assembles the gRPC server: AdminService, ConfigDiscoveryService,
//! grpc.health.v1.Health and server reflection (v1 and v1alpha), plus the
//! optional metrics endpoint and web console, and runs it until told to shut down.

use crate::ack_times::AckTimes;
use crate::admin::Admin;
use crate::args::Args;
use crate::auth::{AuthLayer, Policy, Tokens, TokensError};
use crate::clock::{now_utc, system_clock};
use crate::console::{self, Console};
use crate::database::Database;
use crate::discovery::{Discovery, SecretsGate};
use crate::error::StoreError;
use crate::metrics::{self, Gauges, Metrics};
use crate::nodes::NodeRegistry;
use crate::purge::Purges;
use crate::secrets::{SecretsKey, SecretsKeyError};
use crate::seed::{self, SeedError};
use crate::store::Store;
use crate::upstream_health::HealthReports;
use gateway_proto::v1::admin_service_server::AdminServiceServer;
use gateway_proto::v1::config_discovery_service_server::ConfigDiscoveryServiceServer;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::ServingStatus;

/// How long a graceful shutdown may take before open connections are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// HTTP/2 keepalive: detects data planes that vanished without closing their
/// stream (host crash, cable pull), so they turn DISCONNECTED.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest accepted admin request.
const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// What a control plane needs to start.
#[derive(Clone, Debug)]
pub struct Settings {
    /// gRPC listen address (ignored by [`ControlPlane::start_on`]).
    pub listen: SocketAddr,
    /// Where versions are stored: a SQLite file, or Postgres shared with other control planes.
    pub database: Database,
    /// Seed file committed when the database is empty.
    pub seed: Option<PathBuf>,
    /// Prometheus endpoint address.
    pub metrics_listen: Option<SocketAddr>,
    /// Web console address (needs `auth_tokens_file`); over TLS when `tls` is set.
    pub console_listen: Option<SocketAddr>,
    /// Allow a console without TLS on a non-loopback address.
    pub console_allow_cleartext: bool,
    /// The defences of each listener (gRPC, console, metrics): connection cap,
    /// first-bytes deadline, idle limit.
    pub listener_limits: gateway_listener::Limits,
    /// Spans for every gRPC call (continuing the caller's `traceparent`); exported by OTLP when configured.
    pub tracer: gateway_telemetry::Tracer,
    /// `NAME ROLE TOKEN` file; `None` accepts unauthenticated calls, which
    /// needs `insecure_open` (or a client CA, which authenticates every caller).
    pub auth_tokens_file: Option<PathBuf>,
    /// Start without a tokens file, accepting every call as an anonymous admin.
    pub insecure_open: bool,
    /// Stream private keys and signing secrets over cleartext to non-loopback peers.
    pub allow_cleartext_secrets: bool,
    /// Serve TLS with this certificate and key (PEM files).
    pub tls: Option<TlsFiles>,
    /// Serve TLS with a certificate made on the first start and kept (replaces `tls`'s
    /// certificate and key; its `client_ca` stays).
    pub tls_generate: Option<crate::tls_generate::TlsGenerate>,
    /// The key that encrypts certificates' private keys in the database;
    /// `None`: certificates cannot be stored.
    pub secrets_key_file: Option<PathBuf>,
}

/// The PEM files of the control plane's TLS listener.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// When set, every client must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

impl Default for Settings {
    /// The flags' defaults: `127.0.0.1:50051`, `control-plane.db`, no seed, no metrics,
    /// no tracing, no tokens.
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            database: Database::sqlite("control-plane.db"),
            seed: None,
            metrics_listen: None,
            console_listen: None,
            console_allow_cleartext: false,
            listener_limits: gateway_listener::Limits::default(),
            tracer: gateway_telemetry::Tracer::disabled(),
            auth_tokens_file: None,
            insecure_open: false,
            allow_cleartext_secrets: false,
            tls: None,
            tls_generate: None,
            secrets_key_file: None,
        }
    }
}

impl From<&Args> for Settings {
    fn from(a: &Args) -> Self {
        Settings {
            listen: a.listen,
            database: a.database.clone(),
            seed: a.seed.clone(),
            metrics_listen: a.metrics_listen,
            console_listen: a.console_listen,
            console_allow_cleartext: a.console_allow_cleartext,
            listener_limits: a.listener_limits(),
            tracer: gateway_telemetry::Tracer::disabled(),
            auth_tokens_file: a.auth_tokens_file.clone(),
            insecure_open: a.insecure_open,
            allow_cleartext_secrets: a.allow_cleartext_secrets,
            tls: match (&a.tls_cert, &a.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: a.client_ca.clone(),
                }),
                _ => None,
            },
            tls_generate: a
                .tls_generate_dir
                .as_ref()
                .map(|dir| crate::tls_generate::TlsGenerate {
                    dir: dir.clone(),
                    ca: a.tls_generate_ca.clone(),
                    names: a.tls_generate_names.clone(),
                }),
            secrets_key_file: a.secrets_key_file.clone(),
        }
    }
}

/// Why the control plane could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The database could not be opened or migrated.
    #[error("cannot open database {database}")]
    Database {
        /// The database (a Postgres password masked).
        database: Database,
        /// Why.
        source: StoreError,
    },
    /// The database holds private keys the given secrets key (or none) cannot decrypt.
    #[error("cannot open database {database}: {reason}")]
    SecretsKeyMismatch {
        /// The database (a Postgres password masked).
        database: Database,
        /// Which key is missing or wrong, and what to do.
        reason: String,
    },
    /// The `--secrets-key-file` was refused.
    #[error(transparent)]
    SecretsKey(#[from] SecretsKeyError),
    /// The seed file was refused.
    #[error(transparent)]
    Seed(#[from] SeedError),
    /// The reflection descriptors are broken (a build problem).
    #[error("reflection service: {0:?}")]
    Reflection(tonic_reflection::server::Error),
    /// The server task panicked.
    #[error("gRPC server task failed: {0}")]
    Crashed(String),
    /// The tokens file was refused.
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// No tokens file, no client CA and no `--insecure-open`.
    #[error(
        "refusing to listen on {0} without authentication: any process reaching this address \
         could rewrite every route and read the whole topology. Give --auth-tokens-file FILE \
         (lines `NAME ROLE TOKEN`), or pass --insecure-open to accept unauthenticated calls \
         anyway"
    )]
    Unauthenticated(SocketAddr),
    /// `--tls-generate-dir`: the certificate could not be made or kept.
    #[error("--tls-generate-dir: {0}")]
    TlsGenerate(#[from] crate::tls_generate::GenerateError),
    /// A TLS file could not be read.
    #[error("cannot read TLS file {path}")]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS certificate, key or client CA was refused.
    #[error("invalid TLS configuration: {0}")]
    Tls(String),
    /// A non-loopback `--console-listen` without TLS and without `--console-allow-cleartext`.
    #[error(
        "--console-listen {0} is not a loopback address and the console has no TLS: its \
         sign-in tokens and session cookies would cross the network in clear. Give \
         --tls-cert and --tls-key, listen on 127.0.0.1, or pass --console-allow-cleartext \
         behind a proxy that terminates TLS"
    )]
    ConsoleInCleartext(SocketAddr),
    /// `--console-listen` without `--auth-tokens-file`: nobody could sign in.
    #[error(
        "--console-listen needs --auth-tokens-file: the console signs people in with the \
         tokens of that file (role admin or viewer)"
    )]
    ConsoleWithoutTokens,
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Serve(#[from] tonic::transport::Error),
}

/// A running control plane.
pub struct ControlPlane {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    console_addr: Option<SocketAddr>,
    store: Arc<Store>,
    nodes: Arc<NodeRegistry>,
    health_reports: Arc<HealthReports>,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    metrics: Option<JoinHandle<()>>,
    /// The commit follower and the shared registry's writer (Postgres).
    background: Vec<JoinHandle<()>>,
    console: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("addr", &self.addr)
            .field("metrics_addr", &self.metrics_addr)
            .field("console_addr", &self.console_addr)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Opens the database, applies the seed, binds `settings.listen` and starts serving.
    pub async fn start(settings: Settings) -> Result<Self, StartError> {
        let listener = bind(settings.listen).await?;
        Self::start_on(listener, settings).await
    }

    /// Like [`ControlPlane::start`], on an already bound listener (tests bind `127.0.0.1:0`).
    pub async fn start_on(
        listener: TcpListener,
        mut settings: Settings,
    ) -> Result<Self, StartError> {
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: settings.listen,
            source,
        })?;
        if let Some(generate) = &settings.tls_generate {
            let made = crate::tls_generate::ensure(generate)?;
            tracing::info!(
                cert = %made.cert.display(),
                ca = %made.ca.display(),
                names = ?generate.names,
                made = made.made,
                "gRPC over TLS with the generated certificate (data planes: --control-plane-ca CA)"
            );
            settings.tls = Some(TlsFiles {
                cert: made.cert,
                key: made.key,
                client_ca: settings.tls.take().and_then(|t| t.client_ca),
            });
        }
        let policy = auth_policy(&settings, addr)?;
        let console_tokens = match (&settings.console_listen, &policy) {
            (None, _) => None,
            (Some(_), Policy::Tokens(tokens)) => Some(tokens.clone()),
            (Some(_), Policy::Open) => return Err(StartError::ConsoleWithoutTokens),
        };
        let console_tls = match (&settings.console_listen, &settings.tls) {
            (Some(_), Some(files)) => Some(console::server::tls_acceptor(files)?),
            (Some(addr), None) if !addr.ip().is_loopback() && !settings.console_allow_cleartext => {
                return Err(StartError::ConsoleInCleartext(*addr));
            }
            _ => None,
        };
        let secrets = match &settings.secrets_key_file {
            Some(path) => Some(SecretsKey::load(path)?),
            None => {
                tracing::info!(
                    "no --secrets-key-file: TLS certificates (their private keys) cannot be stored"
                );
                None
            }
        };
        let store = Store::connect(&settings.database, system_clock(), secrets)
            .await
            .map_err(|source| match source {
                StoreError::WrongSecretsKey(reason) => StartError::SecretsKeyMismatch {
                    database: settings.database.clone(),
                    reason,
                },
                source => StartError::Database {
                    database: settings.database.clone(),
                    source,
                },
            })?;
        let store = Arc::new(store);
        if let Some(path) = &settings.seed {
            seed::apply(&store, path).await?;
        }
        let metrics_listener = match settings.metrics_listen {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
        let console_listener = match settings.console_listen {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let console_addr = console_listener.as_ref().and_then(|l| l.local_addr().ok());

        let (shutdown, shutdown_rx) = watch::channel(false);
        // With Postgres, the registry is shared by every control plane of the
        // database, and this one follows the commits of the others.
        let nodes = Arc::new(match store.postgres_pool() {
            Some(pool) => NodeRegistry::shared(
                system_clock(),
                Arc::new(Metrics::default()),
                pool,
                addr.to_string(),
            ),
            None => NodeRegistry::new(system_clock(), Arc::new(Metrics::default())),
        });
        let background = vec![
            tokio::spawn(store.clone().follow_commits(shutdown_rx.clone())),
            tokio::spawn(nodes.clone().run(shutdown_rx.clone())),
        ];
        // ApplyConfig of 10,000 routes is a few MB; tonic's default limit is 4 MB.
        let purges = Arc::new(Purges::default());
        store.follow_purges(purges.clone());
        let admin = AdminServiceServer::new(
            Admin::new(store.clone(), nodes.clone()).with_purges(purges.clone()),
        )
        .max_decoding_message_size(MAX_REQUEST_BYTES);
        let health_reports = Arc::new(HealthReports::new(system_clock()));
        let ack_times = Arc::new(AckTimes::new(system_clock()));
        let discovery = ConfigDiscoveryServiceServer::new(
            Discovery::new(store.subscribe(), nodes.clone(), shutdown_rx.clone())
                .with_secrets_gate(SecretsGate {
                    tls: settings.tls.is_some(),
                    allow_cleartext: settings.allow_cleartext_secrets,
                })
                .with_health_reports(health_reports.clone())
                .with_ack_times(ack_times.clone())
                .with_purges(purges.clone()),
        );
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<AdminServiceServer<Admin>>().await;
        health
            .set_serving::<ConfigDiscoveryServiceServer<Discovery>>()
            .await;
        // grpcurl 1.8 speaks only v1alpha; newer clients use v1. Each builder
        // adds its own reflection descriptor; the other one is registered here
        // so both versions list the same services.
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(gateway_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
            .build_v1()
            .map_err(StartError::Reflection)?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(gateway_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .map_err(StartError::Reflection)?;

        let incoming =
            gateway_listener::Listener::new(listener, settings.listener_limits, "grpc").incoming();
        let mut stop = shutdown_rx.clone();
        let mut builder = Server::builder();
        if let Some(tls) = &settings.tls {
            builder = builder
                .tls_config(tls_config(tls)?)
                .map_err(|e| StartError::Tls(error_chain(&e)))?;
        }
        let server = tokio::spawn(
            builder
                .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
                // One SERVER span per call, continuing the caller's trace.
                .layer(gateway_telemetry::grpc::GrpcTraceLayer::new(
                    settings.tracer.clone(),
                ))
                // Inside the trace layer, so refused calls still get a span.
                .layer(AuthLayer::new(policy))
                .add_service(health_service)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha)
                .add_service(admin)
                .add_service(discovery)
                .serve_with_incoming_shutdown(incoming, async move {
                    crate::shutdown::requested(&mut stop).await;
                    health
                        .set_service_status("", ServingStatus::NotServing)
                        .await;
                }),
        );

        let metrics = metrics_listener.map(|l| {
            let nodes = nodes.clone();
            let config = store.subscribe();
            let clock = system_clock();
            let render = move || {
                let snapshot = config.borrow().clone();
                nodes.metrics().render(&Gauges {
                    connected: nodes.connected(),
                    known: nodes.known(),
                    version: snapshot.version,
                    certificate_expiry: metrics::certificate_expiry(
                        &snapshot.certificates,
                        now_utc(&*clock),
                    ),
                })
            };
            let l = gateway_listener::Listener::new(l, settings.listener_limits, "metrics");
            tokio::spawn(metrics::serve(l, render, shutdown_rx.clone()))
        });
        let console = match (console_listener, console_tokens) {
            (Some(listener), Some(tokens)) => {
                let state = Arc::new(Console {
                    backend: console::backend::Backend::new(
                        Admin::new(store.clone(), nodes.clone()).with_purges(purges.clone()),
                    ),
                    store: store.clone(),
                    health: health_reports.clone(),
                    acks: ack_times,
                    tokens,
                    sessions: Default::default(),
                    throttle: Default::default(),
                    tls: console_tls.is_some(),
                });
                Some(tokio::spawn(console::serve(
                    gateway_listener::Listener::new(listener, settings.listener_limits, "console"),
                    state,
                    console_tls,
                    shutdown_rx.clone(),
                )))
            }
            _ => None,
        };
        tracing::info!(
            %addr,
            tls = settings.tls.is_some(),
            client_certificates = settings.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
            metrics = ?metrics_addr,
            console = ?console_addr,
            database = %settings.database,
            secrets_key = settings.secrets_key_file.is_some(),
            version = store.current().version,
            "listening"
        );
        Ok(ControlPlane {
            addr,
            metrics_addr,
            console_addr,
            store,
            nodes,
            health_reports,
            shutdown,
            server,
            metrics,
            background,
            console,
        })
    }

    /// The bound gRPC address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound metrics address, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The bound web console address, if enabled.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console_addr
    }

    /// The data planes' last upstream health reports.
    pub fn health_reports(&self) -> &Arc<HealthReports> {
        &self.health_reports
    }

    /// The configuration store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The data-plane registry.
    pub fn nodes(&self) -> &Arc<NodeRegistry> {
        &self.nodes
    }

    /// Starts a graceful shutdown: health turns NOT_SERVING, config streams end,
    /// no new connections are accepted, in-flight calls finish.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Serves until `signal` completes (then shuts down gracefully) or the
    /// server fails, and closes the database.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), StartError> {
        let ControlPlane {
            store,
            shutdown,
            mut server,
            metrics,
            background,
            console,
            ..
        } = self;
        let mut stopping = shutdown.subscribe();
        let result = tokio::select! {
            r = &mut server => r,
            _ = async {
                tokio::select! {
                    _ = signal => {}
                    _ = crate::shutdown::requested(&mut stopping) => {}
                }
            } => {
                shutdown.send_replace(true);
                match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::warn!("graceful shutdown timed out; dropping open connections");
                        server.abort();
                        Ok(Ok(()))
                    }
                }
            }
        };
        shutdown.send_replace(true);
        if let Some(m) = metrics {
            let _ = m.await;
        }
        if let Some(c) = console {
            let _ = c.await;
        }
        for task in background {
            let _ = task.await;
        }
        store.close().await;
        match result {
            Ok(r) => r.map_err(StartError::from),
            Err(join) => Err(StartError::Crashed(join.to_string())),
        }
    }

    /// Shuts down gracefully and waits until everything has stopped.
    pub async fn stop(self) -> Result<(), StartError> {
        self.run_until(async {}).await
    }
}

/// The authentication policy for a server bound to `addr`: tokens when a file
/// is given; otherwise open, which needs `settings.insecure_open` unless a
/// client CA authenticates every connection.
fn auth_policy(settings: &Settings, addr: SocketAddr) -> Result<Policy, StartError> {
    if let Some(path) = &settings.auth_tokens_file {
        let tokens = Tokens::load(path)?;
        tracing::info!(tokens = tokens.len(), file = %path.display(), "authentication required");
        return Ok(Policy::Tokens(Arc::new(tokens)));
    }
    if settings.tls.as_ref().is_some_and(|t| t.client_ca.is_some()) {
        tracing::info!(
            "no --auth-tokens-file: only client certificates of --client-ca are accepted \
             (role data-plane)"
        );
    } else if !settings.insecure_open {
        return Err(StartError::Unauthenticated(addr));
    } else if addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "INSECURE: --insecure-open without --auth-tokens-file: any local process can \
             rewrite every route"
        );
    } else {
        tracing::warn!(
            %addr,
            "INSECURE: --insecure-open without --auth-tokens-file: ANYONE who can reach {addr} can \
             rewrite every route and read the whole configuration"
        );
    }
    Ok(Policy::Open)
}

fn read_pem(path: &Path) -> Result<Vec<u8>, StartError> {
    std::fs::read(path).map_err(|source| StartError::TlsFile {
        path: path.to_owned(),
        source,
    })
}

/// The rustls server settings: our identity, and the CA client certificates must chain to.
fn tls_config(files: &TlsFiles) -> Result<ServerTlsConfig, StartError> {
    let cert = read_pem(&files.cert)?;
    let key = read_pem(&files.key)?;
    for (path, pem, marker) in [
        (&files.cert, &cert, "CERTIFICATE-----"),
        (&files.key, &key, "PRIVATE KEY-----"),
    ] {
        if !String::from_utf8_lossy(pem).contains(marker) {
            return Err(StartError::Tls(format!(
                "{} holds no PEM \"{marker}\" block",
                path.display()
            )));
        }
    }
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca) = &files.client_ca {
        let pem = read_pem(ca)?;
        if !String::from_utf8_lossy(&pem).contains("CERTIFICATE-----") {
            return Err(StartError::Tls(format!(
                "{} holds no PEM certificate",
                ca.display()
            )));
        }
        config = config.client_ca_root(Certificate::from_pem(pem));
    }
    Ok(config)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}
