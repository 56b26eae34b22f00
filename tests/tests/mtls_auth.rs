//! `AUTH_MTLS` routes (issue 27) against real processes: a devstack data
//! plane whose HTTPS listener verifies client certificates against
//! `--tls-client-ca`, and the real `curl`.
//!
//! * a client certificate from that CA authenticates the caller: the upstream
//!   hears its Common Name behind `mtls:` as `X-User-Id` (a forged one is
//!   replaced) and `X-User-Role: mtls`;
//! * a route's `mtls_allow` admits only the certificates it names (by Common
//!   Name or subject alternative name); another one gets 403
//!   `client-certificate-not-allowed`;
//! * without a certificate (over HTTPS or cleartext) the route answers 401
//!   `client-certificate-required`, while routes without `AUTH_MTLS` still
//!   serve certificate-less clients;
//! * a certificate from another CA fails the handshake.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`), `redis-server` and `curl` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::process::Command;

use anyhow::{Context as _, Result, ensure};
use devstack::Stack;
use devstack::pki::Pki;
use gateway_proto::v1::{AuthMode, Route};
use gateway_tests::{one_data_plane, open_route, upsert_route_synced};

/// curl to the stack's HTTPS listener as `localhost` (trusting the stack's
/// edge CA), with `extra` arguments; (exit code, body, status).
fn curl_https(stack: &Stack, path: &str, extra: &[&str]) -> Result<(i32, String, String)> {
    let port = stack.ports().gateways_tls[0];
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "--cacert"])
        .arg(stack.edge_ca())
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args(extra)
        .args(["-w", "\n%{http_code}"])
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .context("curl runs (scripts/test installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok((
        out.status.code().unwrap_or(-1),
        body.to_owned(),
        status.to_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_verified_client_certificate_is_the_caller_on_auth_mtls_routes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let clients = Pki::generate(&dir.path().join("clients"))?;
    let strangers = Pki::generate(&dir.path().join("strangers"))?;
    let ca = clients.ca.to_str().unwrap().to_owned();
    let stack = one_data_plane(&["--tls-client-ca", &ca]).await;
    let mtls = Route {
        auth: AuthMode::AuthMtls as i32,
        ..open_route("mtls-users", "/mtls/users", "users", "/users")
    };
    upsert_route_synced(&stack, mtls).await?;
    upsert_route_synced(
        &stack,
        open_route("open-users", "/open/users", "users", "/users"),
    )
    .await?;
    let cert = clients.client_cert.to_str().unwrap();
    let key = clients.client_key.to_str().unwrap();

    // The certificate's subject reaches the upstream; a forged X-User-Id does not.
    let (code, body, status) = curl_https(
        &stack,
        "/mtls/users/1",
        &["--cert", cert, "--key", key, "-H", "X-User-Id: mallory"],
    )?;
    ensure!(code == 0 && status == "200", "{code} {status} {body}");
    let doc: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        doc["headers"]["x-user-id"] == "mtls:devstack-data-plane"
            && doc["headers"]["x-user-role"] == "mtls",
        "{doc}"
    );

    // No certificate: 401 on the mTLS route, served on the open one.
    let (code, body, status) = curl_https(&stack, "/mtls/users/1", &[])?;
    ensure!(
        code == 0 && status == "401" && body.contains("client-certificate-required"),
        "{code} {status} {body}"
    );
    let (code, _, status) = curl_https(&stack, "/open/users/1", &[])?;
    ensure!(code == 0 && status == "200", "{code} {status}");
    // Cleartext never carries a certificate.
    let resp = gateway_tests::client()
        .get(format!("{}/mtls/users/1", stack.gateways()[0]))
        .send()
        .await?;
    ensure!(resp.status() == 401, "cleartext: {}", resp.status());

    // A certificate from a CA the listener does not trust fails the handshake.
    let (code, body, status) = curl_https(
        &stack,
        "/open/users/1",
        &[
            "--cert",
            strangers.client_cert.to_str().unwrap(),
            "--key",
            strangers.client_key.to_str().unwrap(),
        ],
    )?;
    ensure!(
        code != 0 && status != "200",
        "an untrusted certificate was accepted: {code} {status} {body}"
    );
    Ok(())
}

/// Issue 41, item 15: `--tls-client-crl` refuses a revoked client certificate
/// at the handshake; one the list does not name still authenticates.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_client_certificate_fails_the_handshake() -> Result<()> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer,
        DnType, ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, RevokedCertParams,
        SerialNumber,
    };
    let dir = tempfile::tempdir()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "revoking CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let client = |name: &str, serial: u64| -> Result<(String, String)> {
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(SerialNumber::from(serial));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let (cert_path, key_path) = (
            dir.path().join(format!("{name}.pem")),
            dir.path().join(format!("{name}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        Ok((
            cert_path.to_string_lossy().into_owned(),
            key_path.to_string_lossy().into_owned(),
        ))
    };
    let good = client("good-client", 7)?;
    let revoked = client("revoked-client", 8)?;
    let crl = CertificateRevocationListParams {
        this_update: rcgen::date_time_ymd(2025, 1, 1),
        next_update: rcgen::date_time_ymd(2099, 1, 1),
        crl_number: SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: vec![RevokedCertParams {
            serial_number: SerialNumber::from(8u64),
            revocation_time: rcgen::date_time_ymd(2025, 6, 1),
            reason_code: None,
            invalidity_date: None,
        }],
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(&ca)?;
    let (ca_path, crl_path) = (dir.path().join("ca.pem"), dir.path().join("crl.pem"));
    std::fs::write(&ca_path, ca.pem())?;
    std::fs::write(&crl_path, crl.pem()?)?;
    let stack = one_data_plane(&[
        "--tls-client-ca",
        ca_path.to_str().unwrap(),
        "--tls-client-crl",
        crl_path.to_str().unwrap(),
    ])
    .await;
    let mtls = Route {
        auth: AuthMode::AuthMtls as i32,
        ..open_route("mtls-users", "/mtls/users", "users", "/users")
    };
    upsert_route_synced(&stack, mtls).await?;
    let (code, body, status) = curl_https(
        &stack,
        "/mtls/users/1",
        &["--cert", &good.0, "--key", &good.1],
    )?;
    ensure!(code == 0 && status == "200", "{code} {status} {body}");
    let doc: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(doc["headers"]["x-user-id"] == "mtls:good-client", "{doc}");
    let (code, body, status) = curl_https(
        &stack,
        "/mtls/users/1",
        &["--cert", &revoked.0, "--key", &revoked.1],
    )?;
    ensure!(
        code != 0 && status != "200",
        "a revoked certificate was accepted: {code} {status} {body}"
    );
    Ok(())
}

/// Issue 41, item 15: a route's `mtls_allow` admits the certificates it
/// names, by a subject alternative name here, and refuses every other
/// certificate of the trusted CA with 403; the caller's `X-User-Id` is its
/// Common Name behind `mtls:`, never a bare name a JWT `sub` could equal.
#[tokio::test(flavor = "multi_thread")]
async fn an_allow_list_admits_only_the_certificates_it_names() -> Result<()> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };
    let dir = tempfile::tempdir()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "services CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let client = |cn: &str, san: &str| -> Result<(String, String)> {
        let mut params = CertificateParams::new(vec![san.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let (cert_path, key_path) = (
            dir.path().join(format!("{cn}.pem")),
            dir.path().join(format!("{cn}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        Ok((
            cert_path.to_string_lossy().into_owned(),
            key_path.to_string_lossy().into_owned(),
        ))
    };
    let billing = client("billing-service", "billing.internal")?;
    let reports = client("reports-service", "reports.internal")?;
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca.pem())?;
    let stack = one_data_plane(&["--tls-client-ca", ca_path.to_str().unwrap()]).await;
    let listed = Route {
        auth: AuthMode::AuthMtls as i32,
        mtls_allow: vec!["dns:Billing.Internal".into(), "cn:ops-console".into()],
        ..open_route("mtls-users", "/mtls/users", "users", "/users")
    };
    upsert_route_synced(&stack, listed).await?;

    // On the list by its DNS SAN (compared ignoring case): served, as mtls:<CN>.
    let (code, body, status) = curl_https(
        &stack,
        "/mtls/users/1",
        &["--cert", &billing.0, "--key", &billing.1],
    )?;
    ensure!(code == 0 && status == "200", "{code} {status} {body}");
    let doc: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        doc["headers"]["x-user-id"] == "mtls:billing-service"
            && doc["headers"]["x-user-role"] == "mtls",
        "{doc}"
    );

    // Verified by the same CA, but not on the list: 403, never forwarded.
    let (code, body, status) = curl_https(
        &stack,
        "/mtls/users/1",
        &["--cert", &reports.0, "--key", &reports.1],
    )?;
    ensure!(
        code == 0
            && status == "403"
            && body.contains("urn:gateway:problem:client-certificate-not-allowed"),
        "{code} {status} {body}"
    );
    // No certificate at all is still 401.
    let (code, body, status) = curl_https(&stack, "/mtls/users/1", &[])?;
    ensure!(
        code == 0 && status == "401" && body.contains("client-certificate-required"),
        "{code} {status} {body}"
    );
    Ok(())
}
