use super::*;
use crate::changes::{Action, Kind};
use chrono::{TimeZone, Utc};
use gateway_proto::v1::{Instance, Route, Upstream};
use std::collections::BTreeSet;

fn route(name: &str, upstream: &str) -> Route {
    Route {
        name: name.into(),
        path_prefix: format!("/{name}"),
        upstream: upstream.into(),
        ..Default::default()
    }
}

fn upstream(name: &str) -> Upstream {
    Upstream {
        name: name.into(),
        instances: vec![Instance {
            id: "i1".into(),
            url: "http://127.0.0.1:9000".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn fixed_clock() -> Arc<dyn Clock> {
    let t = Utc.with_ymd_and_hms(2025, 3, 4, 5, 6, 7).unwrap();
    Arc::new(gateway_clock::ManualClock::new(
        std::time::Duration::from_secs(t.timestamp() as u64),
    ))
}

/// The secrets key of [`open`]: upstream signing secrets are stored only sealed.
fn test_secrets() -> SecretsKey {
    SecretsKey::from_bytes(&[9; crate::secrets::SECRETS_KEY_LEN])
}

async fn open(dir: &tempfile::TempDir) -> Store {
    Store::open_with(
        &dir.path().join("cp.db"),
        fixed_clock(),
        Some(test_secrets()),
    )
    .await
    .unwrap()
}

fn none() -> MutateOptions {
    MutateOptions::default()
}

#[tokio::test]
async fn a_new_database_is_version_zero() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    assert!(store.is_empty().await.unwrap());
    let cur = store.current();
    assert_eq!(cur.version, 0);
    // Nothing secret in the empty configuration: the SHA-256 of no bytes.
    assert_eq!(cur.hash, gateway_proto::hash::plain_sha256(b""));
    assert_eq!(store.snapshot(0).await.unwrap().version, 0);
    let e = store.snapshot(1).await.unwrap_err();
    assert!(matches!(e, StoreError::NotFound(ref m) if m == "version 1 not found"));
    assert!(store.versions(0).await.unwrap().is_empty());
}

#[tokio::test]
async fn each_mutation_commits_the_next_version_with_its_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let o = store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (1, true));
    let o = store
        .mutate(Mutation::UpsertRoute(route("orders", "u")), &none())
        .await
        .unwrap();
    assert_eq!(o.version, 2);
    let o = store
        .mutate(Mutation::DeleteRoute("orders".into()), &none())
        .await
        .unwrap();
    assert_eq!(o.version, 3);

    let versions = store.versions(0).await.unwrap();
    let got: Vec<(u64, &str)> = versions
        .iter()
        .map(|v| (v.version, v.summary.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (3, "delete route \"orders\""),
            (2, "upsert route \"orders\""),
            (1, "upsert upstream \"u\""),
        ]
    );
    assert_eq!(versions[0].created_at, "2025-03-04T05:06:07.000Z");
    assert_eq!(versions[0].author, ANONYMOUS);
    assert_eq!(store.versions(2).await.unwrap().len(), 2);

    let v2 = store.snapshot(2).await.unwrap();
    assert_eq!(v2.routes.len(), 1);
    assert_eq!(
        v2.hash,
        gateway_proto::config_hash(&v2.routes, &v2.upstreams, &[], &[], &store.hash_key)
    );
    let cur = store.current();
    assert_eq!(cur.version, 3);
    assert!(cur.routes.is_empty());
    assert_eq!(cur.upstreams.len(), 1);
}

#[tokio::test]
async fn invalid_or_failed_mutations_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    store
        .mutate(Mutation::UpsertRoute(route("a", "u")), &none())
        .await
        .unwrap();

    let mut bad = route("b", "u");
    bad.path_prefix = "b".into();
    let e = store
        .mutate(Mutation::UpsertRoute(bad), &none())
        .await
        .unwrap_err();
    assert!(
        matches!(e, StoreError::Invalid(ref m) if m.contains("route \"b\": path_prefix must start with")),
        "{e}"
    );
    let e = store
        .mutate(Mutation::UpsertRoute(route("c", "missing")), &none())
        .await
        .unwrap_err();
    assert!(
        matches!(e, StoreError::Invalid(ref m) if m.contains("upstream \"missing\" does not exist")),
        "{e}"
    );
    let e = store
        .mutate(Mutation::DeleteUpstream("u".into()), &none())
        .await
        .unwrap_err();
    assert!(
        matches!(e, StoreError::Invalid(ref m) if m.contains("still used by route \"a\"")),
        "{e}"
    );
    let e = store
        .mutate(Mutation::DeleteRoute("zz".into()), &none())
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::NotFound(_)), "{e}");

    assert_eq!(store.current().version, 2);
    assert_eq!(store.versions(0).await.unwrap().len(), 2);
}

#[tokio::test]
async fn reapplying_the_current_content_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    let o = store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (1, false));
    let o = store
        .mutate(
            Mutation::Replace(Config::new(vec![], vec![upstream("u")])),
            &none(),
        )
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (1, false));
    assert!(o.changes.is_empty());
    assert_eq!(store.versions(0).await.unwrap().len(), 1);
}

#[tokio::test]
async fn expected_version_is_compare_and_swap() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let cas = |v| MutateOptions {
        expected_version: Some(v),
        ..Default::default()
    };
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &cas(0))
        .await
        .unwrap();
    let e = store
        .mutate(Mutation::UpsertUpstream(upstream("v")), &cas(0))
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "expected version 0, current is 1");
    assert!(matches!(
        e,
        StoreError::VersionMismatch {
            expected: 0,
            current: 1
        }
    ));
    // The CAS check comes before NOT_FOUND: a stale view is reported as such.
    let e = store
        .mutate(Mutation::DeleteRoute("nope".into()), &cas(7))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::VersionMismatch { .. }), "{e}");
    let o = store
        .mutate(Mutation::UpsertUpstream(upstream("v")), &cas(1))
        .await
        .unwrap();
    assert_eq!(o.version, 2);
}

#[tokio::test]
async fn dry_run_diffs_without_committing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(
            Mutation::Replace(Config::new(
                vec![route("a", "u"), route("b", "u")],
                vec![upstream("u")],
            )),
            &none(),
        )
        .await
        .unwrap();
    let mut b = route("b", "u");
    b.timeout_ms = 100;
    let dry = MutateOptions {
        dry_run: true,
        ..Default::default()
    };
    let o = store
        .mutate(
            Mutation::Replace(Config::new(
                vec![b, route("c", "v")],
                vec![upstream("u"), upstream("v")],
            )),
            &dry,
        )
        .await
        .unwrap();
    assert_eq!((o.version, o.committed), (2, false));
    let got: Vec<(Kind, &str, Action)> = o
        .changes
        .iter()
        .map(|c| (c.kind, c.name.as_str(), c.action))
        .collect();
    assert_eq!(
        got,
        [
            (Kind::Route, "a", Action::Removed),
            (Kind::Route, "b", Action::Updated),
            (Kind::Route, "c", Action::Added),
            (Kind::Upstream, "v", Action::Added),
        ]
    );
    assert_eq!(store.current().version, 1);
    assert_eq!(store.versions(0).await.unwrap().len(), 1);

    // A dry run of something invalid reports the same error a commit would.
    let e = store
        .mutate(
            Mutation::Replace(Config::new(vec![route("a", "nope")], vec![])),
            &dry,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e}");

    let o = store
        .mutate(
            Mutation::Replace(Config::new(vec![route("a", "u")], vec![upstream("u")])),
            &none(),
        )
        .await
        .unwrap();
    assert_eq!(o.version, 2);
    assert_eq!(
        store.versions(1).await.unwrap()[0].summary,
        "apply: -1 route"
    );
}

#[tokio::test]
async fn rollback_commits_a_new_version_with_the_old_content() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    store
        .mutate(Mutation::UpsertRoute(route("a", "u")), &none())
        .await
        .unwrap();
    store
        .mutate(Mutation::UpsertRoute(route("b", "u")), &none())
        .await
        .unwrap();
    let o = store.rollback(2, &none()).await.unwrap();
    assert_eq!((o.version, o.committed), (4, true));
    let v4 = store.snapshot(4).await.unwrap();
    let v2 = store.snapshot(2).await.unwrap();
    assert_eq!(v4.hash, v2.hash);
    assert_eq!(v4.routes, v2.routes);
    assert_eq!(v4.summary, "rollback to version 2");

    // Rolling back to what is already current changes nothing.
    let o = store.rollback(2, &none()).await.unwrap();
    assert_eq!((o.version, o.committed), (4, false));

    let e = store.rollback(99, &none()).await.unwrap_err();
    assert!(matches!(e, StoreError::NotFound(ref m) if m == "version 99 not found"));
    let e = store.rollback(0, &none()).await.unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)));
    let e = store
        .rollback(
            1,
            &MutateOptions {
                expected_version: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::VersionMismatch { .. }));
    assert_eq!(store.current().version, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_upserts_get_twenty_consecutive_versions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(&dir).await);
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .mutate(
                        Mutation::UpsertRoute(route(&format!("r{i}"), "u")),
                        &MutateOptions::default(),
                    )
                    .await
                    .unwrap()
                    .version
            })
        })
        .collect();
    let mut versions = BTreeSet::new();
    for t in tasks {
        versions.insert(t.await.unwrap());
    }
    assert_eq!(versions, (2..=21).collect::<BTreeSet<u64>>());
    let cur = store.current();
    assert_eq!(cur.version, 21);
    assert_eq!(cur.routes.len(), 20, "an update was lost");
    // Every intermediate version holds exactly one more route than the one before.
    for v in 2..=21u64 {
        assert_eq!(store.snapshot(v).await.unwrap().routes.len() as u64, v - 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_in_two_processes_serialize_through_sqlite() {
    // Two independent Store handles on one file behave like two processes:
    // only BEGIN IMMEDIATE (not the in-process mutex) keeps them apart.
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(open(&dir).await);
    let b = Arc::new(open(&dir).await);
    a.mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                store
                    .mutate(
                        Mutation::UpsertRoute(route(&format!("r{i}"), "u")),
                        &MutateOptions::default(),
                    )
                    .await
                    .unwrap()
                    .version
            })
        })
        .collect();
    let mut versions = BTreeSet::new();
    for t in tasks {
        versions.insert(t.await.unwrap());
    }
    assert_eq!(versions, (2..=21).collect::<BTreeSet<u64>>());
    assert_eq!(a.snapshot(21).await.unwrap().routes.len(), 20);
}

#[tokio::test]
async fn reopening_keeps_every_version() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir).await;
        store
            .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
            .await
            .unwrap();
        store
            .mutate(Mutation::UpsertRoute(route("a", "u")), &none())
            .await
            .unwrap();
        store.close().await;
    }
    let store = open(&dir).await;
    let cur = store.current();
    assert_eq!(cur.version, 2);
    assert_eq!(cur.routes[0].name, "a");
    assert_eq!(cur.upstreams[0].name, "u");
    assert_eq!(cur.summary, "upsert route \"a\"");
    assert_eq!(store.versions(0).await.unwrap().len(), 2);
    let o = store
        .mutate(Mutation::UpsertRoute(route("b", "u")), &none())
        .await
        .unwrap();
    assert_eq!(o.version, 3);
}

#[tokio::test]
async fn subscribers_see_each_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let mut rx = store.subscribe();
    assert_eq!(rx.borrow_and_update().version, 0);
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    rx.changed().await.unwrap();
    let s = rx.borrow_and_update().clone();
    assert_eq!(s.version, 1);
    assert_eq!(s.upstreams.len(), 1);
    assert_eq!(s.summary, "upsert upstream \"u\"");
    // A no-op publishes nothing.
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    assert!(!rx.has_changed().unwrap());
}

#[tokio::test]
async fn the_schema_keeps_history_append_only_and_gap_free() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    let gap = sqlx::query(
        "INSERT INTO config_versions (version, snapshot, hash, created_at, summary) \
         VALUES (5, x'', 'h', 't', 's')",
    )
    .execute(store.pool.sqlite())
    .await
    .unwrap_err();
    assert!(gap.to_string().contains("consecutive"), "{gap}");
    let update = sqlx::query("UPDATE config_versions SET summary = 'x'")
        .execute(store.pool.sqlite())
        .await
        .unwrap_err();
    assert!(update.to_string().contains("append-only"), "{update}");
    let update = sqlx::query("UPDATE config_versions SET snapshot = x''")
        .execute(store.pool.sqlite())
        .await
        .unwrap_err();
    assert!(update.to_string().contains("append-only"), "{update}");
    let delete = sqlx::query("DELETE FROM config_versions")
        .execute(store.pool.sqlite())
        .await
        .unwrap_err();
    assert!(delete.to_string().contains("append-only"), "{delete}");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(store.pool.sqlite())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn a_row_whose_content_does_not_match_its_hash_is_reported_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    sqlx::query("DROP TRIGGER config_versions_no_update")
        .execute(store.pool.sqlite())
        .await
        .unwrap();
    sqlx::query("UPDATE config_versions SET hash = 'bad' WHERE version = 1")
        .execute(store.pool.sqlite())
        .await
        .unwrap();
    let e = store.snapshot(1).await.unwrap_err();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e}");
}

fn with_secret(name: &str, secret: &str) -> Upstream {
    Upstream {
        identity_signing_secret: secret.into(),
        ..upstream(name)
    }
}

/// The plain SHA-256 of a snapshot's stored bytes: what anyone who knows (or
/// guesses) every secret could compute without the store's key.
fn unkeyed(s: &ConfigSnapshot) -> String {
    let c = ConfigRef::from(s).to_config();
    let plain = ConfigSnapshot {
        routes: c.routes,
        upstreams: c.upstreams,
        api_keys: c.api_keys,
        ..Default::default()
    };
    gateway_proto::hash::plain_sha256(&prost::Message::encode_to_vec(&plain))
}

#[tokio::test]
async fn a_secret_only_change_is_a_new_hash_that_reveals_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let secret = "guessable-secret-guessable-secret-0001";
    let v1 = store
        .mutate(Mutation::UpsertUpstream(with_secret("u", secret)), &none())
        .await
        .unwrap();
    let first = store.current();
    assert_eq!(first.version, v1.version);
    // Someone who guesses the secret cannot confirm it from the hash.
    assert_ne!(first.hash, unkeyed(&first));
    let zero_key = gateway_proto::hash::HashKey::from_bytes([0; 32]);
    assert_ne!(
        first.hash,
        gateway_proto::config_hash(&first.routes, &first.upstreams, &[], &[], &zero_key)
    );

    // Rotating only the secret commits a new version with a new hash.
    let rotated = "guessable-secret-guessable-secret-0002";
    let o = store
        .mutate(Mutation::UpsertUpstream(with_secret("u", rotated)), &none())
        .await
        .unwrap();
    assert!(o.committed);
    let second = store.current();
    assert_eq!(second.version, first.version + 1);
    assert_ne!(second.hash, first.hash);
    // The same secret again changes nothing; clearing it is a change.
    let same = store
        .mutate(Mutation::UpsertUpstream(with_secret("u", rotated)), &none())
        .await
        .unwrap();
    assert!(!same.committed);
    let mut clear = upstream("u");
    clear.clear_identity_signing_secret = true;
    assert!(
        store
            .mutate(Mutation::UpsertUpstream(clear), &none())
            .await
            .unwrap()
            .committed
    );
    let cleared = store.current();
    assert_ne!(cleared.hash, second.hash);
    // Without secrets the hash is the plain one again.
    assert_eq!(cleared.hash, unkeyed(&cleared));

    // The key is stored: a reopened store checks and shows the same hashes.
    let listed: Vec<String> = store
        .versions(0)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.hash)
        .collect();
    store.close().await;
    let reopened = open(&dir).await;
    assert_eq!(reopened.snapshot(1).await.unwrap().hash, first.hash);
    assert_eq!(reopened.snapshot(2).await.unwrap().hash, second.hash);
    let relisted: Vec<String> = reopened
        .versions(0)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.hash)
        .collect();
    assert_eq!(relisted, listed);

    // Another database has another key: same content, another hash.
    let other_dir = tempfile::tempdir().unwrap();
    let other = open(&other_dir).await;
    other
        .mutate(Mutation::UpsertUpstream(with_secret("u", secret)), &none())
        .await
        .unwrap();
    assert_ne!(other.current().hash, first.hash);
    assert_ne!(other.hash_key, reopened.hash_key);
}

#[tokio::test]
async fn one_secret_on_two_upstreams_is_refused_after_kept_secrets_are_put_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    let primary = "primary-secret-0123456789abcdef0123456789";
    let shadow = "shadow-secret-0123456789abcdef01234567890";
    store
        .mutate(
            Mutation::Replace(Config::new(
                vec![],
                vec![
                    with_secret("users", primary),
                    with_secret("users-shadow", shadow),
                ],
            )),
            &none(),
        )
        .await
        .unwrap();
    let before = store.current();
    // ApplyConfig whose input keeps users' stored secret (empty) and gives the shadow the same one.
    let e = store
        .mutate(
            Mutation::Replace(Config::new(
                vec![],
                vec![upstream("users"), with_secret("users-shadow", primary)],
            )),
            &none(),
        )
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, StoreError::Invalid(_)), "{text}");
    assert!(
        text.contains(
            "upstream \"users-shadow\": identity_signing_secret is the same as upstream \"users\"'s"
        ),
        "{text}"
    );
    assert!(!text.contains(primary), "{text}");
    // UpsertUpstream alike.
    let e = store
        .mutate(
            Mutation::UpsertUpstream(with_secret("users-shadow", primary)),
            &none(),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("is the same as upstream \"users\"'s"),
        "{e}"
    );
    assert_eq!(store.current().version, before.version);
    // Both kept (empty in the input): the stored secrets differ, accepted.
    let o = store
        .mutate(
            Mutation::Replace(Config::new(
                vec![],
                vec![
                    upstream("users"),
                    upstream("users-shadow"),
                    upstream("orders"),
                ],
            )),
            &none(),
        )
        .await
        .unwrap();
    assert!(o.committed);
}

/// Makes the database look like one written before migration 0002's key:
/// no key, every hash the plain SHA-256 of its row's bytes.
async fn forget_hash_key(store: &Store) {
    sqlx::query("DELETE FROM hash_key")
        .execute(store.pool.sqlite())
        .await
        .unwrap();
    let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as("SELECT version, snapshot FROM config_versions")
        .fetch_all(store.pool.sqlite())
        .await
        .unwrap();
    for (version, blob) in rows {
        sqlx::query("UPDATE config_versions SET hash = ? WHERE version = ?")
            .bind(gateway_proto::hash::plain_sha256(&blob))
            .bind(version)
            .execute(store.pool.sqlite())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_database_hashed_before_the_key_gets_one_and_new_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(
            Mutation::UpsertUpstream(with_secret("u", "x".repeat(40).as_str())),
            &none(),
        )
        .await
        .unwrap();
    store
        .mutate(Mutation::UpsertRoute(route("a", "u")), &none())
        .await
        .unwrap();
    forget_hash_key(&store).await;
    let old: Vec<String> = store
        .versions(0)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.hash)
        .collect();
    store.close().await;

    let reopened = open(&dir).await;
    let new: Vec<String> = reopened
        .versions(0)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.hash)
        .collect();
    assert_eq!(new.len(), 2);
    // Both versions hold the secret: no hash may stay the plain one.
    for (old, new) in old.iter().zip(&new) {
        assert_ne!(old, new);
    }
    let v1 = reopened.snapshot(1).await.unwrap();
    assert_eq!(v1.hash, new[1]);
    assert_ne!(v1.hash, unkeyed(&v1));
    assert_eq!(reopened.current().hash, new[0]);
}

#[tokio::test]
async fn a_corrupt_row_stops_the_hash_key_migration() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    forget_hash_key(&store).await;
    sqlx::query("UPDATE config_versions SET hash = 'bad' WHERE version = 1")
        .execute(store.pool.sqlite())
        .await
        .unwrap();
    store.close().await;
    let e = Store::open_with(
        &dir.path().join("cp.db"),
        fixed_clock(),
        Some(test_secrets()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, StoreError::Corrupt(ref m) if m.contains("version 1")),
        "{e}"
    );
}

/// Arms (or disarms) a trigger that fails the next version's INSERT with
/// `RAISE(ROLLBACK)`: SQLite ends the whole transaction itself, as it does
/// when a write or a commit fails for a full disk or an I/O error.
async fn fail_inserts(store: &Store, armed: bool) {
    for sql in [
        "CREATE TABLE IF NOT EXISTS test_fault (armed INTEGER NOT NULL)",
        "CREATE TRIGGER IF NOT EXISTS test_fault_insert BEFORE INSERT ON config_versions \
         WHEN (SELECT armed FROM test_fault) \
         BEGIN SELECT RAISE(ROLLBACK, 'injected: disk full'); END",
        "DELETE FROM test_fault",
    ] {
        sqlx::query(sql).execute(store.pool.sqlite()).await.unwrap();
    }
    sqlx::query("INSERT INTO test_fault (armed) VALUES (?)")
        .bind(armed)
        .execute(store.pool.sqlite())
        .await
        .unwrap();
}

/// A write that SQLite rolls back by itself (a full disk, an I/O error)
/// leaves no connection half inside a transaction: once the fault is gone,
/// every following mutation commits. Before, the failed connection went back
/// to the pool still counted "in a transaction" by sqlx (its ROLLBACK found
/// none), and every `BEGIN IMMEDIATE` on it failed with "attempted to call
/// begin_with at non-zero transaction depth".
#[tokio::test]
async fn a_write_that_sqlite_rolls_back_leaves_the_store_usable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store
        .mutate(Mutation::UpsertUpstream(upstream("u")), &none())
        .await
        .unwrap();
    fail_inserts(&store, true).await;
    for attempt in 0..3 {
        let e = store
            .mutate(Mutation::UpsertRoute(route("a", "u")), &none())
            .await
            .unwrap_err();
        assert!(
            matches!(e, StoreError::Database(_)) && e.to_string().contains("injected: disk full"),
            "attempt {attempt}: {e}"
        );
    }
    assert_eq!(store.current().version, 1, "nothing was half-applied");
    assert_eq!(store.versions(0).await.unwrap().len(), 1);

    fail_inserts(&store, false).await;
    // More commits than the pool has connections: every one is used again.
    let n = store.pool.sqlite().options().get_max_connections() + 1;
    for i in 0..n {
        store
            .mutate(Mutation::UpsertRoute(route(&format!("r{i}"), "u")), &none())
            .await
            .unwrap_or_else(|e| panic!("commit {i} after the fault: {e}"));
    }
    assert_eq!(store.current().version, 1 + u64::from(n));
}
