//! `--proxy-protocol` (issue 41, item 1) against a real data plane: a TCP
//! proxy in front names the client in a PROXY v2 header, on the cleartext
//! and the HTTPS listener.
//!
//! * from a trusted peer, the header's source is the client: `ip_allow`
//!   decides on it, the upstream's `X-Forwarded-For` and `-Proto` are the
//!   data plane's own, and the client's forwarding headers are not believed;
//! * a trusted peer's connection without a header is closed unanswered;
//! * a peer that is not trusted cannot send one: 400 and a close on the
//!   cleartext listener, a failed handshake on the HTTPS one;
//! * a `LOCAL` header (a health check) keeps the real peer.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::Route;
use gateway_tests::{RawResponse, one_data_plane, open_route, upsert_route_synced};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

/// The address the tests' "edge" connects from: the only trusted proxy.
const EDGE: &str = "127.0.0.2";
/// Every wait's bound.
const DEADLINE: Duration = Duration::from_secs(20);

/// A data plane that expects PROXY headers from [`EDGE`], with `/open` (any
/// client) and `/allow` (only 203.0.113.0/24) → `users`, the mock that
/// answers with the headers it got.
async fn stack() -> Result<Stack> {
    let stack = one_data_plane(&[
        &format!("--trusted-proxies={EDGE}/32"),
        "--proxy-protocol",
        "--header-read-timeout-ms=2000",
    ])
    .await;
    upsert_route_synced(&stack, open_route("open", "/open/users", "users", "/users")).await?;
    let allow = Route {
        ip_allow: vec!["203.0.113.0/24".to_owned()],
        ..open_route("allow", "/allow/users", "users", "/users")
    };
    upsert_route_synced(&stack, allow).await?;
    Ok(stack)
}

/// A PROXY v2 header: `PROXY` from `source` (TCP over IPv4) to `destination`,
/// with a NOOP TLV; or `LOCAL` without addresses.
fn header(proxied: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    let Some((SocketAddr::V4(src), SocketAddr::V4(dst))) = proxied else {
        h.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        return h;
    };
    h.extend_from_slice(&[0x21, 0x11, 0x00, 12 + 3]);
    h.extend_from_slice(&src.ip().octets());
    h.extend_from_slice(&dst.ip().octets());
    h.extend_from_slice(&src.port().to_be_bytes());
    h.extend_from_slice(&dst.port().to_be_bytes());
    h.extend_from_slice(&[0x04, 0x00, 0x00]);
    h
}

/// `PROXY` naming `client` as the source.
fn proxy_from(client: &str) -> Vec<u8> {
    header(Some((
        format!("{client}:50000").parse().unwrap(),
        "10.0.0.5:8080".parse().unwrap(),
    )))
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse()?, 0))?;
    Ok(socket.connect(to).await?)
}

/// A GET of `path` that asks to close, with the spoofed forwarding headers a
/// client would try.
fn spoofing_get(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nhost: gw.test\r\nx-forwarded-for: 203.0.113.9\r\n\
         x-forwarded-proto: https\r\nx-real-ip: 203.0.113.9\r\n\
         forwarded: for=203.0.113.9;proto=https\r\nconnection: close\r\n\r\n"
    )
}

/// Sends `bytes` on `io` and reads until the server closes (within [`DEADLINE`]).
async fn exchange<IO: AsyncRead + AsyncWrite + Unpin>(
    io: &mut IO,
    bytes: &[u8],
) -> Result<Vec<u8>> {
    io.write_all(bytes).await?;
    let mut raw = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match io.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => raw.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .context("the connection was still open")?;
    Ok(raw)
}

/// The header named `name` of the mock's echo in `resp` (200 required).
fn seen(resp: &RawResponse, name: &str) -> Result<Option<String>> {
    ensure!(
        resp.status == 200,
        "status {}: {}",
        resp.status,
        String::from_utf8_lossy(&resp.body)
    );
    Ok(resp.json()?["headers"][name].as_str().map(str::to_owned))
}

fn gateway(stack: &Stack) -> SocketAddr {
    stack.gateways()[0]
        .trim_start_matches("http://")
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_a_trusted_proxy_names_is_the_client() -> Result<()> {
    let stack = stack().await?;
    let gw = gateway(&stack);

    // The header names a client inside the allow list: admitted, whatever it claims.
    let mut s = connect_from(EDGE, gw).await?;
    let mut sent = proxy_from("203.0.113.7");
    sent.extend_from_slice(spoofing_get("/allow/users/1").as_bytes());
    let resp = RawResponse::parse(&exchange(&mut s, &sent).await?)?;
    // The client's X-Forwarded-For is not believed: the client is the header's source.
    let xff = seen(&resp, "x-forwarded-for")?.unwrap_or_default();
    ensure!(xff.ends_with("203.0.113.7"), "x-forwarded-for {xff:?}");
    ensure!(
        seen(&resp, "x-forwarded-proto")?.as_deref() == Some("http"),
        "a cleartext client's X-Forwarded-Proto: https was believed"
    );
    ensure!(seen(&resp, "x-real-ip")?.is_none(), "X-Real-IP passed");
    ensure!(seen(&resp, "forwarded")?.is_none(), "Forwarded passed");

    // A client outside the list claims an address inside it: refused.
    let mut s = connect_from(EDGE, gw).await?;
    let mut sent = proxy_from("198.51.100.1");
    sent.extend_from_slice(spoofing_get("/allow/users/1").as_bytes());
    let resp = RawResponse::parse(&exchange(&mut s, &sent).await?)?;
    ensure!(
        resp.status == 403,
        "spoofed X-Forwarded-For passed ip_allow: {}",
        resp.status
    );

    // LOCAL (a health check): the real peer, the trusted proxy, whose X-Forwarded-For counts.
    let mut s = connect_from(EDGE, gw).await?;
    let mut sent = header(None);
    sent.extend_from_slice(spoofing_get("/allow/users/1").as_bytes());
    let resp = RawResponse::parse(&exchange(&mut s, &sent).await?)?;
    ensure!(resp.status == 200, "LOCAL: {}", resp.status);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_header_is_required_from_trusted_peers_and_refused_from_others() -> Result<()> {
    let stack = stack().await?;
    let gw = gateway(&stack);

    // A trusted peer without a header: closed, nothing answered.
    let mut s = connect_from(EDGE, gw).await?;
    let got = exchange(&mut s, spoofing_get("/open/users/1").as_bytes()).await?;
    ensure!(
        got.is_empty(),
        "answered: {}",
        String::from_utf8_lossy(&got)
    );

    // Any other peer sending one: 400 and a close.
    let mut s = connect_from("127.0.0.1", gw).await?;
    let mut sent = proxy_from("203.0.113.7");
    sent.extend_from_slice(spoofing_get("/allow/users/1").as_bytes());
    let resp = RawResponse::parse(&exchange(&mut s, &sent).await?)?;
    ensure!(resp.status == 400, "status {}", resp.status);

    // The same peer without one is served as before (and believed in nothing).
    let mut s = connect_from("127.0.0.1", gw).await?;
    let resp =
        RawResponse::parse(&exchange(&mut s, spoofing_get("/allow/users/1").as_bytes()).await?)?;
    ensure!(resp.status == 403, "status {}", resp.status);
    let mut s = connect_from("127.0.0.1", gw).await?;
    let resp =
        RawResponse::parse(&exchange(&mut s, spoofing_get("/open/users/1").as_bytes()).await?)?;
    let xff = seen(&resp, "x-forwarded-for")?.unwrap_or_default();
    ensure!(xff.ends_with("127.0.0.1"), "x-forwarded-for {xff:?}");
    Ok(())
}

/// A TLS client trusting the stack's edge CA, offering HTTP/1.1.
fn connector(stack: &Stack) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(stack.edge_ca()).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

#[tokio::test(flavor = "multi_thread")]
async fn on_the_https_listener_the_header_comes_before_the_handshake() -> Result<()> {
    let stack = stack().await?;
    let tls: SocketAddr = format!("127.0.0.1:{}", stack.ports().gateways_tls[0]).parse()?;
    let connector = connector(&stack);
    let name = ServerName::try_from("localhost")?;

    // Through the trusted proxy: the header, then TLS; the header's client decides.
    for (client, want) in [("203.0.113.7", 200), ("198.51.100.1", 403)] {
        let mut tcp = connect_from(EDGE, tls).await?;
        tcp.write_all(&proxy_from(client)).await?;
        let mut s = tokio::time::timeout(DEADLINE, connector.connect(name.clone(), tcp))
            .await
            .context("handshake")??;
        let resp = RawResponse::parse(
            &exchange(&mut s, spoofing_get("/allow/users/1").as_bytes()).await?,
        )?;
        ensure!(resp.status == want, "{client}: status {}", resp.status);
        if want == 200 {
            let xff = seen(&resp, "x-forwarded-for")?.unwrap_or_default();
            ensure!(xff.ends_with(client), "x-forwarded-for {xff:?}");
            ensure!(seen(&resp, "x-forwarded-proto")?.as_deref() == Some("https"));
        }
    }

    // The trusted proxy without a header: no handshake.
    let tcp = connect_from(EDGE, tls).await?;
    let shook = tokio::time::timeout(DEADLINE, connector.connect(name.clone(), tcp))
        .await
        .context("the handshake neither failed nor completed")?;
    ensure!(
        shook.is_err(),
        "a trusted peer without a header completed a handshake"
    );

    // Anyone else with a header: no handshake either.
    let mut tcp = connect_from("127.0.0.1", tls).await?;
    tcp.write_all(&proxy_from("203.0.113.7")).await?;
    let shook = tokio::time::timeout(DEADLINE, connector.connect(name, tcp))
        .await
        .context("the handshake neither failed nor completed")?;
    ensure!(shook.is_err(), "an untrusted peer's PROXY header was read");
    Ok(())
}
