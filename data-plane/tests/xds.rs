//! The config stream end to end: a real data plane (in-process, through the
//! library) against an in-test control plane. ACK of a good snapshot, NACK of a
//! bad one while the good one stays in service, and a restart from the disk
//! cache while the control plane is gone.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use gateway_proto::v1::ConfigRequest;
use http::StatusCode;

fn assert_ack(req: &ConfigRequest, version: &str, nonce: &str) {
    assert_eq!(req.response_nonce, nonce, "{req:?}");
    assert_eq!(req.version_info, version, "{req:?}");
    assert!(req.error_detail.is_empty(), "expected an ACK, got {req:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ack_nack_and_restart_from_cache() {
    let up_a = TestUpstream::start("a").await;
    let up_b = TestUpstream::start("b").await;
    let mut cp = FakeControlPlane::start().await;
    let cache = tempfile::tempdir().unwrap();

    let good = snapshot(
        1,
        vec![route("api", "/api", "svc")],
        vec![upstream("svc", &[("a", up_a.url())])],
    );
    cp.push(&good, "nonce-1");

    let dp = start_data_plane(&cp.url(), cache.path(), &[]).await;

    // The stream opens with the node and no version (nothing cached yet).
    let hello = cp.next_request().await;
    let node = hello.node.as_ref().expect("node on the first message");
    assert_eq!(node.id, "dp-test");
    assert!(!node.hostname.is_empty());
    assert_eq!(node.build_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(hello.version_info, "");
    assert_eq!(hello.response_nonce, "");

    assert_ack(&cp.next_request().await, "1", "nonce-1");
    let (status, _, _) = get(dp.proxy_addr(), "/api/x").await;
    assert_eq!(status, StatusCode::OK);

    // Status reports come on messages of their own (no nonce: no ACK, no NACK)
    // and, once version 1 is served, list its instance as the balancer sees it.
    let report = loop {
        let r = cp.next_report().await;
        assert_eq!(r.response_nonce, "", "{r:?}");
        assert!(r.error_detail.is_empty(), "{r:?}");
        if r.version_info == "1" {
            break r.upstream_health.unwrap();
        }
    };
    let [instance] = &report.instances[..] else {
        panic!("{report:?}")
    };
    assert_eq!(
        (instance.upstream.as_str(), instance.instance.as_str()),
        ("svc", "a")
    );
    assert_eq!(instance.url, up_a.url());
    assert!(instance.healthy);
    assert_eq!(instance.breaker, "closed");
    let (_, headers, _) = get(dp.proxy_addr(), "/api/x").await;
    assert_eq!(headers["x-instance-id"], "a");
    assert_eq!(ops(&dp, "/readyz").await.0, StatusCode::OK);
    let (_, config) = ops(&dp, "/config").await;
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["version"], 1);
    assert_eq!(config["hash"], "hash-1");

    // A snapshot the data plane cannot apply: a route naming a missing upstream,
    // and an instance with a URL it cannot connect to.
    let mut bad = snapshot(
        2,
        vec![
            route("api", "/api", "svc"),
            route("ghost", "/ghost", "nowhere"),
        ],
        vec![upstream("svc", &[("b", "ftp://b.example:443".into())])],
    );
    bad.hash = "hash-2".into();
    cp.push(&bad, "nonce-2");
    let nack = cp.next_request().await;
    assert_eq!(nack.response_nonce, "nonce-2", "{nack:?}");
    assert_eq!(
        nack.version_info, "1",
        "a NACK names the version still served"
    );
    assert!(
        nack.error_detail
            .contains("upstream \"nowhere\" does not exist"),
        "{}",
        nack.error_detail
    );
    assert!(nack.error_detail.contains("url"), "{}", nack.error_detail);

    // The old configuration is still served.
    let (status, headers, _) = get(dp.proxy_addr(), "/api/x").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-instance-id"], "a");
    let (_, config) = ops(&dp, "/config").await;
    assert!(config.contains("\"version\":1"), "{config}");
    let (_, metrics) = ops(&dp, "/metrics").await;
    assert_eq!(
        metric(&metrics, "gateway_config_updates_total{result=\"nack\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&metrics, "gateway_control_plane_connected"),
        Some(1.0)
    );

    // A later good snapshot is applied.
    let v3 = snapshot(
        3,
        vec![route("api", "/api", "svc")],
        vec![upstream("svc", &[("b", up_b.url())])],
    );
    cp.push(&v3, "nonce-3");
    assert_ack(&cp.next_request().await, "3", "nonce-3");
    let (_, headers, _) = get(dp.proxy_addr(), "/api/x").await;
    assert_eq!(headers["x-instance-id"], "b");

    // Restart with the control plane gone: the cache (version 3) is served.
    dp.shutdown().await;
    let cp_url = cp.url();
    cp.kill().await;
    let dp = start_data_plane(&cp_url, cache.path(), &[]).await;
    assert_eq!(
        ops(&dp, "/readyz").await.0,
        StatusCode::OK,
        "ready from the cache alone"
    );
    let (status, headers, _) = get(dp.proxy_addr(), "/api/x").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-instance-id"], "b");
    let (_, config) = ops(&dp, "/config").await;
    assert!(config.contains("\"version\":3"), "{config}");
    let (_, metrics) = ops(&dp, "/metrics").await;
    assert_eq!(
        metric(&metrics, "gateway_control_plane_connected"),
        Some(0.0)
    );
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reconnects_announce_the_cached_version_and_readyz_waits_for_config() {
    let up = TestUpstream::start("a").await;
    let cache = tempfile::tempdir().unwrap();
    let mut cp = FakeControlPlane::start().await;

    // Nothing pushed yet: not ready, requests get 503.
    let dp = start_data_plane(&cp.url(), cache.path(), &[]).await;
    let hello = cp.next_request().await;
    assert_eq!(hello.version_info, "");
    assert_eq!(ops(&dp, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _, body) = get(dp.proxy_addr(), "/api").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("not-ready"), "{body}");

    cp.push(
        &snapshot(
            5,
            vec![route("api", "/api", "svc")],
            vec![upstream("svc", &[("a", up.url())])],
        ),
        "n5",
    );
    assert_ack(&cp.next_request().await, "5", "n5");
    eventually("readyz 200", || async {
        (ops(&dp, "/readyz").await.0 == StatusCode::OK).then_some(())
    })
    .await;
    dp.shutdown().await;

    // A new data plane with the same cache announces version 5 when it connects.
    let dp = start_data_plane(&cp.url(), cache.path(), &[]).await;
    let hello = cp.next_request().await;
    assert_eq!(hello.version_info, "5");
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn draining_answers_readyz_503_but_serves_until_the_delay_ends() {
    let up = TestUpstream::start("a").await;
    let cache = tempfile::tempdir().unwrap();
    let mut cp = FakeControlPlane::start().await;
    let dp = start_data_plane(&cp.url(), cache.path(), &[]).await;
    cp.next_request().await;
    cp.push(
        &snapshot(
            1,
            vec![route("api", "/api", "svc")],
            vec![upstream("svc", &[("a", up.url())])],
        ),
        "n1",
    );
    assert_ack(&cp.next_request().await, "1", "n1");
    eventually("readyz 200", || async {
        (ops(&dp, "/readyz").await.0 == StatusCode::OK).then_some(())
    })
    .await;
    let (proxy, admin) = (dp.proxy_addr(), dp.admin_addr());

    let drained = tokio::spawn(dp.drain_then_shutdown(std::time::Duration::from_secs(5)));
    eventually("readyz 503 while draining", || async {
        (get(admin, "/readyz").await.0 == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await;
    // Not ready, yet still serving (the listener closes only after the delay).
    assert_eq!(get(proxy, "/api").await.0, StatusCode::OK);
    drained.await.unwrap();
    // And then the listener is gone.
    assert!(tokio::net::TcpStream::connect(proxy).await.is_err());
}

/// `--control-plane A,B`: the stream goes to one replica; when it dies, the
/// data plane keeps serving, reconnects to the other, announces the version it
/// serves and takes the other's later changes.
#[tokio::test(flavor = "multi_thread")]
async fn fails_over_to_the_next_control_plane_endpoint() {
    let up = TestUpstream::start("a").await;
    let mut a = FakeControlPlane::start().await;
    let mut b = FakeControlPlane::start().await;
    let cache = tempfile::tempdir().unwrap();
    let v1 = snapshot(
        1,
        vec![route("api", "/api", "svc")],
        vec![upstream("svc", &[("a", up.url())])],
    );
    a.push(&v1, "a-1");
    b.push(&v1, "b-1");
    let endpoints = format!("{},{}", a.url(), b.url());
    let dp = start_data_plane(&endpoints, cache.path(), &[]).await;

    // The first endpoint is chosen at random: see which one the stream opened on.
    let (mut first, mut other, nonce) = tokio::select! {
        hello = a.next_request() => { assert!(hello.node.is_some()); (a, b, "a-1") }
        hello = b.next_request() => { assert!(hello.node.is_some()); (b, a, "b-1") }
    };
    assert_ack(&first.next_request().await, "1", nonce);
    assert_eq!(get(dp.proxy_addr(), "/api/x").await.0, StatusCode::OK);

    // The replica dies; a change is committed on the other one meanwhile.
    first.kill().await;
    let v2 = snapshot(
        2,
        vec![route("api", "/api", "svc"), route("more", "/more", "svc")],
        vec![upstream("svc", &[("a", up.url())])],
    );
    other.push(&v2, "other-2");
    // Still serving what it has.
    assert_eq!(get(dp.proxy_addr(), "/api/x").await.0, StatusCode::OK);

    let hello = other.next_request().await;
    assert_eq!(
        hello.version_info, "1",
        "the reconnect announces the served version"
    );
    assert_ack(&other.next_request().await, "2", "other-2");
    assert_eq!(get(dp.proxy_addr(), "/more/x").await.0, StatusCode::OK);
    let (_, config) = ops(&dp, "/config").await;
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["version"], 2);
}

/// A certificate for `host` and its key, made now (no fixed PEM file that expires).
fn certificate(name: &str, host: &str) -> gateway_proto::v1::Certificate {
    let key = rcgen::KeyPair::generate().unwrap();
    let chain = rcgen::CertificateParams::new(vec![host.to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    gateway_proto::v1::Certificate {
        name: name.into(),
        sni_hosts: vec![host.into()],
        cert_chain_pem: chain,
        private_key_pem: key.serialize_pem(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_with_certificates_is_acked_and_cached_and_a_bad_key_is_nacked() {
    let up = TestUpstream::start("a").await;
    let cache = tempfile::tempdir().unwrap();
    let mut cp = FakeControlPlane::start().await;
    let dp = start_data_plane(&cp.url(), cache.path(), &[]).await;
    cp.next_request().await;

    let edge = certificate("default", "localhost");
    let mut good = snapshot(
        1,
        vec![route("api", "/api", "svc")],
        vec![upstream("svc", &[("a", up.url())])],
    );
    good.certificates = vec![edge.clone(), certificate("api", "api.example.com")];
    cp.push(&good, "n1");
    assert_ack(&cp.next_request().await, "1", "n1");
    assert_eq!(get(dp.proxy_addr(), "/api/x").await.0, StatusCode::OK);
    // Kept with the snapshot (the HTTPS listener will need them), in the
    // owner-only cache file.
    let cached = std::fs::read_to_string(cache.path().join("config-snapshot.json")).unwrap();
    let cached: gateway_proto::v1::ConfigSnapshot = serde_json::from_str(&cached).unwrap();
    assert_eq!(cached.certificates.len(), 2);
    assert_eq!(cached.certificates[0].private_key_pem, edge.private_key_pem);

    // A key that is not the certificate's: NACKed with the reason, v1 stays.
    let mut bad = snapshot(
        2,
        vec![route("api", "/api", "svc")],
        vec![upstream("svc", &[("a", up.url())])],
    );
    let mut mismatched = certificate("default", "localhost");
    mismatched.private_key_pem = certificate("x", "localhost").private_key_pem;
    bad.certificates = vec![mismatched.clone()];
    cp.push(&bad, "n2");
    let nack = cp.next_request().await;
    assert_eq!(
        (nack.response_nonce.as_str(), nack.version_info.as_str()),
        ("n2", "1")
    );
    assert!(
        nack.error_detail.contains(
            "certificate \"default\": private_key_pem does not match the public key of the certificate"
        ),
        "{}",
        nack.error_detail
    );
    assert!(
        !nack.error_detail.contains("PRIVATE KEY"),
        "{}",
        nack.error_detail
    );
    assert_eq!(get(dp.proxy_addr(), "/api/x").await.0, StatusCode::OK);
    let (_, config) = ops(&dp, "/config").await;
    assert!(config.contains("\"version\":1"), "{config}");
    assert!(!config.contains("PRIVATE KEY"), "{config}");
    dp.shutdown().await;
}
