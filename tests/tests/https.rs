//! The data plane's HTTPS listener (issue 27) against real processes:
//! devstack's control plane and data planes (each with `--tls-listen` and
//! the stack's edge certificate, named `default`), and the real `curl`,
//! `openssl s_client` and `nghttp` clients.
//!
//! * the certificate is chosen by SNI among the pushed ones: exact names,
//!   wildcards, and `default` for the rest; without a default an unknown name
//!   gets the `unrecognized_name` alert;
//! * ALPN `h2` and `http/1.1` both reach the pipeline, which tells the
//!   upstream `X-Forwarded-Proto: https`;
//! * TLS 1.0 and 1.1, and suites without forward secrecy or AEAD, are refused;
//! * a rotated certificate applies to new handshakes under traffic with no
//!   failed request, and open connections keep theirs;
//! * a client that never completes its handshake is cut off at the handshake
//!   timeout; `/metrics` counts handshakes and shows certificate expiry.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`), `redis-server`, `curl`, `openssl` and
//! `nghttp` (`apt-get install nghttp2-client`) on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use devstack::Stack;
use gateway_proto::v1::{Certificate, DeleteCertificateRequest, UpsertCertificateRequest};
use gateway_tests::{metric_sample, one_data_plane, open_route, poll, upsert_route_synced};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const DEADLINE: Duration = Duration::from_secs(20);

/// A test CA and the certificates it signs.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "https test CA");
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// A certificate named `name` for `hosts` (the first is its common name).
    fn certificate(&self, name: &str, hosts: &[&str]) -> Certificate {
        let names: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].clone());
        let key = KeyPair::generate().unwrap();
        Certificate {
            name: name.to_owned(),
            sni_hosts: names,
            cert_chain_pem: params.signed_by(&key, &self.issuer).unwrap().pem(),
            private_key_pem: key.serialize_pem(),
            ..Default::default()
        }
    }

    fn write(&self, dir: &Path) -> std::path::PathBuf {
        let path = dir.join("test-ca.pem");
        std::fs::write(&path, self.issuer.pem()).unwrap();
        path
    }
}

async fn upsert(stack: &Stack, certificate: Certificate) -> Result<()> {
    let version = stack
        .admin_client()
        .await
        .upsert_certificate(UpsertCertificateRequest {
            certificate: Some(certificate),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;
    Ok(())
}

/// The HTTPS port of the stack's first data plane.
fn tls_port(stack: &Stack) -> u16 {
    stack.ports().gateways_tls[0]
}

/// Runs `openssl s_client` against `port` with `args`; its stdout and stderr.
fn s_client(port: u16, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The common name of the certificate the server offered, from s_client's output.
fn subject_cn(out: &str) -> Option<&str> {
    out.lines()
        .find_map(|l| l.strip_prefix("subject=")?.split("CN = ").nth(1))
        .map(str::trim)
}

/// Runs curl with `args`; its stdout, or an error with its stderr.
fn curl(args: &[&str]) -> Result<String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .context("running curl")?;
    ensure!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A stack with one data plane and the open route `/open/users` → users.
async fn stack_with_open_route(data_plane_args: &[&str]) -> Result<Stack> {
    let stack = one_data_plane(data_plane_args).await;
    upsert_route_synced(
        &stack,
        open_route("open-users", "/open/users", "users", "/users"),
    )
    .await?;
    Ok(stack)
}

#[tokio::test(flavor = "multi_thread")]
async fn sni_picks_the_certificate_and_the_default_answers_the_rest() -> Result<()> {
    let stack = stack_with_open_route(&[]).await?;
    let port = tls_port(&stack);
    let ca = TestCa::new();
    let dir = tempfile::tempdir()?;
    let test_ca = ca.write(dir.path());
    upsert(&stack, ca.certificate("api", &["api.example.com"])).await?;
    upsert(&stack, ca.certificate("wild", &["*.example.org"])).await?;

    // openssl: the offered certificate by SNI; none, or an unknown name, gets `default` (localhost).
    for (sni, cn) in [
        (Some("api.example.com"), "api.example.com"),
        (Some("www.example.org"), "*.example.org"),
        (Some("other.example.net"), "localhost"),
        (None, "localhost"),
    ] {
        let out = match sni {
            Some(name) => s_client(port, &["-servername", name]),
            None => s_client(port, &["-noservername"]),
        };
        ensure!(subject_cn(&out) == Some(cn), "SNI {sni:?}: {out}");
    }

    // curl verifies the chain and the name, and the upstream hears `https`.
    let resolve = format!("api.example.com:{port}:127.0.0.1");
    let body = curl(&[
        "--cacert",
        test_ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        &format!("https://api.example.com:{port}/open/users/1"),
    ])?;
    let doc: serde_json::Value = serde_json::from_str(&body).context(body.clone())?;
    ensure!(doc["headers"]["x-forwarded-proto"] == "https", "{doc}");
    // The cleartext listener still says `http`.
    let body = curl(&[&format!("{}/open/users/1", stack.gateways()[0])])?;
    let doc: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(doc["headers"]["x-forwarded-proto"] == "http", "{doc}");

    // Without a default, an unknown name is refused with `unrecognized_name`,
    // and the named certificates are still offered.
    let version = stack
        .admin_client()
        .await
        .delete_certificate(DeleteCertificateRequest {
            name: "default".into(),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;
    let out = s_client(port, &["-servername", "other.example.net"]);
    ensure!(out.contains("unrecognized name"), "{out}");
    ensure!(subject_cn(&out).is_none(), "{out}");
    let out = s_client(port, &["-noservername"]);
    ensure!(out.contains("unrecognized name"), "{out}");
    let out = s_client(port, &["-servername", "api.example.com"]);
    ensure!(subject_cn(&out) == Some("api.example.com"), "{out}");
    let ops = &stack.gateway_admins()[0];
    let refused = metric_sample(
        ops,
        "gateway_tls_handshakes_total{outcome=\"unrecognized_name\"}",
    )
    .await?;
    ensure!(refused >= 2.0, "{refused}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn alpn_h2_with_curl_and_nghttp_and_http1_without_it() -> Result<()> {
    let stack = stack_with_open_route(&[]).await?;
    let url = format!("{}/open/users/1", stack.gateways_tls()[0]);
    let ca = stack.edge_ca().to_str().unwrap().to_owned();

    let out = curl(&[
        "--http2",
        "--cacert",
        &ca,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        &url,
    ])?;
    ensure!(out == "200 2", "{out}");
    let out = curl(&[
        "--http1.1",
        "--cacert",
        &ca,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_version}",
        &url,
    ])?;
    ensure!(out == "200 1.1", "{out}");

    // nghttp speaks only HTTP/2: it needs ALPN h2.
    let out = Command::new("nghttp")
        .args(["-v", "--timeout=10", &url])
        .output()
        .context("running nghttp (apt-get install nghttp2-client)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(text.contains("The negotiated protocol: h2"), "{text}");
    ensure!(text.contains(":status: 200"), "{text}");
    ensure!(text.contains("\"x-forwarded-proto\":\"https\""), "{text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_only_route_redirects_cleartext_gets_and_refuses_the_rest() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    let port = tls_port(&stack);
    let mut route = open_route("secure-users", "/secure/users", "users", "/users");
    route.https_only = true;
    upsert_route_synced(&stack, route).await?;
    let plain = &stack.gateways()[0];
    let ca = stack.edge_ca().to_str().unwrap().to_owned();

    // GET and HEAD: 301 to the same URL (path and query) on the HTTPS port.
    let out = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{redirect_url}",
        "-H",
        "host: localhost:1234",
        &format!("{plain}/secure/users/1?x=1"),
    ])?;
    ensure!(
        out == format!("301 https://localhost:{port}/secure/users/1?x=1"),
        "{out}"
    );
    let out = curl(&[
        "-I",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("{plain}/secure/users/1"),
    ])?;
    ensure!(out == "301", "{out}");
    // Any other method: 403, with the reason.
    let out = curl(&[
        "-X",
        "POST",
        "-d",
        "x",
        "-w",
        " %{http_code}",
        &format!("{plain}/secure/users/1"),
    ])?;
    ensure!(
        out.ends_with(" 403") && out.contains("https-required"),
        "{out}"
    );
    // Following the redirect lands on the HTTPS listener, which serves it.
    let out = curl(&[
        "-L",
        "--cacert",
        &ca,
        "-H",
        "host: localhost",
        "--resolve",
        &format!("localhost:{port}:127.0.0.1"),
        &format!("{plain}/secure/users/1"),
    ])?;
    let doc: serde_json::Value = serde_json::from_str(&out).context(out.clone())?;
    ensure!(doc["headers"]["x-forwarded-proto"] == "https", "{doc}");
    let out = curl(&[
        "--cacert",
        &ca,
        "-X",
        "POST",
        "-d",
        "x",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("https://localhost:{port}/secure/users/1"),
    ])?;
    ensure!(out != "403" && out != "301", "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn old_protocol_versions_and_weak_suites_are_refused() -> Result<()> {
    let stack = one_data_plane(&[]).await;
    let port = tls_port(&stack);
    // SECLEVEL=0 lets this openssl offer what it would refuse itself, so the
    // refusal seen is the gateway's (an alert from the server).
    for (version, cipher) in [
        ("-tls1", "DEFAULT@SECLEVEL=0"),
        ("-tls1_1", "DEFAULT@SECLEVEL=0"),
        // TLS 1.2 without forward secrecy or AEAD.
        ("-tls1_2", "AES128-SHA:AES256-GCM-SHA384@SECLEVEL=0"),
        (
            "-tls1_2",
            "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA@SECLEVEL=0",
        ),
    ] {
        let out = s_client(port, &[version, "-cipher", cipher]);
        ensure!(
            out.contains("SSL alert number") && subject_cn(&out).is_none(),
            "{version} {cipher}: {out}"
        );
    }
    // What is accepted: TLS 1.2 with ECDHE and AES-GCM, and TLS 1.3.
    let out = s_client(
        port,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
    );
    ensure!(
        out.contains("New, TLSv1.2, Cipher is ECDHE-ECDSA-AES128-GCM-SHA256"),
        "{out}"
    );
    let out = s_client(port, &["-tls1_3"]);
    ensure!(out.contains("New, TLSv1.3, Cipher is"), "{out}");
    Ok(())
}

/// A TLS client trusting the PEM CA files `cas`, offering HTTP/1.1; with
/// `resume`, it resumes sessions (and a resumed handshake shows no new
/// certificate: the session's is kept).
fn connector(cas: &[&Path], resume: bool) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        for c in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    TlsConnector::from(Arc::new(config))
}

/// Connects to `localhost:port` over TLS.
async fn connect(tls: &TlsConnector, port: u16) -> Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    Ok(tls.connect(ServerName::try_from("localhost")?, tcp).await?)
}

/// The DER bytes of the certificate the server offered on `stream`.
fn offered(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// GET `path` on a keep-alive HTTP/1.1 connection; the status.
async fn get(stream: &mut TlsStream<TcpStream>, path: &str) -> Result<u16> {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            bail!("closed mid-answer: {}", String::from_utf8_lossy(&raw));
        }
        raw.extend_from_slice(&buf[..n]);
        let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .context("an answer with a length")?
            .trim()
            .parse()?;
        if raw.len() >= end + 4 + length {
            return Ok(head[9..12].parse()?);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_certificate_applies_to_new_handshakes_under_traffic() -> Result<()> {
    let stack = stack_with_open_route(&[]).await?;
    let port = tls_port(&stack);
    let ca = TestCa::new();
    let dir = tempfile::tempdir()?;
    let test_ca = ca.write(dir.path());
    // Every handshake a full one, so each shows the certificate offered now.
    let tls = connector(&[stack.edge_ca(), &test_ca], false);

    // A keep-alive connection made with the first certificate.
    let mut kept = connect(&tls, port).await?;
    ensure!(get(&mut kept, "/open/users/1").await? == 200);
    let first = offered(&kept);

    // Traffic: a new handshake and request at a time, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let rotated_seen = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (tls, stop, ok, failed, rotated_seen, first) = (
            tls.clone(),
            stop.clone(),
            ok.clone(),
            failed.clone(),
            rotated_seen.clone(),
            first.clone(),
        );
        tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let answered = async {
                    let mut s = connect(&tls, port).await?;
                    let status = get(&mut s, "/open/users/1").await?;
                    ensure!(status == 200, "status {status}");
                    Ok(offered(&s) != first)
                }
                .await;
                match answered {
                    Ok(rotated) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        if rotated {
                            rotated_seen.store(true, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors.push(e.to_string());
                    }
                }
            }
            errors
        })
    };
    poll(DEADLINE, "traffic before the rotation", || {
        let n = ok.load(Ordering::Relaxed);
        async move {
            if n >= 20 {
                Ok(())
            } else {
                Err(format!("{n} answered"))
            }
        }
    })
    .await?;

    // The rotation: a new `default`, from another CA the client also trusts.
    upsert(&stack, ca.certificate("default", &["localhost"])).await?;
    poll(DEADLINE, "a handshake offering the new certificate", || {
        let seen = rotated_seen.load(Ordering::Relaxed);
        async move {
            if seen {
                Ok(())
            } else {
                Err("old certificate".to_owned())
            }
        }
    })
    .await?;
    let after = ok.load(Ordering::Relaxed);
    poll(DEADLINE, "traffic after the rotation", || {
        let n = ok.load(Ordering::Relaxed);
        async move {
            if n >= after + 20 {
                Ok(())
            } else {
                Err(format!("{n} answered"))
            }
        }
    })
    .await?;
    stop.store(true, Ordering::Relaxed);
    let errors = traffic.await?;
    ensure!(
        failed.load(Ordering::Relaxed) == 0,
        "{} requests failed: {errors:?}",
        errors.len()
    );

    // The connection made before the rotation is still served, with its certificate.
    ensure!(get(&mut kept, "/open/users/1").await? == 200);
    ensure!(offered(&kept) == first);
    let fresh = connect(&tls, port).await?;
    ensure!(offered(&fresh) != first);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_handshake_is_cut_off_and_metrics_show_tls() -> Result<()> {
    let stack = stack_with_open_route(&["--tls-handshake-timeout-ms", "300"]).await?;
    let port = tls_port(&stack);
    let ops = stack.gateway_admins()[0].clone();

    // A client that connects and never sends its ClientHello.
    let mut silent = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut sink = Vec::new();
    let read = tokio::time::timeout(DEADLINE, silent.read_to_end(&mut sink)).await;
    ensure!(matches!(read, Ok(Ok(0))), "not closed: {read:?}");
    let timed_out =
        metric_sample(&ops, "gateway_tls_handshakes_total{outcome=\"timeout\"}").await?;
    ensure!(timed_out >= 1.0, "{timed_out}");

    // Completed handshakes are counted; a client that comes back resumes
    // its session (a ticket: TLS 1.3).
    let tls = connector(&[stack.edge_ca()], true);
    let mut s = connect(&tls, port).await?;
    ensure!(get(&mut s, "/open/users/1").await? == 200);
    ensure!(s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Full));
    let mut again = connect(&tls, port).await?;
    ensure!(get(&mut again, "/open/users/1").await? == 200);
    ensure!(again.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed));
    let full = metric_sample(&ops, "gateway_tls_handshakes_total{outcome=\"full\"}").await?;
    ensure!(full >= 1.0, "{full}");
    let resumed = metric_sample(&ops, "gateway_tls_handshakes_total{outcome=\"resumed\"}").await?;
    ensure!(resumed >= 1.0, "{resumed}");
    let left = metric_sample(&ops, "gateway_certificate_expiry_seconds{name=\"default\"}").await?;
    // rcgen's default validity ends in 4096: far away, and positive.
    ensure!(left > 365.0 * 86_400.0, "{left}");
    let config: serde_json::Value = gateway_tests::client()
        .get(format!("{ops}/config"))
        .send()
        .await?
        .json()
        .await?;
    let default = &config["certificates"][0];
    ensure!(default["name"] == "default", "{config}");
    ensure!(default["sni_hosts"][0] == "localhost", "{config}");
    ensure!(
        default["expires_in_seconds"].as_i64() > Some(365 * 86_400),
        "{config}"
    );
    Ok(())
}
