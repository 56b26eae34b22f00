//! TLS certificates through the real binary: UpsertCertificate,
//! GetCertificate, ListCertificates and DeleteCertificate; the private key
//! never read back, only streamed to data planes; every refusal with its
//! reason; expired certificates accepted with a warning; ApplyConfig's dry
//! run, compare-and-swap and RollbackConfig; keys encrypted in the SQLite
//! file; a wrong or missing secrets key stopping the start. Certificates are
//! made with rcgen (RSA ones with the openssl command): none can expire.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use gateway_proto::v1::{
    ApplyConfigRequest, Certificate, ConfigChange, ConfigRequest, DeleteCertificateRequest,
    GetCertificateRequest, GetConfigRequest, ListCertificatesRequest, Node, RollbackConfigRequest,
    UpsertCertificateRequest,
};
use rcgen::{CertificateParams, KeyPair};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// A secrets key file (64 hex digits, mode 0600) in `dir`.
fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    let hex = gateway_hex::encode([byte; 32]);
    std::io::Write::write_all(&mut f, format!("{hex}\n").as_bytes()).unwrap();
    path
}

/// A control plane with a secrets key and tokens (its private keys are
/// streamed only to an authenticated data plane), on `dir`/cp.db.
async fn start(dir: &tempfile::TempDir) -> CpProcess {
    let key = key_file(dir.path(), "secrets.key", 7);
    CpProcess::start_with_tokens(
        &dir.path().join("cp.db"),
        &["--secrets-key-file", key.to_str().unwrap()],
    )
    .await
}

/// A certificate named `name` for `hosts`, made with `key`, valid from 2020
/// to `until`, and the DER of its leaf.
fn issued(name: &str, hosts: &[&str], key: &KeyPair, until: i32) -> (Certificate, Vec<u8>) {
    let mut params =
        CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(until, 1, 1);
    let cert = params.self_signed(key).unwrap();
    let c = Certificate {
        name: name.into(),
        sni_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        cert_chain_pem: cert.pem(),
        private_key_pem: key.serialize_pem(),
        ..Default::default()
    };
    (c, cert.der().to_vec())
}

fn issue(name: &str, hosts: &[&str], key: &KeyPair, until: i32) -> Certificate {
    issued(name, hosts, key, until).0
}

fn fresh(name: &str, host: &str) -> Certificate {
    issue(name, &[host], &KeyPair::generate().unwrap(), 2100)
}

async fn upsert(admin: &mut Admin, c: Certificate) -> Result<ConfigChange, tonic::Status> {
    admin
        .upsert_certificate(UpsertCertificateRequest {
            certificate: Some(c),
            expected_version: None,
        })
        .await
        .map(|r| r.into_inner())
}

async fn get(admin: &mut Admin, name: &str) -> Result<Certificate, Code> {
    admin
        .get_certificate(GetCertificateRequest { name: name.into() })
        .await
        .map(|r| r.into_inner())
        .map_err(|s| s.code())
}

/// The certificates the data planes get (the config stream is the only place a key travels).
async fn pushed(cp: &CpProcess, node: &str) -> Vec<Certificate> {
    let mut dp = FakeDataPlane::connect(cp, node, "").await;
    dp.next().await.certificates
}

#[track_caller]
fn refused(r: Result<ConfigChange, tonic::Status>, code: Code, needle: &str) -> String {
    let e = r.unwrap_err();
    assert_eq!(e.code(), code, "{e:?}");
    assert!(
        e.message().contains(needle),
        "{needle:?} not in {:?}",
        e.message()
    );
    assert!(!e.message().contains("PRIVATE KEY-----"), "{e:?}");
    e.message().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn upsert_get_list_delete_and_the_key_is_never_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let mut admin = cp.admin().await;

    let (mut edge, leaf) = issued(
        "edge",
        &["api.example.com", "*.example.com"],
        &KeyPair::generate().unwrap(),
        2100,
    );
    edge.sni_hosts = vec!["API.Example.com".into(), "*.Example.COM".into()];
    let change = upsert(&mut admin, edge.clone()).await.unwrap();
    assert_eq!(change.version, 1);
    assert!(change.warnings.is_empty(), "{:?}", change.warnings);
    // A host the certificate's names do not cover: accepted, with a warning.
    let mut narrow = fresh("narrow", "narrow.example.org");
    narrow.sni_hosts.push("other.example.org".into());
    let change = upsert(&mut admin, narrow).await.unwrap();
    assert_eq!(
        change.warnings,
        [
            "certificate \"narrow\": sni_hosts \"other.example.org\" is not among the certificate's names (narrow.example.org); clients asking for it will refuse the certificate"
        ]
    );
    admin
        .delete_certificate(DeleteCertificateRequest {
            name: "narrow".into(),
            expected_version: None,
        })
        .await
        .unwrap();

    let got = get(&mut admin, "edge").await.unwrap();
    assert_eq!(got.private_key_pem, "", "never read back");
    assert!(got.private_key_set);
    assert_eq!(
        got.sni_hosts,
        ["api.example.com", "*.example.com"],
        "lower-cased"
    );
    assert_eq!(got.cert_chain_pem, edge.cert_chain_pem);
    assert_eq!(got.not_before, "2020-01-01T00:00:00Z");
    assert_eq!(got.not_after, "2100-01-01T00:00:00Z");
    assert_eq!(got.subject_alt_names, ["api.example.com", "*.example.com"]);
    assert_eq!(
        got.sha256_fingerprint,
        gateway_hex::encode(Sha256::digest(&leaf))
    );

    upsert(&mut admin, fresh("admin", "admin.example.com"))
        .await
        .unwrap();
    let listed = admin
        .list_certificates(ListCertificatesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.version, 4);
    let names: Vec<&str> = listed
        .certificates
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["admin", "edge"], "sorted by name");
    assert!(
        listed
            .certificates
            .iter()
            .all(|c| c.private_key_pem.is_empty() && c.private_key_set)
    );
    for version in [None, Some(1), Some(2), Some(4)] {
        let config = admin
            .get_config(GetConfigRequest { version })
            .await
            .unwrap()
            .into_inner();
        assert!(config.redacted);
        assert!(!config.certificates.is_empty());
        assert!(
            config
                .certificates
                .iter()
                .all(|c| c.private_key_pem.is_empty() && c.private_key_set),
            "{version:?}"
        );
    }
    // The data planes' stream is the one place the key travels.
    let streamed = pushed(&cp, "dp-keys").await;
    assert_eq!(streamed[1].name, "edge");
    assert_eq!(streamed[1].private_key_pem, edge.private_key_pem);
    assert!(
        !cp.logs().contains(&pem_line(&edge.private_key_pem)),
        "a key was logged"
    );

    let change = admin
        .delete_certificate(DeleteCertificateRequest {
            name: "edge".into(),
            expected_version: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(change.version, 5);
    assert_eq!(get(&mut admin, "edge").await, Err(Code::NotFound));
    let e = admin
        .delete_certificate(DeleteCertificateRequest {
            name: "edge".into(),
            expected_version: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "certificate \"edge\" not found");
    assert_eq!(get(&mut admin, "").await, Err(Code::InvalidArgument));
    let e = admin
        .upsert_certificate(UpsertCertificateRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::InvalidArgument, "certificate: required")
    );
}

/// A line of a PEM block's body, long enough to be unique.
fn pem_line(pem: &str) -> String {
    pem.lines()
        .find(|l| !l.starts_with("-----"))
        .unwrap()
        .to_owned()
}

/// An RSA certificate and PKCS#8 key of `bits` bits, made by the openssl command.
fn rsa(dir: &Path, bits: u32, host: &str) -> Certificate {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("these tests need the openssl command ({e}): apt-get install openssl")
            });
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        &format!("rsa_keygen_bits:{bits}"),
        "-out",
        "rsa.key",
    ]);
    run(&[
        "req",
        "-x509",
        "-new",
        "-key",
        "rsa.key",
        "-subj",
        &format!("/CN={host}"),
        "-addext",
        &format!("subjectAltName=DNS:{host}"),
        "-days",
        "2",
        "-out",
        "rsa.pem",
    ]);
    Certificate {
        name: format!("rsa-{bits}"),
        sni_hosts: vec![host.into()],
        cert_chain_pem: std::fs::read_to_string(dir.join("rsa.pem")).unwrap(),
        private_key_pem: std::fs::read_to_string(dir.join("rsa.key")).unwrap(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_is_invalid_argument_naming_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let mut admin = cp.admin().await;
    let good = fresh("edge", "api.example.com");

    let mut mismatch = good.clone();
    mismatch.private_key_pem = KeyPair::generate().unwrap().serialize_pem();
    refused(
        upsert(&mut admin, mismatch).await,
        Code::InvalidArgument,
        "certificate \"edge\": private_key_pem does not match the public key of the certificate",
    );
    let mut bad_pem = good.clone();
    bad_pem.cert_chain_pem =
        "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n".into();
    refused(
        upsert(&mut admin, bad_pem).await,
        Code::InvalidArgument,
        "certificate \"edge\": cert_chain_pem is not valid PEM",
    );
    let mut no_pem = good.clone();
    no_pem.cert_chain_pem = "hello".into();
    refused(
        upsert(&mut admin, no_pem).await,
        Code::InvalidArgument,
        "cert_chain_pem holds no PEM CERTIFICATE block",
    );
    let mut missing_key = good.clone();
    missing_key.private_key_pem.clear();
    refused(
        upsert(&mut admin, missing_key).await,
        Code::InvalidArgument,
        "certificate \"edge\": private_key_pem is required",
    );
    let weak = rsa(dir.path(), 1024, "weak.example.com");
    refused(
        upsert(&mut admin, weak).await,
        Code::InvalidArgument,
        "certificate \"rsa-1024\": cert_chain_pem: the leaf's key is RSA of 1024 bits; at least 2048 bits are required",
    );
    let mut wildcard = good.clone();
    wildcard.sni_hosts = vec!["api.*.example.com".into()];
    refused(
        upsert(&mut admin, wildcard).await,
        Code::InvalidArgument,
        "sni_hosts: \"api.*.example.com\" is not a lower-case host name",
    );
    assert_eq!(
        get(&mut admin, "edge").await,
        Err(Code::NotFound),
        "nothing was stored"
    );

    // RSA 2048 is accepted; a second certificate claiming its host names both.
    let strong = rsa(dir.path(), 2048, "rsa.example.com");
    assert_eq!(upsert(&mut admin, strong).await.unwrap().version, 1);
    refused(
        upsert(&mut admin, fresh("other", "rsa.example.com")).await,
        Code::InvalidArgument,
        "certificate \"rsa-2048\": sni_hosts: \"rsa.example.com\" is already claimed by certificate \"other\"",
    );

    // A key pair changed without its key: refused, the stored key does not fit.
    let mut rekeyed = fresh("rsa-2048", "rsa.example.com");
    rekeyed.private_key_pem.clear();
    refused(
        upsert(&mut admin, rekeyed).await,
        Code::InvalidArgument,
        "private_key_pem is required: the certificate's public key is not the one of the stored certificate",
    );

    // Expired: accepted, with a warning.
    let key = KeyPair::generate().unwrap();
    let change = upsert(&mut admin, issue("old", &["old.example.com"], &key, 2021))
        .await
        .unwrap();
    assert_eq!(change.version, 2);
    assert_eq!(
        change.warnings,
        [
            "certificate \"old\": expired at 2021-01-01T00:00:00Z (not_after is in the past); accepted, but clients will refuse it until it is replaced"
        ]
    );
    // Renewed with the same key pair and no key in the request: kept, no warning.
    let mut renewed = issue("old", &["old.example.com"], &key, 2100);
    renewed.private_key_pem.clear();
    let change = upsert(&mut admin, renewed).await.unwrap();
    assert_eq!((change.version, change.warnings.len()), (3, 0));
    let streamed = pushed(&cp, "dp-renewed").await;
    assert_eq!(streamed[0].name, "old");
    assert_eq!(streamed[0].private_key_pem, key.serialize_pem());
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_secrets_key_a_certificate_is_failed_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    let mut admin = cp.admin().await;
    let e = refused(
        upsert(&mut admin, fresh("edge", "api.example.com")).await,
        Code::FailedPrecondition,
        "--secrets-key-file FILE (CONTROL_PLANE_SECRETS_KEY_FILE",
    );
    assert!(
        e.starts_with(
            "storing a certificate's private key or an upstream's identity_signing_secret needs a secrets key"
        ),
        "{e}"
    );
    assert_eq!(get(&mut admin, "edge").await, Err(Code::NotFound));
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_dry_run_compare_and_swap_and_rollback_cover_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let mut admin = cp.admin().await;
    let first_key = KeyPair::generate().unwrap();
    let first = issue("edge", &["api.example.com"], &first_key, 2100);

    let apply = |certificates: Vec<Certificate>, dry_run: bool, expected_version: Option<u64>| {
        ApplyConfigRequest {
            certificates,
            dry_run,
            expected_version,
            ..Default::default()
        }
    };
    let dry = admin
        .apply_config(apply(vec![first.clone()], true, None))
        .await
        .unwrap()
        .into_inner();
    assert!(dry.dry_run);
    assert_eq!(dry.version, 1);
    let changes: Vec<(&str, &str, &str)> = dry
        .changes
        .iter()
        .map(|c| (c.kind.as_str(), c.name.as_str(), c.action.as_str()))
        .collect();
    assert_eq!(changes, [("certificate", "edge", "added")]);
    assert_eq!(
        get(&mut admin, "edge").await,
        Err(Code::NotFound),
        "dry run commits nothing"
    );

    let e = admin
        .apply_config(apply(vec![first.clone()], false, Some(4)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(e.message(), "expected version 4, current is 0");
    let applied = admin
        .apply_config(apply(vec![first.clone()], false, Some(0)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(applied.version, 1);

    // GetConfig's answer applied back as it is (no keys): nothing changes.
    let shown = admin
        .get_config(GetConfigRequest { version: None })
        .await
        .unwrap()
        .into_inner();
    let again = admin
        .apply_config(apply(shown.certificates.clone(), false, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.version, 1);
    assert!(again.changes.is_empty());

    // Version 2: another key pair; version 3: an expired certificate added
    // by ApplyConfig, warned about.
    let second = fresh("edge", "api.example.com");
    assert_eq!(upsert(&mut admin, second.clone()).await.unwrap().version, 2);
    let key = KeyPair::generate().unwrap();
    let expired = issue("old", &["old.example.com"], &key, 2021);
    let applied = admin
        .apply_config(apply(vec![second.clone(), expired], false, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(applied.version, 3);
    assert_eq!(applied.warnings.len(), 1, "{:?}", applied.warnings);
    assert!(
        applied.warnings[0].starts_with("certificate \"old\": expired at 2021-01-01T00:00:00Z")
    );
    assert_eq!(
        pushed(&cp, "dp-v3").await[0].private_key_pem,
        second.private_key_pem
    );

    // Rollback to 1: the first certificate comes back with its key, "old" goes.
    let back = admin
        .rollback_config(RollbackConfigRequest {
            version: 1,
            expected_version: Some(3),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(back.version, 4);
    let streamed = pushed(&cp, "dp-v4").await;
    assert_eq!(streamed.len(), 1);
    assert_eq!(streamed[0].cert_chain_pem, first.cert_chain_pem);
    assert_eq!(streamed[0].private_key_pem, first.private_key_pem);
    let config = admin
        .get_config(GetConfigRequest { version: None })
        .await
        .unwrap()
        .into_inner();
    let v1 = admin
        .get_config(GetConfigRequest { version: Some(1) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(config.hash, v1.hash, "same content as version 1");
    assert_eq!(config.summary, "rollback to version 1");

    // An ApplyConfig that lists no certificate keeps them (a client that
    // predates certificates removes none); clear_certificates removes them.
    let kept = admin
        .apply_config(apply(vec![], false, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.version, 4);
    assert!(kept.changes.is_empty(), "{:?}", kept.changes);
    let both = ApplyConfigRequest {
        clear_certificates: true,
        ..apply(vec![first.clone()], false, None)
    };
    let e = admin.apply_config(both).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::InvalidArgument,
            "certificates and clear_certificates cannot both be set"
        )
    );
    let cleared = admin
        .apply_config(ApplyConfigRequest {
            clear_certificates: true,
            ..apply(vec![], false, Some(4))
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.version, 5);
    assert_eq!(cleared.changes[0].action, "removed");
    assert!(pushed(&cp, "dp-v5").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_are_encrypted_at_rest_and_only_their_key_starts_the_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cp.db");
    let right = key_file(dir.path(), "right.key", 1);
    let wrong = key_file(dir.path(), "wrong.key", 2);
    let mut cp =
        CpProcess::start_with_tokens(&db, &["--secrets-key-file", right.to_str().unwrap()]).await;
    let edge = fresh("edge", "api.example.com");
    upsert(&mut cp.admin().await, edge.clone()).await.unwrap();
    let status = cp.terminate().await;
    assert!(status.success(), "{status}; logs:\n{}", cp.logs());

    // Every byte SQLite wrote: the chain is there, the key is not.
    let mut stored = Vec::new();
    for name in ["cp.db", "cp.db-wal"] {
        if let Ok(b) = std::fs::read(dir.path().join(name)) {
            stored.extend(b);
        }
    }
    let has = |needle: &str| stored.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(
        has(&pem_line(&edge.cert_chain_pem)),
        "the scan finds the stored chain"
    );
    for line in edge
        .private_key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
    {
        assert!(
            !has(line),
            "a line of the private key is in the database file"
        );
    }
    assert!(!has("PRIVATE KEY"));

    // Another key, or none: the start is refused, saying why.
    let (status, stderr) =
        CpProcess::start_fails(&db, &["--secrets-key-file", wrong.to_str().unwrap()]).await;
    assert!(!status.success());
    assert!(
        stderr.contains("the --secrets-key-file key is not the one this database's private keys were encrypted with"),
        "{stderr}"
    );
    let (status, stderr) = CpProcess::start_fails(&db, &[]).await;
    assert!(!status.success());
    assert!(
        stderr.contains("this database holds certificates' private keys encrypted with a secrets key; start with --secrets-key-file"),
        "{stderr}"
    );
    // A key file that is no key.
    let junk = dir.path().join("junk.key");
    std::fs::write(&junk, "not a key").unwrap();
    let (status, stderr) =
        CpProcess::start_fails(&db, &["--secrets-key-file", junk.to_str().unwrap()]).await;
    assert!(!status.success());
    assert!(
        stderr.contains("must hold 32 bytes: 64 hex digits"),
        "{stderr}"
    );
    assert!(!stderr.contains("not a key"), "{stderr}");

    // The right key: the key is back, and streamed.
    let cp =
        CpProcess::start_with_tokens(&db, &["--secrets-key-file", right.to_str().unwrap()]).await;
    assert_eq!(
        pushed(&cp, "dp-restart").await[0].private_key_pem,
        edge.private_key_pem
    );
}

/// `msg` with `authorization: Bearer TOKEN`.
fn with<T>(token: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn with_tokens_only_data_planes_receive_keys_and_viewers_read_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "ops admin admin-token\nwatch viewer viewer-token\nedge data-plane dp-token\n",
    )
    .unwrap();
    let key = key_file(dir.path(), "secrets.key", 3);
    let cp = CpProcess::start(
        &dir.path().join("cp.db"),
        &[
            "--auth-tokens-file",
            tokens.to_str().unwrap(),
            "--secrets-key-file",
            key.to_str().unwrap(),
        ],
    )
    .await;
    let mut admin = cp.admin().await;
    let edge = fresh("edge", "api.example.com");
    let upsert_as = |token: &str| {
        with(
            token,
            UpsertCertificateRequest {
                certificate: Some(edge.clone()),
                expected_version: None,
            },
        )
    };
    let e = admin
        .upsert_certificate(upsert_as("viewer-token"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    admin
        .upsert_certificate(upsert_as("admin-token"))
        .await
        .unwrap();
    let seen = admin
        .get_certificate(with(
            "viewer-token",
            GetCertificateRequest {
                name: "edge".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(seen.private_key_set && seen.private_key_pem.is_empty());
    let listed = admin
        .list_certificates(with("viewer-token", ListCertificatesRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.certificates.len(), 1);

    // StreamConfig: refused to operators' tokens, the key for a data plane's.
    let stream_as = |token: &str| {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.try_send(ConfigRequest {
            node: Some(Node {
                id: format!("dp-{token}"),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
        (tx, with(token, ReceiverStream::new(rx)))
    };
    for token in ["admin-token", "viewer-token"] {
        let (_tx, req) = stream_as(token);
        let e = cp.discovery().await.stream_config(req).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{token}");
    }
    let (_tx, req) = stream_as("dp-token");
    let mut stream = cp
        .discovery()
        .await
        .stream_config(req)
        .await
        .unwrap()
        .into_inner();
    let snapshot = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        snapshot.certificates[0].private_key_pem,
        edge.private_key_pem
    );
}
