//! `ConfigDiscoveryService.StreamConfig`: the state-of-the-world config stream
//! to data planes, modelled on Envoy xDS.
//!
//! One task per stream follows the store's `watch` channel (no database
//! polling) and the data plane's messages:
//! * it pushes the full current snapshot on connect unless the data plane
//!   already serves that version, and again after every commit;
//! * a message quoting the last push's nonce ACKs it (empty `error_detail`) or
//!   NACKs it; messages quoting an older nonce are ignored, as in xDS;
//! * a version the node NACKed is never pushed to it again (later ones are);
//! * a message carrying `upstream_health` (a status report, sent with an empty
//!   nonce) is kept in [`HealthReports`] for the web console;
//! * a cache purge ([`crate::purge`]) is pushed at once as the current snapshot
//!   with `purge` set, a push like any other (new nonce, ACKed).
//!
//! Secrets: a snapshot holding private keys or upstream signing secrets is
//! pushed only to a stream authenticated by a token or a client certificate
//! (never to an anonymous caller of an `--insecure-open` control plane), and
//! only over TLS or from a loopback peer unless `--allow-cleartext-secrets`
//! ([`SecretsGate`]). Any other stream is ended with a status naming the
//! version and the fix, instead of receiving the configuration without them.
//!
//! Safety choice: the empty version 0 is pushed only to a data plane that
//! serves nothing yet (so it can become ready). A data plane that already
//! serves a configuration from its disk cache keeps it when it meets a control
//! plane whose database is empty, instead of being wiped; it shows as STALE.

use crate::ack_times::AckTimes;
use crate::auth::Caller;
use crate::nodes::{NodeRegistry, StreamId};
use crate::purge::Purges;
use crate::upstream_health::HealthReports;
use gateway_proto::v1::config_discovery_service_server::ConfigDiscoveryService;
use gateway_proto::v1::{CachePurge, ConfigRequest, ConfigResponse, ConfigSnapshot};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// How long a new stream may stay silent before its first message.
const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The ConfigDiscoveryService implementation.
pub struct Discovery {
    config: watch::Receiver<Arc<ConfigSnapshot>>,
    nodes: Arc<NodeRegistry>,
    shutdown: watch::Receiver<bool>,
    nonces: Arc<Nonces>,
    health: Option<Arc<HealthReports>>,
    acks: Option<Arc<AckTimes>>,
    purges: Option<Arc<Purges>>,
    secrets_gate: SecretsGate,
}

/// Which streams may receive snapshots that hold private keys or signing secrets.
#[derive(Clone, Copy, Debug, Default)]
pub struct SecretsGate {
    /// The gRPC listener serves TLS: every stream is encrypted.
    pub tls: bool,
    /// `--allow-cleartext-secrets`: cleartext streams from non-loopback peers receive them too.
    pub allow_cleartext: bool,
}

impl SecretsGate {
    /// Why a stream of `caller` from `peer` may not receive secrets; `None` when it may.
    fn refusal(&self, caller: Option<&Caller>, peer: Option<SocketAddr>) -> Option<Refusal> {
        if caller.is_none_or(Caller::is_anonymous) {
            return Some(Refusal::Anonymous);
        }
        // `to_canonical`: a dual-stack listener sees 127.0.0.1 as ::ffff:127.0.0.1.
        let loopback = peer.is_some_and(|p| p.ip().to_canonical().is_loopback());
        if !self.tls && !loopback && !self.allow_cleartext {
            return Some(Refusal::Cleartext);
        }
        None
    }
}

/// Why a stream is not sent private keys and signing secrets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// An unauthenticated caller (`--insecure-open`).
    Anonymous,
    /// Cleartext gRPC from a non-loopback peer, without `--allow-cleartext-secrets`.
    Cleartext,
}

impl Refusal {
    fn status(self, version: u64) -> Status {
        match self {
            Refusal::Anonymous => Status::permission_denied(format!(
                "configuration version {version} holds private keys or signing secrets, which \
                 are never streamed to an unauthenticated caller: give this data plane a \
                 data-plane token (the data plane's --control-plane-token) or a client certificate"
            )),
            Refusal::Cleartext => Status::failed_precondition(format!(
                "configuration version {version} holds private keys or signing secrets, which \
                 are not streamed over cleartext gRPC to a non-loopback peer: serve gRPC over \
                 TLS (--tls-cert, --tls-key), or pass --allow-cleartext-secrets to the control \
                 plane"
            )),
        }
    }
}

/// Whether `snapshot` holds a private key or an upstream signing secret.
pub fn holds_secrets(snapshot: &ConfigSnapshot) -> bool {
    snapshot
        .certificates
        .iter()
        .any(|c| !c.private_key_pem.is_empty())
        || snapshot
            .upstreams
            .iter()
            .any(|u| !u.identity_signing_secret.is_empty())
}

impl Discovery {
    /// Streams `config` to data planes, recording them in `nodes`, until `shutdown` turns true.
    pub fn new(
        config: watch::Receiver<Arc<ConfigSnapshot>>,
        nodes: Arc<NodeRegistry>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Discovery {
            config,
            nodes,
            shutdown,
            nonces: Arc::new(Nonces::new()),
            health: None,
            acks: None,
            purges: None,
            secrets_gate: SecretsGate::default(),
        }
    }

    /// The same service, deciding with `gate` which streams may receive secrets.
    pub fn with_secrets_gate(mut self, gate: SecretsGate) -> Self {
        self.secrets_gate = gate;
        self
    }

    /// The same service, pushing the cache purges of `purges` to its data planes.
    pub fn with_purges(mut self, purges: Arc<Purges>) -> Self {
        self.purges = Some(purges);
        self
    }

    /// The same service, keeping the data planes' status reports
    /// (`upstream_health`) in `reports`; without it they are ignored.
    pub fn with_health_reports(mut self, reports: Arc<HealthReports>) -> Self {
        self.health = Some(reports);
        self
    }

    /// The same service, noting when each data plane ACKs in `acks`.
    pub fn with_ack_times(mut self, acks: Arc<AckTimes>) -> Self {
        self.acks = Some(acks);
        self
    }
}

/// Unique nonces: a random per-process prefix (so nonces from before a
/// restart never match) and a counter.
struct Nonces {
    prefix: String,
    next: AtomicU64,
}

impl Nonces {
    fn new() -> Self {
        Nonces {
            prefix: format!("{:08x}", rand::random::<u32>()),
            next: AtomicU64::new(1),
        }
    }

    fn next(&self) -> String {
        format!(
            "{}-{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

type ResponseTx = mpsc::Sender<Result<ConfigResponse, Status>>;

#[tonic::async_trait]
impl ConfigDiscoveryService for Discovery {
    type StreamConfigStream = ReceiverStream<Result<ConfigResponse, Status>>;

    async fn stream_config(
        &self,
        request: Request<Streaming<ConfigRequest>>,
    ) -> Result<Response<Self::StreamConfigStream>, Status> {
        let peer = request.remote_addr();
        let secrets_refusal = self
            .secrets_gate
            .refusal(request.extensions().get::<Caller>(), peer);
        let inbound = request.into_inner();
        // Small buffer: a snapshot is pushed at most once per commit, and the
        // newest one supersedes anything queued (state of the world).
        let (tx, rx) = mpsc::channel(2);
        let session = Session {
            config: self.config.clone(),
            nodes: self.nodes.clone(),
            shutdown: self.shutdown.clone(),
            nonces: self.nonces.clone(),
            health: self.health.clone(),
            acks: self.acks.clone(),
            purges: self.purges.as_ref().map(|p| p.subscribe()),
            secrets_refusal,
            tx,
        };
        tokio::spawn(async move {
            session.run(inbound).await;
            tracing::debug!(?peer, "config stream closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The last push on a stream, awaiting its ACK or NACK.
struct Pushed {
    version: u64,
    nonce: String,
    at: Instant,
    answered: bool,
}

struct Session {
    config: watch::Receiver<Arc<ConfigSnapshot>>,
    nodes: Arc<NodeRegistry>,
    shutdown: watch::Receiver<bool>,
    nonces: Arc<Nonces>,
    health: Option<Arc<HealthReports>>,
    acks: Option<Arc<AckTimes>>,
    /// Cache purges to push (`None`: this service pushes none).
    purges: Option<broadcast::Receiver<CachePurge>>,
    /// Why this stream may not receive secrets (`None`: it may).
    secrets_refusal: Option<Refusal>,
    tx: ResponseTx,
}

/// What ended a wait inside a session.
enum Event {
    Config,
    Purge(CachePurge),
    Message(ConfigRequest),
    End,
}

impl Session {
    async fn run(mut self, mut inbound: Streaming<ConfigRequest>) {
        let first = tokio::select! {
            m = tokio::time::timeout(FIRST_MESSAGE_TIMEOUT, inbound.message()) => m,
            _ = crate::shutdown::requested(&mut self.shutdown) => return,
        };
        let first = match first {
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return,
            Ok(Err(status)) => {
                tracing::debug!(%status, "config stream failed before its first message");
                return;
            }
            Err(_) => {
                self.fail(Status::deadline_exceeded(
                    "no first ConfigRequest within 30 s",
                ))
                .await;
                return;
            }
        };
        let Some(node) = first.node.filter(|n| !n.id.is_empty()) else {
            self.fail(Status::invalid_argument(
                "the first ConfigRequest must carry node.id",
            ))
            .await;
            return;
        };
        let mut serving = parse_version(&first.version_info);
        let stream = self.nodes.connect(&node, serving);
        // With a shared registry: a version it rejected on another control plane is not resent here.
        self.nodes.recall(&node.id).await;
        tracing::info!(
            node = %node.id,
            hostname = %node.hostname,
            build = %node.build_version,
            version_info = %first.version_info,
            "data plane connected"
        );
        let mut pushed: Option<Pushed> = None;
        let mut purge = None;
        loop {
            let snapshot = self.config.borrow_and_update().clone();
            if purge.is_some() || self.should_push(&node.id, &snapshot, serving, pushed.as_ref()) {
                if let Some(refusal) = self.secrets_refusal
                    && holds_secrets(&snapshot)
                {
                    tracing::warn!(node = %node.id, version = snapshot.version, ?refusal,
                        "not streaming a configuration with secrets to this data plane");
                    self.fail(refusal.status(snapshot.version)).await;
                    break;
                }
                let nonce = self.nonces.next();
                let response = ConfigResponse {
                    version: snapshot.version,
                    hash: snapshot.hash.clone(),
                    nonce: nonce.clone(),
                    routes: snapshot.routes.clone(),
                    upstreams: snapshot.upstreams.clone(),
                    api_keys: snapshot.api_keys.clone(),
                    // With their private keys: only role data-plane may open this stream,
                    // and an anonymous or cleartext one was refused above.
                    certificates: snapshot.certificates.clone(),
                    jwt_issuers: snapshot.jwt_issuers.clone(),
                    purge: purge.take(),
                };
                if !self.send(Ok(response)).await {
                    break;
                }
                self.nodes.metrics().record_push();
                tracing::debug!(node = %node.id, version = snapshot.version, %nonce, "pushed configuration");
                pushed = Some(Pushed {
                    version: snapshot.version,
                    nonce,
                    at: Instant::now(),
                    answered: false,
                });
            }
            let event = tokio::select! {
                changed = self.config.changed() => if changed.is_ok() { Event::Config } else { Event::End },
                m = inbound.message() => match m {
                    Ok(Some(m)) => Event::Message(m),
                    Ok(None) => Event::End,
                    Err(status) => {
                        tracing::debug!(node = %node.id, %status, "config stream failed");
                        Event::End
                    }
                },
                p = next_purge(&mut self.purges) => Event::Purge(p),
                _ = self.tx.closed() => Event::End,
                _ = crate::shutdown::requested(&mut self.shutdown) => Event::End,
            };
            match event {
                Event::Config => {}
                Event::Purge(p) => purge = Some(p),
                Event::End => break,
                Event::Message(m) => {
                    self.answer(&node.id, stream, &m, pushed.as_mut(), &mut serving)
                }
            }
        }
        self.nodes.disconnect(&node.id, stream);
        tracing::info!(node = %node.id, "data plane disconnected");
    }

    /// Whether the node needs `snapshot` now.
    fn should_push(
        &self,
        node_id: &str,
        snapshot: &ConfigSnapshot,
        serving: Option<u64>,
        pushed: Option<&Pushed>,
    ) -> bool {
        let v = snapshot.version;
        if pushed.is_some_and(|p| p.version == v) || serving == Some(v) {
            return false; // it has it, or has been sent it
        }
        if self.nodes.last_nack_version(node_id) == Some(v) {
            return false; // it rejected this version: never resend
        }
        // Do not wipe a cached configuration with the empty initial one.
        !(v == 0 && serving.is_some())
    }

    /// Handles an ACK or NACK (or ignores a stale one).
    fn answer(
        &self,
        node_id: &str,
        stream: StreamId,
        m: &ConfigRequest,
        pushed: Option<&mut Pushed>,
        serving: &mut Option<u64>,
    ) {
        if let (Some(report), Some(reports)) = (&m.upstream_health, &self.health) {
            reports.record(node_id, report.clone());
        }
        let Some(p) = pushed.filter(|p| !p.answered && p.nonce == m.response_nonce) else {
            // Status report, first-message repeat, stale nonce or duplicate answer:
            // no ACK or NACK, as in xDS.
            self.nodes.seen(node_id, stream);
            return;
        };
        p.answered = true;
        if m.error_detail.is_empty() {
            *serving = Some(p.version);
            self.nodes.ack(node_id, stream, p.version, p.at.elapsed());
            if let Some(acks) = &self.acks {
                acks.record(node_id, p.version);
            }
            tracing::debug!(node = %node_id, version = p.version, "ACK");
        } else {
            *serving = parse_version(&m.version_info);
            self.nodes.nack(node_id, stream, p.version, &m.error_detail);
            tracing::warn!(node = %node_id, version = p.version, error = %m.error_detail, "data plane rejected configuration (NACK)");
        }
    }

    /// Sends on the response stream; false when the stream is gone or we are shutting down.
    async fn send(&mut self, item: Result<ConfigResponse, Status>) -> bool {
        tokio::select! {
            r = self.tx.send(item) => r.is_ok(),
            _ = crate::shutdown::requested(&mut self.shutdown) => false,
        }
    }

    async fn fail(&mut self, status: Status) {
        tracing::warn!(%status, "config stream refused");
        self.send(Err(status)).await;
    }
}

/// The next cache purge to push; pending forever without a subscription.
async fn next_purge(purges: &mut Option<broadcast::Receiver<CachePurge>>) -> CachePurge {
    let Some(rx) = purges else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(purge) => return purge,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(skipped = n, "a slow config stream skipped cache purges");
            }
            Err(broadcast::error::RecvError::Closed) => {
                *purges = None;
                return std::future::pending().await;
            }
        }
    }
}

/// `version_info` as a version number; empty or unparsable means "serves nothing known".
fn parse_version(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let v = s.parse().ok();
    if v.is_none() {
        tracing::warn!(
            version_info = s,
            "ignoring a version_info that is not a number"
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_go_only_to_authenticated_streams_over_tls_or_loopback() {
        use crate::auth::Role;
        let dp = Caller {
            name: "edge-1".into(),
            role: Role::DataPlane,
        };
        let anonymous = Caller::anonymous();
        let remote: SocketAddr = "10.0.0.7:40000".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let v6_local: SocketAddr = "[::1]:40000".parse().unwrap();
        let mapped_local: SocketAddr = "[::ffff:127.0.0.1]:40000".parse().unwrap();
        let mapped_remote: SocketAddr = "[::ffff:10.0.0.7]:40000".parse().unwrap();
        let cleartext = SecretsGate::default();
        let tls = SecretsGate {
            tls: true,
            allow_cleartext: false,
        };
        let allowed = SecretsGate {
            tls: false,
            allow_cleartext: true,
        };
        for gate in [cleartext, tls, allowed] {
            for peer in [Some(remote), Some(local), None] {
                assert_eq!(
                    gate.refusal(Some(&anonymous), peer),
                    Some(Refusal::Anonymous)
                );
                assert_eq!(gate.refusal(None, peer), Some(Refusal::Anonymous));
            }
            assert_eq!(gate.refusal(Some(&dp), Some(local)), None);
            assert_eq!(gate.refusal(Some(&dp), Some(v6_local)), None);
            assert_eq!(gate.refusal(Some(&dp), Some(mapped_local)), None);
        }
        assert_eq!(
            cleartext.refusal(Some(&dp), Some(mapped_remote)),
            Some(Refusal::Cleartext)
        );
        assert_eq!(
            cleartext.refusal(Some(&dp), Some(remote)),
            Some(Refusal::Cleartext)
        );
        assert_eq!(cleartext.refusal(Some(&dp), None), Some(Refusal::Cleartext));
        assert_eq!(tls.refusal(Some(&dp), Some(remote)), None);
        assert_eq!(allowed.refusal(Some(&dp), Some(remote)), None);
        let status = Refusal::Cleartext.status(7);
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains("version 7"), "{status:?}");
        assert!(status.message().contains("--allow-cleartext-secrets"));
    }

    #[test]
    fn secrets_are_private_keys_and_signing_secrets() {
        use gateway_proto::v1::{Certificate, Upstream};
        let mut s = ConfigSnapshot::default();
        assert!(!holds_secrets(&s));
        s.upstreams.push(Upstream {
            name: "u".into(),
            ..Default::default()
        });
        s.certificates.push(Certificate {
            name: "c".into(),
            cert_chain_pem: "chain".into(),
            ..Default::default()
        });
        assert!(!holds_secrets(&s));
        s.upstreams[0].identity_signing_secret = "x".into();
        assert!(holds_secrets(&s));
        s.upstreams[0].identity_signing_secret.clear();
        s.certificates[0].private_key_pem = "key".into();
        assert!(holds_secrets(&s));
    }

    #[test]
    fn nonces_are_unique() {
        let n = Nonces::new();
        let a = n.next();
        let b = n.next();
        assert_ne!(a, b);
        assert!(a.starts_with(&n.prefix));
    }

    #[test]
    fn version_info_parsing() {
        assert_eq!(parse_version(""), None);
        assert_eq!(parse_version("12"), Some(12));
        assert_eq!(parse_version("v12"), None);
    }
}
