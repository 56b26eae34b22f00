//! Rate limits on a real 3-master Redis Cluster (`redis+cluster://`), decided by
//! several limiters at once (each one a data plane's `RateLimiter`, with its
//! own connection): exact limits on every slot, a slot moved by hand
//! (`CLUSTER SETSLOT` + `MIGRATE`) during traffic, stacked limits whose keys
//! lie on different slots, and a master killed and brought back.

mod redis_ha;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;
use futures::future::join_all;
use gateway_ratelimit::{Algorithm, Policy, RateLimiter, RateLimiterOptions, Source};
use gateway_tests::poll;
use redis_ha::{Cluster, command, keyslot};

/// Exact figures: no leases (a lease's unspent tokens would make "exactly
/// `limit` admitted" a "no more than"), and deadlines far above a loopback
/// round trip, so no decision falls back to the local limiter by bad luck.
fn exact() -> RateLimiterOptions {
    RateLimiterOptions {
        decision_timeout: Duration::from_millis(500),
        probe_timeout: Duration::from_secs(1),
        breaker_open_for: Duration::from_millis(100),
        lease_max_tokens: 0,
        ..RateLimiterOptions::default()
    }
}

async fn limiters(
    url: &str,
    n: usize,
    options: RateLimiterOptions,
) -> anyhow::Result<Vec<Arc<RateLimiter>>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Arc::new(RateLimiter::new(
            Some(url.to_owned()),
            options.clone(),
        )?));
    }
    for (i, l) in out.iter().enumerate() {
        poll(
            Duration::from_secs(10),
            "the limiter to reach the cluster",
            || async {
                l.is_shared()
                    .then_some(())
                    .ok_or_else(|| format!("limiter {i} not shared yet"))
            },
        )
        .await?;
    }
    Ok(out)
}

/// `per_limiter` concurrent decisions of `subject` on each limiter; how many were admitted.
async fn burst(
    limiters: &[Arc<RateLimiter>],
    policy: &Policy,
    subject: &str,
    per_limiter: usize,
) -> (usize, usize) {
    let calls = limiters.iter().flat_map(|l| {
        (0..per_limiter).map(move |_| {
            let (l, p, s) = (l.clone(), policy.clone(), subject.to_owned());
            tokio::spawn(async move { l.check(&p, s).await })
        })
    });
    let mut admitted = 0;
    let mut local = 0;
    for d in join_all(calls).await {
        let d = d.expect("decision task");
        admitted += usize::from(d.allowed);
        local += usize::from(d.source == Source::Local);
    }
    (admitted, local)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_exact_across_limiters_on_every_master_and_through_a_moved_slot()
-> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = Cluster::start(3).await?;
    let limiters = limiters(&cluster.url(), 3, exact()).await?;
    let policy = Policy::new("api", Algorithm::FixedWindow, 50, 60)?;

    // Subjects on every master: exactly `limit` each, whoever decides.
    let mut masters = std::collections::BTreeSet::new();
    let mut subjects = Vec::new();
    for i in 0.. {
        let subject = format!("user-{i}");
        let (owner, _) = cluster
            .owner(keyslot(&cluster.nodes[0], &policy.redis_key(&subject)).await?)
            .await?;
        if masters.insert(owner) || subjects.len() < 3 {
            subjects.push(subject);
        }
        if masters.len() == 3 && subjects.len() >= 3 {
            break;
        }
    }
    let results = join_all(subjects.iter().map(|s| burst(&limiters, &policy, s, 30))).await;
    for (subject, (admitted, local)) in subjects.iter().zip(results) {
        ensure!(
            local == 0,
            "{subject}: {local} decisions fell back to the local limiter"
        );
        ensure!(
            admitted == 50,
            "{subject}: {admitted} of 90 admitted, the limit is 50"
        );
    }

    // A slot moved while three limiters keep deciding on its key.
    let moving = Policy::new("moving", Algorithm::FixedWindow, 200, 60)?;
    let key = moving.redis_key("mover");
    let slot = keyslot(&cluster.nodes[0], &key).await?;
    let (from, ids) = cluster.owner(slot).await?;
    let to = (from + 1) % 3;
    let (before, _) = burst(&limiters, &moving, "mover", 20).await;
    ensure!(before == 60, "{before} admitted before the move");
    let traffic = {
        let limiters = limiters.clone();
        let moving = moving.clone();
        tokio::spawn(async move {
            let mut admitted = 0;
            let mut local = 0;
            for _ in 0..40 {
                let (a, l) = burst(&limiters, &moving, "mover", 3).await;
                admitted += a;
                local += l;
                tokio::task::yield_now().await;
            }
            (admitted, local)
        })
    };
    let slot_text = slot.to_string();
    let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
    command(
        dst,
        &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &ids[from]],
    )
    .await
    .map_err(anyhow::Error::msg)?;
    command(
        src,
        &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &ids[to]],
    )
    .await
    .map_err(anyhow::Error::msg)?;
    let dst_port = dst.port().to_string();
    loop {
        let keys = command(src, &["CLUSTER", "GETKEYSINSLOT", &slot_text, "100"])
            .await
            .map_err(anyhow::Error::msg)?;
        if keys.is_empty() {
            break;
        }
        for k in keys.lines() {
            command(src, &["MIGRATE", "127.0.0.1", &dst_port, k, "0", "5000"])
                .await
                .map_err(anyhow::Error::msg)?;
        }
    }
    for node in &cluster.nodes {
        command(node, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &ids[to]])
            .await
            .map_err(anyhow::Error::msg)?;
    }
    let (during, local) = traffic.await?;
    ensure!(local == 0, "{local} decisions fell back during the move");
    // 60 before, then 360 more asked for: the budget's 200 and not one more.
    ensure!(
        before + during == 200,
        "{} admitted through the move, the limit is 200",
        before + during
    );
    let (after, _) = burst(&limiters, &moving, "mover", 5).await;
    ensure!(after == 0, "{after} admitted after the budget was spent");
    let on_dst = command(dst, &["EXISTS", std::str::from_utf8(&key)?])
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(on_dst == "1", "the budget did not move to its new master");
    println!(
        "cluster exact limits and moved slot: {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_limits_on_different_slots_never_admit_more_than_the_tightest() -> anyhow::Result<()>
{
    let cluster = Cluster::start(3).await?;
    let limiters = limiters(&cluster.url(), 3, exact()).await?;
    let node = &cluster.nodes[0];

    // One subject, two limits: one slot, one atomic run.
    let burst_limit = Policy::new("burst", Algorithm::FixedWindow, 10, 60)?;
    let hourly = Policy::new("hourly", Algorithm::SlidingWindow, 15, 3600)?;
    ensure!(
        keyslot(node, &burst_limit.redis_key("bob")).await?
            == keyslot(node, &hourly.redis_key("bob")).await?,
        "one subject's budgets share a slot"
    );

    // Three subjects (user, address, route): three slots.
    let per_user = Policy::new("per-user", Algorithm::FixedWindow, 40, 60)?;
    let per_ip = Policy::new("per-ip", Algorithm::FixedWindow, 25, 60)?;
    let per_route = Policy::new("per-route", Algorithm::TokenBucket, 60, 60)?;
    let stack = [
        (&per_user, "alice"),
        (&per_ip, "198.51.100.7"),
        (&per_route, "orders"),
    ];
    let mut slots = Vec::new();
    for (p, s) in &stack {
        slots.push(keyslot(node, &p.redis_key(s)).await?);
    }
    ensure!(
        slots[0] != slots[1] && slots[1] != slots[2] && slots[0] != slots[2],
        "{slots:?}"
    );

    let decide = |limits: Vec<(Policy, &'static str)>, each: usize| {
        let calls = limiters.iter().flat_map(move |l| {
            let limits = limits.clone();
            (0..each).map(move |_| {
                let (l, limits) = (l.clone(), limits.clone());
                tokio::spawn(async move {
                    let refs: Vec<(&Policy, &[u8])> =
                        limits.iter().map(|(p, s)| (p, s.as_bytes())).collect();
                    l.check_all(&refs).await.1
                })
            })
        });
        join_all(calls)
    };
    let same_slot = decide(
        vec![(burst_limit.clone(), "bob"), (hourly.clone(), "bob")],
        10,
    )
    .await;
    let admitted = same_slot
        .iter()
        .filter(|d| d.as_ref().is_ok_and(|d| d.allowed))
        .count();
    ensure!(
        admitted == 10,
        "{admitted} admitted under 10 per minute and 15 per hour"
    );

    let split = decide(stack.iter().map(|(p, s)| ((*p).clone(), *s)).collect(), 30).await;
    let mut admitted = 0;
    for d in &split {
        let d = d.as_ref().expect("decision task");
        ensure!(
            d.source == Source::Shared,
            "a split decision fell back: {d:?}"
        );
        admitted += usize::from(d.allowed);
    }
    ensure!(
        admitted == 25,
        "{admitted} of 90 admitted; the tightest limit is 25"
    );
    // What the refused requests spent on the other slots was given back: every
    // budget counts exactly the 25 admitted requests.
    for (p, s) in &stack[..2] {
        let key = String::from_utf8(p.redis_key(s))?;
        let owner = &cluster.nodes[cluster.owner(keyslot(node, key.as_bytes()).await?).await?.0];
        let count = command(owner, &["HGET", &key, "fn"])
            .await
            .map_err(anyhow::Error::msg)?;
        ensure!(count == "25", "{key} counts {count}, not the 25 admitted");
    }
    let route_key = String::from_utf8(per_route.redis_key("orders"))?;
    let owner = &cluster.nodes[cluster
        .owner(keyslot(node, route_key.as_bytes()).await?)
        .await?
        .0];
    // Token bucket levels are in token-milliseconds: 60 tokens of 60,000 each when full.
    let level: f64 = command(owner, &["HGET", &route_key, "tl"])
        .await
        .map_err(anyhow::Error::msg)?
        .parse()?;
    let spent = 60.0 - level / 60_000.0;
    ensure!(
        (20.0..=25.0).contains(&spent),
        "the route's bucket spent {spent} tokens for 25 admitted requests"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_means_local_decisions_then_shared_ones_again() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let options = RateLimiterOptions {
        decision_timeout: Duration::from_millis(50),
        ..exact()
    };
    let limiter = limiters(&cluster.url(), 1, options).await?.remove(0);
    let policy = Policy::new("outage", Algorithm::FixedWindow, 1000, 60)?;
    // A subject on the master about to die.
    let victim = 2;
    let mut subject = String::new();
    for i in 0.. {
        subject = format!("user-{i}");
        let slot = keyslot(&cluster.nodes[0], &policy.redis_key(&subject)).await?;
        if cluster.owner(slot).await?.0 == victim {
            break;
        }
    }
    ensure!(limiter.check(&policy, &subject).await.source == Source::Shared);

    cluster.nodes[victim].kill().await;
    let killed = Instant::now();
    // Every decision is still answered, fast, by the local limiter.
    let fallback = poll(
        Duration::from_secs(10),
        "decisions to fall back",
        || async {
            let asked = Instant::now();
            let d = limiter.check(&policy, &subject).await;
            let took = asked.elapsed();
            if took > Duration::from_millis(1500) {
                return Err(format!("a decision took {took:?}"));
            }
            (d.source == Source::Local && d.allowed)
                .then(|| killed.elapsed())
                .ok_or_else(|| format!("{d:?}"))
        },
    )
    .await?;
    ensure!(limiter.stats().fallbacks > 0);

    cluster.nodes[victim].restart().await?;
    let restarted = Instant::now();
    cluster.wait_ok(Duration::from_secs(20)).await?;
    let recovered = poll(
        Duration::from_secs(20),
        "shared decisions again",
        || async {
            let d = limiter.check(&policy, &subject).await;
            (d.source == Source::Shared)
                .then(|| restarted.elapsed())
                .ok_or_else(|| format!("{d:?}"))
        },
    )
    .await?;
    // Exact again on the master that came back (empty: its budgets start whole).
    let fresh = Policy::new("after", Algorithm::FixedWindow, 20, 60)?;
    let mut admitted = 0;
    for _ in 0..30 {
        admitted += usize::from(limiter.check(&fresh, &subject).await.allowed);
    }
    ensure!(
        admitted == 20,
        "{admitted} admitted after recovery, the limit is 20"
    );
    println!(
        "master killed: local decisions after {fallback:?}; shared again {recovered:?} after its restart"
    );
    Ok(())
}
