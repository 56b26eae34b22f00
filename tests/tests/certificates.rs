//! TLS certificates as configuration (issue 27, control-plane side) against
//! real processes: devstack's control plane (with its generated
//! `--secrets-key-file`) and two data planes. A certificate committed through
//! AdminService reaches every data plane, which ACKs it (SYNCED) and keeps it
//! in its cache file; a refused one changes nothing; a control-plane restart
//! reopens the encrypted keys; no private key reaches any log. The data
//! planes do not serve HTTPS yet.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use anyhow::{Context, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::{
    Certificate, ConfigSnapshot, GetCertificateRequest, ListDataPlanesRequest,
    UpsertCertificateRequest,
};
use gateway_tests::secrets_in_logs;

/// A certificate for `host`, valid from 2020 to `until`, made now.
fn certificate(name: &str, host: &str, until: i32) -> Certificate {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(until, 1, 1);
    Certificate {
        name: name.into(),
        sni_hosts: vec![host.into()],
        cert_chain_pem: params.self_signed(&key).unwrap().pem(),
        private_key_pem: key.serialize_pem(),
        ..Default::default()
    }
}

fn upsert(c: &Certificate) -> UpsertCertificateRequest {
    UpsertCertificateRequest {
        certificate: Some(c.clone()),
        expected_version: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn data_planes_ack_certificates_and_no_key_reaches_a_log() -> Result<()> {
    let stack = Stack::new().data_planes(2).auth(false).start().await?;
    let mut admin = stack.admin_client().await;
    let seeded = stack.seeded_version();

    let edge = certificate("default", "localhost", 2100);
    let change = admin.upsert_certificate(upsert(&edge)).await?.into_inner();
    ensure!(change.version == seeded + 1, "{change:?}");
    ensure!(change.warnings.is_empty(), "{change:?}");
    // Every data plane validates the snapshot and ACKs it.
    stack.wait_synced(change.version).await?;

    // A key that is not the certificate's: refused by the control plane, nothing pushed.
    let mut mismatched = certificate("api", "api.example.com", 2100);
    mismatched.private_key_pem = certificate("x", "x.example.com", 2100).private_key_pem;
    let e = admin
        .upsert_certificate(upsert(&mismatched))
        .await
        .unwrap_err();
    ensure!(e.code() == tonic::Code::InvalidArgument, "{e:?}");
    ensure!(
        e.message()
            .contains("certificate \"api\": private_key_pem does not match"),
        "{e:?}"
    );

    // An expired one: accepted with a warning, and ACKed too.
    let old = certificate("old", "old.example.com", 2021);
    let change = admin.upsert_certificate(upsert(&old)).await?.into_inner();
    ensure!(change.warnings.len() == 1, "{change:?}");
    stack.wait_synced(change.version).await?;
    let planes = admin
        .list_data_planes(ListDataPlanesRequest {})
        .await?
        .into_inner();
    ensure!(
        planes
            .data_planes
            .iter()
            .all(|p| p.acked_version == change.version && p.last_nack_error.is_empty()),
        "{planes:?}"
    );

    // Each data plane keeps them, keys included, in its owner-only cache file.
    for name in stack.data_plane_names() {
        let path = stack
            .dir()
            .join(format!("{name}-cache"))
            .join("config-snapshot.json");
        let cached: ConfigSnapshot = serde_json::from_str(
            &std::fs::read_to_string(&path).with_context(|| path.display().to_string())?,
        )?;
        let names: Vec<&str> = cached
            .certificates
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        ensure!(names == ["default", "old"], "{name}: {names:?}");
        ensure!(cached.certificates[0].private_key_pem == edge.private_key_pem);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        ensure!(mode == 0o600, "{name}'s cache is mode {mode:o}");
    }

    // The control plane restarts with the same key file: the keys open again
    // and the data planes stay in sync.
    stack.kill("control-plane").await?;
    stack.start_process("control-plane").await?;
    stack.wait_synced(change.version).await?;
    let mut admin = stack.admin_client().await;
    let read = admin
        .get_certificate(GetCertificateRequest {
            name: "default".into(),
        })
        .await?
        .into_inner();
    ensure!(
        read.private_key_set && read.private_key_pem.is_empty(),
        "{read:?}"
    );
    ensure!(read.not_after == "2100-01-01T00:00:00Z", "{read:?}");

    let mut secrets = Vec::new();
    for c in [&edge, &mismatched, &old] {
        for (i, line) in c
            .private_key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .enumerate()
        {
            secrets.push((
                format!("{}'s private key, line {i}", c.name),
                line.to_owned(),
            ));
        }
    }
    let (scanned, leaks) = secrets_in_logs(&stack.log_dir(), &secrets)?;
    ensure!(scanned >= 4, "only {scanned} log files");
    ensure!(leaks.is_empty(), "keys in the logs:\n{}", leaks.join("\n"));
    stack.shutdown().await;
    Ok(())
}
