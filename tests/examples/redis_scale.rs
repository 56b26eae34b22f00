//! Rate-limit decisions per second through a 3-master Redis Cluster against a
//! single Redis (issue 28; BENCHMARKS.md, "Redis Cluster against one Redis").
//!
//! For each target, `--limiters` `RateLimiter`s (default 2: two data planes,
//! each with its own connection) decide for `--seconds` (default 5) with
//! `--concurrency` decisions in flight each (default 64), over `--subjects`
//! subjects (default 10,000, spread over every slot) of a token bucket no
//! decision exhausts. Leases are off, so every decision is one script run on
//! Redis (what an exact limit costs). Printed: decisions per second, the
//! share decided by Redis (the rest fell back to the local limiter), and the
//! CPU spent per decision by this process and by the Redis servers.
//!
//! Usage: `cargo build --workspace --release --examples &&
//! target/release/examples/redis_scale [--seconds N] [--limiters N]
//! [--concurrency N] [--subjects N]`. Needs `redis-server` and `redis-cli`.

#![allow(
    clippy::unwrap_used,
    reason = "a measuring program: unwrap stops it where it failed"
)]

#[path = "../tests/redis_ha/mod.rs"]
mod redis_ha;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use devstack::RedisServer;
use gateway_ratelimit::{Algorithm, Policy, RateLimiter, RateLimiterOptions, Source};
use gateway_tests::poll;

struct Settings {
    seconds: u64,
    limiters: usize,
    concurrency: usize,
    subjects: usize,
}

fn settings() -> Result<Settings> {
    let mut s = Settings {
        seconds: 5,
        limiters: 2,
        concurrency: 64,
        subjects: 10_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value: u64 = args
            .next()
            .with_context(|| format!("{flag} needs a number"))?
            .parse()
            .with_context(|| format!("{flag} needs a number"))?;
        match flag.as_str() {
            "--seconds" => s.seconds = value,
            "--limiters" => s.limiters = usize::try_from(value)?,
            "--concurrency" => s.concurrency = usize::try_from(value)?,
            "--subjects" => s.subjects = usize::try_from(value)?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(s)
}

/// User and system CPU time of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// What one target measured.
struct Measured {
    decisions: u64,
    shared: u64,
    elapsed: Duration,
    own_ticks: u64,
    redis_ticks: u64,
}

async fn measure(url: &str, redis_pids: &[u32], s: &Settings) -> Result<Measured> {
    let options = RateLimiterOptions {
        decision_timeout: Duration::from_millis(500),
        lease_max_tokens: 0,
        ..RateLimiterOptions::default()
    };
    let mut limiters = Vec::new();
    for _ in 0..s.limiters {
        let l = Arc::new(RateLimiter::new(Some(url.to_owned()), options.clone())?);
        let probe = l.clone();
        poll(
            Duration::from_secs(10),
            "the limiter to reach Redis",
            || {
                let probe = probe.clone();
                async move {
                    probe
                        .is_shared()
                        .then_some(())
                        .ok_or_else(|| "not shared yet".to_owned())
                }
            },
        )
        .await?;
        limiters.push(l);
    }
    let policy = Policy::new("scale", Algorithm::TokenBucket, 1_000_000_000, 1)?;
    // Warm-up: connections made, scripts loaded, slots learnt.
    for l in &limiters {
        for i in 0..200 {
            l.check(&policy, format!("user-{i}")).await;
        }
    }
    let decisions = Arc::new(AtomicU64::new(0));
    let shared = Arc::new(AtomicU64::new(0));
    let self_pid = std::process::id();
    let (own0, redis0) = (
        cpu_ticks(self_pid),
        redis_pids.iter().map(|p| cpu_ticks(*p)).sum::<u64>(),
    );
    let started = Instant::now();
    let end = started + Duration::from_secs(s.seconds);
    let mut tasks = Vec::new();
    for (li, l) in limiters.iter().enumerate() {
        for t in 0..s.concurrency {
            let (l, policy) = (l.clone(), policy.clone());
            let (decisions, shared) = (decisions.clone(), shared.clone());
            let subjects = s.subjects;
            tasks.push(tokio::spawn(async move {
                let mut i = li * 7919 + t * 104_729;
                while Instant::now() < end {
                    let d = l.check(&policy, format!("user-{}", i % subjects)).await;
                    decisions.fetch_add(1, Ordering::Relaxed);
                    if d.source == Source::Shared {
                        shared.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            }));
        }
    }
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed();
    Ok(Measured {
        decisions: decisions.load(Ordering::Relaxed),
        shared: shared.load(Ordering::Relaxed),
        elapsed,
        own_ticks: cpu_ticks(self_pid) - own0,
        redis_ticks: redis_pids.iter().map(|p| cpu_ticks(*p)).sum::<u64>() - redis0,
    })
}

fn row(name: &str, m: &Measured) -> String {
    // Clock ticks are 1/100 s on Linux (getconf CLK_TCK).
    let us = |ticks: u64| ticks as f64 * 10_000.0 / m.decisions.max(1) as f64;
    format!(
        "| {name} | {:.0} | {:.1} % | {:.1} | {:.1} |",
        m.decisions as f64 / m.elapsed.as_secs_f64(),
        100.0 * m.shared as f64 / m.decisions.max(1) as f64,
        us(m.own_ticks),
        us(m.redis_ticks),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let s = settings()?;
    let single = RedisServer::start().await?;
    let one = measure(&single.url(), &[single.pid().unwrap_or(0)], &s).await?;
    drop(single);
    let cluster = redis_ha::Cluster::start(3).await?;
    let pids: Vec<u32> = cluster.nodes.iter().filter_map(RedisServer::pid).collect();
    let three = measure(&cluster.url(), &pids, &s).await?;
    println!(
        "{} limiters × {} decisions in flight, {} subjects, {} s, no leases:\n",
        s.limiters, s.concurrency, s.subjects, s.seconds
    );
    println!(
        "| target | decisions/s | decided by Redis | this process µs CPU/decision | Redis µs CPU/decision |"
    );
    println!("|---|---:|---:|---:|---:|");
    println!("{}", row("one Redis (redis://)", &one));
    println!("{}", row("3-master Cluster (redis+cluster://)", &three));
    Ok(())
}
