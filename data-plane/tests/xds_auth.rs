//! The config stream against the real control plane with authentication:
//! a token (`--control-plane-token`) and client certificates (mTLS). A data
//! plane that is refused keeps serving its cached configuration.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use control_plane::config::{Config, Mutation};
use control_plane::store::MutateOptions;
use control_plane::{ControlPlane, Settings, TlsFiles};
use gateway_proto::v1::DataPlaneState;
use http::StatusCode;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::{TcpListener, TcpStream};

const DP_TOKEN: &str = "dp-secret-Hq7Zt2";
const ADMIN_TOKEN: &str = "admin-secret-Lp4Wd9";

async fn start_cp(dir: &Path, tls: Option<TlsFiles>) -> ControlPlane {
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("ops admin {ADMIN_TOKEN}\nedge data-plane {DP_TOKEN}\n"),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    ControlPlane::start_on(
        listener,
        Settings {
            database: dir.join("cp.db").into(),
            auth_tokens_file: Some(tokens),
            tls,
            ..Settings::default()
        },
    )
    .await
    .unwrap()
}

/// Commits a configuration routing `/api` to `up_url`, tagged by `prefix` route name.
async fn commit(cp: &ControlPlane, extra_route: Option<&str>, up_url: String) -> u64 {
    let mut routes = vec![route("api", "/api", "svc")];
    if let Some(name) = extra_route {
        routes.push(route(name, &format!("/{name}"), "svc"));
    }
    let upstreams = vec![upstream("svc", &[("a", up_url)])];
    cp.store()
        .mutate(
            Mutation::Replace(Config::new(routes, upstreams)),
            &MutateOptions::default(),
        )
        .await
        .unwrap()
        .version
}

async fn served_version(dp: &data_plane::Running) -> Option<u64> {
    let (status, body) = ops(dp, "/config").await;
    if status != StatusCode::OK {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(&body).ok()?["version"].as_u64()
}

async fn wait_version(dp: &data_plane::Running, version: u64) {
    eventually(&format!("data plane serves version {version}"), || async {
        (served_version(dp).await == Some(version)).then_some(())
    })
    .await
}

async fn connected(dp: &data_plane::Running) -> Option<f64> {
    metric(
        &ops(dp, "/metrics").await.1,
        "gateway_control_plane_connected",
    )
}

/// Serving the cache while refused: ready, the cached version, routes work.
async fn assert_serves_cache(dp: &data_plane::Running, version: u64) {
    wait_version(dp, version).await;
    assert_eq!(ops(dp, "/readyz").await.0, StatusCode::OK);
    assert_eq!(get(dp.proxy_addr(), "/api/x").await.0, StatusCode::OK);
    assert_eq!(connected(dp).await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn right_token_syncs_wrong_token_keeps_serving_the_cache() {
    let up = TestUpstream::start("a").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let cp = start_cp(dir.path(), None).await;
    let url = format!("http://{}", cp.local_addr());
    assert_eq!(commit(&cp, None, up.url()).await, 1);

    let dp = start_data_plane(&url, cache.path(), &["--control-plane-token", DP_TOKEN]).await;
    wait_version(&dp, 1).await;
    assert_eq!(commit(&cp, Some("more"), up.url()).await, 2);
    wait_version(&dp, 2).await;
    assert_eq!(get(dp.proxy_addr(), "/more/x").await.0, StatusCode::OK);
    assert_eq!(connected(&dp).await, Some(1.0));
    dp.shutdown().await;

    // Version 3 exists, but these data planes are refused and keep serving version 2.
    assert_eq!(commit(&cp, None, up.url()).await, 3);
    for refused in [
        vec!["--control-plane-token", "not-the-token"],
        vec!["--control-plane-token", ADMIN_TOKEN],
        vec![],
    ] {
        // Through a forwarder that counts connections: every retry is a new one.
        let (proxy, attempts) = counting_forwarder(cp.local_addr()).await;
        let dp = start_data_plane(&format!("http://{proxy}"), cache.path(), &refused).await;
        assert_serves_cache(&dp, 2).await;
        eventually("the refused data plane retries", || async {
            (attempts.load(Ordering::SeqCst) >= 2).then_some(())
        })
        .await;
        let connects = || async {
            metric(
                &ops(&dp, "/metrics").await.1,
                "gateway_control_plane_connects_total",
            )
        };
        assert_eq!(connects().await, Some(0.0), "{refused:?}");
        assert_eq!(served_version(&dp).await, Some(2), "{refused:?}");
        assert!(
            cp.nodes()
                .list_local(3)
                .iter()
                .all(|n| n.node_id != "dp-test" || n.status != DataPlaneState::Synced as i32),
            "a refused data plane is listed as synced"
        );
        dp.shutdown().await;
    }

    // The right token again: catches up to version 3.
    let dp = start_data_plane(&url, cache.path(), &["--control-plane-token", DP_TOKEN]).await;
    wait_version(&dp, 3).await;
    dp.shutdown().await;
    cp.stop().await.unwrap();
}

/// A TCP forwarder to `target` counting the connections it accepts.
async fn counting_forwarder(target: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, count)
}

struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn pki(dir: &Path) -> Pki {
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str, usage| {
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (sc, sk) = leaf("localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let (cc, ck) = leaf("edge-1", ExtendedKeyUsagePurpose::ClientAuth);
    Pki {
        ca: write("ca.pem", ca.pem()),
        server_cert: write("server.pem", sc),
        server_key: write("server-key.pem", sk),
        client_cert: write("client.pem", cc),
        client_key: write("client-key.pem", ck),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn client_certificate_authenticates_without_a_token() {
    let up = TestUpstream::start("a").await;
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let cp = start_cp(
        dir.path(),
        Some(TlsFiles {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
            client_ca: Some(pki.ca.clone()),
        }),
    )
    .await;
    // The certificate names localhost; connect by that name.
    let url = format!("https://localhost:{}", cp.local_addr().port());
    assert_eq!(commit(&cp, None, up.url()).await, 1);
    let ca = pki.ca.to_str().unwrap();
    let with_cert = [
        "--control-plane-ca",
        ca,
        "--tls-cert",
        pki.client_cert.to_str().unwrap(),
        "--tls-key",
        pki.client_key.to_str().unwrap(),
    ];

    let dp = start_data_plane(&url, cache.path(), &with_cert).await;
    wait_version(&dp, 1).await;
    assert_eq!(connected(&dp).await, Some(1.0));
    dp.shutdown().await;

    // Without a client certificate: refused, serves the cache.
    assert_eq!(commit(&cp, Some("more"), up.url()).await, 2);
    let dp = start_data_plane(&url, cache.path(), &["--control-plane-ca", ca]).await;
    assert_serves_cache(&dp, 1).await;
    assert_eq!(
        get(dp.proxy_addr(), "/more/x").await.0,
        StatusCode::NOT_FOUND
    );
    dp.shutdown().await;

    // Restarted with the certificate: syncs.
    let dp = start_data_plane(&url, cache.path(), &with_cert).await;
    wait_version(&dp, 2).await;
    assert_eq!(get(dp.proxy_addr(), "/more/x").await.0, StatusCode::OK);
    dp.shutdown().await;
    cp.stop().await.unwrap();
}
