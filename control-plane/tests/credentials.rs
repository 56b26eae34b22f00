//! Credentials through the real binary: API keys (CreateApiKey returns the key
//! once, only its hash is kept and pushed, List/GetConfig show no secret,
//! revoke, errors) and the write-only upstream `identity_signing_secret`
//! (never read back, carried over, cleared explicitly), and how both survive
//! ApplyConfig and RollbackConfig.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use control_plane::credentials::key_sha256;
use gateway_proto::v1::{
    ApplyConfigRequest, CreateApiKeyRequest, GetConfigRequest, GetUpstreamRequest, Instance,
    ListApiKeysRequest, ListUpstreamsRequest, RevokeApiKeyRequest, RollbackConfigRequest,
    UpsertUpstreamRequest, Upstream,
};
use tonic::Code;

const SECRET_A: &str = "secret-a-0123456789abcdef0123456789";
const SECRET_B: &str = "secret-b-0123456789abcdef0123456789";

/// A control plane with a secrets key (signing secrets are sealed at rest) and
/// tokens (they are streamed only to an authenticated data plane).
async fn start(dir: &tempfile::TempDir) -> CpProcess {
    let key = dir.path().join("secrets.key");
    std::fs::write(&key, "5a".repeat(32)).unwrap();
    CpProcess::start_with_tokens(
        &dir.path().join("cp.db"),
        &["--secrets-key-file", key.to_str().unwrap()],
    )
    .await
}

fn create(name: &str, subject: &str, role: &str) -> CreateApiKeyRequest {
    CreateApiKeyRequest {
        name: name.into(),
        subject: subject.into(),
        role: role.into(),
        expected_version: None,
    }
}

fn upstream(secret: &str) -> Upstream {
    Upstream {
        name: "users".into(),
        instances: vec![Instance {
            id: "users-1".into(),
            url: "http://127.0.0.1:9001".into(),
            ..Default::default()
        }],
        identity_signing_secret: secret.into(),
        ..Default::default()
    }
}

async fn upsert(admin: &mut Admin, u: Upstream) -> Result<u64, tonic::Status> {
    admin
        .upsert_upstream(UpsertUpstreamRequest {
            upstream: Some(u),
            expected_version: None,
        })
        .await
        .map(|r| r.into_inner().version)
}

/// The secret the data planes get for upstream "users" (the config stream is
/// the only place it travels).
async fn pushed_secret(cp: &CpProcess, node: &str) -> String {
    let mut dp = FakeDataPlane::connect(cp, node, "").await;
    let r = dp.next().await;
    r.upstreams
        .iter()
        .find(|u| u.name == "users")
        .map(|u| u.identity_signing_secret.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_are_shown_once_hashed_listed_without_secrets_and_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let mut admin = cp.admin().await;

    let created = admin
        .create_api_key(create("billing", "svc-billing", "service"))
        .await
        .unwrap()
        .into_inner();
    let key = created.key.clone();
    assert!(key.starts_with("gw_") && key.len() == 67, "{key}");
    assert_eq!(created.version, 1);
    let record = created.api_key.unwrap();
    assert_eq!(
        (
            record.name.as_str(),
            record.subject.as_str(),
            record.role.as_str()
        ),
        ("billing", "svc-billing", "service")
    );
    assert_eq!(record.key_sha256, "", "the create answer shows no hash");
    assert_eq!(record.prefix, key[..11]);
    assert!(!record.created_at.is_empty());

    // A second key gets another secret.
    let other = admin
        .create_api_key(create("reports", "svc-reports", "viewer"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(other.key, key);

    // Reads never carry the key or its hash.
    let listed = admin
        .list_api_keys(ListApiKeysRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.version, 2);
    let names: Vec<_> = listed.api_keys.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["billing", "reports"]);
    let config = admin
        .get_config(GetConfigRequest { version: None })
        .await
        .unwrap()
        .into_inner();
    assert!(config.redacted);
    assert_eq!(config.api_keys.len(), 2);
    for text in [format!("{listed:?}"), format!("{config:?}")] {
        assert!(!text.contains(&key[3..]), "a read shows the key: {text}");
        assert!(
            !text.contains(&key_sha256(&key)),
            "a read shows the hash: {text}"
        );
    }

    // Data planes get the hash (and only the hash) of each key.
    let mut dp = FakeDataPlane::connect(&cp, "dp-keys", "").await;
    let pushed = dp.next().await;
    assert_eq!(pushed.version, 2);
    let billing = pushed
        .api_keys
        .iter()
        .find(|k| k.name == "billing")
        .unwrap();
    assert_eq!(billing.key_sha256, key_sha256(&key));
    assert!(!format!("{pushed:?}").contains(&key[3..]));
    dp.ack(&pushed).await;

    // Errors.
    let dup = admin
        .create_api_key(create("billing", "x", "y"))
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);
    assert_eq!(dup.message(), "api key \"billing\" already exists");
    let bad = admin
        .create_api_key(create("Bad_Name", "", "r"))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message().contains("name must match"),
        "{}",
        bad.message()
    );
    assert!(
        bad.message().contains("subject must be"),
        "{}",
        bad.message()
    );
    let unknown = admin
        .revoke_api_key(RevokeApiKeyRequest {
            name: "nope".into(),
            expected_version: None,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    // Revoke: a new version without the key, pushed at once.
    let v = admin
        .revoke_api_key(RevokeApiKeyRequest {
            name: "billing".into(),
            expected_version: None,
        })
        .await
        .unwrap()
        .into_inner()
        .version;
    assert_eq!(v, 3);
    let pushed = dp.next().await;
    assert_eq!(pushed.version, 3);
    let names: Vec<_> = pushed.api_keys.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["reports"]);
    // The key never reached a log line.
    assert!(!cp.logs().contains(&key[3..]));
}

#[tokio::test(flavor = "multi_thread")]
async fn rollback_and_apply_never_bring_back_a_revoked_key() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let mut admin = cp.admin().await;
    let v1 = upsert(&mut admin, upstream("")).await.unwrap();
    admin
        .create_api_key(create("old", "svc", "service"))
        .await
        .unwrap();
    admin
        .create_api_key(create("kept", "svc", "service"))
        .await
        .unwrap();
    admin
        .revoke_api_key(RevokeApiKeyRequest {
            name: "old".into(),
            expected_version: None,
        })
        .await
        .unwrap();
    // Version 1 had no key, version 2 had "old": neither rollback changes the keys.
    for target in [v1, v1 + 1] {
        admin
            .rollback_config(RollbackConfigRequest {
                version: target,
                expected_version: None,
            })
            .await
            .unwrap();
        let keys = admin
            .list_api_keys(ListApiKeysRequest {})
            .await
            .unwrap()
            .into_inner()
            .api_keys;
        let names: Vec<_> = keys.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["kept"], "after rollback to {target}");
    }
    // ApplyConfig replaces routes and upstreams, never keys.
    admin
        .apply_config(ApplyConfigRequest {
            upstreams: vec![upstream("")],
            ..Default::default()
        })
        .await
        .unwrap();
    let keys = admin
        .list_api_keys(ListApiKeysRequest {})
        .await
        .unwrap()
        .into_inner()
        .api_keys;
    assert_eq!(keys.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_signing_secret_is_write_only_carried_over_and_cleared_explicitly() {
    let dir = tempfile::tempdir().unwrap();
    let cp = start(&dir).await;
    let mut admin = cp.admin().await;
    let with_a = upsert(&mut admin, upstream(SECRET_A)).await.unwrap();

    // No read returns it; each says that it is set.
    let got = admin
        .get_upstream(GetUpstreamRequest {
            name: "users".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let listed = admin
        .list_upstreams(ListUpstreamsRequest {})
        .await
        .unwrap()
        .into_inner()
        .upstreams;
    let current = admin
        .get_config(GetConfigRequest { version: None })
        .await
        .unwrap()
        .into_inner();
    let past = admin
        .get_config(GetConfigRequest {
            version: Some(with_a),
        })
        .await
        .unwrap()
        .into_inner();
    for u in [&got, &listed[0], &current.upstreams[0], &past.upstreams[0]] {
        assert_eq!(u.identity_signing_secret, "");
        assert!(u.identity_signing_secret_set);
    }
    for text in [
        format!("{got:?}"),
        format!("{listed:?}"),
        format!("{current:?}"),
        format!("{past:?}"),
    ] {
        assert!(!text.contains(SECRET_A), "{text}");
    }
    assert_eq!(pushed_secret(&cp, "dp-1").await, SECRET_A);

    // Writing back what GetUpstream returned keeps the secret (no new version).
    let mut edited = got.clone();
    let same = upsert(&mut admin, edited.clone()).await.unwrap();
    assert_eq!(same, with_a, "an unchanged upsert makes no version");
    edited.instances[0].url = "http://127.0.0.1:9002".into();
    upsert(&mut admin, edited).await.unwrap();
    assert_eq!(pushed_secret(&cp, "dp-2").await, SECRET_A);
    // ApplyConfig carries it over by name too.
    admin
        .apply_config(ApplyConfigRequest {
            upstreams: vec![upstream("")],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(pushed_secret(&cp, "dp-3").await, SECRET_A);

    // Rotate to B; a rollback to the version with A keeps B.
    upsert(&mut admin, upstream(SECRET_B)).await.unwrap();
    admin
        .rollback_config(RollbackConfigRequest {
            version: with_a,
            expected_version: None,
        })
        .await
        .unwrap();
    assert_eq!(pushed_secret(&cp, "dp-4").await, SECRET_B);

    // Bad values are refused without echoing them.
    let short = upsert(&mut admin, upstream("too-short")).await.unwrap_err();
    assert_eq!(short.code(), Code::InvalidArgument);
    assert!(
        short
            .message()
            .contains("upstream \"users\": identity_signing_secret must be 32 to 256"),
        "{}",
        short.message()
    );
    assert!(!short.message().contains("too-short"));
    let mut both = upstream(SECRET_A);
    both.clear_identity_signing_secret = true;
    let both = upsert(&mut admin, both).await.unwrap_err();
    assert_eq!(both.code(), Code::InvalidArgument);

    // Clearing is explicit.
    let mut clear = upstream("");
    clear.clear_identity_signing_secret = true;
    upsert(&mut admin, clear).await.unwrap();
    let got = admin
        .get_upstream(GetUpstreamRequest {
            name: "users".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.identity_signing_secret_set);
    assert!(!got.clear_identity_signing_secret);
    assert_eq!(pushed_secret(&cp, "dp-5").await, "");
    for secret in [SECRET_A, SECRET_B] {
        assert!(!cp.logs().contains(secret), "a secret was logged");
    }
}
