//! The data plane's shared state, and the one way a snapshot becomes current:
//! [`Runtime::apply`] (validate and compile off the async workers, publish,
//! start health checks, persist to the cache). [`Runtime::rediscover`] is the
//! same path for a DNS member change: the last accepted configuration compiled
//! again with the new members ([`crate::upstream::dns`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gateway_proto::v1::{CachePurge, ConfigSnapshot};
use gateway_transport::pool::PoolSettings;

use crate::app::cache::SnapshotCache;
use crate::composition::response_cache::ResponseCache;
use crate::config::{CompileError, ConfigStore, compile_with_members};
use crate::metrics::Metrics;
use crate::upstream::dns::{Discovery, Resolver};
use crate::upstream::health::HealthSupervisor;

/// Why a snapshot was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The snapshot is invalid or cannot be compiled.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The compile task died (a bug); the old configuration stays.
    #[error("compiling the snapshot failed unexpectedly: {0}")]
    Internal(String),
}

/// What [`Runtime::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A new configuration is now current.
    Updated,
    /// The snapshot is the one already served (same version and hash).
    Unchanged,
}

/// State shared by the listeners, the config client and the health checks.
#[derive(Debug)]
pub struct Runtime {
    /// The current configuration.
    pub config: Arc<ConfigStore>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Active health check tasks.
    pub health: HealthSupervisor,
    /// DNS discovery: member sets and refresh tasks.
    pub discovery: Discovery,
    /// Where accepted snapshots are persisted.
    pub cache: Option<SnapshotCache>,
    /// Connection pool limits for new instances.
    pub pool: PoolSettings,
    /// The stored answers of routes with `cache` (`None`: caching is off).
    pub response_cache: Option<Arc<ResponseCache>>,
    /// Serialises applies (the config stream, the start-up cache load and DNS
    /// member changes) and holds the last accepted snapshot, which a member
    /// change compiles again.
    accepted: tokio::sync::Mutex<Option<Arc<ConfigSnapshot>>>,
    draining: AtomicBool,
}

impl Runtime {
    /// A runtime with nothing loaded.
    pub fn new(cache: Option<SnapshotCache>, pool: PoolSettings) -> Self {
        Self {
            config: Arc::new(ConfigStore::new()),
            metrics: Arc::new(Metrics::default()),
            health: HealthSupervisor::default(),
            discovery: Discovery::default(),
            cache,
            pool,
            response_cache: None,
            accepted: tokio::sync::Mutex::new(None),
            draining: AtomicBool::new(false),
        }
    }

    /// The same runtime, caching answers of routes with `cache` within
    /// `max_bytes` (`--cache-max-bytes`; 0: no caching).
    pub fn with_response_cache(mut self, max_bytes: u64) -> Self {
        self.response_cache = (max_bytes > 0).then(|| {
            Arc::new(ResponseCache::new(
                max_bytes,
                self.metrics.response_cache.clone(),
            ))
        });
        self
    }

    /// Drops the cached answers a purge names (`ConfigResponse.purge`);
    /// returns how many keys went.
    pub fn purge(&self, purge: &CachePurge) -> u64 {
        let Some(cache) = &self.response_cache else {
            return 0;
        };
        let removed = cache.purge(&purge.route, &purge.path_prefix);
        tracing::info!(route = %purge.route, path_prefix = %purge.path_prefix, removed, "cache purged");
        removed
    }

    /// The same runtime, resolving discovery names with `resolver` instead of
    /// the system resolver (tests).
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolver>) -> Self {
        self.discovery = Discovery::new(resolver);
        self
    }

    /// Makes `snapshot` current unless it is invalid, in which case the current
    /// configuration stays. With `persist`, an applied snapshot is written to the
    /// cache (a cache write failure is logged, not fatal: the snapshot is served).
    pub async fn apply(
        &self,
        snapshot: ConfigSnapshot,
        persist: bool,
    ) -> Result<Applied, ApplyError> {
        let mut accepted = self.accepted.lock().await;
        let previous = self.config.load();
        if previous.loaded && previous.version == snapshot.version && previous.hash == snapshot.hash
        {
            return Ok(Applied::Unchanged);
        }
        let pool = self.pool;
        let snapshot = Arc::new(snapshot);
        // New discovery names are resolved before the snapshot goes live.
        let members = self.discovery.prepare(&snapshot.upstreams).await;
        // Large tables take a while to compile: keep that off the async workers.
        let (compiled, snapshot, members) = tokio::task::spawn_blocking(move || {
            let compiled = compile_with_members(&snapshot, &previous, pool, &members);
            (compiled, snapshot, members)
        })
        .await
        .map_err(|e| ApplyError::Internal(e.to_string()))?;
        let compiled = Arc::new(compiled?);
        self.config.publish(compiled.clone());
        *accepted = Some(snapshot.clone());
        self.discovery.reconcile(&compiled.upstreams, &members);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.metrics
            .config_applied_unix_ms
            .store(now_ms, Ordering::Relaxed);
        self.health.reconcile(&compiled.upstreams);
        tracing::info!(version = compiled.version, hash = %compiled.hash,
            routes = compiled.router.len(), upstreams = compiled.upstreams.len(), "configuration applied");
        if persist && let Some(cache) = self.cache.clone() {
            let saved = tokio::task::spawn_blocking(move || cache.save(&snapshot)).await;
            match saved {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not persist the snapshot to the cache")
                }
                Err(e) => tracing::warn!(error = %e, "cache write task failed"),
            }
        }
        Ok(Applied::Updated)
    }

    /// Compiles the last accepted snapshot again with the current DNS member
    /// sets and publishes it (same version and hash: the configuration did not
    /// change, its members did). Instances that stay keep their state.
    pub async fn rediscover(&self) -> Result<Applied, ApplyError> {
        let accepted = self.accepted.lock().await;
        let Some(snapshot) = accepted.clone() else {
            return Ok(Applied::Unchanged);
        };
        let previous = self.config.load();
        let members = self.discovery.members();
        let pool = self.pool;
        let compiled = tokio::task::spawn_blocking(move || {
            compile_with_members(&snapshot, &previous, pool, &members)
        })
        .await
        .map_err(|e| ApplyError::Internal(e.to_string()))?;
        let compiled = Arc::new(compiled?);
        self.config.publish(compiled.clone());
        self.health.reconcile(&compiled.upstreams);
        tracing::debug!(
            version = compiled.version,
            "snapshot recompiled with new DNS members"
        );
        Ok(Applied::Updated)
    }

    /// Recompiles on every DNS member change ([`rediscover`](Self::rediscover))
    /// until the task is aborted.
    pub async fn follow_discovery(self: Arc<Self>) {
        loop {
            self.discovery.changed().await;
            if let Err(e) = self.rediscover().await {
                tracing::error!(error = %e, "could not apply new DNS members; keeping the current ones");
            }
        }
    }

    /// Loads the cached snapshot, if any, and serves it. Returns its version.
    pub async fn load_cache(&self) -> Option<u64> {
        let cache = self.cache.clone()?;
        let loaded = tokio::task::spawn_blocking(move || cache.load())
            .await
            .ok()?;
        match loaded {
            Ok(Some(snapshot)) => {
                let version = snapshot.version;
                match self.apply(snapshot, false).await {
                    Ok(_) => {
                        tracing::info!(version, "serving the cached configuration");
                        Some(version)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the cached configuration cannot be used");
                        None
                    }
                }
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "the configuration cache cannot be read");
                None
            }
        }
    }

    /// Whether a configuration is loaded and the data plane is not shutting down.
    pub fn is_ready(&self) -> bool {
        self.config.is_loaded() && !self.is_draining()
    }

    /// Marks the data plane as shutting down (`/readyz` answers 503).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
