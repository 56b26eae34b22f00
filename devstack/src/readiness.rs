//! Single readiness probes. Callers poll them until a deadline; none of
//! them waits longer than its own short timeout.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Timeout of one probe.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The HTTP client devstack probes with: no proxy (children are local), short timeouts.
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(PROBE_TIMEOUT)
        .build()
        .expect("a plain HTTP client always builds")
}

/// `GET url` answers 200.
pub(crate) async fn http_ok(client: &reqwest::Client, url: &str) -> Result<(), String> {
    match client.get(url).send().await {
        Ok(r) if r.status() == reqwest::StatusCode::OK => Ok(()),
        Ok(r) => Err(format!("GET {url} answered {}", r.status())),
        Err(e) => Err(format!("GET {url}: {e}")),
    }
}

/// Redis at `addr` ("127.0.0.1:P") answers `PING` with `+PONG`.
pub(crate) async fn redis_ping(addr: &str) -> Result<(), String> {
    let probe = async {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        stream
            .write_all(b"PING\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if buf[..n].starts_with(b"+PONG") {
            Ok(())
        } else {
            Err(format!(
                "answered {:?}",
                String::from_utf8_lossy(&buf[..n]).trim_end()
            ))
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .map_err(|_| "PING timed out".to_owned())?
        .map_err(|e| format!("redis {addr}: {e}"))
}

/// `grpc.health.v1.Health/Check` for the whole server answers SERVING.
/// With `tls`, over TLS.
pub(crate) async fn grpc_serving(url: &str, tls: Option<ClientTlsConfig>) -> Result<(), String> {
    let probe = async {
        let mut endpoint = Channel::from_shared(url.to_owned())
            .map_err(|e| e.to_string())?
            .connect_timeout(PROBE_TIMEOUT);
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let response = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|s| format!("Health/Check: {}", s.message()))?;
        match response.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other => Err(format!("Health/Check says {}", other.as_str_name())),
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .map_err(|_| "Health/Check timed out".to_owned())?
        .map_err(|e| format!("{url}: {e}"))
}
