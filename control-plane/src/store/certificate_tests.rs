//! Certificates in the store: private keys sealed at rest, opened only with
//! their secrets key, restored by rollback; warnings for expired ones.

use super::*;
use crate::changes::{Action, Kind};
use chrono::{TimeZone, Utc};
use gateway_proto::v1::Certificate;
use rcgen::{CertificateParams, KeyPair};

fn fixed_clock() -> Arc<dyn Clock> {
    let t = Utc.with_ymd_and_hms(2025, 3, 4, 5, 6, 7).unwrap();
    Arc::new(gateway_clock::ManualClock::new(
        std::time::Duration::from_secs(t.timestamp() as u64),
    ))
}

fn secrets(byte: u8) -> SecretsKey {
    SecretsKey::from_bytes(&[byte; crate::secrets::SECRETS_KEY_LEN])
}

async fn open_with(dir: &tempfile::TempDir, key: Option<u8>) -> Result<Store, StoreError> {
    Store::open_with(&dir.path().join("cp.db"), fixed_clock(), key.map(secrets)).await
}

fn none() -> MutateOptions {
    MutateOptions::default()
}

/// A certificate for `host` made with `key` (valid until `not_after_year`).
fn issue(name: &str, host: &str, key: &KeyPair, not_after_year: i32) -> Certificate {
    let mut params = CertificateParams::new(vec![host.to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(not_after_year, 1, 1);
    Certificate {
        name: name.into(),
        sni_hosts: vec![host.into()],
        cert_chain_pem: params.self_signed(key).unwrap().pem(),
        private_key_pem: key.serialize_pem(),
        ..Default::default()
    }
}

/// The base64 body of a PEM block: what would show in the file if the key were stored in the clear.
fn pem_body(pem: &str) -> String {
    pem.lines().filter(|l| !l.starts_with("-----")).collect()
}

/// Every byte SQLite wrote for the database: the file and its write-ahead log.
fn database_bytes(dir: &tempfile::TempDir) -> Vec<u8> {
    let mut all = Vec::new();
    for name in ["cp.db", "cp.db-wal"] {
        if let Ok(b) = std::fs::read(dir.path().join(name)) {
            all.extend(b);
        }
    }
    all
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn without_a_secrets_key_no_certificate_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir, None).await.unwrap();
    let key = KeyPair::generate().unwrap();
    let e = store
        .mutate(
            Mutation::UpsertCertificate(issue("edge", "a.example.com", &key, 2100)),
            &none(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::NoSecretsKey), "{e}");
    assert!(e.to_string().contains("--secrets-key-file"), "{e}");
    // Even an invalid certificate gets the same answer: nothing could be stored.
    let mut bad = issue("edge", "a.example.com", &key, 2100);
    bad.cert_chain_pem = "garbage".into();
    let e = store
        .mutate(Mutation::UpsertCertificate(bad), &none())
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::NoSecretsKey), "{e}");
    assert_eq!(store.current().version, 0);
}

#[tokio::test]
async fn keys_are_sealed_at_rest_and_open_only_with_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir, Some(1)).await.unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = issue("edge", "a.example.com", &key, 2100);
    let o = store
        .mutate(Mutation::UpsertCertificate(cert.clone()), &none())
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (1, true));
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    let cur = store.current();
    let stored = &cur.certificates[0];
    assert_eq!(
        stored.private_key_pem, cert.private_key_pem,
        "in memory, for the streams"
    );
    assert_eq!(stored.not_after, "2100-01-01T00:00:00Z");
    assert_eq!(stored.not_before, "2020-01-01T00:00:00Z");
    assert_eq!(stored.sha256_fingerprint.len(), 64);
    assert_eq!(stored.subject_alt_names, ["a.example.com"]);
    assert_eq!(
        cur.hash,
        ConfigRef::from(&*cur).to_config().hash(&store.hash_key)
    );
    store.close().await;

    // The file holds the chain, never the key.
    let bytes = database_bytes(&dir);
    assert!(
        contains(&bytes, &pem_body(&cert.cert_chain_pem)[..40]),
        "the scan sees stored PEM"
    );
    let key_body = pem_body(&cert.private_key_pem);
    assert!(
        !contains(&bytes, &key_body[..24]),
        "the private key is stored in the clear"
    );
    assert!(!contains(&bytes, "PRIVATE KEY"));

    // Another key, or none: refused before anything is served.
    for other in [Some(2), None] {
        let e = open_with(&dir, other).await.unwrap_err();
        assert!(matches!(e, StoreError::WrongSecretsKey(_)), "{e}");
        assert!(e.to_string().contains("--secrets-key-file"), "{e}");
    }
    // The right key: the key comes back, the hash still matches.
    let store = open_with(&dir, Some(1)).await.unwrap();
    assert_eq!(
        store.current().certificates[0].private_key_pem,
        cert.private_key_pem
    );
    assert_eq!(
        store.snapshot(1).await.unwrap().certificates[0].private_key_pem,
        cert.private_key_pem
    );
}

#[tokio::test]
async fn a_database_without_keys_opens_with_any_secrets_key_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir, Some(1)).await.unwrap();
    store
        .mutate(
            Mutation::UpsertUpstream(gateway_proto::v1::Upstream {
                name: "u".into(),
                instances: vec![gateway_proto::v1::Instance {
                    id: "i".into(),
                    url: "http://127.0.0.1:1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            &none(),
        )
        .await
        .unwrap();
    store.close().await;
    open_with(&dir, Some(2)).await.unwrap().close().await;
    open_with(&dir, None).await.unwrap();
}

#[tokio::test]
async fn an_upsert_without_a_key_keeps_it_for_the_same_key_pair_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir, Some(1)).await.unwrap();
    let key = KeyPair::generate().unwrap();
    let first = issue("edge", "a.example.com", &key, 2100);
    store
        .mutate(Mutation::UpsertCertificate(first.clone()), &none())
        .await
        .unwrap();
    // Renewed (new dates, same key pair), sent without its key: kept.
    let mut renewed = issue("edge", "a.example.com", &key, 2101);
    renewed.private_key_pem.clear();
    let o = store
        .mutate(Mutation::UpsertCertificate(renewed), &none())
        .await
        .unwrap();
    assert_eq!(o.version, 2);
    let cur = store.current();
    assert_eq!(cur.certificates[0].private_key_pem, first.private_key_pem);
    assert_eq!(cur.certificates[0].not_after, "2101-01-01T00:00:00Z");
    // A new key pair without its key: refused; with it: accepted.
    let other = KeyPair::generate().unwrap();
    let mut rekeyed = issue("edge", "a.example.com", &other, 2100);
    let given = std::mem::take(&mut rekeyed.private_key_pem);
    let e = store
        .mutate(Mutation::UpsertCertificate(rekeyed.clone()), &none())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Invalid(m) if m.contains("private_key_pem is required")),
        "{e}"
    );
    rekeyed.private_key_pem = given;
    assert_eq!(
        store
            .mutate(Mutation::UpsertCertificate(rekeyed), &none())
            .await
            .unwrap()
            .version,
        3
    );
}

#[tokio::test]
async fn rollback_restores_the_old_certificates_with_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir, Some(1)).await.unwrap();
    let (k1, k2) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
    let v1 = issue("edge", "a.example.com", &k1, 2100);
    store
        .mutate(Mutation::UpsertCertificate(v1.clone()), &none())
        .await
        .unwrap();
    store
        .mutate(
            Mutation::UpsertCertificate(issue("edge", "a.example.com", &k2, 2100)),
            &none(),
        )
        .await
        .unwrap();
    store
        .mutate(Mutation::DeleteCertificate("edge".into()), &none())
        .await
        .unwrap();
    assert!(store.current().certificates.is_empty());
    let o = store.rollback(1, &none()).await.unwrap();
    assert_eq!(o.version, 4);
    assert_eq!(o.changes.len(), 1);
    assert_eq!(
        (o.changes[0].kind, o.changes[0].action),
        (Kind::Certificate, Action::Added)
    );
    let cur = store.current();
    assert_eq!(cur.certificates[0].private_key_pem, v1.private_key_pem);
    assert_eq!(cur.certificates[0].cert_chain_pem, v1.cert_chain_pem);
    // Same content as version 1: same hash.
    assert_eq!(cur.hash, store.snapshot(1).await.unwrap().hash);
}

#[tokio::test]
async fn apply_dry_run_and_compare_and_swap_cover_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir, Some(1)).await.unwrap();
    let key = KeyPair::generate().unwrap();
    let expired = issue("old", "old.example.com", &key, 2021);
    let with = Config::new(vec![], vec![]).with_certificates(vec![expired.clone()]);
    let dry = MutateOptions {
        dry_run: true,
        ..Default::default()
    };
    let o = store
        .mutate(Mutation::Replace(with.clone()), &dry)
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (1, false));
    assert_eq!(
        (o.changes[0].kind, o.changes[0].name.as_str()),
        (Kind::Certificate, "old")
    );
    assert_eq!(o.warnings.len(), 1, "{:?}", o.warnings);
    assert!(
        o.warnings[0].contains("certificate \"old\": expired at 2021-01-01T00:00:00Z"),
        "{:?}",
        o.warnings
    );
    assert_eq!(store.current().version, 0, "a dry run commits nothing");

    let cas = |v| MutateOptions {
        expected_version: Some(v),
        ..Default::default()
    };
    let e = store
        .mutate(Mutation::Replace(with.clone()), &cas(5))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::VersionMismatch { .. }), "{e}");
    let o = store
        .mutate(Mutation::Replace(with), &cas(0))
        .await
        .unwrap();
    assert_eq!((o.version, o.warnings.len()), (1, 1));
    assert_eq!(
        store.versions(0).await.unwrap()[0].summary,
        "apply: +1 certificate"
    );

    // Applying back what a read shows (no key) keeps the key and changes nothing.
    let shown = crate::certificates::redact_certificate(&store.current().certificates[0]);
    let o = store
        .mutate(
            Mutation::Replace(Config::new(vec![], vec![]).with_certificates(vec![shown])),
            &none(),
        )
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (1, false));
    assert!(o.warnings.is_empty(), "nothing new to warn about");
    // An ApplyConfig without certificates keeps them (clients that predate
    // certificates never remove one); clearing them is explicit.
    let o = store
        .mutate(Mutation::Replace(Config::default()), &none())
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (1, false));
    assert_eq!(store.current().certificates.len(), 1);
    let key = KeyPair::generate().unwrap();
    let e = store
        .mutate(
            Mutation::ReplaceClearingCertificates(
                Config::default().with_certificates(vec![issue(
                    "new",
                    "new.example.com",
                    &key,
                    2100,
                )]),
            ),
            &none(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Invalid(m) if m == "certificates and clear_certificates cannot both be set"),
        "{e}"
    );
    let o = store
        .mutate(
            Mutation::ReplaceClearingCertificates(Config::default()),
            &none(),
        )
        .await
        .unwrap();
    assert_eq!(o.version, 2);
    assert!(store.current().certificates.is_empty());
    assert_eq!(
        (o.changes[0].kind, o.changes[0].action),
        (Kind::Certificate, Action::Removed)
    );
}

/// An upstream with a signing secret (issue 41, item 10).
fn signed_upstream(name: &str, secret: &str) -> gateway_proto::v1::Upstream {
    gateway_proto::v1::Upstream {
        name: name.into(),
        instances: vec![gateway_proto::v1::Instance {
            id: "i1".into(),
            url: "http://127.0.0.1:7001".into(),
            ..Default::default()
        }],
        identity_signing_secret: secret.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn signing_secrets_are_sealed_at_rest_like_private_keys() {
    const SECRET: &str = "sealed-at-rest-0123456789abcdef-signing";
    let dir = tempfile::tempdir().unwrap();
    // Without a secrets key, no signing secret is stored either.
    let store = open_with(&dir, None).await.unwrap();
    let e = store
        .mutate(
            Mutation::UpsertUpstream(signed_upstream("users", SECRET)),
            &none(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::NoSecretsKey), "{e}");
    assert!(e.to_string().contains("identity_signing_secret"), "{e}");
    assert_eq!(store.current().version, 0);
    store.close().await;

    let store = open_with(&dir, Some(1)).await.unwrap();
    store
        .mutate(
            Mutation::UpsertUpstream(signed_upstream("users", SECRET)),
            &none(),
        )
        .await
        .unwrap();
    assert_eq!(
        store.current().upstreams[0].identity_signing_secret,
        SECRET,
        "in memory, for the streams"
    );
    store.close().await;
    assert!(
        !contains(&database_bytes(&dir), SECRET),
        "the signing secret is stored in the clear"
    );
    // Only its key opens the database; with it the secret comes back.
    for other in [Some(2), None] {
        let e = open_with(&dir, other).await.unwrap_err();
        assert!(matches!(e, StoreError::WrongSecretsKey(_)), "{e}");
    }
    let store = open_with(&dir, Some(1)).await.unwrap();
    let cur = store.current();
    assert_eq!(cur.upstreams[0].identity_signing_secret, SECRET);
    assert_eq!(
        cur.hash,
        ConfigRef::from(&*cur).to_config().hash(&store.hash_key)
    );
}

#[test]
fn a_stored_row_from_before_sealing_still_decodes() {
    // Rows written by earlier releases hold the secret in the upstream itself.
    let mut plain = Vec::new();
    prost::encoding::message::encode(4, &signed_upstream("users", "legacy-secret"), &mut plain);
    let config = crate::config::Config::decode(&plain, None).unwrap();
    assert_eq!(config.upstreams[0].identity_signing_secret, "legacy-secret");
}

#[test]
fn a_sealed_private_key_never_opens_as_a_signing_secret() {
    let key = secrets(1);
    let config = crate::config::Config::new(Vec::new(), vec![signed_upstream("edge", "s3cret")]);
    let mut bytes = config.encode(Some(&key)).unwrap();
    // A certificate's sealed key, named like the upstream, swapped into field 13.
    let swapped = key.seal("edge", b"-----BEGIN PRIVATE KEY-----");
    prost::encoding::message::encode(13, &swapped, &mut bytes);
    let e = crate::config::Config::decode(&bytes, Some(&key)).unwrap_err();
    assert!(e.to_string().contains("not sealed for an upstream"), "{e}");
}
