//! The operator experience: the real `grpcurl` binary (reflection v1alpha)
//! against the real control-plane process. A missing grpcurl fails these tests.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod common;

use common::*;
use serde_json::Value;

const USERS: &str = r#"{"upstream": {"name": "users", "instances": [{"id": "users-1", "url": "http://127.0.0.1:9001"}]}}"#;
const ORDERS: &str = r#"{"upstream": {"name": "orders", "instances": [
    {"id": "orders-1", "url": "http://127.0.0.1:9002"}, {"id": "orders-2", "url": "http://127.0.0.1:9003"}],
    "healthCheck": {"path": "/health", "intervalMs": 5000, "timeoutMs": 2000, "unhealthyThreshold": 3, "healthyThreshold": 2},
    "circuitBreaker": {"failureThreshold": 3, "resetTimeoutMs": 10000, "halfOpenMaxRequests": 1}}}"#;
const ROUTE_USERS: &str = r#"{"route": {"name": "users", "pathPrefix": "/api/users", "rewritePrefix": "/users",
    "upstream": "users", "auth": "AUTH_JWT",
    "rateLimit": {"policy": "api", "algorithm": "TOKEN_BUCKET", "key": "KEY_USER", "limit": 20, "windowSeconds": 60}}}"#;

async fn current_version(cp: &CpProcess) -> u64 {
    u64_field(&ok(cp, "GetConfig", "{}").await, "version")
}

/// A control plane with upstreams users and orders and route users (version 3).
async fn with_demo(dir: &tempfile::TempDir) -> CpProcess {
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    assert_eq!(
        u64_field(&ok(&cp, "UpsertUpstream", USERS).await, "version"),
        1
    );
    assert_eq!(
        u64_field(&ok(&cp, "UpsertUpstream", ORDERS).await, "version"),
        2
    );
    assert_eq!(
        u64_field(&ok(&cp, "UpsertRoute", ROUTE_USERS).await, "version"),
        3
    );
    cp
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_the_services_and_describe_works() {
    let dir = tempfile::tempdir().unwrap();
    let cp = CpProcess::start(&dir.path().join("cp.db"), &[]).await;
    let out = grpcurl_raw(&cp, &[], &["list"]).await;
    assert!(out.status.success(), "{out:?}");
    let list = String::from_utf8_lossy(&out.stdout);
    for service in [
        "gateway.v1.AdminService",
        "gateway.v1.ConfigDiscoveryService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            list.lines().any(|l| l == service),
            "{service} missing:\n{list}"
        );
    }

    let out = grpcurl_raw(&cp, &[], &["describe", "gateway.v1.Route"]).await;
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("gateway.v1.Route is a message"), "{text}");
    assert!(text.contains("string path_prefix = 3;"), "{text}");
    assert!(
        text.contains(".gateway.v1.RateLimit rate_limit = 8;"),
        "{text}"
    );

    let out = grpcurl_raw(&cp, &[], &["describe", "gateway.v1.AdminService"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rpc ApplyConfig"), "{text}");

    let health = ok(&cp, "grpc.health.v1.Health/Check", "{}").await;
    assert_eq!(health["status"], "SERVING");
}

#[tokio::test(flavor = "multi_thread")]
async fn upsert_list_get_delete_routes_and_upstreams() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_demo(&dir).await;

    let routes = ok(&cp, "ListRoutes", "{}").await;
    assert_eq!(u64_field(&routes, "version"), 3);
    assert_eq!(routes["routes"][0]["name"], "users");
    assert_eq!(routes["routes"][0]["auth"], "AUTH_JWT");

    let r = ok(&cp, "GetRoute", r#"{"name": "users"}"#).await;
    assert_eq!(r["pathPrefix"], "/api/users");
    assert_eq!(r["rateLimit"]["limit"], 20);

    let ups = ok(&cp, "ListUpstreams", "{}").await;
    let names: Vec<&str> = ups["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders", "users"], "sorted by name");
    let u = ok(&cp, "GetUpstream", r#"{"name": "orders"}"#).await;
    assert_eq!(u["instances"].as_array().unwrap().len(), 2);
    assert_eq!(u["circuitBreaker"]["failureThreshold"], 3);

    // Replace a route by name.
    let changed = ok(
        &cp,
        "UpsertRoute",
        r#"{"route": {"name": "users", "pathPrefix": "/v2/users", "upstream": "orders"}}"#,
    )
    .await;
    assert_eq!(u64_field(&changed, "version"), 4);
    let r = ok(&cp, "GetRoute", r#"{"name": "users"}"#).await;
    assert_eq!(r["pathPrefix"], "/v2/users");
    assert_eq!(r["upstream"], "orders");

    assert_eq!(
        u64_field(
            &ok(&cp, "DeleteRoute", r#"{"name": "users"}"#).await,
            "version"
        ),
        5
    );
    assert_eq!(
        u64_field(
            &ok(&cp, "DeleteUpstream", r#"{"name": "users"}"#).await,
            "version"
        ),
        6
    );
    let e = call(&cp, "GetRoute", r#"{"name": "users"}"#)
        .await
        .unwrap_err();
    assert!(e.contains("Code: NotFound"), "{e}");
    assert!(e.contains(r#"route "users" not found"#), "{e}");
    let e = call(&cp, "DeleteUpstream", r#"{"name": "users"}"#)
        .await
        .unwrap_err();
    assert!(e.contains("Code: NotFound"), "{e}");
    let e = call(&cp, "GetUpstream", r#"{"name": "zzz"}"#)
        .await
        .unwrap_err();
    assert!(e.contains(r#"upstream "zzz" not found"#), "{e}");

    let versions = ok(&cp, "ListConfigVersions", r#"{"limit": 2}"#).await;
    let v = versions["versions"].as_array().unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(u64_field(&v[0], "version"), 6);
    assert_eq!(v[0]["summary"], r#"delete upstream "users""#);
    assert_eq!(v[0]["author"], "anonymous");
    assert_eq!(v[1]["summary"], r#"delete route "users""#);
    let all = ok(&cp, "ListConfigVersions", "{}").await;
    assert_eq!(all["versions"].as_array().unwrap().len(), 6);

    let planes = ok(&cp, "ListDataPlanes", "{}").await;
    assert_eq!(u64_field(&planes, "currentVersion"), 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_invalid_request_is_invalid_argument_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_demo(&dir).await;
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "bad name",
            "UpsertRoute",
            r#"{"route": {"name": "Bad_Name", "pathPrefix": "/x", "upstream": "users"}}"#,
            r#"route "Bad_Name": name must match"#,
        ),
        (
            "duplicate name",
            "ApplyConfig",
            r#"{"upstreams": [{"name": "u", "instances": [{"id": "i", "url": "http://127.0.0.1:1"}]}],
                "routes": [{"name": "a", "pathPrefix": "/a", "upstream": "u"},
                           {"name": "a", "pathPrefix": "/b", "upstream": "u"}]}"#,
            r#"route "a": duplicate name"#,
        ),
        (
            "missing upstream",
            "UpsertRoute",
            r#"{"route": {"name": "x", "pathPrefix": "/x", "upstream": "nope"}}"#,
            r#"route "x": upstream "nope" does not exist"#,
        ),
        (
            "delete upstream in use",
            "DeleteUpstream",
            r#"{"name": "users"}"#,
            r#"upstream "users": still used by route "users""#,
        ),
        (
            "bad URL",
            "UpsertUpstream",
            r#"{"upstream": {"name": "bad", "instances": [{"id": "b1", "url": "ftp://example.com/x"}]}}"#,
            r#"upstream "bad": instance "b1": url "ftp://example.com/x" must be http://host:port or https://host:port"#,
        ),
        (
            "path not starting with /",
            "UpsertRoute",
            r#"{"route": {"name": "x", "pathPrefix": "api/x", "upstream": "users"}}"#,
            r#"route "x": path_prefix must start with "/""#,
        ),
        (
            "zero limit",
            "UpsertRoute",
            r#"{"route": {"name": "x", "pathPrefix": "/x", "upstream": "users",
                "rateLimit": {"policy": "p", "key": "KEY_IP", "limit": 0, "windowSeconds": 60}}}"#,
            r#"route "x": rate_limit.limit must be greater than 0"#,
        ),
        (
            "zero window",
            "UpsertRoute",
            r#"{"route": {"name": "x", "pathPrefix": "/x", "upstream": "users",
                "rateLimit": {"policy": "p", "key": "KEY_IP", "limit": 5, "windowSeconds": 0}}}"#,
            r#"route "x": rate_limit.window_seconds must be"#,
        ),
        (
            "bad health check interval",
            "UpsertUpstream",
            r#"{"upstream": {"name": "h", "instances": [{"id": "h1", "url": "http://127.0.0.1:1"}],
                "healthCheck": {"path": "/health", "intervalMs": 10, "timeoutMs": 5, "unhealthyThreshold": 1, "healthyThreshold": 1}}}"#,
            r#"upstream "h": health_check.interval_ms must be 100 to"#,
        ),
        (
            "bad breaker threshold",
            "UpsertUpstream",
            r#"{"upstream": {"name": "h", "instances": [{"id": "h1", "url": "http://127.0.0.1:1"}],
                "circuitBreaker": {"failureThreshold": 0, "resetTimeoutMs": 1000, "halfOpenMaxRequests": 1}}}"#,
            r#"upstream "h": circuit_breaker.failure_threshold must be 1 to"#,
        ),
        (
            "identical matcher",
            "UpsertRoute",
            r#"{"route": {"name": "users-copy", "pathPrefix": "/api/users", "upstream": "orders"}}"#,
            r#"same hosts, path_prefix and methods as route"#,
        ),
        (
            "bad host",
            "UpsertRoute",
            r#"{"route": {"name": "x", "hosts": ["Not A Host"], "pathPrefix": "/x", "upstream": "users"}}"#,
            r#"route "x": hosts: "Not A Host" is not a lower-case host name"#,
        ),
        (
            "no instances",
            "UpsertUpstream",
            r#"{"upstream": {"name": "empty"}}"#,
            r#"upstream "empty": instances must not be empty"#,
        ),
        ("missing route", "UpsertRoute", r#"{}"#, "route: required"),
        (
            "missing upstream message",
            "UpsertUpstream",
            r#"{"expectedVersion": 3}"#,
            "upstream: required",
        ),
        (
            "rollback to version 0",
            "RollbackConfig",
            r#"{}"#,
            "version: required",
        ),
    ];
    let before = ok(&cp, "GetConfig", "{}").await;
    for (what, method, json, message) in cases {
        let e = call(&cp, method, json)
            .await
            .expect_err(&format!("{what}: accepted"));
        assert!(
            e.contains("Code: InvalidArgument"),
            "{what}: wrong code:\n{e}"
        );
        assert!(
            e.contains(message),
            "{what}: message lacks {message:?}:\n{e}"
        );
    }
    // Versions only ever grow, so an unchanged current version and history
    // prove that no case above committed anything.
    assert_eq!(ok(&cp, "GetConfig", "{}").await, before);
    assert_eq!(u64_field(&before, "version"), 3);
    assert_eq!(
        ok(&cp, "ListConfigVersions", "{}").await["versions"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_reports_changes_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_demo(&dir).await;
    let desired = r#"{
        "dryRun": true,
        "upstreams": [{"name": "orders", "instances": [{"id": "orders-1", "url": "http://127.0.0.1:9002"}]},
                      {"name": "billing", "instances": [{"id": "billing-1", "url": "http://127.0.0.1:9004"}]}],
        "routes": [{"name": "orders", "pathPrefix": "/api/orders", "upstream": "orders"},
                   {"name": "billing", "pathPrefix": "/api/billing", "upstream": "billing"}]}"#;
    let r = ok(&cp, "ApplyConfig", desired).await;
    assert_eq!(r["dryRun"], true);
    assert_eq!(
        u64_field(&r, "version"),
        4,
        "the version a commit would create"
    );
    let changes: Vec<(String, String, String)> = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_owned(),
                c["name"].as_str().unwrap().to_owned(),
                c["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expect = [
        ("route", "billing", "added"),
        ("route", "orders", "added"),
        ("route", "users", "removed"),
        ("upstream", "billing", "added"),
        ("upstream", "orders", "updated"),
        ("upstream", "users", "removed"),
    ];
    let expect: Vec<(String, String, String)> = expect
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    assert_eq!(changes, expect);
    assert_eq!(current_version(&cp).await, 3);

    // The same request for real commits exactly that.
    let real = desired.replace(r#""dryRun": true"#, r#""dryRun": false"#);
    let r = ok(&cp, "ApplyConfig", &real).await;
    assert_eq!(u64_field(&r, "version"), 4);
    assert_eq!(r["changes"].as_array().unwrap().len(), 6);
    let v = ok(&cp, "ListConfigVersions", r#"{"limit": 1}"#).await;
    assert_eq!(
        v["versions"][0]["summary"],
        "apply: +2 routes, -1 route, +1 upstream, ~1 upstream, -1 upstream"
    );
    // Applying it again changes nothing and creates no version.
    let r = ok(&cp, "ApplyConfig", &real).await;
    assert_eq!(u64_field(&r, "version"), 4);
    assert!(r.get("changes").is_none(), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn compare_and_swap_refuses_a_stale_expected_version() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_demo(&dir).await;
    let stale = r#"{"expectedVersion": 2, "route": {"name": "b", "pathPrefix": "/b", "upstream": "users"}}"#;
    let e = call(&cp, "UpsertRoute", stale).await.unwrap_err();
    assert!(e.contains("Code: FailedPrecondition"), "{e}");
    assert!(e.contains("expected version 2, current is 3"), "{e}");
    let e = call(&cp, "ApplyConfig", r#"{"expectedVersion": 1}"#)
        .await
        .unwrap_err();
    assert!(e.contains("Code: FailedPrecondition"), "{e}");
    let e = call(
        &cp,
        "DeleteRoute",
        r#"{"name": "users", "expectedVersion": 9}"#,
    )
    .await
    .unwrap_err();
    assert!(e.contains("expected version 9, current is 3"), "{e}");
    assert_eq!(current_version(&cp).await, 3);

    let fresh = stale.replace(r#""expectedVersion": 2"#, r#""expectedVersion": 3"#);
    assert_eq!(
        u64_field(&ok(&cp, "UpsertRoute", &fresh).await, "version"),
        4
    );
    // The same expected version cannot win twice.
    let e = call(&cp, "UpsertRoute", &fresh).await.unwrap_err();
    assert!(e.contains("expected version 3, current is 4"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rollback_commits_the_old_content_as_a_new_version() {
    let dir = tempfile::tempdir().unwrap();
    let cp = with_demo(&dir).await;
    let v2 = ok(&cp, "GetConfig", r#"{"version": 2}"#).await;
    assert_eq!(u64_field(&v2, "version"), 2);
    assert!(v2.get("routes").is_none(), "version 2 had no route: {v2}");

    let r = ok(&cp, "RollbackConfig", r#"{"version": 2}"#).await;
    assert_eq!(u64_field(&r, "version"), 4);
    let now = ok(&cp, "GetConfig", "{}").await;
    assert_eq!(u64_field(&now, "version"), 4);
    assert_eq!(now["hash"], v2["hash"]);
    assert_eq!(now["upstreams"], v2["upstreams"]);
    assert!(now.get("routes").is_none());
    assert_eq!(now["summary"], "rollback to version 2");
    // Forward again to version 3's content.
    let r = ok(
        &cp,
        "RollbackConfig",
        r#"{"version": 3, "expectedVersion": 4}"#,
    )
    .await;
    assert_eq!(u64_field(&r, "version"), 5);
    let v3 = ok(&cp, "GetConfig", r#"{"version": 3}"#).await;
    assert_eq!(ok(&cp, "GetConfig", "{}").await["hash"], v3["hash"]);

    let e = call(&cp, "RollbackConfig", r#"{"version": 99}"#)
        .await
        .unwrap_err();
    assert!(e.contains("Code: NotFound"), "{e}");
    assert!(e.contains("version 99 not found"), "{e}");
    let e = call(&cp, "GetConfig", r#"{"version": 99}"#)
        .await
        .unwrap_err();
    assert!(e.contains("Code: NotFound"), "{e}");
    assert_eq!(current_version(&cp).await, 5);
    let _: Value = ok(&cp, "ListConfigVersions", "{}").await;
}

/// What an operator pastes: a certificate and its key as PEM strings in the JSON.
fn certificate_json(name: &str, host: &str, until: i32) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(until, 1, 1);
    let pem = key.serialize_pem();
    let json = serde_json::json!({
        "certificate": {
            "name": name,
            "sniHosts": [host],
            "certChainPem": params.self_signed(&key).unwrap().pem(),
            "privateKeyPem": pem,
        }
    });
    (json.to_string(), pem)
}

#[tokio::test(flavor = "multi_thread")]
async fn certificates_upsert_get_list_delete_without_ever_showing_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("secrets.key");
    std::fs::write(&key_file, "c3".repeat(32)).unwrap();
    let cp = CpProcess::start(
        &dir.path().join("cp.db"),
        &["--secrets-key-file", key_file.to_str().unwrap()],
    )
    .await;
    let out = grpcurl_raw(&cp, &[], &["describe", "gateway.v1.Certificate"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("string private_key_pem = 4;"), "{text}");
    assert!(text.contains("string sha256_fingerprint = 8;"), "{text}");

    let (edge, key) = certificate_json("edge", "api.example.com", 2100);
    let r = ok(&cp, "UpsertCertificate", &edge).await;
    assert_eq!(u64_field(&r, "version"), 1);
    assert!(r.get("warnings").is_none(), "{r}");

    let got = ok(&cp, "GetCertificate", r#"{"name": "edge"}"#).await;
    assert_eq!(got["privateKeySet"], true);
    assert!(got.get("privateKeyPem").is_none(), "{got}");
    assert_eq!(got["notBefore"], "2020-01-01T00:00:00Z");
    assert_eq!(got["notAfter"], "2100-01-01T00:00:00Z");
    assert_eq!(
        got["subjectAltNames"],
        serde_json::json!(["api.example.com"])
    );
    let fingerprint = got["sha256Fingerprint"].as_str().unwrap();
    assert!(
        fingerprint.len() == 64 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()),
        "{fingerprint}"
    );

    let (old, _) = certificate_json("old", "old.example.com", 2021);
    let r = ok(&cp, "UpsertCertificate", &old).await;
    assert_eq!(u64_field(&r, "version"), 2);
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("certificate \"old\": expired at 2021-01-01T00:00:00Z"),
        "{r}"
    );
    let list = ok(&cp, "ListCertificates", "{}").await;
    assert_eq!(u64_field(&list, "version"), 2);
    let names: Vec<&str> = list["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["edge", "old"]);
    let config = ok(&cp, "GetConfig", "{}").await;
    for text in [list.to_string(), config.to_string(), got.to_string()] {
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        assert!(!text.contains(key.lines().nth(1).unwrap()), "{text}");
    }

    let e = call(
        &cp,
        "UpsertCertificate",
        &edge.replace("BEGIN CERTIFICATE", "BEGIN CERTIFICATX"),
    )
    .await
    .unwrap_err();
    assert!(e.contains("Code: InvalidArgument"), "{e}");
    assert!(e.contains("certificate \"edge\": cert_chain_pem"), "{e}");

    let r = ok(&cp, "DeleteCertificate", r#"{"name": "old"}"#).await;
    assert_eq!(u64_field(&r, "version"), 3);
    let e = call(&cp, "GetCertificate", r#"{"name": "old"}"#)
        .await
        .unwrap_err();
    assert!(e.contains("Code: NotFound"), "{e}");
    assert!(e.contains("certificate \"old\" not found"), "{e}");
}
