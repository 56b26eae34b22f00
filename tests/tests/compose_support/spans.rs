//! Where the compose suite reads finished spans: Jaeger's query API when the real Jaeger image
//! runs, otherwise the in-test OTLP/gRPC receiver that the offline relay forwards to.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};

use super::wait_for;

/// One finished span, reduced to what the tracing scenario checks.
#[derive(Debug, Clone)]
pub(crate) struct SpanInfo {
    /// `service.name` of the process that exported it.
    pub service: String,
    /// Span name.
    pub name: String,
    /// Span id, 16 lowercase hex digits.
    pub span_id: String,
    /// Parent span id ("" for a root span).
    pub parent: String,
}

/// The span source of one compose run.
pub(super) enum Source {
    /// Jaeger all-in-one's HTTP query API (`/api/traces/{id}`).
    Jaeger(String),
    /// The in-test OTLP receiver.
    Receiver(Receiver),
}

impl Source {
    /// Jaeger at `base` (http://127.0.0.1:port of the UI).
    pub(super) fn jaeger(base: String) -> Source {
        Source::Jaeger(base)
    }

    /// Starts the OTLP receiver on the Docker host's docker0 address, where the offline relay
    /// (host.docker.internal) reaches it. Returns the source and the `host:port` the relay
    /// must forward to.
    pub(super) async fn start_receiver(image: &str) -> Result<(Source, String)> {
        let receiver = Receiver::start(image).await?;
        let sink = format!("host.docker.internal:{}", receiver.port);
        Ok((Source::Receiver(receiver), sink))
    }

    /// Spans of `trace_id` once a data-plane span and an orders span are both in (or after 45 s,
    /// whatever arrived: the caller's checks then say what is missing).
    pub(super) async fn collect(
        &self,
        http: &reqwest::Client,
        trace_id: &str,
    ) -> Result<Vec<SpanInfo>> {
        let spans = parking_lot::Mutex::new(Vec::new());
        let complete = wait_for(
            "the trace's spans to arrive",
            Duration::from_secs(45),
            || async {
                let found = match self {
                    Source::Jaeger(base) => jaeger_spans(http, base, trace_id).await?,
                    Source::Receiver(r) => r.spans(trace_id),
                };
                let done = found.iter().any(|s| s.service == "data-plane")
                    && found.iter().any(|s| s.service == "orders");
                *spans.lock() = found;
                Ok(done)
            },
        )
        .await;
        if let Err(e) = complete {
            eprintln!("{e:#}");
        }
        Ok(spans.into_inner())
    }
}

async fn jaeger_spans(http: &reqwest::Client, base: &str, trace_id: &str) -> Result<Vec<SpanInfo>> {
    let resp = http
        .get(format!("{base}/api/traces/{trace_id}"))
        .send()
        .await?;
    if resp.status() == 404 {
        return Ok(Vec::new());
    }
    let body: Value = resp.json().await.context("Jaeger answer is not JSON")?;
    let mut out = Vec::new();
    for trace in body["data"].as_array().into_iter().flatten() {
        let processes = &trace["processes"];
        for span in trace["spans"].as_array().into_iter().flatten() {
            let process = span["processID"].as_str().unwrap_or_default();
            let parent = span["references"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["refType"] == "CHILD_OF")
                .and_then(|r| r["spanID"].as_str())
                .unwrap_or_default();
            out.push(SpanInfo {
                service: processes[process]["serviceName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name: span["operationName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                span_id: span["spanID"].as_str().unwrap_or_default().to_owned(),
                parent: parent.to_owned(),
            });
        }
    }
    Ok(out)
}

/// The in-test OTLP receiver (loopback only) plus a forwarder on the Docker host's bridge
/// address, so the offline relay container can deliver to it through `host.docker.internal`.
pub(super) struct Receiver {
    receiver: gateway_telemetry::receiver::Receiver,
    port: u16,
    forwarder: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start(image: &str) -> Result<Receiver> {
        let receiver = gateway_telemetry::receiver::Receiver::start()
            .await
            .context("starting the OTLP receiver")?;
        let bridge = host_gateway_address(image).await?;
        let listener = TcpListener::bind((bridge, 0))
            .await
            .with_context(|| format!("binding the OTLP forwarder on {bridge}"))?;
        let port = listener.local_addr()?.port();
        let target = receiver.addr();
        let forwarder = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Receiver {
            receiver,
            port,
            forwarder,
        })
    }

    fn spans(&self, trace_id: &str) -> Vec<SpanInfo> {
        self.receiver
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .map(|s| SpanInfo {
                service: s.service_name,
                name: s.name,
                span_id: s.span_id,
                parent: s.parent_span_id,
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

/// The address `host-gateway` stands for (the Docker host's docker0 address), asked of the
/// engine itself through a throwaway container, exactly as the relay will resolve it.
async fn host_gateway_address(image: &str) -> Result<IpAddr> {
    let out = super::docker(&[
        "run",
        "--rm",
        "--add-host",
        "host.docker.internal:host-gateway",
        "--entrypoint",
        "getent",
        image,
        "hosts",
        "host.docker.internal",
    ])
    .await?;
    out.split_whitespace()
        .next()
        .and_then(|a| a.parse::<IpAddr>().ok())
        .with_context(|| format!("host-gateway resolved to {out:?}"))
}
