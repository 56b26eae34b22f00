//! The orders mock serving TLS (`mock_service::serve_tls`, as `--tls-cert`
//! and `--client-ca` do), for `mock_tls.rs` and `upstream_tls.rs`.

use std::net::SocketAddr;

use devstack::pki::Pki;
use gateway_telemetry::Tracer;
use mock_service::{MockConfig, Service};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// An orders mock (instance `orders-tls`) on a free port with `pki`'s server
/// certificate, requiring a client certificate from `pki`'s CA when
/// `client_ca`; dropping the sender stops it.
pub(crate) async fn start(pki: &Pki, client_ca: bool) -> (SocketAddr, oneshot::Sender<()>) {
    let tls = mock_service::tls::acceptor(
        &pki.server_cert,
        &pki.server_key,
        client_ca.then_some(pki.ca.as_path()),
    )
    .expect("the PKI's files make a TLS acceptor");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("its address");
    let (tx, rx) = oneshot::channel::<()>();
    let config = MockConfig::new(Service::Orders, "orders-tls", 0.0).expect("a valid mock config");
    tokio::spawn(mock_service::serve_tls(
        listener,
        config,
        Tracer::disabled(),
        tls,
        async move {
            let _ = rx.await;
        },
    ));
    (addr, tx)
}
