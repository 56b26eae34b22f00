//! The mocks as HTTPS upstreams (`--tls-cert`, `--client-ca`): HTTP/1.1 and
//! h2 chosen by ALPN over one listener, a client certificate required when
//! asked. They are the backends of the TLS upstream
//! tests (issue 27).
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::sync::Arc;

use bytes::Bytes;
use devstack::pki::Pki;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

mod tls_mock;

/// A client trusting the stack's CA, offering `alpn`, with the client
/// certificate when `identify`, limited to `versions`.
fn connector(
    pki: &Pki,
    alpn: &[&[u8]],
    identify: bool,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&pki.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut config = if identify {
        let chain = CertificateDer::pem_file_iter(&pki.client_cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(&pki.client_key).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

/// GET /orders/7 over a new TLS connection; the negotiated ALPN, the HTTP
/// version of the answer and its body.
async fn get(
    addr: &str,
    tls: TlsConnector,
) -> anyhow::Result<(Option<Vec<u8>>, http::Version, serde_json::Value)> {
    let tcp = TcpStream::connect(addr).await?;
    let stream = tls.connect(ServerName::try_from("localhost")?, tcp).await?;
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let req = http::Request::get(format!("https://{addr}/orders/7"))
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())?;
    let resp = if alpn.as_deref() == Some(b"h2") {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(conn);
        send.send_request(req).await?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        send.send_request(req).await?
    };
    let version = resp.version();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((alpn, version, serde_json::from_slice(&body)?))
}

const MODERN: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

#[tokio::test(flavor = "multi_thread")]
async fn https_with_alpn_h2_and_http1_on_one_listener() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path()).unwrap();
    let (addr, _stop) = tls_mock::start(&pki, false).await;
    let addr = addr.to_string();

    let (alpn, version, doc) = get(&addr, connector(&pki, &[b"h2", b"http/1.1"], false, MODERN))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(version, http::Version::HTTP_2);
    assert_eq!(doc["instance"], "orders-tls");
    assert_eq!(doc["id"], "7");

    let (alpn, version, doc) = get(&addr, connector(&pki, &[b"http/1.1"], false, MODERN))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(version, http::Version::HTTP_11);
    assert_eq!(doc["instance"], "orders-tls");

    // TLS 1.2 alone is accepted too.
    get(
        &addr,
        connector(&pki, &[b"http/1.1"], false, &[&rustls::version::TLS12]),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_certificate_is_required_with_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path()).unwrap();
    let (addr, _stop) = tls_mock::start(&pki, true).await;
    let addr = addr.to_string();
    let (_, _, doc) = get(&addr, connector(&pki, &[b"h2"], true, MODERN))
        .await
        .unwrap();
    assert_eq!(doc["instance"], "orders-tls");
    // Without one the handshake (TLS 1.3: the first read after it) fails.
    let refused = get(&addr, connector(&pki, &[b"h2"], false, MODERN)).await;
    assert!(refused.is_err(), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_over_tls_with_a_client_certificate() {
    use mock_service::grpc::v1::EchoRequest;
    use mock_service::grpc::v1::echo_client::EchoClient;
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path()).unwrap();
    let (addr, _stop) = tls_mock::start(&pki, true).await;
    let addr = addr.to_string();
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(read(&pki.ca)))
        .identity(Identity::from_pem(
            read(&pki.client_cert),
            read(&pki.client_key),
        ));
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let reply = EchoClient::new(channel)
        .unary(EchoRequest {
            message: "over h2 and TLS".into(),
            ..EchoRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.message, "over h2 and TLS");
    assert_eq!(reply.instance, "orders-tls");
}
