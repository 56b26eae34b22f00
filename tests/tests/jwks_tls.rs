//! `--jwks-url https://…` with `--jwks-ca` through a real data plane (issue 25,
//! item 10): the test serves a JWKS over TLS with a throwaway CA
//! (devstack's `Pki`) and signs its own tokens with the published key. A data
//! plane given that CA verifies them; one given another CA fetches no key,
//! answers 401, and its log says the certificate was refused.
//!
//! Needs the binaries built (`cargo build --workspace --bins`) and
//! `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use devstack::Stack;
use devstack::pki::Pki;
use gateway_tests::{client, poll};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Serves `jwks` over HTTPS on 127.0.0.1 with `pki`'s server certificate
/// (which names `localhost` and `127.0.0.1`), one response per connection.
/// Returns the port; the server lives as long as the test's runtime.
async fn tls_jwks_server(pki: &Pki, jwks: String) -> Result<u16> {
    let chain = CertificateDer::pem_file_iter(&pki.server_cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&pki.server_key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let response = Arc::new(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{jwks}",
        jwks.len()
    ));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, response) = (acceptor.clone(), response.clone());
            tokio::spawn(async move {
                // A client that does not trust the certificate ends the handshake here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = [0u8; 4096];
                let _ = tls.read(&mut request).await;
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    Ok(port)
}

/// An Ed25519 key: its JWKS document (kid `tls-k1`) and a token for `carol`
/// that the data plane's default issuer and audience accept.
fn jwks_and_token() -> Result<(String, String)> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let x = URL_SAFE_NO_PAD.encode(key.public_key_raw());
    let jwks = format!(
        r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"tls-k1","alg":"EdDSA","use":"sig"}}]}}"#
    );
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let claims = serde_json::json!({
        "sub": "carol", "role": "user", "iss": "gateway-auth", "aud": "gateway",
        "exp": now + 600, "nbf": now, "iat": now
    });
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some("tls-k1".into());
    let token = jsonwebtoken::encode(
        &header,
        &claims,
        &EncodingKey::from_ed_pem(key.serialize_pem().as_bytes())?,
    )?;
    Ok((jwks, token))
}

/// A stack without the auth service whose data plane takes its keys from `url`, trusting `ca`.
async fn stack(url: &str, ca: &Path) -> Result<Stack> {
    Stack::new()
        .data_planes(1)
        .auth(false)
        .data_plane_arg(format!("--jwks-url={url}"))
        .data_plane_arg(format!("--jwks-ca={}", ca.display()))
        .start()
        .await
        .context("starting the stack")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_jwks_is_trusted_only_through_its_ca() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let right = Pki::generate(&dir.path().join("right"))?;
    let wrong = Pki::generate(&dir.path().join("wrong"))?;
    let (jwks, token) = jwks_and_token()?;
    let port = tls_jwks_server(&right, jwks).await?;
    let url = format!("https://127.0.0.1:{port}/.well-known/jwks.json");
    let http = client();

    // The right CA: the token signed with the published key is accepted.
    let trusted = stack(&url, &right.ca).await?;
    let gw = trusted.gateways()[0].clone();
    let body: serde_json::Value = poll(Duration::from_secs(10), "a verified request", || {
        let request = http.get(format!("{gw}/api/users/1")).bearer_auth(&token);
        async move {
            let response = request.send().await.map_err(|e| e.to_string())?;
            if response.status() != 200 {
                return Err(format!("status {}", response.status()));
            }
            response.json().await.map_err(|e| e.to_string())
        }
    })
    .await?;
    ensure!(
        body["headers"]["x-user-id"] == "carol",
        "the backend did not get the verified identity: {body}"
    );
    trusted.shutdown().await;

    // Another CA: no key is fetched, the request is refused, the log says why.
    let refusing = stack(&url, &wrong.ca).await?;
    let gw = refusing.gateways()[0].clone();
    let response = http
        .get(format!("{gw}/api/users/1"))
        .bearer_auth(&token)
        .send()
        .await?;
    ensure!(
        response.status() == 401,
        "a JWKS behind an untrusted certificate was used: {}",
        response.status()
    );
    let name = refusing.data_plane_names()[0].clone();
    let log = poll(Duration::from_secs(10), "the refusal in the log", || {
        let log = refusing.log_tail(&name, 200);
        async move {
            // Both CAs are named "devstack throwaway CA", so rustls reports the
            // chain as a bad signature rather than an unknown issuer.
            if log.contains("JWKS fetch failed") && log.contains("invalid peer certificate") {
                Ok(log)
            } else {
                Err(log)
            }
        }
    })
    .await?;
    ensure!(
        log.contains(&url),
        "the log does not name the JWKS URL:\n{log}"
    );
    refusing.shutdown().await;
    Ok(())
}
