//! The library API: a control plane started in-process on an already bound
//! listener, its metrics endpoint (certificates' expiry included), and a
//! graceful stop with open config streams, and the console's need of a tokens file.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use control_plane::{ControlPlane, Settings};
use gateway_proto::v1::config_discovery_service_client::ConfigDiscoveryServiceClient;
use gateway_proto::v1::{ConfigRequest, Instance, Node, UpsertUpstreamRequest, Upstream};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;

async fn start(dir: &tempfile::TempDir) -> ControlPlane {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    ControlPlane::start_on(
        listener,
        Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            database: dir.path().join("cp.db").into(),
            seed: None,
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            tracer: gateway_telemetry::Tracer::disabled(),
            insecure_open: true,
            ..Settings::default()
        },
    )
    .await
    .unwrap()
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_pushes_acks_and_connected_data_planes() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let url = format!("http://{}", cp.local_addr());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ConfigRequest {
        node: Some(Node {
            id: "dp-m".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = ConfigDiscoveryServiceClient::connect(url)
        .await
        .unwrap()
        .stream_config(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    tx.send(ConfigRequest {
        version_info: first.version.to_string(),
        response_nonce: first.nonce,
        ..Default::default()
    })
    .await
    .unwrap();
    let metrics = cp.metrics_addr().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let body = http_get(metrics, "/metrics").await;
        if body.contains("control_plane_config_acks_total 1") {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ACK counted:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("text/plain; version=0.0.4"), "{body}");
    for line in [
        "control_plane_data_planes_connected 1",
        "control_plane_config_pushes_total 1",
        "control_plane_config_nacks_total 0",
        "control_plane_config_push_ack_seconds_count 1",
        "control_plane_config_version 0",
    ] {
        assert!(body.lines().any(|l| l == line), "missing {line}:\n{body}");
    }
    assert!(http_get(metrics, "/nope").await.starts_with("HTTP/1.1 404"));
    drop(stream);
    cp.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_each_certificates_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("secrets.key");
    std::fs::write(&key_file, "5a".repeat(32)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp = ControlPlane::start_on(
        listener,
        Settings {
            database: dir.path().join("cp.db").into(),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            secrets_key_file: Some(key_file),
            insecure_open: true,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    let mut admin = gateway_proto::v1::admin_service_client::AdminServiceClient::connect(format!(
        "http://{}",
        cp.local_addr()
    ))
    .await
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for (name, year) in [("old", 2021), ("edge", 2100)] {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec![format!("{name}.example.com")]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        admin
            .upsert_certificate(gateway_proto::v1::UpsertCertificateRequest {
                certificate: Some(gateway_proto::v1::Certificate {
                    name: name.into(),
                    sni_hosts: vec![format!("{name}.example.com")],
                    cert_chain_pem: params.self_signed(&key).unwrap().pem(),
                    private_key_pem: key.serialize_pem(),
                    ..Default::default()
                }),
                expected_version: None,
            })
            .await
            .unwrap();
    }
    let body = http_get(cp.metrics_addr().unwrap(), "/metrics").await;
    let value = |name: &str| -> i64 {
        let prefix = format!("control_plane_certificate_expiry_seconds{{name=\"{name}\"}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no expiry of {name}:\n{body}"))
            .parse()
            .unwrap()
    };
    // 2021-01-01 and 2100-01-01 from now, give or take the seconds this test took.
    let (old, edge) = (value("old"), value("edge"));
    assert!((old - (1_609_459_200 - now)).abs() < 60, "{old}");
    assert!(old < 0, "expired: negative");
    assert!((edge - (4_102_444_800 - now)).abs() < 60, "{edge}");
    assert!(
        body.contains("# TYPE control_plane_certificate_expiry_seconds gauge"),
        "{body}"
    );
    cp.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_is_prompt_even_with_open_config_streams() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let url = format!("http://{}", cp.local_addr());
    let mut admin =
        gateway_proto::v1::admin_service_client::AdminServiceClient::connect(url.clone())
            .await
            .unwrap();
    admin
        .upsert_upstream(UpsertUpstreamRequest {
            upstream: Some(Upstream {
                name: "u".into(),
                instances: vec![Instance {
                    id: "u1".into(),
                    url: "http://127.0.0.1:1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            expected_version: None,
        })
        .await
        .unwrap();
    assert_eq!(cp.store().current().version, 1);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ConfigRequest {
        node: Some(Node {
            id: "dp-open".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = ConfigDiscoveryServiceClient::connect(url)
        .await
        .unwrap()
        .stream_config(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().version, 1);
    assert_eq!(cp.nodes().connected(), 1);

    let started = std::time::Instant::now();
    cp.stop().await.unwrap();
    // Well under the 10 s grace period: streams are ended, not waited for.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stop took {:?}",
        started.elapsed()
    );
    // The data plane sees its stream end and can reconnect elsewhere.
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    drop(tx);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_needs_a_tokens_file() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = ControlPlane::start_on(
        listener,
        Settings {
            database: dir.path().join("cp.db").into(),
            console_listen: Some("127.0.0.1:0".parse().unwrap()),
            insecure_open: true,
            ..Settings::default()
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, control_plane::StartError::ConsoleWithoutTokens),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("--auth-tokens-file"),
        "{refused}"
    );

    // With a tokens file it serves the sign-in form on its own port.
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "ops admin s3cret-admin-token\n").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp = ControlPlane::start_on(
        listener,
        Settings {
            database: dir.path().join("cp.db").into(),
            console_listen: Some("127.0.0.1:0".parse().unwrap()),
            auth_tokens_file: Some(tokens),
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    let console = cp.console_addr().unwrap();
    assert_ne!(console, cp.local_addr());
    let answer = http_get(console, "/signin").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("Admin or viewer token"), "{answer}");
    cp.stop().await.unwrap();

    // Issue 41, item 16: on a non-loopback address without TLS it is refused,
    // unless --console-allow-cleartext says a proxy terminates TLS.
    let tokens = dir.path().join("tokens");
    let settings = || Settings {
        database: dir.path().join("cp.db").into(),
        console_listen: Some("0.0.0.0:0".parse().unwrap()),
        auth_tokens_file: Some(tokens.clone()),
        ..Settings::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = ControlPlane::start_on(listener, settings())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, control_plane::StartError::ConsoleInCleartext(_)),
        "{refused}"
    );
    assert!(refused.to_string().contains("--tls-cert"), "{refused}");
    // (Accepted with console_allow_cleartext: not started here, since tests
    // bind only loopback addresses.)
}

/// Issue 41, item 7: idle sockets on every listener (gRPC, console, metrics)
/// are capped and closed; the admin API and the other listeners keep answering.
#[tokio::test(flavor = "multi_thread")]
async fn idle_sockets_cannot_hold_any_listener() {
    use tokio::io::AsyncReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "ops admin s3cret-admin-token\n").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp = ControlPlane::start_on(
        listener,
        Settings {
            database: dir.path().join("cp.db").into(),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            console_listen: Some("127.0.0.1:0".parse().unwrap()),
            auth_tokens_file: Some(tokens),
            listener_limits: gateway_listener::Limits {
                max_connections: 16,
                first_bytes_timeout: Duration::from_millis(500),
                idle_timeout: Duration::from_secs(2),
            },
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    let targets = [
        cp.local_addr(),
        cp.console_addr().unwrap(),
        cp.metrics_addr().unwrap(),
    ];
    // 40 idle sockets on each: 24 closed at once by the cap, 16 at the first-bytes deadline.
    let mut idle = Vec::new();
    for addr in targets {
        for _ in 0..40 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
    }
    for (i, s) in idle.iter_mut().enumerate() {
        // Read to the end (an HTTP/2 server sends its SETTINGS first).
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "idle socket {i} was not closed");
    }
    // Every listener answers.
    let mut admin = gateway_proto::v1::admin_service_client::AdminServiceClient::connect(format!(
        "http://{}",
        cp.local_addr()
    ))
    .await
    .unwrap();
    let mut req = tonic::Request::new(gateway_proto::v1::ListRoutesRequest::default());
    req.metadata_mut().insert(
        "authorization",
        "Bearer s3cret-admin-token".parse().unwrap(),
    );
    admin.list_routes(req).await.unwrap();
    assert!(
        http_get(targets[1], "/signin")
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert!(
        http_get(targets[2], "/metrics")
            .await
            .starts_with("HTTP/1.1 200")
    );
    cp.stop().await.unwrap();
}

/// Issue 41, item 10: the database file (and its WAL) is readable by its owner only.
#[tokio::test(flavor = "multi_thread")]
async fn the_database_file_is_mode_0600() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cp.db");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cp = ControlPlane::start_on(
        listener,
        Settings {
            database: db.clone().into(),
            insecure_open: true,
            ..Settings::default()
        },
    )
    .await
    .unwrap();
    for file in [db.clone(), dir.path().join("cp.db-wal")] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
    cp.stop().await.unwrap();
}
