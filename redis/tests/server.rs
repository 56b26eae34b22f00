//! [`RedisTarget`] against a real `redis-server`: passwords (`requirepass`
//! and an ACL user) and a TLS-only server with a throwaway CA.
//! Needs `redis-server` (built with TLS, as Debian's is) on PATH or at
//! `/usr/bin/redis-server`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gateway_redis::RedisTarget;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::process::{Child, Command};

const PASSWORD: &str = "pw-4f1d9c2e-redis";

fn redis_server() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("redis-server"))
        .chain([PathBuf::from("/usr/bin/redis-server")])
        .find(|p| p.is_file())
        .expect("redis-server not found: apt-get install redis-server")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A redis-server child, killed when dropped.
struct Server {
    _child: Child,
    port: u16,
}

/// Starts redis-server with `args` (plus a port: `--port` or, with `tls`,
/// `--tls-port`) and waits until `ready` can PING it.
async fn start(extra: &[String], tls: bool, ready: impl Fn(u16) -> RedisTarget) -> Server {
    let port = free_port();
    let mut args: Vec<String> = if tls {
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
        ]
    } else {
        vec!["--port".into(), port.to_string()]
    };
    args.extend(
        ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            .into_iter()
            .map(String::from),
    );
    args.extend_from_slice(extra);
    let child = Command::new(redis_server())
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn redis-server");
    let server = Server {
        _child: child,
        port,
    };
    let target = ready(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ping(&target).await {
            Ok(()) => return server,
            Err(e) if Instant::now() > deadline => panic!("redis-server never answered: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

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
    let server = start(&["--requirepass".into(), PASSWORD.into()], false, |port| {
        target(&url(port), None)
    })
    .await;
    let port = server.port;
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

/// A CA and a server certificate for `localhost` and 127.0.0.1, as PEM files in `dir`.
fn pki(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} test CA"));
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let paths = (
        dir.join(format!("{name}-ca.pem")),
        dir.join(format!("{name}-cert.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[tokio::test]
async fn a_tls_only_redis_is_reached_with_its_ca_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path(), "redis");
    let (other_ca, _, _) = pki(dir.path(), "other");
    let path = |p: &PathBuf| p.display().to_string();
    let url = |port: u16| format!("rediss://:{PASSWORD}@127.0.0.1:{port}");
    let server = start(
        &[
            "--tls-cert-file".into(),
            path(&cert),
            "--tls-key-file".into(),
            path(&key),
            "--tls-ca-cert-file".into(),
            path(&ca),
            "--tls-auth-clients".into(),
            "no".into(),
            "--requirepass".into(),
            PASSWORD.into(),
        ],
        true,
        |port| target(&url(port), Some(&ca)),
    )
    .await;
    let port = server.port;
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
