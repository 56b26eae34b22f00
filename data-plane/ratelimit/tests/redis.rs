//! The limiter against a real `redis-server` spawned per test.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use devstack::RedisServer;
use gateway_ratelimit::{
    Algorithm, FIXED_WINDOW_LUA, Policy, RateLimiter, RateLimiterOptions, Source, TOKEN_BUCKET_LUA,
};

/// Options for tests that need every decision to reach Redis: a deadline
/// generous enough that a loaded CI machine cannot turn a slow answer into a
/// local fallback (which would make "exactly `limit`" unprovable).
fn patient() -> RateLimiterOptions {
    RateLimiterOptions {
        decision_timeout: Duration::from_secs(2),
        ..RateLimiterOptions::default()
    }
}

/// Polls until the limiter sends decisions to Redis, or panics after `within`.
async fn wait_shared(limiter: &RateLimiter, within: Duration) {
    let deadline = Instant::now() + within;
    while !limiter.is_shared() {
        assert!(
            Instant::now() < deadline,
            "limiter did not reach Redis within {within:?}: {:?}",
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn sha_loaded(conn: &mut redis::aio::MultiplexedConnection, lua: &str) -> bool {
    let sha = redis::Script::new(lua).get_hash().to_owned();
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(sha)
        .query_async(conn)
        .await
        .unwrap();
    exists[0]
}

/// 200 concurrent decisions on one key, spread over two limiters (two
/// "replicas" with their own connections): exactly `limit` are admitted.
async fn exactly_limit_admitted(algorithm: Algorithm) {
    let redis = RedisServer::start().await.unwrap();
    let a = Arc::new(RateLimiter::new(Some(redis.url()), patient()).unwrap());
    let b = Arc::new(RateLimiter::new(Some(redis.url()), patient()).unwrap());
    wait_shared(&a, Duration::from_secs(10)).await;
    wait_shared(&b, Duration::from_secs(10)).await;
    // A long window: no refill can sneak in during the test.
    let policy = Policy::new("burst", algorithm, 37, 3600).unwrap();

    // A sliding window's count weighs on through the next window too: a
    // denial early in a window waits for the rest of it and then for the
    // window's count to fade enough (up to 1/37 of the next one).
    let (longest_retry, longest_ttl_ms) = match algorithm {
        Algorithm::SlidingWindow => (Duration::from_secs(3600 + 3600 / 37 + 1), 7_200_000),
        _ => (Duration::from_secs(3600), 3_600_000),
    };

    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let limiter = Arc::clone(if i % 2 == 0 { &a } else { &b });
            let policy = policy.clone();
            tokio::spawn(async move { limiter.check(&policy, "alice").await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let decision = task.await.unwrap();
        assert_eq!(decision.source, Source::Shared, "{decision:?}");
        assert_eq!(decision.limit, 37);
        if decision.allowed {
            admitted += 1;
        } else {
            let retry = decision.retry_after.expect("a denial says when to retry");
            assert!(
                retry > Duration::ZERO && retry <= longest_retry,
                "{algorithm:?}: retry after {retry:?}"
            );
        }
    }
    assert_eq!(admitted, 37, "{algorithm:?}: exactly the limit is admitted");
    for limiter in [&a, &b] {
        let stats = limiter.stats();
        assert_eq!(stats.fallbacks, 0, "{stats:?}");
        assert_eq!(stats.redis_errors + stats.redis_timeouts, 0, "{stats:?}");
    }
    let total = a.stats().allowed_shared + b.stats().allowed_shared;
    assert_eq!(total, 37);
    // 100 requests of one key at once per replica: most waited on another's
    // Redis call and were decided in its merged run — with the same verdicts.
    let merged = a.stats().merged + b.stats().merged;
    assert!(
        merged > 0,
        "no decision was merged: {:?} {:?}",
        a.stats(),
        b.stats()
    );

    // The budget lives under the hash-tagged key and expires by itself.
    let mut conn = redis.connection().await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg("rl:{alice}:burst")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        pttl > 0 && pttl <= longest_ttl_ms,
        "rl:{{alice}}:burst must carry an expiry, PTTL = {pttl}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sliding_window_admits_exactly_the_limit_under_200_concurrent_decisions() {
    exactly_limit_admitted(Algorithm::SlidingWindow).await;
}

/// Stacked limits through Redis: 200 concurrent requests over two replicas,
/// each under a route-wide bucket of 50 and a per-caller window of 37. Exactly
/// 37 are admitted, and the 163 refusals burn nothing: the bucket lost 37.
#[tokio::test(flavor = "multi_thread")]
async fn stacked_limits_are_all_or_nothing_under_200_concurrent_decisions() {
    let redis = RedisServer::start().await.unwrap();
    let a = Arc::new(RateLimiter::new(Some(redis.url()), patient()).unwrap());
    let b = Arc::new(RateLimiter::new(Some(redis.url()), patient()).unwrap());
    wait_shared(&a, Duration::from_secs(10)).await;
    wait_shared(&b, Duration::from_secs(10)).await;
    let route = Policy::new("route", Algorithm::TokenBucket, 50, 3600).unwrap();
    let caller = Policy::new("caller", Algorithm::FixedWindow, 37, 3600).unwrap();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let limiter = Arc::clone(if i % 2 == 0 { &a } else { &b });
            let (route, caller) = (route.clone(), caller.clone());
            tokio::spawn(async move {
                limiter
                    .check_all(&[(&route, b"orders"), (&caller, b"alice")])
                    .await
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let (limit, d) = task.await.unwrap();
        assert_eq!(d.source, Source::Shared, "{d:?}");
        // The per-caller window always has less left, and is what refuses.
        assert_eq!(limit, 1, "{d:?}");
        assert_eq!(d.limit, 37);
        admitted += usize::from(d.allowed);
    }
    assert_eq!(admitted, 37);
    let merged = a.stats().merged + b.stats().merged;
    assert!(merged > 0, "{:?} {:?}", a.stats(), b.stats());
    assert_eq!(a.stats().fallbacks + b.stats().fallbacks, 0);
    // The route's bucket spent exactly the admitted ones.
    let d = a.check(&route, "orders").await;
    assert!(d.allowed);
    assert_eq!(d.remaining, 50 - 37 - 1);
    // Another caller: the bucket is now the most restrictive limit.
    let (limit, d) = b.check_all(&[(&route, b"orders"), (&caller, b"bob")]).await;
    assert!(d.allowed);
    assert_eq!((limit, d.remaining, d.limit), (0, 11, 50));
    // A refused limit is remembered: the next request of that key set (or of
    // any set holding that limit) is refused without a round trip.
    let spent = [(&route, &b"orders"[..]), (&caller, &b"alice"[..])];
    let (limit, first) = a.check_all(&spent).await;
    assert!(!first.allowed && limit == 1, "{first:?}");
    let hits = a.stats().deny_cache_hits;
    let (limit, again) = a.check_all(&spent).await;
    assert!(!again.allowed && limit == 1, "{again:?}");
    assert_eq!(again.source, Source::Shared);
    assert!(again.retry_after.is_some());
    assert_eq!(a.stats().deny_cache_hits, hits + 1);
    // ... and neither refusal spent anything: the bucket still has its 11.
    let d = a.check(&route, "orders").await;
    assert_eq!(d.remaining, 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn token_bucket_admits_exactly_the_limit_under_200_concurrent_decisions() {
    exactly_limit_admitted(Algorithm::TokenBucket).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_window_admits_exactly_the_limit_under_200_concurrent_decisions() {
    exactly_limit_admitted(Algorithm::FixedWindow).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_scripts_report_remaining_reset_and_retry_after_from_redis_time() {
    let redis = RedisServer::start().await.unwrap();
    let limiter = RateLimiter::new(Some(redis.url()), patient()).unwrap();
    wait_shared(&limiter, Duration::from_secs(10)).await;

    // Token bucket: 2 tokens, one every 5 s.
    let tb = Policy::new("tb", Algorithm::TokenBucket, 2, 10).unwrap();
    let first = limiter.check(&tb, "u").await;
    assert!(first.allowed);
    assert_eq!(first.remaining, 1);
    assert!(first.reset_after <= Duration::from_secs(5));
    let second = limiter.check(&tb, "u").await;
    assert!(second.allowed);
    assert_eq!(second.remaining, 0);
    let denied = limiter.check(&tb, "u").await;
    assert!(!denied.allowed);
    assert_eq!(denied.source, Source::Shared);
    let retry = denied.retry_after.unwrap();
    // The bucket was emptied moments ago: about 5 s to the next token, and never less than the truth.
    assert!(
        retry > Duration::from_millis(4_000) && retry <= Duration::from_secs(5),
        "{retry:?}"
    );
    assert!(denied.reset_after >= retry && denied.reset_after <= Duration::from_secs(10));
    assert_eq!(denied.retry_after_secs(), Some(5));

    // Fixed window: 3 per hour, windows aligned to the epoch hour.
    let fw = Policy::new("fw", Algorithm::FixedWindow, 3, 3600).unwrap();
    for expected_remaining in [2, 1, 0] {
        let d = limiter.check(&fw, "10.0.0.1").await;
        assert!(d.allowed);
        assert_eq!(d.remaining, expected_remaining);
    }
    let denied = limiter.check(&fw, "10.0.0.1").await;
    assert!(!denied.allowed);
    let retry = denied.retry_after.unwrap();
    assert!(retry > Duration::ZERO && retry <= Duration::from_secs(3600));
    assert_eq!(denied.reset_after, retry, "a window resets when it ends");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let to_hour_end = Duration::from_secs(3600) - Duration::from_secs(now.as_secs() % 3600);
    assert!(
        retry.abs_diff(to_hour_end) < Duration::from_secs(5),
        "{retry:?} vs {to_hour_end:?}"
    );
    // The next request of a denied key is answered from the "denied until" cache.
    let again = limiter.check(&fw, "10.0.0.1").await;
    assert!(!again.allowed);
    assert_eq!(again.source, Source::Shared);
    assert!(again.retry_after.unwrap() <= retry);
    assert_eq!(limiter.stats().deny_cache_hits, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn flushed_scripts_are_reloaded_transparently() {
    let redis = RedisServer::start().await.unwrap();
    let limiter = RateLimiter::new(Some(redis.url()), patient()).unwrap();
    wait_shared(&limiter, Duration::from_secs(10)).await;
    let mut conn = redis.connection().await.unwrap();

    for (algorithm, lua) in [
        (Algorithm::TokenBucket, TOKEN_BUCKET_LUA),
        (Algorithm::FixedWindow, FIXED_WINDOW_LUA),
    ] {
        let policy = Policy::new("flush", algorithm, 10, 3600).unwrap();
        let subject = algorithm.as_str();
        for expected in [9, 8, 7] {
            let d = limiter.check(&policy, subject).await;
            assert!(d.allowed && d.source == Source::Shared);
            assert_eq!(d.remaining, expected);
        }
        assert!(sha_loaded(&mut conn, lua).await);

        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!sha_loaded(&mut conn, lua).await, "the flush removed it");

        // The next decision meets NOSCRIPT, reloads, and carries on with the same budget.
        for expected in [6, 5] {
            let d = limiter.check(&policy, subject).await;
            assert!(d.allowed, "{algorithm:?}: {d:?}");
            assert_eq!(d.source, Source::Shared, "{algorithm:?}: {d:?}");
            assert_eq!(d.remaining, expected, "{algorithm:?}");
        }
        assert!(sha_loaded(&mut conn, lua).await, "reloaded");
    }
    let stats = limiter.stats();
    assert_eq!(stats.redis_errors, 0, "NOSCRIPT never surfaced: {stats:?}");
    assert_eq!(stats.fallbacks, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_killed_mid_traffic_stays_fast_falls_back_and_resumes_after_restart() {
    let mut redis = RedisServer::start().await.unwrap();
    let port = redis.port();
    // Production defaults: a 5 ms decision deadline, a 1 s breaker.
    let limiter =
        Arc::new(RateLimiter::new(Some(redis.url()), RateLimiterOptions::default()).unwrap());
    wait_shared(&limiter, Duration::from_secs(10)).await;
    let policy = Policy::new("outage", Algorithm::TokenBucket, 1_000_000, 60).unwrap();
    let bound = Duration::from_millis(50);

    // Eight clients send back-to-back requests and record their slowest decision.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let limiter = Arc::clone(&limiter);
            let policy = policy.clone();
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let subject = format!("user-{i}");
                let mut slowest = Duration::ZERO;
                let mut decisions = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = Instant::now();
                    let d = limiter.check(&policy, &subject).await;
                    slowest = slowest.max(started.elapsed());
                    assert!(d.allowed, "a huge budget admits everything: {d:?}");
                    decisions += 1;
                    // Yield so the kill and the probes get CPU on a busy machine.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                (slowest, decisions)
            })
        })
        .collect();

    // Let traffic flow through Redis, then kill it mid-traffic.
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.stats().allowed_shared < 100 {
        assert!(
            Instant::now() < deadline,
            "no shared traffic: {:?}",
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = limiter.stats();
    redis.kill().await;

    // Traffic goes on, locally.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = limiter.stats();
        if stats.breaker_open && stats.fallbacks > before.fallbacks + 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no fallback after the kill: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let during = limiter.stats();
    assert!(during.breaker_opened > before.breaker_opened, "{during:?}");
    assert!(during.allowed_local > before.allowed_local, "{during:?}");

    // Restart Redis where the limiter expects it: shared limiting comes back by itself.
    redis.restart().await.unwrap();
    assert_eq!(redis.port(), port);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut conn = redis.connection().await.unwrap();
    loop {
        let exists: i64 = redis::cmd("EXISTS")
            .arg("rl:{user-0}:outage")
            .query_async(&mut conn)
            .await
            .unwrap();
        if limiter.is_shared() && exists == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shared limiting did not resume: {:?}",
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resumed = limiter.stats();
    // A few more decisions go to the new Redis.
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.stats().allowed_shared < resumed.allowed_shared + 50 {
        assert!(Instant::now() < deadline, "{:?}", limiter.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for worker in workers {
        let (slowest, decisions) = worker.await.unwrap();
        assert!(
            slowest < bound,
            "a decision took {slowest:?}, more than {bound:?}"
        );
        total += decisions;
    }
    let end = limiter.stats();
    assert_eq!(end.decisions(), total);
    assert!(!end.breaker_open, "{end:?}");
    let check = limiter.check(&policy, "user-0").await;
    assert_eq!(check.source, Source::Shared);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_redis_costs_each_decision_at_most_the_deadline() {
    let redis = RedisServer::start().await.unwrap();
    // Production defaults: a 5 ms decision deadline, a 1 s breaker.
    let limiter =
        Arc::new(RateLimiter::new(Some(redis.url()), RateLimiterOptions::default()).unwrap());
    wait_shared(&limiter, Duration::from_secs(10)).await;
    let policy = Policy::new("frozen", Algorithm::FixedWindow, 1_000_000, 60).unwrap();
    let bound = Duration::from_millis(50);

    // SIGSTOP: connections stay open but nothing answers, the worst case for
    // a client without deadlines (a killed Redis at least refuses at once).
    redis.suspend().unwrap();
    let before = limiter.stats();
    let mut slowest = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let batch = (0..16).map(|i| {
            let limiter = Arc::clone(&limiter);
            let policy = policy.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let d = limiter.check(&policy, &format!("client-{i}")).await;
                (started.elapsed(), d)
            })
        });
        for task in futures::future::join_all(batch).await {
            let (elapsed, decision) = task.unwrap();
            assert!(decision.allowed, "{decision:?}");
            slowest = slowest.max(elapsed);
        }
        let stats = limiter.stats();
        if stats.breaker_open && stats.fallbacks >= before.fallbacks + 100 {
            break;
        }
        assert!(Instant::now() < deadline, "breaker never opened: {stats:?}");
    }
    assert!(
        slowest < bound,
        "a decision took {slowest:?} against a frozen Redis"
    );
    let frozen = limiter.stats();
    assert!(frozen.redis_timeouts > before.redis_timeouts, "{frozen:?}");
    assert!(frozen.breaker_opened > before.breaker_opened, "{frozen:?}");

    // SIGCONT: the probe sees Redis again and decisions are shared once more.
    redis.resume().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let d = limiter.check(&policy, "client-0").await;
        if d.source == Source::Shared {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "did not resume: {:?}",
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(limiter.is_shared());
}

/// A batch's leader that misses its deadline decides locally, but the run it
/// started goes on for its followers: they get Redis's verdicts within their
/// own (later) deadlines, and the late success counts as a success.
#[tokio::test]
async fn a_batch_outlives_its_leaders_deadline_and_answers_its_followers() {
    use futures::FutureExt;
    let redis = RedisServer::start().await.unwrap();
    let deadline = Duration::from_millis(500);
    let limiter = RateLimiter::new(
        Some(redis.url()),
        RateLimiterOptions {
            decision_timeout: deadline,
            // The client's own bound on a command must outlast the frozen phase.
            probe_timeout: Duration::from_secs(10),
            ..RateLimiterOptions::default()
        },
    )
    .unwrap();
    wait_shared(&limiter, Duration::from_secs(10)).await;
    let policy = Policy::new("late", Algorithm::TokenBucket, 100, 3600).unwrap();

    // Redis stops answering. `a` leads a run alone; `b` queues behind it, and
    // so do `c` and `d` a little later, so their deadlines end after `b`'s.
    redis.suspend().unwrap();
    let mut a = std::pin::pin!(limiter.check(&policy, "k"));
    let mut b = std::pin::pin!(limiter.check(&policy, "k"));
    assert!((&mut a).now_or_never().is_none());
    assert!((&mut b).now_or_never().is_none());
    tokio::time::sleep(deadline * 7 / 10).await;
    let mut c = std::pin::pin!(limiter.check(&policy, "k"));
    let mut d = std::pin::pin!(limiter.check(&policy, "k"));
    assert!((&mut c).now_or_never().is_none());
    assert!((&mut d).now_or_never().is_none());

    // `a` gives up and decides locally; `b` then leads the batch {b, c, d}
    // and gives up too, one deadline later.
    assert_eq!(a.await.source, Source::Local);
    assert_eq!(b.await.source, Source::Local);
    // Redis answers again before `c` and `d` give up: the batch's run, which
    // went on without its leader, decides them.
    redis.resume().unwrap();
    let (c, d) = (c.await, d.await);
    assert_eq!(
        (c.source, d.source),
        (Source::Shared, Source::Shared),
        "{c:?} {d:?}"
    );
    assert!(c.allowed && d.allowed);
    // Positions 1 and 2 of one batch: consecutive remaining counts.
    assert_eq!(c.remaining, d.remaining + 1, "{c:?} {d:?}");
    let stats = limiter.stats();
    assert_eq!(stats.merged, 2, "{stats:?}");
    assert_eq!(stats.redis_timeouts, 2, "the two leaders: {stats:?}");
    assert_eq!(stats.redis_errors, 0, "{stats:?}");
    assert_eq!(stats.fallbacks, 2, "{stats:?}");
    assert!(
        limiter.is_shared(),
        "a late success is a success: {stats:?}"
    );
    // The next decision is shared and sees the batch's spending.
    let next = limiter.check(&policy, "k").await;
    assert_eq!(next.source, Source::Shared);
    assert!(next.remaining < d.remaining, "{next:?} after {d:?}");
}

/// Script runs Redis has executed so far (`INFO commandstats`).
async fn script_runs(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A busy key over two replicas: leases answer most decisions without Redis,
/// and together the replicas still never admit more than the limit.
#[tokio::test(flavor = "multi_thread")]
async fn leases_spare_redis_for_a_busy_key_and_never_over_admit_across_replicas() {
    let redis = RedisServer::start().await.unwrap();
    let a = Arc::new(RateLimiter::new(Some(redis.url()), patient()).unwrap());
    let b = Arc::new(RateLimiter::new(Some(redis.url()), patient()).unwrap());
    wait_shared(&a, Duration::from_secs(10)).await;
    wait_shared(&b, Duration::from_secs(10)).await;
    // A bucket that refills one token per 1,000 s: nothing refills during the test.
    const LIMIT: u32 = 10_000;
    let policy = Policy::new("busy", Algorithm::TokenBucket, LIMIT, 10_000_000).unwrap();
    let started = Instant::now();
    let mut conn = redis.connection().await.unwrap();
    let runs_before = script_runs(&mut conn).await;

    // 30,000 requests, 32 at a time on each replica, three times the budget.
    let mut admitted = 0u32;
    let mut waves = 0u32;
    for _ in 0..(30_000 / 64) {
        let wave: Vec<_> = (0..64)
            .map(|i| {
                let limiter = Arc::clone(if i % 2 == 0 { &a } else { &b });
                let policy = policy.clone();
                tokio::spawn(async move { limiter.check(&policy, "alice").await })
            })
            .collect();
        for task in futures::future::join_all(wave).await {
            let d = task.unwrap();
            assert_eq!(d.source, Source::Shared, "{d:?}");
            admitted += u32::from(d.allowed);
        }
        waves += 1;
    }
    let decisions = u64::from(waves) * 64;
    let runs = script_runs(&mut conn).await - runs_before;
    let (sa, sb) = (a.stats(), b.stats());
    eprintln!(
        "{decisions} decisions, {admitted} admitted, {runs} script runs; leased decisions {} + {}",
        sa.leased, sb.leased
    );
    let refilled = (started.elapsed().as_secs() / 1_000) as u32;
    assert!(
        admitted <= LIMIT + refilled,
        "{admitted} admitted: more than the limit"
    );
    // Unspent leases are lost, but each replica's traffic kept spending its
    // own; at most the last lease of each (<= 1,000 tokens) can be left.
    assert!(
        admitted >= LIMIT - 2 * 1_000,
        "{admitted} admitted: leases wasted too much of the budget {sa:?} {sb:?}"
    );
    assert!(sa.leased > 0 && sb.leased > 0, "{sa:?} {sb:?}");
    for s in [&sa, &sb] {
        assert!(s.leased <= s.lease_tokens, "spent more than leased: {s:?}");
        assert_eq!(s.fallbacks, 0, "{s:?}");
    }
    // Most admitted decisions came from leases, so far fewer script runs than
    // admissions (denials are answered by the denied-until cache).
    assert!(
        runs * 4 < u64::from(admitted),
        "{runs} script runs for {admitted} admissions ({decisions} decisions)"
    );
}

/// On one replica a leased decision's headers read as if every request had
/// gone to Redis: the budget left falls by one per request.
#[tokio::test(flavor = "multi_thread")]
async fn leased_decisions_report_the_budget_left_one_by_one() {
    let redis = RedisServer::start().await.unwrap();
    let limiter = RateLimiter::new(Some(redis.url()), patient()).unwrap();
    wait_shared(&limiter, Duration::from_secs(10)).await;
    const LIMIT: u32 = 100_000;
    let policy = Policy::new("steady", Algorithm::FixedWindow, LIMIT, 86_400).unwrap();
    let day = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 86_400
    };
    let first_day = day();
    let mut seen = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let d = limiter.check(&policy, "bob").await;
        assert!(d.allowed && d.source == Source::Shared, "{d:?}");
        seen.push(d.remaining);
    }
    // A new window (midnight UTC) during the run would restart the count.
    if day() == first_day {
        let want: Vec<u64> = (0..2_000).map(|i| u64::from(LIMIT) - 1 - i).collect();
        assert_eq!(seen, want, "remaining must fall by one per request");
    }
    let stats = limiter.stats();
    assert!(
        stats.leased > 1_000,
        "back-to-back requests lease: {stats:?}"
    );
}

/// `lease_max_tokens: 0` turns leasing off: every admission is a script run's.
#[tokio::test(flavor = "multi_thread")]
async fn leasing_can_be_turned_off() {
    let redis = RedisServer::start().await.unwrap();
    let options = RateLimiterOptions {
        lease_max_tokens: 0,
        ..patient()
    };
    let limiter = RateLimiter::new(Some(redis.url()), options).unwrap();
    wait_shared(&limiter, Duration::from_secs(10)).await;
    let policy = Policy::new("off", Algorithm::TokenBucket, 100_000, 86_400).unwrap();
    let mut conn = redis.connection().await.unwrap();
    // The first decision loads the script (a refused EVALSHA, then a good one).
    assert!(limiter.check(&policy, "carol").await.allowed);
    let before = script_runs(&mut conn).await;
    for _ in 0..200 {
        assert!(limiter.check(&policy, "carol").await.allowed);
    }
    let stats = limiter.stats();
    assert_eq!((stats.leased, stats.lease_tokens), (0, 0), "{stats:?}");
    assert_eq!(script_runs(&mut conn).await - before, 200);
}
