//! Postgres over verified TLS (issue 41, item 9): the control plane and the
//! auth service connect with `sslmode=verify-full&sslrootcert=CA`, their
//! sessions are TLS (the server's `pg_stat_ssl` says so), and a control plane
//! whose CA did not sign the server's certificate, whose certificate names
//! another host, or whose `sslrootcert` is missing refuses to start with an
//! error that says why, the password never printed (nor for a URL that does
//! not parse).
//!
//! Needs the workspace binaries built (`cargo build --workspace --bins`),
//! Postgres (`initdb`, `pg_ctl`) and `redis-server`; `scripts/test` installs them.

#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

mod postgres;

use std::path::Path;

use anyhow::{Context, ensure};
use devstack::RedisServer;
use gateway_proto::v1::{Instance, UpsertUpstreamRequest, Upstream};
use gateway_tests::poll;
use postgres::{
    ALICE, AuthService, ControlPlane, PG_PASSWORD, PgServer, Proc, SOON, add_user, secrets_key,
    tokens_file, work_dir,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A throwaway CA.
fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A server certificate for `hosts` signed by `ca`: (certificate PEM, key PEM).
fn server_cert(ca: &CertifiedIssuer<'static, KeyPair>, hosts: &[&str]) -> (String, String) {
    let mut params =
        CertificateParams::new(hosts.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, hosts[0].to_owned());
    let key = KeyPair::generate().unwrap();
    (
        params.signed_by(&key, ca).unwrap().pem(),
        key.serialize_pem(),
    )
}

/// `pg`'s URL verifying the server with the CA file `ca`.
fn verify_full(pg: &PgServer, ca: &Path) -> String {
    format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.url(),
        ca.display()
    )
}

/// Starts a control plane on `database` that must refuse to start: waits until
/// it has exited and returns its log.
async fn refused(name: &str, database: &str, dir: &Path) -> anyhow::Result<String> {
    let args = vec![
        "--listen".to_owned(),
        format!("127.0.0.1:{}", devstack::ports::free_port()?),
        "--secrets-key-file".to_owned(),
        secrets_key(dir)?.display().to_string(),
        "--auth-tokens-file".to_owned(),
        tokens_file(dir)?.display().to_string(),
    ];
    let mut proc = Proc::spawn(
        "control-plane",
        &args,
        &[("CONTROL_PLANE_DATABASE", database.to_owned())],
        dir.join(format!("{name}.log")),
    )?;
    poll(SOON, &format!("{name} exiting"), || {
        let running = proc.running();
        async move {
            if running {
                Err("still running".to_owned())
            } else {
                Ok(())
            }
        }
    })
    .await
    .with_context(|| proc.log_tail(30))?;
    // The whole log: with RUST_BACKTRACE set (CI) the error is followed by a long backtrace.
    let log = std::fs::read_to_string(dir.join(format!("{name}.log")))?;
    ensure!(
        !log.contains(PG_PASSWORD),
        "the log shows the password: {log}"
    );
    Ok(log)
}

/// How many of `application`'s sessions are TLS, and how many are not.
async fn sessions(pg: &PgServer, application: &str) -> anyhow::Result<(u32, u32)> {
    let out = pg
        .psql(&format!(
            "SELECT count(*) FILTER (WHERE s.ssl) || ' ' || count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = '{application}'"
        ))
        .await?;
    let (tls, plain) = out
        .trim()
        .split_once(' ')
        .with_context(|| format!("psql answered {out:?}"))?;
    Ok((tls.parse()?, plain.parse()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_over_tls_and_a_wrong_ca_or_host_refuses_to_start()
-> anyhow::Result<()> {
    let pg = PgServer::start().await?;
    let dir = work_dir()?;
    let ours = ca("postgres test CA");
    let other = ca("another CA");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ours.pem())?;
    let other_file = dir.path().join("other-ca.pem");
    std::fs::write(&other_file, other.pem())?;

    // A URL sqlx cannot read: refused at start, the password masked (clap, which
    // prints a refused flag value whole, never sees it refused).
    let bad = format!("postgres://gateway:{PG_PASSWORD}@127.0.0.1:notaport/gateway");
    let log = refused("cp-bad-url", &bad, dir.path()).await?;
    ensure!(
        log.contains("invalid port number") && log.contains("gateway:***@127.0.0.1:notaport"),
        "no error naming the bad URL, masked: {log}"
    );

    // A certificate from our CA, but for another host name: verify-full refuses it.
    let (cert, key) = server_cert(&ours, &["db.example.test"]);
    pg.enable_tls(&cert, &key).await?;
    let log = refused("cp-wrong-host", &verify_full(&pg, &ca_file), dir.path()).await?;
    ensure!(
        log.contains("certificate not valid for name \"127.0.0.1\"")
            && log.contains("name the host 127.0.0.1"),
        "no certificate error naming the host: {log}"
    );

    // The right certificate.
    let (cert, key) = server_cert(&ours, &["127.0.0.1", "localhost"]);
    pg.enable_tls(&cert, &key).await?;

    // Another CA: a clear startup error naming the certificate and the CA file.
    let log = refused("cp-other-ca", &verify_full(&pg, &other_file), dir.path()).await?;
    ensure!(
        log.contains("TLS")
            && log.contains("invalid peer certificate: UnknownIssuer")
            && log.contains(&other_file.display().to_string()),
        "no TLS certificate error naming the CA: {log}"
    );

    // A missing CA file: refused before connecting, the path named.
    let missing = dir.path().join("missing-ca.pem");
    let log = refused("cp-no-ca", &verify_full(&pg, &missing), dir.path()).await?;
    ensure!(
        log.contains(&format!(
            "sslrootcert {}: cannot read it",
            missing.display()
        )),
        "no error naming the missing CA file: {log}"
    );

    // Our CA: the control plane starts, commits a version, and its sessions are TLS.
    let cp = ControlPlane::start("cp", &verify_full(&pg, &ca_file), dir.path(), None).await?;
    let change = cp
        .admin(ALICE)
        .upsert_upstream(UpsertUpstreamRequest {
            upstream: Some(Upstream {
                name: "orders".into(),
                instances: vec![Instance {
                    id: "orders-1".into(),
                    url: "http://127.0.0.1:9".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            expected_version: None,
        })
        .await?
        .into_inner();
    assert_eq!(change.version, 1, "{change:?}");
    let (tls, plain) = sessions(&pg, "gateway-control-plane").await?;
    ensure!(
        tls >= 1 && plain == 0,
        "control plane sessions: {tls} TLS, {plain} cleartext"
    );

    // The auth service too: `users add` and the server, both verify-full.
    let redis = RedisServer::start().await?;
    add_user(&verify_full(&pg, &ca_file), "carol", "carol-password-41").await?;
    let _auth = AuthService::start(
        "auth",
        &verify_full(&pg, &ca_file),
        &redis.url(),
        dir.path(),
        &[],
    )
    .await?;
    let (tls, plain) = sessions(&pg, "gateway-auth-service").await?;
    ensure!(
        tls >= 1 && plain == 0,
        "auth service sessions: {tls} TLS, {plain} cleartext"
    );
    Ok(())
}
