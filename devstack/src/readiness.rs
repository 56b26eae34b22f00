//! Single readiness probes. Callers poll them until a deadline; none of
//! them waits longer than its own short timeout.

use std::time::Duration;

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

/// Redis answers `PING`, through the same client code the services use
/// (`rediss://`, CA, password). Errors name the URL only redacted.
pub(crate) async fn redis_ping(target: &gateway_redis::RedisTarget) -> Result<(), String> {
    let probe = async {
        let client = target.client().map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("redis {target}: {e}")),
        Err(_) => Err(format!("redis {target}: PING timed out")),
    }
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
