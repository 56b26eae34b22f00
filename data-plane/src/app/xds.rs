//! The configuration stream client (docs/grpc-api.md, `ConfigDiscoveryService`).
//!
//! One long-lived `StreamConfig` call: the first request names the node and
//! the version already served (from the cache, or empty); every pushed
//! snapshot is applied through [`Runtime::apply`] and answered with an ACK
//! (`version_info` = the new version) or a NACK (`version_info` = the version
//! still served, `error_detail` = why). Both quote the response nonce.
//!
//! Every few seconds it also sends a status report of its upstream instances
//! on a message of its own (`upstream_health`, empty nonce: neither an ACK nor
//! a NACK; [`crate::app::status_report`]).
//!
//! When the stream fails or ends, the client reconnects with jittered
//! exponential backoff, 0.5 s doubling to 30 s, reset when a stream delivers its
//! first message. Meanwhile the data plane keeps serving what it has. With
//! several control plane endpoints (replicas), each reconnect goes to the
//! next one in the list, round the list, so a replica that died is left at
//! the first failure; the first endpoint tried is chosen at random, so a
//! fleet of data planes spreads over the replicas.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gateway_proto::v1::config_discovery_service_client::ConfigDiscoveryServiceClient;
use gateway_proto::v1::{ConfigRequest, ConfigSnapshot, Node};
use rand::Rng as _;
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::app::args::Secret;
use crate::app::runtime::Runtime;
use crate::app::status_report::{REPORT_INTERVAL, Reporter};

/// First reconnect delay.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why a config stream ended.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// The control plane URL is not usable.
    #[error("invalid control plane URL {url:?}: {source}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// Connecting failed.
    #[error("cannot connect to the control plane: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The stream failed.
    #[error("config stream failed: {0}")]
    Stream(#[from] tonic::Status),
    /// The token cannot be sent as gRPC metadata (not visible ASCII).
    #[error("--control-plane-token holds characters that cannot be sent in a header")]
    Token,
    /// The control plane closed the stream.
    #[error("the control plane closed the config stream")]
    Closed,
}

/// Reconnect delays: exponential from [`BACKOFF_INITIAL`] to [`BACKOFF_MAX`],
/// each drawn uniformly from the upper half of the current step ("equal jitter"),
/// so a fleet of data planes does not reconnect in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    step: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            step: BACKOFF_INITIAL,
        }
    }
}

impl Backoff {
    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(BACKOFF_MAX);
        step.mul_f64(rand::rng().random_range(0.5..=1.0))
    }

    /// Back to the initial delay.
    pub fn reset(&mut self) {
        self.step = BACKOFF_INITIAL;
    }
}

/// Where to connect and who we are.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// Control plane URLs (one or more replicas), e.g. `http://127.0.0.1:50051`.
    pub urls: Vec<String>,
    /// This data plane's identity.
    pub node: Node,
    /// Sent as `authorization: Bearer TOKEN` (redacted in `Debug`).
    pub token: Option<Secret>,
    /// TLS settings for an `https://` URL (CA, optional client certificate).
    pub tls: Option<ClientTlsConfig>,
}

/// Why the TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFilesError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no PEM block of the expected kind.
    #[error("{path} holds no PEM {kind}")]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What was expected.
        kind: &'static str,
    },
}

fn read_pem(path: &Path, kind: &'static str, marker: &str) -> Result<Vec<u8>, TlsFilesError> {
    let bytes = std::fs::read(path).map_err(|source| TlsFilesError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !String::from_utf8_lossy(&bytes).contains(marker) {
        return Err(TlsFilesError::NotPem {
            path: path.to_owned(),
            kind,
        });
    }
    Ok(bytes)
}

/// Client TLS settings from PEM files: the CA the control plane's certificate
/// must chain to, and optionally our client certificate and key (mTLS). The
/// server name checked is the URL's host.
pub fn client_tls(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, TlsFilesError> {
    let ca = read_pem(ca, "certificate", "CERTIFICATE-----")?;
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    if let Some((cert, key)) = identity {
        let cert = read_pem(cert, "certificate", "CERTIFICATE-----")?;
        let key = read_pem(key, "private key", "PRIVATE KEY-----")?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// Runs the config client until the task is aborted.
pub async fn run(runtime: Arc<Runtime>, settings: XdsSettings) {
    let mut backoff = Backoff::default();
    let mut failures = 0u32;
    let mut next = if settings.urls.len() > 1 {
        rand::rng().random_range(0..settings.urls.len())
    } else {
        0
    };
    loop {
        let Some(url) = settings.urls.get(next % settings.urls.len().max(1)) else {
            tracing::error!("no control plane endpoint to connect to");
            return;
        };
        next = next.wrapping_add(1);
        let result = session(&runtime, &settings, url, &mut backoff).await;
        let was_connected = runtime
            .metrics
            .control_plane_connected
            .swap(false, Ordering::Relaxed);
        if let Err(e) = result {
            let error = error_chain(&e);
            // Log the first failure loudly; repeats while the control plane stays down quietly.
            if was_connected || failures == 0 {
                tracing::warn!(%error, %url, serving = %served_version(&runtime),
                    "control plane unavailable; serving the configuration already loaded (if any)");
            } else {
                tracing::debug!(%error, "control plane still unavailable");
            }
        }
        failures = failures.saturating_add(1);
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// `error: cause: cause` (tonic's transport errors say little without their sources).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        // Wrappers often repeat their inner error's text: say it once.
        if !out.ends_with(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

fn served_version(runtime: &Runtime) -> String {
    let current = runtime.config.load();
    if current.loaded {
        current.version.to_string()
    } else {
        String::new()
    }
}

async fn session(
    runtime: &Runtime,
    settings: &XdsSettings,
    url: &str,
    backoff: &mut Backoff,
) -> Result<(), XdsError> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|source| XdsError::Url {
            url: url.to_owned(),
            source,
        })?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // Notice a control plane that vanished without closing the connection.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let endpoint = match &settings.tls {
        Some(tls) => endpoint
            .tls_config(tls.clone())
            .map_err(XdsError::Connect)?,
        None => endpoint,
    };
    let channel = endpoint.connect().await.map_err(XdsError::Connect)?;
    let authorization = match &settings.token {
        Some(token) => {
            let mut value = MetadataValue::try_from(format!("Bearer {}", token.expose()))
                .map_err(|_| XdsError::Token)?;
            value.set_sensitive(true);
            Some(value)
        }
        None => None,
    };
    let mut client = ConfigDiscoveryServiceClient::with_interceptor(
        channel,
        move |mut request: tonic::Request<()>| {
            if let Some(value) = &authorization {
                request
                    .metadata_mut()
                    .insert("authorization", value.clone());
            }
            Ok(request)
        },
    )
    .max_decoding_message_size(256 * 1024 * 1024);
    let (tx, rx) = mpsc::channel(4);
    let hello = ConfigRequest {
        node: Some(settings.node.clone()),
        version_info: served_version(runtime),
        ..Default::default()
    };
    tx.send(hello).await.map_err(|_| XdsError::Closed)?;
    let mut inbound = client
        .stream_config(ReceiverStream::new(rx))
        .await?
        .into_inner();
    runtime
        .metrics
        .control_plane_connected
        .store(true, Ordering::Relaxed);
    runtime
        .metrics
        .control_plane_connects
        .fetch_add(1, Ordering::Relaxed);
    tracing::info!(%url, node = %settings.node.id, "config stream open");
    let mut first = true;
    // Status reports (status_report.rs) on their own messages: the first one
    // at once, then every REPORT_INTERVAL while the stream stays open.
    let mut reporter = Reporter::default();
    let mut reports = tokio::time::interval(REPORT_INTERVAL);
    reports.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_report = tokio::time::Instant::now();
    loop {
        let resp = tokio::select! {
            message = inbound.message() => match message? {
                Some(resp) => resp,
                None => break,
            },
            _ = reports.tick() => {
                let now = tokio::time::Instant::now();
                let report = reporter.report(&runtime.config.load(), now - last_report);
                last_report = now;
                let status = ConfigRequest {
                    version_info: served_version(runtime),
                    upstream_health: Some(report),
                    ..Default::default()
                };
                tx.send(status).await.map_err(|_| XdsError::Closed)?;
                continue;
            }
        };
        if first {
            backoff.reset();
            first = false;
        }
        let version = resp.version;
        let nonce = resp.nonce;
        // A cache purge (AdminService.PurgeCache) rides on a push of the current snapshot.
        let purge = resp.purge;
        let snapshot = ConfigSnapshot {
            version,
            hash: resp.hash,
            routes: resp.routes,
            upstreams: resp.upstreams,
            api_keys: resp.api_keys,
            certificates: resp.certificates,
            jwt_issuers: resp.jwt_issuers,
            ..Default::default()
        };
        let applied = runtime.apply(snapshot, true).await;
        if let Some(purge) = &purge {
            runtime.purge(purge);
        }
        let reply = match applied {
            Ok(_) => {
                runtime.metrics.config_acks.fetch_add(1, Ordering::Relaxed);
                ConfigRequest {
                    version_info: version.to_string(),
                    response_nonce: nonce,
                    ..Default::default()
                }
            }
            Err(e) => {
                runtime.metrics.config_nacks.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(version, error = %e, "configuration rejected; keeping the current one");
                ConfigRequest {
                    version_info: served_version(runtime),
                    response_nonce: nonce,
                    error_detail: e.to_string(),
                    ..Default::default()
                }
            }
        };
        tx.send(reply).await.map_err(|_| XdsError::Closed)?;
    }
    Err(XdsError::Closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::default();
        let mut step = BACKOFF_INITIAL;
        for _ in 0..12 {
            let d = b.next_delay();
            assert!(
                d >= step / 2 && d <= step,
                "{d:?} not within [{:?}, {step:?}]",
                step / 2
            );
            step = (step * 2).min(BACKOFF_MAX);
        }
        assert_eq!(step, BACKOFF_MAX);
        b.reset();
        assert!(b.next_delay() <= BACKOFF_INITIAL);
    }
}
