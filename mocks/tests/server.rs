//! The mock server over real sockets: HTTP/1.1 framing, streaming in both
//! directions, and graceful shutdown.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::Duration;

use futures::StreamExt;
use gateway_telemetry::receiver::{Kind, Receiver};
use gateway_telemetry::{Sampler, Tracer, TracerOptions};
use mock_service::{MockConfig, Service};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

struct Running {
    base: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(service: Service, id: &str) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = oneshot::channel::<()>();
    let config = MockConfig::new(service, id, 0.0).unwrap();
    let task = tokio::spawn(mock_service::serve(
        listener,
        config,
        Tracer::disabled(),
        async move {
            let _ = rx.await;
        },
    ));
    Running {
        base,
        stop: Some(tx),
        task,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_records_with_instance_header() {
    let mock = start(Service::Orders, "orders-2").await;
    let resp = client()
        .get(format!("{}/orders/7?trace=1", mock.base))
        .header("X-Probe", "yes")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-instance-id"], "orders-2");
    let doc: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(doc["instance"], "orders-2");
    assert_eq!(doc["service"], "orders");
    assert_eq!(doc["id"], "7");
    assert_eq!(doc["query"], "trace=1");
    assert_eq!(doc["headers"]["x-probe"], "yes");

    let health = client()
        .get(format!("{}/health", mock.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.headers()["x-instance-id"], "orders-2");
}

#[tokio::test(flavor = "multi_thread")]
async fn large_bodies_stream_chunked_in_both_directions() {
    let mock = start(Service::Users, "users-1").await;
    let n: u64 = 20 * 1024 * 1024 + 3;
    let resp = client()
        .get(format!("{}/users/1?bytes={n}", mock.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["transfer-encoding"], "chunked");
    assert!(resp.headers().get("content-length").is_none());
    let mut total = 0u64;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        total += chunk.unwrap().len() as u64;
    }
    assert_eq!(total, n);

    // Upload 16 MiB as a stream of 64 KiB chunks; the mock counts them.
    let chunks = futures::stream::iter((0..256).map(|_| Ok::<_, std::io::Error>(bytes_chunk())));
    let resp = client()
        .post(format!("{}/users", mock.base))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let doc: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(doc["received_bytes"], 256 * 65536);
}

fn bytes_chunk() -> Vec<u8> {
    vec![b'z'; 65536]
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_lets_in_flight_requests_finish() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut mock = start(Service::Users, "users-1").await;
    let addr = mock.base.trim_start_matches("http://").to_owned();
    // Send a slow request first, on its own connection.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /users/1?delay_ms=300 HTTP/1.1\r\nHost: mock\r\n\r\n")
        .await
        .unwrap();
    // The listener accepts in order, so once a later connection has been
    // answered the slow one is being served.
    let probe = client()
        .get(format!("{}/health", mock.base))
        .send()
        .await
        .unwrap();
    assert_eq!(probe.status(), 200);
    mock.stop.take().unwrap().send(()).unwrap();

    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut answer))
        .await
        .expect("the in-flight request completes")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), mock.task)
        .await
        .expect("server stops after draining")
        .unwrap()
        .unwrap();
    // New connections are refused once it stopped.
    assert!(tokio::net::TcpStream::connect(&addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn continues_the_incoming_trace_and_exports_its_span() {
    let receiver = Receiver::start().await.unwrap();
    let mut options = TracerOptions::new("orders");
    options.instance_id = Some("orders-1".into());
    options.endpoint = Some(receiver.endpoint());
    options.sampler = Sampler::from_values(Some("parentbased_always_on"), None).unwrap();
    options.scheduled_delay = Duration::from_millis(100);
    let tracer = Tracer::new(options).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let config = MockConfig::new(Service::Orders, "orders-1", 0.0).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(mock_service::serve(
        listener,
        config,
        tracer.clone(),
        async move {
            let _ = stopped.await;
        },
    ));

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let resp = client()
        .get(format!("{base}/orders/9"))
        .header("traceparent", format!("00-{trace_id}-{parent}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let traceresponse = resp.headers()["traceresponse"].to_str().unwrap().to_owned();
    assert!(traceresponse.contains(trace_id), "{traceresponse}");

    let spans = receiver
        .wait_for(
            |spans| spans.iter().any(|s| s.trace_id == trace_id),
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|e| panic!("no span exported: {e:?}"));
    let span = spans.iter().find(|s| s.trace_id == trace_id).unwrap();
    assert_eq!(span.parent_span_id, parent);
    assert_eq!(span.kind, Kind::Server);
    assert_eq!(span.service_name, "orders");
    assert_eq!(span.service_instance_id.as_deref(), Some("orders-1"));
    assert_eq!(span.attr("http.route"), Some("/orders/{id}"));
    assert_eq!(span.attr("http.response.status_code"), Some("200"));
    assert!(
        traceresponse.contains(&span.span_id),
        "{traceresponse} names the mock's span"
    );

    // Health checks are not traced.
    let health = client().get(format!("{base}/health")).send().await.unwrap();
    assert!(health.headers().get("traceresponse").is_none());

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    tokio::task::spawn_blocking(move || tracer.shutdown(Duration::from_secs(2)))
        .await
        .unwrap()
        .unwrap();
}
