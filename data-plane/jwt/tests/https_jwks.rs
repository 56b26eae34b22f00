//! `https://` JWKS against a real TLS server started here, with a throwaway
//! CA (rcgen): keys are fetched and tokens verified with the right CA; the
//! wrong CA, the system's roots (which do not hold the throwaway CA) and a
//! certificate for another name are refused with an error that says so.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey as _;
use gateway_jwt::{JwtConfig, JwtConfigError, JwtError, JwtVerifier};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA: its PEM file, and what signs leaf certificates.
struct Ca {
    pem: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

fn ca(dir: &Path, name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} throwaway CA"));
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let pem = dir.join(format!("{name}.pem"));
    std::fs::write(&pem, issuer.pem()).unwrap();
    Ca { pem, issuer }
}

/// A TLS JWKS server on 127.0.0.1 whose certificate (signed by `ca`) names
/// only `127.0.0.1`. Returns its port; it stops with the test's runtime.
async fn https_jwks_server(ca: &Ca, jwks: String) -> u16 {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "jwks test server");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = Bytes::from(jwks);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let body = body.clone();
            tokio::spawn(async move {
                // A refused handshake (the client did not trust us) ends here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |_req| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(body)))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    port
}

/// A signing key, its JWKS document and a valid token for `alice`.
fn key_jwks_and_token() -> (String, String) {
    let signing = SigningKey::from_bytes(&[11; 32]);
    let x = URL_SAFE_NO_PAD.encode(signing.verifying_key().as_bytes());
    let jwks = format!(
        r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"k1","alg":"EdDSA","use":"sig"}}]}}"#
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "sub": "alice", "role": "user", "iss": "gateway-auth", "aud": "gateway",
        "exp": now + 600, "nbf": now, "iat": now
    });
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some("k1".into());
    let der = signing.to_pkcs8_der().unwrap();
    let token =
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ed_der(der.as_bytes())).unwrap();
    (jwks, token)
}

fn config(url: String, ca: Option<&Path>) -> JwtConfig {
    JwtConfig {
        jwks_url: url,
        jwks_ca: ca.map(Path::to_path_buf),
        refresh_interval: Duration::ZERO,
        fetch_timeout: Duration::from_secs(5),
        ..JwtConfig::default()
    }
}

#[tokio::test]
async fn https_jwks_is_verified_with_the_right_ca_and_refused_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let right = ca(dir.path(), "right");
    let wrong = ca(dir.path(), "wrong");
    let (jwks, token) = key_jwks_and_token();
    let port = https_jwks_server(&right, jwks).await;
    let url = format!("https://127.0.0.1:{port}/.well-known/jwks.json");

    // The right CA: keys fetched over TLS, a token verified with them.
    let verifier = JwtVerifier::new(config(url.clone(), Some(&right.pem))).unwrap();
    assert_eq!(verifier.refresh_now().await, Ok(1));
    let identity = verifier.verify(&token).await.unwrap();
    assert_eq!(
        (identity.sub.as_str(), identity.role.as_str()),
        ("alice", "user")
    );

    // The wrong CA: no key, and the error says why.
    let verifier = JwtVerifier::new(config(url.clone(), Some(&wrong.pem))).unwrap();
    let err = verifier.refresh_now().await.unwrap_err();
    let JwtError::KeysUnavailable(reason) = &err else {
        panic!("expected KeysUnavailable, got {err:?}");
    };
    assert!(reason.contains(&url), "{reason}");
    assert!(
        reason.contains("invalid peer certificate") && reason.contains("UnknownIssuer"),
        "{reason}"
    );
    assert!(matches!(
        verifier.verify(&token).await,
        Err(JwtError::KeysUnavailable(_))
    ));

    // No CA: the system's roots, which do not hold the throwaway CA.
    let verifier = JwtVerifier::new(config(url.clone(), None)).unwrap();
    let reason = verifier.refresh_now().await.unwrap_err().to_string();
    assert!(reason.contains("UnknownIssuer"), "{reason}");

    // The right CA, but the certificate does not name the host asked for.
    let other_name = format!("https://localhost:{port}/.well-known/jwks.json");
    let verifier = JwtVerifier::new(config(other_name, Some(&right.pem))).unwrap();
    let reason = verifier.refresh_now().await.unwrap_err().to_string();
    assert!(
        reason.contains("invalid peer certificate")
            && reason.contains("not valid for name \"localhost\""),
        "{reason}"
    );
}

#[test]
fn ca_settings_are_checked_when_the_verifier_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let ca_pem = ca(dir.path(), "any").pem;

    // A CA with a plain-HTTP URL could never be used.
    let err = JwtVerifier::new(config(
        "http://127.0.0.1:4000/.well-known/jwks.json".into(),
        Some(&ca_pem),
    ))
    .unwrap_err();
    assert!(matches!(err, JwtConfigError::CaWithoutTls { .. }), "{err}");
    assert!(err.to_string().contains("not https://"), "{err}");

    let https = || "https://127.0.0.1:4000/.well-known/jwks.json".to_owned();
    let missing = dir.path().join("missing.pem");
    let err = JwtVerifier::new(config(https(), Some(&missing))).unwrap_err();
    assert!(matches!(err, JwtConfigError::Ca { .. }), "{err}");
    assert!(err.to_string().contains("missing.pem"), "{err}");

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let err = JwtVerifier::new(config(https(), Some(&empty))).unwrap_err();
    assert!(err.to_string().contains("no PEM certificate"), "{err}");

    let broken = dir.path().join("broken.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let err = JwtVerifier::new(config(https(), Some(&broken))).unwrap_err();
    assert!(err.to_string().contains("broken.pem"), "{err}");

    // Neither http nor https.
    let err = JwtVerifier::new(config("ftp://auth/jwks".into(), None)).unwrap_err();
    assert!(err.to_string().contains("http:// or https://"), "{err}");
}
