//! Two control planes on one Postgres database (issue 28): operators commit
//! concurrently through the real grpcurl on both, and every version is
//! numbered once, gap-free, with its author, whichever replica took it; both
//! replicas serve the same head. API keys, certificates (private keys sealed
//! with the shared --secrets-key-file) and rollbacks made on one replica are
//! seen on the other, and the history stays append-only in the database.
//!
//! Needs the workspace binaries built (`cargo build --workspace --bins`),
//! Postgres (`initdb`, `pg_ctl`) and grpcurl; `scripts/test` installs both.

#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod postgres;

use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use gateway_proto::v1::{
    Certificate, CreateApiKeyRequest, GetCertificateRequest, ListApiKeysRequest,
    ListConfigVersionsRequest, ListRoutesRequest, RollbackConfigRequest, UpsertCertificateRequest,
};
use gateway_tests::poll;
use postgres::{ALICE, BOB, ControlPlane, PgServer, SOON, grpcurl, work_dir};

/// Commits per replica in the concurrent burst.
const PER_REPLICA: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_grpcurl_commits_on_two_replicas_get_gap_free_versions_and_one_head()
-> anyhow::Result<()> {
    let pg = PgServer::start().await?;
    let dir = work_dir()?;
    let a = ControlPlane::start("cp-a", &pg.url(), dir.path(), None).await?;
    let b = ControlPlane::start("cp-b", &pg.url(), dir.path(), None).await?;

    let first = grpcurl(
        a.addr,
        ALICE,
        "UpsertUpstream",
        r#"{"upstream":{"name":"orders","instances":[{"id":"o1","url":"http://127.0.0.1:9"}]}}"#,
    )
    .await?
    .json()?;
    assert_eq!(first["version"], "1", "{first}");

    // Alice on replica A and Bob on replica B, all at once.
    let mut calls = Vec::new();
    for i in 0..PER_REPLICA {
        for (cp, token, who) in [(&a, ALICE, "alice"), (&b, BOB, "bob")] {
            let addr = cp.addr;
            let body = format!(
                r#"{{"route":{{"name":"{who}-{i}","pathPrefix":"/{who}/{i}","upstream":"orders","auth":"AUTH_NONE"}}}}"#
            );
            calls.push(tokio::spawn(async move {
                grpcurl(addr, token, "UpsertRoute", &body).await
            }));
        }
    }
    let mut versions = BTreeSet::new();
    for call in calls {
        let answer = call.await??.json()?;
        let v: u64 = answer["version"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no version in {answer}"))?;
        ensure!(versions.insert(v), "version {v} was given to two commits");
    }
    let last = 1 + 2 * PER_REPLICA as u64;
    assert_eq!(
        versions,
        (2..=last).collect::<BTreeSet<u64>>(),
        "every commit got its own version, without gaps"
    );

    // Both replicas serve the same head, with every route.
    for cp in [&a, &b] {
        let mut admin = cp.admin(ALICE);
        poll(SOON, &format!("{} serving version {last}", cp.name), || {
            let mut admin = admin.clone();
            async move {
                let routes = admin
                    .list_routes(ListRoutesRequest {})
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                if routes.version == last && routes.routes.len() == 2 * PER_REPLICA {
                    Ok(())
                } else {
                    Err(format!(
                        "version {}, {} routes",
                        routes.version,
                        routes.routes.len()
                    ))
                }
            }
        })
        .await?;
        // The history each one reads: 1..=last, newest first, each author the operator who committed it.
        let history = admin
            .list_config_versions(ListConfigVersionsRequest { limit: Some(100) })
            .await?
            .into_inner()
            .versions;
        let numbers: Vec<u64> = history.iter().map(|v| v.version).collect();
        assert_eq!(numbers, (1..=last).rev().collect::<Vec<_>>(), "{}", cp.name);
        for v in &history {
            let expected = if v.summary.contains("bob-") {
                "bob"
            } else {
                "alice"
            };
            assert_eq!(v.author, expected, "version {} ({})", v.version, v.summary);
        }
    }
    let head = |history: &[gateway_proto::v1::ConfigVersion]| history[0].hash.clone();
    let ha = a
        .admin(ALICE)
        .list_config_versions(ListConfigVersionsRequest { limit: Some(1) })
        .await?
        .into_inner()
        .versions;
    let hb = b
        .admin(BOB)
        .list_config_versions(ListConfigVersionsRequest { limit: Some(1) })
        .await?
        .into_inner()
        .versions;
    assert_eq!(head(&ha), head(&hb));

    // Append-only in the database itself, whoever connects to it.
    for sql in [
        "UPDATE config_versions SET summary = 'rewritten' WHERE version = 1",
        "DELETE FROM config_versions WHERE version = 1",
        "INSERT INTO config_versions (version, snapshot, hash, created_at, summary) \
         VALUES (1000, '', '', '', 'a gap')",
    ] {
        let refused = pg.psql(sql).await.unwrap_err().to_string();
        assert!(
            refused.contains("append-only") || refused.contains("consecutive"),
            "{sql}: {refused}"
        );
    }
    Ok(())
}

fn certificate(name: &str, host: &str) -> Certificate {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2090, 1, 1);
    Certificate {
        name: name.into(),
        sni_hosts: vec![host.into()],
        cert_chain_pem: params.self_signed(&key).unwrap().pem(),
        private_key_pem: key.serialize_pem(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_certificates_and_rollback_work_across_replicas() -> anyhow::Result<()> {
    let pg = PgServer::start().await?;
    let dir = work_dir()?;
    let a = ControlPlane::start("cp-a", &pg.url(), dir.path(), None).await?;
    let b = ControlPlane::start("cp-b", &pg.url(), dir.path(), None).await?;
    let (mut on_a, mut on_b) = (a.admin(ALICE), b.admin(BOB));

    // An API key made on A is listed on B (its secret only in A's answer).
    let created = on_a
        .create_api_key(CreateApiKeyRequest {
            name: "billing".into(),
            subject: "svc-billing".into(),
            role: "service".into(),
            expected_version: None,
        })
        .await?
        .into_inner();
    assert!(!created.key.is_empty());
    let listed = poll(SOON, "B listing the API key made on A", || {
        let mut on_b = on_b.clone();
        async move {
            let keys = on_b
                .list_api_keys(ListApiKeysRequest {})
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
                .api_keys;
            keys.into_iter()
                .find(|k| k.name == "billing")
                .ok_or_else(|| "not yet".to_owned())
        }
    })
    .await?;
    assert_eq!(listed.subject, "svc-billing");
    assert!(listed.key_sha256.is_empty(), "the key's hash is not shown");

    // A certificate stored through B, its key sealed with the shared key
    // file, is served by A without the key, as stored.
    let cert = certificate("edge", "api.example.test");
    let stored = on_b
        .upsert_certificate(UpsertCertificateRequest {
            certificate: Some(cert.clone()),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    let seen = poll(SOON, "A serving the certificate stored on B", || {
        let mut on_a = on_a.clone();
        async move {
            on_a.get_certificate(GetCertificateRequest {
                name: "edge".into(),
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| e.to_string())
        }
    })
    .await?;
    assert_eq!(seen.cert_chain_pem, cert.cert_chain_pem);
    assert!(seen.private_key_set && seen.private_key_pem.is_empty());
    let dump = pg
        .psql("SELECT encode(snapshot, 'escape') FROM config_versions")
        .await?;
    assert!(
        !dump.contains("PRIVATE KEY"),
        "a private key reached the database in the clear"
    );

    // Roll back on A to the version before the certificate; B serves the result,
    // recorded as Alice's rollback.
    let rolled = on_a
        .rollback_config(RollbackConfigRequest {
            version: stored - 1,
            expected_version: Some(stored),
        })
        .await?
        .into_inner()
        .version;
    assert_eq!(rolled, stored + 1);
    poll(SOON, "B serving the rollback", || {
        let mut on_b = on_b.clone();
        async move {
            match on_b
                .get_certificate(GetCertificateRequest {
                    name: "edge".into(),
                })
                .await
            {
                Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await?;
    let newest = on_b
        .list_config_versions(ListConfigVersionsRequest { limit: Some(1) })
        .await?
        .into_inner()
        .versions
        .remove(0);
    assert_eq!((newest.version, newest.author.as_str()), (rolled, "alice"));
    assert!(newest.summary.contains("rollback"), "{}", newest.summary);

    // A compare-and-swap against a version the other replica already moved past fails.
    let stale = on_b
        .rollback_config(RollbackConfigRequest {
            version: 1,
            expected_version: Some(stored),
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    Ok(())
}
