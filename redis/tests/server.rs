//! [`RedisTarget`] against a real `redis-server`: passwords (`requirepass`
//! and an ACL user) and a TLS-only server with a throwaway CA.
//! Needs `redis-server` (built with TLS, as Debian's is) on PATH or at
//! `/usr/bin/redis-server`.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::path::Path;
use std::time::Duration;

use devstack::RedisServer;
use devstack::pki::Pki;
use gateway_redis::RedisTarget;

const PASSWORD: &str = "pw-4f1d9c2e-redis";

fn target(url: &str, ca: Option<&Path>) -> RedisTarget {
    RedisTarget::new(url.parse().expect("valid URL"), ca).expect("target")
}

/// One PING through a fresh connection; the error as text.
async fn ping(target: &RedisTarget) -> Result<(), String> {
    let attempt = async {
        let client = target.client().map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(Duration::from_secs(3), attempt)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

#[tokio::test]
async fn password_urls_log_in_and_a_wrong_password_is_refused_without_being_echoed() {
    let url = |port: u16| format!("redis://:{PASSWORD}@127.0.0.1:{port}");
    let server = RedisServer::builder()
        .password(PASSWORD)
        .start()
        .await
        .unwrap();
    let port = server.port();
    ping(&target(&url(port), None)).await.unwrap();
    ping(&target(&format!("{}/3", url(port)), None))
        .await
        .unwrap();

    // An ACL user (Redis 6+): `redis://user:password@…`.
    let mut admin = target(&url(port), None)
        .client()
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "limiter", "on", ">limiter-pw-77", "~*", "+@all"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    ping(&target(
        &format!("redis://limiter:limiter-pw-77@127.0.0.1:{port}"),
        None,
    ))
    .await
    .unwrap();

    // Wrong password, wrong user, no password: refused, with Redis's reason and no secret.
    let wrong = "wrong-pw-0b7e";
    for (url, reason) in [
        (
            format!("redis://:{wrong}@127.0.0.1:{port}"),
            "Password authentication failed",
        ),
        (
            format!("redis://limiter:{wrong}@127.0.0.1:{port}"),
            "Password authentication failed",
        ),
        (format!("redis://127.0.0.1:{port}"), "NOAUTH"),
    ] {
        let err = ping(&target(&url, None)).await.unwrap_err();
        eprintln!("{}: {err}", gateway_redis::redact(&url));
        assert!(err.contains(reason), "{url}: {err}");
        assert!(
            !err.contains(wrong) && !err.contains(PASSWORD),
            "{url}: {err}"
        );
    }
}

#[tokio::test]
async fn a_tls_only_redis_is_reached_with_its_ca_and_refused_without_it() {
    let server = RedisServer::builder()
        .password(PASSWORD)
        .tls(true)
        .start()
        .await
        .unwrap();
    let ca = server.pki().expect("a TLS server has a CA").ca.clone();
    let dir = tempfile::tempdir().unwrap();
    let other_ca = Pki::generate(dir.path()).unwrap().ca;
    let url = |port: u16| format!("rediss://:{PASSWORD}@127.0.0.1:{port}");
    let port = server.port();
    ping(&target(&url(port), Some(&ca))).await.unwrap();
    // The host name is checked against the certificate too: `localhost` is in it.
    ping(&target(
        &format!("rediss://:{PASSWORD}@localhost:{port}"),
        Some(&ca),
    ))
    .await
    .unwrap();

    // Without the CA (system roots) or with another CA, the certificate is not trusted.
    for ca in [None, Some(other_ca.as_path())] {
        let err = ping(&target(&url(port), ca)).await.unwrap_err();
        assert!(
            err.to_ascii_lowercase().contains("certificate"),
            "CA {ca:?}: {err}"
        );
        assert!(!err.contains(PASSWORD), "{err}");
    }
    // Plain text to the TLS port gets nothing usable.
    let plain = format!("redis://:{PASSWORD}@127.0.0.1:{port}");
    assert!(ping(&target(&plain, None)).await.is_err());
}
