//! Active health checks (docs/grpc-api.md `HealthCheck`, docs/data-plane.md "Balance → breaker").
//!
//! Every instance of an upstream with `health_check` gets one task that sends
//! `GET <path>` on a fresh connection every `interval` (±10 % jitter, first
//! check within a second, so replicas and instances do not probe in lockstep).
//! A 2xx answer within `timeout` is a success. A healthy instance becomes
//! unhealthy after `unhealthy_threshold` consecutive failures; an unhealthy one
//! becomes healthy after `healthy_threshold` consecutive successes.
//!
//! Instances start healthy: a new instance takes traffic at once, and its
//! circuit breaker protects clients until the first checks have run. Instances of
//! upstreams without `health_check` are always healthy.
//!
//! The health state lives in [`InstanceState`] and survives config changes; a
//! change of the check settings restarts the task with the state kept.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gateway_proto::spec::HealthCheckSpec;
use http::header::HeaderValue;
use http::{Request, header};
use rand::Rng as _;
use tokio::task::JoinHandle;

use gateway_transport::body::RequestBody;
use gateway_transport::pool::{Pool, Protocol};
use gateway_transport::upstream_error::{Failure, UpstreamError};

use crate::upstream::{InstanceKey, InstanceState, UpstreamEntry};

/// Health check settings of an upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSettings {
    /// Path to GET.
    pub path: Arc<str>,
    /// Time between checks.
    pub interval: Duration,
    /// Time allowed for one check.
    pub timeout: Duration,
    /// Consecutive failures that make a healthy instance unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successes that make an unhealthy instance healthy.
    pub healthy_threshold: u32,
}

impl HealthSettings {
    /// From a validated upstream's `health_check`.
    pub fn from_spec(hc: &HealthCheckSpec<'_>) -> Self {
        Self {
            path: hc.path.into(),
            interval: hc.interval,
            timeout: hc.timeout,
            unhealthy_threshold: hc.unhealthy_threshold,
            healthy_threshold: hc.healthy_threshold,
        }
    }
}

/// Consecutive check results of one instance, and the transitions they cause.
#[derive(Debug, Default, Clone, Copy)]
pub struct HealthTracker {
    successes: u32,
    failures: u32,
}

impl HealthTracker {
    /// Records one check result. Returns the new health state when it changes.
    pub fn observe(&mut self, ok: bool, healthy: bool, s: &HealthSettings) -> Option<bool> {
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            (!healthy && self.successes >= s.healthy_threshold).then_some(true)
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            (healthy && self.failures >= s.unhealthy_threshold).then_some(false)
        }
    }
}

/// Why one check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Connecting failed (TCP, or the TLS handshake of an https:// instance).
    #[error("connect failed: {0}")]
    Connect(Failure),
    /// No HTTP/2 connection could be made (connect, TLS or the HTTP/2 handshake).
    #[error("connect failed: {0}")]
    Unreachable(#[source] UpstreamError),
    /// The HTTP exchange failed.
    #[error("HTTP error: {0}")]
    Http(#[source] UpstreamError),
    /// The request could not be built (bad path or authority).
    #[error("invalid check request: {0}")]
    Request(#[source] http::Error),
    /// No answer within the timeout.
    #[error("timed out")]
    Timeout,
    /// An answer other than 2xx.
    #[error("answered {0}")]
    Status(http::StatusCode),
}

/// Sends one check: `GET path` to the instance of `pool` on a fresh
/// connection made as requests' are (TCP, and TLS for an https:// instance),
/// with the client requests use: the transport's HTTP/1.1 client, or
/// hyper's HTTP/2 client for an `HTTP2` upstream.
pub async fn check_once(pool: &Pool, path: &str, timeout: Duration) -> Result<(), CheckError> {
    let authority = pool.authority();
    let exchange = async {
        let req = Request::get(path)
            .header(header::HOST, authority)
            .header(header::USER_AGENT, "gateway-health-check")
            .body(RequestBody::empty())
            .map_err(CheckError::Request)?;
        let status = match pool.protocol() {
            Protocol::Http1 => {
                let conn = pool.fresh_connection().await.map_err(CheckError::Connect)?;
                let mut req = Box::new(req);
                req.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                conn.send(req, authority)
                    .await
                    .map_err(|failed| CheckError::Http(failed.error))?
                    .status()
            }
            Protocol::Http2 => pool.send_on_fresh_h2(req).await.map_err(|e| {
                if e.never_reached() {
                    CheckError::Unreachable(e)
                } else {
                    CheckError::Http(e)
                }
            })?,
        };
        if status.is_success() {
            Ok(())
        } else {
            Err(CheckError::Status(status))
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| CheckError::Timeout)?
}

fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(rand::rng().random_range(0.9..1.1))
}

async fn run_checks(instance: Arc<InstanceState>, s: HealthSettings) {
    let first = s.interval.min(Duration::from_secs(1));
    let first = first.mul_f64(rand::rng().random_range(0.0..1.0));
    tokio::time::sleep(first).await;
    let mut tracker = HealthTracker::default();
    loop {
        let result = check_once(&instance.pool, &s.path, s.timeout).await;
        if let Err(e) = &result {
            instance
                .metrics
                .health_check_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(upstream = %instance.key.upstream, instance = %instance.id, error = %e, "health check failed");
        }
        if let Some(now) = tracker.observe(result.is_ok(), instance.is_healthy(), &s) {
            instance.set_healthy(now);
            if now {
                tracing::info!(upstream = %instance.key.upstream, instance = %instance.id, "instance is healthy again");
            } else {
                tracing::warn!(upstream = %instance.key.upstream, instance = %instance.id,
                    error = %result.err().map(|e| e.to_string()).unwrap_or_default(),
                    "instance marked unhealthy");
            }
        }
        let pause = jittered(s.interval);
        tokio::time::sleep(pause).await;
    }
}

struct Task {
    settings: HealthSettings,
    handle: JoinHandle<()>,
}

/// Runs one check task per checked instance and keeps the set in line with the
/// current configuration.
#[derive(Default)]
pub struct HealthSupervisor {
    tasks: Mutex<HashMap<InstanceKey, Task>>,
}

impl std::fmt::Debug for HealthSupervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.tasks.lock().len();
        f.debug_struct("HealthSupervisor")
            .field("tasks", &n)
            .finish()
    }
}

impl HealthSupervisor {
    /// Starts, restarts or stops tasks to match `upstreams` (a snapshot's).
    /// Must run inside a Tokio runtime.
    pub fn reconcile(&self, upstreams: &[Arc<UpstreamEntry>]) {
        let mut tasks = self.tasks.lock();
        let mut wanted: HashMap<&InstanceKey, (&Arc<InstanceState>, &HealthSettings)> =
            HashMap::new();
        for u in upstreams {
            for i in &u.instances {
                match &u.health {
                    Some(s) => {
                        wanted.insert(&i.key, (i, s));
                    }
                    // No checks configured: always healthy.
                    None => {
                        i.set_healthy(true);
                    }
                }
            }
        }
        tasks.retain(|key, task| {
            let keep = wanted.get(key).is_some_and(|(_, s)| **s == task.settings);
            if !keep {
                task.handle.abort();
            }
            keep
        });
        for (key, (instance, settings)) in wanted {
            if !tasks.contains_key(key) {
                let handle = tokio::spawn(run_checks(Arc::clone(instance), settings.clone()));
                tasks.insert(
                    key.clone(),
                    Task {
                        settings: settings.clone(),
                        handle,
                    },
                );
            }
        }
    }

    /// Number of running check tasks.
    pub fn task_count(&self) -> usize {
        self.tasks.lock().len()
    }

    /// Stops every task.
    pub fn stop(&self) {
        let mut tasks = self.tasks.lock();
        for (_, t) in tasks.drain() {
            t.handle.abort();
        }
    }
}

impl Drop for HealthSupervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HealthSettings {
        HealthSettings {
            path: "/health".into(),
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(50),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
        }
    }

    #[test]
    fn thresholds_decide_transitions() {
        let s = settings();
        let mut t = HealthTracker::default();
        let mut healthy = true;
        let mut step = |ok: bool, healthy: &mut bool| {
            if let Some(n) = t.observe(ok, *healthy, &s) {
                *healthy = n;
            }
            *healthy
        };
        assert!(step(false, &mut healthy));
        assert!(step(false, &mut healthy));
        assert!(
            step(true, &mut healthy),
            "a success resets the failure count"
        );
        assert!(step(false, &mut healthy));
        assert!(step(false, &mut healthy));
        assert!(!step(false, &mut healthy), "third consecutive failure");
        assert!(!step(true, &mut healthy));
        assert!(!step(false, &mut healthy));
        assert!(!step(true, &mut healthy));
        assert!(step(true, &mut healthy), "second consecutive success");
    }

    #[tokio::test]
    async fn check_against_a_closed_port_fails() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let pool = Pool::new(addr, gateway_transport::pool::PoolSettings::default());
        let e = check_once(&pool, "/health", Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(matches!(e, CheckError::Connect(_)), "{e}");
    }
}
