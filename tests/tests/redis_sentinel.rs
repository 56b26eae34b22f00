//! Rate limits and refresh-token families through Redis Sentinel
//! (`redis+sentinel://`): a master, a replica and three Sentinels, all with a
//! password; the master is killed during traffic. Shared limits and refreshes
//! must work again within [`FAILOVER_BOUND`] of its death, and every refresh
//! family the replica held must still rotate on the promoted replica.

mod redis_ha;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;
use auth_service::refresh::{RefreshStore, RotateOutcome};
use devstack::RedisServer;
use gateway_ratelimit::{Algorithm, Policy, RateLimiter, RateLimiterOptions, Source};
use gateway_tests::poll;
use redis_ha::{command, target};

const PASSWORD: &str = "sentinel-test-pw-5";
const MASTER: &str = "gateway";
/// What the README promises: with `down-after-milliseconds 1000`, shared
/// limits and refreshes work again this soon after the master dies.
const FAILOVER_BOUND: Duration = Duration::from_secs(15);

async fn sentinel(master_port: u16) -> anyhow::Result<RedisServer> {
    let mut b = RedisServer::builder().password(PASSWORD).arg("--sentinel");
    for option in [
        format!("monitor {MASTER} 127.0.0.1 {master_port} 2"),
        format!("auth-pass {MASTER} {PASSWORD}"),
        format!("sentinel-pass {PASSWORD}"),
        format!("down-after-milliseconds {MASTER} 1000"),
        format!("failover-timeout {MASTER} 5000"),
    ] {
        b = b.arg("--sentinel");
        for word in option.split(' ') {
            b = b.arg(word);
        }
    }
    Ok(b.start().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_limits_and_every_replicated_refresh_family() -> anyhow::Result<()> {
    let started = Instant::now();
    let mut master = RedisServer::builder()
        .password(PASSWORD)
        .arg("--masterauth")
        .arg(PASSWORD)
        .start()
        .await?;
    let replica = RedisServer::builder()
        .password(PASSWORD)
        .arg("--masterauth")
        .arg(PASSWORD)
        .arg("--replicaof")
        .arg("127.0.0.1")
        .arg(master.port().to_string())
        .start()
        .await?;
    let mut sentinels = Vec::new();
    for _ in 0..3 {
        sentinels.push(sentinel(master.port()).await?);
    }
    // Ready when every Sentinel knows the replica and the two other Sentinels.
    poll(
        Duration::from_secs(20),
        "Sentinels that know each other",
        || async {
            for s in &sentinels {
                let others = command(s, &["SENTINEL", "SENTINELS", MASTER]).await?;
                let replicas = command(s, &["SENTINEL", "REPLICAS", MASTER]).await?;
                let known = others.lines().filter(|l| *l == "runid").count();
                if known < 2 || !replicas.contains(&replica.port().to_string()) {
                    return Err(format!(
                        "sentinel {} knows {known} others, replicas {replicas:?}",
                        s.port()
                    ));
                }
            }
            Ok(())
        },
    )
    .await?;

    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redis+sentinel://:{PASSWORD}@{}/{MASTER}", hosts.join(","));
    let target = target(&url);
    let limiter = Arc::new(RateLimiter::new(
        Some(url.clone()),
        RateLimiterOptions {
            decision_timeout: Duration::from_millis(200),
            breaker_open_for: Duration::from_millis(100),
            lease_max_tokens: 0,
            ..RateLimiterOptions::default()
        },
    )?);
    let refresh = RefreshStore::new(auth_service::redis_connection(&target)?);
    poll(
        Duration::from_secs(10),
        "the limiter to reach the master",
        || async {
            limiter
                .is_shared()
                .then_some(())
                .ok_or("not shared yet".to_owned())
        },
    )
    .await?;

    // Refresh families, replicated before the master dies.
    let now = 1_700_000_000;
    let mut tokens = Vec::new();
    for i in 0..20 {
        tokens.push(
            refresh
                .create(&format!("user-{i}"), "user", now)
                .await?
                .token,
        );
    }
    let policy = Policy::new("failover", Algorithm::FixedWindow, 40, 600)?;
    let mut admitted = 0;
    for _ in 0..25 {
        let d = limiter.check(&policy, "alice").await;
        ensure!(d.source == Source::Shared, "{d:?}");
        admitted += usize::from(d.allowed);
    }
    ensure!(admitted == 25);
    // Every write so far acknowledged by the replica (WAIT, in short steps:
    // the launcher's connections have a short response timeout).
    poll(
        Duration::from_secs(10),
        "the replica to acknowledge every write",
        || async {
            let acked = command(&master, &["WAIT", "1", "200"]).await?;
            (acked == "1").then_some(()).ok_or(acked)
        },
    )
    .await?;

    // Traffic while the master dies: every decision is answered (locally
    // while no master is known), and shared ones resume.
    let traffic = {
        let limiter = limiter.clone();
        let policy = Policy::new("during", Algorithm::TokenBucket, 1_000_000, 60)?;
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut local = 0;
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                let asked = Instant::now();
                let d = limiter.check(&policy, "bob").await;
                slowest = slowest.max(asked.elapsed());
                local += usize::from(d.source == Source::Local);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (slowest, local)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    master.kill().await;
    let killed = Instant::now();

    let refreshed = poll(
        FAILOVER_BOUND,
        "a refresh through the new master",
        || async {
            match refresh.rotate(&tokens[0], now + 1).await {
                Ok(RotateOutcome::Rotated(next)) => Ok((next.token, killed.elapsed())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    tokens[0] = refreshed.0;
    let shared = poll(
        FAILOVER_BOUND,
        "shared limits on the new master",
        || async {
            let d = limiter.check(&policy, "carol").await;
            (d.source == Source::Shared)
                .then(|| killed.elapsed())
                .ok_or_else(|| format!("{d:?}"))
        },
    )
    .await?;
    let (slowest, local) = traffic.await?;
    ensure!(
        slowest < Duration::from_secs(2),
        "a decision waited {slowest:?} during the failover"
    );
    let promoted = command(&replica, &["ROLE"])
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(
        promoted.starts_with("master"),
        "the replica was not promoted: {promoted}"
    );

    // The budget spent before the failover was replicated: 15 of 40 left.
    let mut admitted = 0;
    for _ in 0..25 {
        admitted += usize::from(limiter.check(&policy, "alice").await.allowed);
    }
    ensure!(
        admitted == 15,
        "{admitted} admitted after the failover; 15 of the budget were left"
    );
    // No family the replica had is lost: each one rotates, once.
    for (i, token) in tokens.iter().enumerate().skip(1) {
        let outcome = refresh.rotate(token, now + 2).await?;
        ensure!(
            matches!(outcome, RotateOutcome::Rotated(_)),
            "family {i}: {outcome:?}"
        );
    }
    println!(
        "sentinel failover: refresh after {:?}, shared limits after {shared:?}, {local} local decisions, slowest {slowest:?}; test {:?}",
        refreshed.1,
        started.elapsed()
    );
    Ok(())
}
