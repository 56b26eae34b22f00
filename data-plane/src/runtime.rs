//! The data plane's shared state, and the one way a snapshot becomes current:
//! [`Runtime::apply`] (validate and compile off the async workers, publish,
//! start health checks, persist to the cache).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gateway_proto::v1::ConfigSnapshot;

use crate::cache::SnapshotCache;
use crate::config::{CompileError, ConfigStore, compile};
use crate::health::HealthSupervisor;
use crate::metrics::Metrics;
use crate::pool::PoolSettings;

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
    /// Where accepted snapshots are persisted.
    pub cache: Option<SnapshotCache>,
    /// Connection pool limits for new instances.
    pub pool: PoolSettings,
    /// Serialises applies (the config stream and the start-up cache load).
    apply_lock: tokio::sync::Mutex<()>,
    draining: AtomicBool,
}

impl Runtime {
    /// A runtime with nothing loaded.
    pub fn new(cache: Option<SnapshotCache>, pool: PoolSettings) -> Self {
        Self {
            config: Arc::new(ConfigStore::new()),
            metrics: Arc::new(Metrics::default()),
            health: HealthSupervisor::default(),
            cache,
            pool,
            apply_lock: tokio::sync::Mutex::new(()),
            draining: AtomicBool::new(false),
        }
    }

    /// Makes `snapshot` current unless it is invalid, in which case the current
    /// configuration stays. With `persist`, an applied snapshot is written to the
    /// cache (a cache write failure is logged, not fatal: the snapshot is served).
    pub async fn apply(
        &self,
        snapshot: ConfigSnapshot,
        persist: bool,
    ) -> Result<Applied, ApplyError> {
        let _guard = self.apply_lock.lock().await;
        let previous = self.config.load();
        if previous.loaded && previous.version == snapshot.version && previous.hash == snapshot.hash
        {
            return Ok(Applied::Unchanged);
        }
        let pool = self.pool;
        // Large tables take a while to compile: keep that off the async workers.
        let (compiled, snapshot) = tokio::task::spawn_blocking(move || {
            let compiled = compile(&snapshot, &previous, pool);
            (compiled, snapshot)
        })
        .await
        .map_err(|e| ApplyError::Internal(e.to_string()))?;
        let compiled = Arc::new(compiled?);
        self.config.publish(compiled.clone());
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.metrics
            .config_applied_unix_ms
            .store(now_ms, Ordering::Relaxed);
        self.health.reconcile(&compiled);
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
