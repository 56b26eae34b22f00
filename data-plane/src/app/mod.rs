//! The application: the stack assembled top to bottom. [`DataPlane`] starts
//! the listeners, the workers and the config stream; [`pipeline`] runs every
//! request through the stages in order; [`runtime`] makes a compiled snapshot
//! current; [`xds`] is the config stream client (with [`status_report`], the
//! upstream health it reports) and [`cache`] its on-disk copy
//! of the last accepted snapshot; [`ops`] serves the ops listener and
//! [`exposition`] its `/metrics` page; [`args`] and [`cli`] are the flags and
//! the binary's entry point.

pub mod args;
pub mod cache;
pub mod cli;
pub mod exposition;
pub mod ops;
pub mod pipeline;
pub mod runtime;
pub mod status_report;
pub mod xds;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use gateway_proto::v1::Node;
use gateway_telemetry::Tracer;
use gateway_transport::conn_limit::Connections;
use gateway_transport::server::{self, Scheme};
use gateway_transport::tls::TlsAcceptor;
use gateway_transport::workers::{self, TlsListeners};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::composition::websocket;
use crate::config::SniResolver;
use crate::metrics;
use crate::policy::hooks::{Authenticator, RateLimiter};
use crate::policy::{jwt, ratelimit};
use args::Args;
use cache::SnapshotCache;
use pipeline::Pipeline;
use runtime::Runtime;
use xds::XdsSettings;

/// Most open connections of the ops listener (its own cap, apart from the proxy's).
const OPS_MAX_CONNECTIONS: usize = 1024;

/// Why the data plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is unusable.
    #[error(transparent)]
    Args(#[from] args::ArgsError),
    /// The token verifier cannot be built (bad `--jwks-url` or `--jwks-ca`, empty issuer or audience).
    #[error("token verification: {0}")]
    Jwt(#[from] gateway_jwt::JwtConfigError),
    /// The rate limiter cannot be built.
    #[error(transparent)]
    RateLimit(#[from] gateway_ratelimit::RateLimitError),
    /// The rate-limit Redis settings are unusable (`--redis-ca`, the TLS client).
    #[error("rate-limit Redis: {0}")]
    Redis(#[from] gateway_redis::RedisTargetError),
    /// The control plane TLS files are unusable.
    #[error("control plane TLS: {0}")]
    ControlPlaneTls(#[from] xds::TlsFilesError),
    /// The HTTPS listener's TLS settings could not be built.
    #[error("HTTPS listener: {0}")]
    Tls(#[from] rustls::Error),
    /// `--tls-client-ca` cannot be read or holds no usable CA certificate.
    #[error("HTTPS listener: {0}")]
    ClientCa(#[from] gateway_transport::tls::ClientCaError),
    /// A proxy worker thread or its runtime could not be created.
    #[error("cannot start the proxy workers: {0}")]
    Workers(#[source] std::io::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A data plane to start: the settings plus the optional stage implementations.
pub struct DataPlane {
    args: Args,
    authenticator: Option<Arc<dyn Authenticator>>,
    rate_limiter: Option<Arc<dyn RateLimiter>>,
    tracer: Tracer,
}

impl DataPlane {
    /// A data plane with these settings. Unless replaced, [`start`](Self::start)
    /// verifies tokens with [`jwt::JwtAuth`] when `--jwks-url` is set, limits
    /// with [`ratelimit::RouteLimiter`] (Redis-shared with `--redis-url`, else
    /// replica-local), and traces with a tracer that exports nothing.
    pub fn new(args: Args) -> Self {
        Self {
            args,
            authenticator: None,
            rate_limiter: None,
            tracer: Tracer::disabled(),
        }
    }

    /// Creates the request spans (and exports them if it is exporting).
    pub fn tracer(mut self, tracer: Tracer) -> Self {
        self.tracer = tracer;
        self
    }

    /// Verifies callers of `AUTH_JWT` routes.
    pub fn authenticator(mut self, a: Arc<dyn Authenticator>) -> Self {
        self.authenticator = Some(a);
        self
    }

    /// Enforces route rate limits.
    pub fn rate_limiter(mut self, r: Arc<dyn RateLimiter>) -> Self {
        self.rate_limiter = Some(r);
        self
    }

    /// Binds both listeners, loads the cached configuration (if any), and starts
    /// serving and following the control plane.
    pub async fn start(self) -> Result<Running, StartError> {
        let args = self.args;
        args.validate()?;
        let redis = args.redis()?;
        let control_plane_tls = match &args.control_plane_ca {
            Some(ca) => Some(xds::client_tls(
                ca,
                args.tls_cert.as_deref().zip(args.tls_key.as_deref()),
            )?),
            None => None,
        };
        let bind = |addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Bind { addr, source })
        };
        let workers = workers::count(args.workers);
        let (proxy_listeners, proxy_addr) =
            workers::bind(args.listen, workers).map_err(|source| StartError::Bind {
                addr: args.listen,
                source,
            })?;
        // The HTTPS listener: one socket per worker too, on its own port.
        let tls_sockets = args
            .tls_listen
            .map(|addr| {
                workers::bind(addr, workers).map_err(|source| StartError::Bind { addr, source })
            })
            .transpose()?;
        let ops_listener = bind(args.admin_listen).await?;
        let admin_addr = ops_listener
            .local_addr()
            .map_err(|source| StartError::Bind {
                addr: args.admin_listen,
                source,
            })?;

        if args.cache_dir.is_none() {
            tracing::warn!(
                "no --cache-dir: this data plane cannot start while the control plane is down"
            );
        }
        // Built here, inside the runtime: both start background tasks on it.
        let authenticator = match (self.authenticator, args.jwt()) {
            (Some(a), _) => Some(a),
            (None, Some(config)) => Some(Arc::new(jwt::JwtAuth(gateway_jwt::JwtVerifier::new(
                config,
            )?)) as Arc<dyn Authenticator>),
            (None, None) => {
                tracing::info!("no --jwks-url: AUTH_JWT routes answer 401");
                None
            }
        };
        let rate_limiter = match self.rate_limiter {
            Some(r) => r,
            None => {
                if redis.is_none() {
                    tracing::warn!(
                        "no --redis-url: rate limits are enforced per replica, not shared"
                    );
                }
                let limiter =
                    gateway_ratelimit::RateLimiter::with_target(redis.as_ref(), args.ratelimit())?;
                Arc::new(ratelimit::RouteLimiter::new(limiter))
            }
        };
        let runtime = Arc::new(
            Runtime::new(args.cache_dir.clone().map(SnapshotCache::new), args.pool())
                .with_response_cache(args.cache_max_bytes),
        );
        // Every handshake asks the current snapshot for its certificate.
        let (tls, tls_addr) = match tls_sockets {
            Some((sockets, addr)) => {
                let client_ca = match &args.tls_client_ca {
                    Some(path) => Some(gateway_transport::tls::client_ca_roots(path)?),
                    None => None,
                };
                let client_crls = match &args.tls_client_crl {
                    Some(path) => gateway_transport::tls::client_crls(path)?,
                    None => Vec::new(),
                };
                let acceptor = Arc::new(TlsAcceptor::new(
                    Arc::new(SniResolver(runtime.config.clone())),
                    std::time::Duration::from_millis(args.tls_handshake_timeout_ms),
                    client_ca,
                    client_crls,
                )?);
                (Some(TlsListeners { sockets, acceptor }), Some(addr))
            }
            None => (None, None),
        };
        let tls_stats = tls.as_ref().map(|t| t.acceptor.stats().clone());
        // Before the cached configuration is loaded, so its DNS members are followed.
        let discovery = tokio::spawn(runtime.clone().follow_discovery());
        runtime.load_cache().await;

        let pipeline = Arc::new(Pipeline {
            config: runtime.config.clone(),
            metrics: runtime.metrics.clone(),
            limits: args.limits(),
            trusted_proxies: args.trusted_proxies.clone().into(),
            authenticator: authenticator.clone(),
            rate_limiter: Some(rate_limiter.clone()),
            tracer: self.tracer.clone(),
            mirror_max_in_flight: args.mirror_max_in_flight,
            worker: workers::OFF_WORKER,
            scheme: Scheme::Http,
            https_port: args
                .https_redirect_port
                .or(tls_addr.map(|a| a.port()))
                .unwrap_or(443),
            response_cache: runtime.response_cache.clone(),
        });
        let (stop, stopped) = watch::channel(false);
        let http = args.http();
        let connections = Connections::new("proxy", args.max_connections());
        // The ops listener's own cap: a flood there must not take the proxy's slots.
        let ops_connections = Connections::new("ops", OPS_MAX_CONNECTIONS);
        let proxy = workers::spawn(
            proxy_listeners,
            tls,
            http,
            connections.clone(),
            args.proxy_protocol(),
            |worker, scheme| {
                let pipeline = Arc::new(pipeline.for_listener(worker, scheme));
                move |req, peer| {
                    let pipeline = pipeline.clone();
                    // Boxed: a connection keeps one slot the size of this future for the
                    // connection's whole life; a pointer there instead of the whole request state
                    // keeps idle keep-alive connections small (the state is freed after each request).
                    // Allocated before the future is made, so it is built in its box: a
                    // `Box::pin(future)` copied all ~5 KB of it (mostly never-used state) into
                    // fresh memory, about 90 cache lines written per request (BENCHMARKS.md).
                    let slot = Box::new_uninit();
                    Box::into_pin(Box::write(
                        slot,
                        async move { pipeline.handle(req, peer).await },
                    ))
                }
            },
            &stopped,
        )
        .map_err(StartError::Workers)?;
        let ops_runtime = runtime.clone();
        let tracer = self.tracer;
        // What /metrics adds to the data plane's own counters.
        let ops_counted = ops_connections.clone();
        let certificates_of = runtime.config.clone();
        let cache_metrics = runtime.metrics.response_cache.clone();
        let extra_metrics = move |out: &mut String| {
            metrics::write_connections(out, &[&connections, &ops_counted]);
            let current = certificates_of.load();
            let certificates = current.certificates.info().iter();
            metrics::write_certificates(out, certificates.map(|c| (c.name.as_str(), c.not_after)));
            current.jwt_issuers.write_metrics(out);
            if let Some(stats) = &tls_stats {
                stats.render(out);
            }
            websocket::write_metrics(out);
            metrics::write_response_cache(out, &cache_metrics);
            rate_limiter.write_metrics(out);
            if let Some(a) = &authenticator {
                a.write_metrics(out);
            }
            metrics::render_trace_stats(out, &tracer.stats());
        };
        let ops = tokio::spawn(server::serve(
            ops_listener,
            http,
            ops_connections,
            // Never behind the edge's PROXY header: its health checks connect directly.
            None,
            move |req, _peer| std::future::ready(ops::handle(&ops_runtime, &extra_metrics, &req)),
            stopped,
        ));
        let node = Node {
            id: args.node_id(),
            hostname: args::hostname(),
            build_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        // The Redis URL only ever appears redacted (`redis://:***@host:port`).
        let redis_shown = redis
            .as_ref()
            .map_or_else(|| "none".to_owned(), |r| r.to_string());
        let https_shown = tls_addr.map_or_else(|| "off".to_owned(), |a| a.to_string());
        tracing::info!(proxy = %proxy_addr, https = %https_shown, ops = %admin_addr, node = %node.id, workers,
            control_plane = %args.control_plane, redis = %redis_shown, "data plane started");
        let xds = tokio::spawn(xds::run(
            runtime.clone(),
            XdsSettings {
                urls: args
                    .control_planes()
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
                node,
                token: args.control_plane_token.clone(),
                tls: control_plane_tls,
            },
        ));
        Ok(Running {
            proxy_addr,
            tls_addr,
            admin_addr,
            runtime,
            stop,
            proxy,
            ops,
            xds,
            discovery,
        })
    }
}

/// A started data plane.
pub struct Running {
    proxy_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    admin_addr: SocketAddr,
    runtime: Arc<Runtime>,
    stop: watch::Sender<bool>,
    proxy: JoinHandle<()>,
    ops: JoinHandle<()>,
    xds: JoinHandle<()>,
    discovery: JoinHandle<()>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("proxy_addr", &self.proxy_addr)
            .field("admin_addr", &self.admin_addr)
            .finish()
    }
}

impl Running {
    /// Where the proxy listens.
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    /// Where the HTTPS listener listens (`--tls-listen`).
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// Where the ops listener listens.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The shared state (configuration, metrics).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// [`shutdown`](Self::shutdown) after `delay` of draining: readiness
    /// answers 503 at once while requests are still served, so a load balancer
    /// that checks `/readyz` stops routing here before the listeners close.
    pub async fn drain_then_shutdown(self, delay: std::time::Duration) {
        if !delay.is_zero() {
            tracing::info!(?delay, "draining: /readyz answers 503, still serving");
            self.runtime.start_draining();
            tokio::time::sleep(delay).await;
        }
        tracing::info!("shutting down");
        self.shutdown().await;
    }

    /// Graceful shutdown: readiness goes to 503, listeners close, in-flight
    /// requests get the grace period to finish, background tasks stop.
    pub async fn shutdown(self) {
        self.runtime.start_draining();
        self.xds.abort();
        let _ = self.stop.send(true);
        let _ = self.proxy.await;
        let _ = self.ops.await;
        self.discovery.abort();
        self.runtime.discovery.stop();
        self.runtime.health.stop();
        tracing::info!("data plane stopped");
    }
}

/// Starts a data plane and runs it until `shutdown` resolves, then drains.
pub async fn run(
    data_plane: DataPlane,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let drain_delay = std::time::Duration::from_millis(data_plane.args.drain_delay_ms);
    let running = data_plane.start().await?;
    shutdown.await;
    running.drain_then_shutdown(drain_delay).await;
    Ok(())
}
