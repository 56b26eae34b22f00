//! TLS on the gRPC listener (`--tls-cert`, `--tls-key`) and client
//! certificates (`--client-ca`), with a throwaway CA made by rcgen: grpcurl
//! over TLS with `-cacert`, a tonic client with and without a client
//! certificate, and a data plane authenticated by its certificate alone.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::{DEADLINE, grpcurl_bin};
use control_plane::{ControlPlane, Settings, TlsFiles};
use gateway_proto::v1::admin_service_client::AdminServiceClient;
use gateway_proto::v1::config_discovery_service_client::ConfigDiscoveryServiceClient;
use gateway_proto::v1::{ConfigRequest, ListRoutesRequest, Node};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::path::{Path, PathBuf};
use tokio::net::TcpListener;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// PEM files of a throwaway PKI in a temp dir.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A client certificate from another CA.
    rogue_cert: PathBuf,
    rogue_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn pki(dir: &Path) -> Pki {
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let authority = ca("gateway test CA");
    let (server_cert, server_key) =
        leaf(&authority, "localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = leaf(&authority, "edge-1", ExtendedKeyUsagePurpose::ClientAuth);
    let rogue = ca("someone else");
    let (rogue_cert, rogue_key) = leaf(&rogue, "edge-x", ExtendedKeyUsagePurpose::ClientAuth);
    Pki {
        ca: write("ca.pem", &authority.pem()),
        server_cert: write("server.pem", &server_cert),
        server_key: write("server-key.pem", &server_key),
        client_cert: write("client.pem", &client_cert),
        client_key: write("client-key.pem", &client_key),
        rogue_cert: write("rogue.pem", &rogue_cert),
        rogue_key: write("rogue-key.pem", &rogue_key),
    }
}

async fn start(dir: &Path, pki: &Pki, client_ca: bool, tokens: Option<&str>) -> ControlPlane {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    // Without tokens and without a client CA it runs open, as --insecure-open.
    let insecure_open = tokens.is_none() && !client_ca;
    let auth_tokens_file = tokens.map(|t| {
        let p = dir.join("tokens");
        std::fs::write(&p, t).unwrap();
        p
    });
    ControlPlane::start_on(
        listener,
        Settings {
            database: dir.join("cp.db").into(),
            tls: Some(TlsFiles {
                cert: pki.server_cert.clone(),
                key: pki.server_key.clone(),
                client_ca: client_ca.then(|| pki.ca.clone()),
            }),
            auth_tokens_file,
            insecure_open,
            ..Settings::default()
        },
    )
    .await
    .unwrap()
}

async fn channel(
    cp: &ControlPlane,
    pki: &Pki,
    identity: Option<(&Path, &Path)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&pki.ca).unwrap()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    }
    Channel::from_shared(format!("https://{}", cp.local_addr()))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

async fn grpcurl(args: &[String]) -> std::process::Output {
    let out = tokio::process::Command::new(grpcurl_bin())
        .args(args)
        .output();
    tokio::time::timeout(DEADLINE, out)
        .await
        .expect("grpcurl hung")
        .unwrap()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn grpcurl_over_tls_with_cacert() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let cp = start(dir.path(), &pki, false, None).await;
    let addr = cp.local_addr().to_string();
    let ca = pki.ca.to_str().unwrap();

    let out = grpcurl(&s(&[
        "-cacert",
        ca,
        "-servername",
        "localhost",
        &addr,
        "gateway.v1.AdminService/ListRoutes",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let out = grpcurl(&s(&[
        "-cacert",
        ca,
        "-servername",
        "localhost",
        &addr,
        "list",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("gateway.v1.AdminService"));

    // Plaintext is refused, and so is an unknown CA.
    let out = grpcurl(&s(&["-plaintext", &addr, "list"])).await;
    assert!(!out.status.success(), "{out:?}");
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, ca_pem_of("unrelated")).unwrap();
    let out = grpcurl(&s(&[
        "-cacert",
        other.to_str().unwrap(),
        "-servername",
        "localhost",
        &addr,
        "list",
    ]))
    .await;
    assert!(!out.status.success(), "{out:?}");

    // A tonic client with the CA works too.
    let mut admin = AdminServiceClient::new(channel(&cp, &pki, None).await.unwrap());
    admin.list_routes(ListRoutesRequest {}).await.unwrap();
    cp.stop().await.unwrap();
}

fn ca_pem_of(name: &str) -> String {
    ca(name).pem()
}

async fn stream(channel: Channel, token: Option<&str>) -> Result<(), tonic::Status> {
    let header: Option<tonic::metadata::MetadataValue<_>> =
        token.map(|t| format!("Bearer {t}").parse().unwrap());
    let mut c =
        ConfigDiscoveryServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
            if let Some(h) = &header {
                r.metadata_mut().insert("authorization", h.clone());
            }
            Ok(r)
        });
    let first = ConfigRequest {
        node: Some(Node {
            id: "edge-1".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut s = c
        .stream_config(tokio_stream::iter(vec![first]))
        .await?
        .into_inner();
    let r = tokio::time::timeout(DEADLINE, s.message())
        .await
        .expect("no snapshot")?;
    assert!(r.is_some(), "stream ended without a snapshot");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn client_ca_requires_a_certificate_which_authenticates_a_data_plane() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let cp = start(
        dir.path(),
        &pki,
        true,
        Some("alice admin admin-token-1\nviewer viewer viewer-token-1\n"),
    )
    .await;

    // No client certificate: the handshake (or the first call) fails.
    let refused = match channel(&cp, &pki, None).await {
        Err(_) => true,
        Ok(ch) => AdminServiceClient::new(ch)
            .list_routes(ListRoutesRequest {})
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    // A certificate from another CA is refused too.
    let refused = match channel(&cp, &pki, Some((&pki.rogue_cert, &pki.rogue_key))).await {
        Err(_) => true,
        Ok(ch) => stream(ch, None).await.is_err(),
    };
    assert!(refused, "a client with a foreign certificate was served");

    // A valid certificate and no token: role data-plane.
    let ch = channel(&cp, &pki, Some((&pki.client_cert, &pki.client_key)))
        .await
        .unwrap();
    stream(ch.clone(), None).await.unwrap();
    let e = AdminServiceClient::new(ch.clone())
        .list_routes(ListRoutesRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("client-cert:"), "{e:?}");
    // A token on top of the certificate decides the role.
    let mut admin = AdminServiceClient::with_interceptor(ch, |mut r: tonic::Request<()>| {
        r.metadata_mut()
            .insert("authorization", "Bearer admin-token-1".parse().unwrap());
        Ok(r)
    });
    admin.list_routes(ListRoutesRequest {}).await.unwrap();

    // grpcurl with -cacert, -cert and -key.
    let addr = cp.local_addr().to_string();
    let out = grpcurl(&s(&[
        "-cacert",
        pki.ca.to_str().unwrap(),
        "-cert",
        pki.client_cert.to_str().unwrap(),
        "-key",
        pki.client_key.to_str().unwrap(),
        "-servername",
        "localhost",
        "-H",
        "authorization: Bearer viewer-token-1",
        &addr,
        "gateway.v1.AdminService/ListConfigVersions",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let out = grpcurl(&s(&[
        "-cacert",
        pki.ca.to_str().unwrap(),
        "-servername",
        "localhost",
        &addr,
        "list",
    ]))
    .await;
    assert!(!out.status.success(), "no client cert accepted: {out:?}");
    cp.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_tls_files_are_clear_startup_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let cases = [
        (
            dir.path().join("missing.pem"),
            pki.server_key.clone(),
            "cannot read TLS file",
        ),
        (pki.server_key.clone(), pki.server_key.clone(), "no PEM"),
        (pki.server_cert.clone(), pki.server_cert.clone(), "no PEM"),
    ];
    for (cert, key, expected) in cases {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let e = ControlPlane::start_on(
            listener,
            Settings {
                database: dir.path().join("cp.db").into(),
                tls: Some(TlsFiles {
                    cert: cert.clone(),
                    key,
                    client_ca: None,
                }),
                insecure_open: true,
                ..Settings::default()
            },
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains(expected), "{cert:?}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_generated_certificate_is_kept_and_trusted_through_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("shared").join("control-plane-ca.pem");
    let start = || async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        ControlPlane::start_on(
            listener,
            Settings {
                database: dir.path().join("cp.db").into(),
                tls_generate: Some(control_plane::tls_generate::TlsGenerate {
                    dir: dir.path().join("tls"),
                    ca: Some(ca.clone()),
                    names: vec!["control-plane".into(), "localhost".into()],
                }),
                insecure_open: true,
                ..Settings::default()
            },
        )
        .await
        .unwrap()
    };
    let list = |cp: &ControlPlane| {
        let url = format!("https://{}", cp.local_addr());
        let ca_pem = std::fs::read(&ca).unwrap();
        async move {
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca_pem))
                .domain_name("localhost");
            let channel = Channel::from_shared(url)
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await?;
            AdminServiceClient::new(channel)
                .list_routes(ListRoutesRequest {})
                .await
                .map(drop)
                .map_err(|e| -> Box<dyn std::error::Error> { Box::new(e) })?;
            Ok::<_, Box<dyn std::error::Error>>(())
        }
    };
    let cp = start().await;
    list(&cp).await.unwrap();
    // Cleartext is not served.
    let plain = Channel::from_shared(format!("http://{}", cp.local_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    assert!(
        AdminServiceClient::new(plain)
            .list_routes(ListRoutesRequest {})
            .await
            .is_err()
    );
    let first_ca = std::fs::read_to_string(&ca).unwrap();
    cp.stop().await.unwrap();

    // A restart keeps the certificate, so data planes keep trusting the same CA file.
    let cp = start().await;
    assert_eq!(std::fs::read_to_string(&ca).unwrap(), first_ca);
    list(&cp).await.unwrap();
    cp.stop().await.unwrap();
}
