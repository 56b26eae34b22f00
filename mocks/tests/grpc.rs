//! The mocks' gRPC Echo service over a real socket: unary and server
//! streaming, metadata echoed, requested and injected failures, reflection
//! for grpcurl (v1alpha), and the HTTP endpoints still on the same port.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use futures::StreamExt as _;
use gateway_telemetry::Tracer;
use mock_service::grpc::v1::echo_client::EchoClient;
use mock_service::grpc::v1::{EchoRequest, StreamRequest};
use mock_service::{MockConfig, Service};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;

async fn start(config: MockConfig) -> (String, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(mock_service::serve(
        listener,
        config,
        Tracer::disabled(),
        async move {
            let _ = rx.await;
        },
    ));
    (addr, tx)
}

async fn client(addr: &str) -> EchoClient<Channel> {
    EchoClient::connect(format!("http://{addr}")).await.unwrap()
}

fn config() -> MockConfig {
    MockConfig::new(Service::Orders, "grpc-1", 0.0).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn unary_echoes_the_message_instance_and_metadata() {
    let (addr, _stop) = start(config()).await;
    let mut c = client(&addr).await;
    let mut req = tonic::Request::new(EchoRequest {
        message: "hello".into(),
        ..EchoRequest::default()
    });
    req.metadata_mut()
        .insert("x-user-id", "alice".parse().unwrap());
    let reply = c.unary(req).await.unwrap().into_inner();
    assert_eq!(reply.message, "hello");
    assert_eq!(reply.instance, "grpc-1");
    assert_eq!(reply.metadata["x-user-id"], "alice");
    assert_eq!(reply.sequence, 0);

    // HTTP on the same port, same connection kind (h2c).
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let health = http
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_requested_status_comes_back_and_bad_hooks_are_refused() {
    let (addr, _stop) = start(config()).await;
    let mut c = client(&addr).await;
    for code in 1..=16 {
        let e = c
            .unary(EchoRequest {
                fail_code: code,
                ..EchoRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::from(code), "{e:?}");
    }
    let e = c
        .unary(EchoRequest {
            fail_code: 17,
            ..EchoRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("fail_code"), "{e:?}");
    let e = c
        .unary(EchoRequest {
            delay_ms: 600_001,
            ..EchoRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_streams_count_answers_and_can_fail_midway() {
    let (addr, _stop) = start(config()).await;
    let mut c = client(&addr).await;
    let replies: Vec<_> = c
        .server_stream(StreamRequest {
            message: "m".into(),
            count: 5,
            interval_ms: 1,
            ..StreamRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    let seq: Vec<u32> = replies
        .iter()
        .map(|r| r.as_ref().unwrap().sequence)
        .collect();
    assert_eq!(seq, [0, 1, 2, 3, 4]);
    assert!(replies.iter().all(|r| r.as_ref().unwrap().message == "m"));

    let replies: Vec<_> = c
        .server_stream(StreamRequest {
            count: 5,
            fail_code: Code::Aborted as i32,
            fail_after: 2,
            ..StreamRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert_eq!(replies[1].as_ref().unwrap().sequence, 1);
    assert_eq!(replies[2].as_ref().unwrap_err().code(), Code::Aborted);

    let e = c
        .server_stream(StreamRequest {
            count: 10_001,
            ..StreamRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread")]
async fn fail_rate_answers_unavailable() {
    let (addr, _stop) = start(MockConfig::new(Service::Orders, "grpc-1", 1.0).unwrap()).await;
    let e = client(&addr)
        .await
        .unary(EchoRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(e.message(), "injected failure (FAIL_RATE)");
}

#[tokio::test(flavor = "multi_thread")]
async fn grpcurl_lists_and_calls_it_through_reflection() {
    let (addr, _stop) = start(config()).await;
    let run = |args: Vec<String>| async move {
        let out = tokio::process::Command::new("grpcurl")
            .args(&args)
            .output()
            .await
            .expect("grpcurl runs (scripts/test installs it)");
        assert!(out.status.success(), "grpcurl {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let listed = run(vec!["-plaintext".into(), addr.clone(), "list".into()]).await;
    assert!(listed.lines().any(|l| l == "mock.v1.Echo"), "{listed}");
    let answer = run(vec![
        "-plaintext".into(),
        "-d".into(),
        r#"{"message": "via grpcurl"}"#.into(),
        addr.clone(),
        "mock.v1.Echo/Unary".into(),
    ])
    .await;
    let doc: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(doc["message"], "via grpcurl");
    assert_eq!(doc["instance"], "grpc-1");
}
