//! The Lua scripts compute exactly what `algorithm.rs` computes.
//!
//! Redis's clock cannot be set, so each script is run with its one `TIME`
//! call replaced by a time passed as an argument, and its `PEXPIRE` replaced
//! by a write of the expiry to a second key (a real expiry would fire on the
//! real clock, in the middle of a simulated timeline). Everything else is the
//! production text, run by a real `redis-server`, step by step beside the
//! Rust model over long pseudo-random timelines (including the clock going
//! backwards), comparing every outcome, the stored state's effect, and the expiry.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use devstack::RedisServer;
use gateway_ratelimit::algorithm::{self, FixedWindowState, Outcome, TokenBucketState};
use gateway_ratelimit::stacked::{self, LimitOutcome, Shape, State};
use gateway_ratelimit::{Algorithm, FIXED_WINDOW_LUA, STACKED_LUA, TOKEN_BUCKET_LUA};

const TIME_CALL: &str = "local t = redis.call('TIME')";
const FAKE_TIME: &str =
    "local t = {math.floor(tonumber(ARGV[4]) / 1000), (tonumber(ARGV[4]) % 1000) * 1000}";

/// The production script with an injectable clock and an observable expiry.
fn with_fake_clock(lua: &str) -> redis::Script {
    assert!(
        lua.contains(TIME_CALL),
        "the script reads Redis's clock once"
    );
    assert!(lua.contains("redis.call('PEXPIRE', key, "));
    let text = lua
        .replace(TIME_CALL, FAKE_TIME)
        .replace("redis.call('PEXPIRE', key, ", "redis.call('SET', KEYS[2], ");
    redis::Script::new(&text)
}

/// A small deterministic generator (no dependency, same timeline every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

/// The next simulated time: mostly small steps, sometimes a long idle gap,
/// rarely a step back.
fn step(rng: &mut Lcg, now: u64, window_ms: u64) -> u64 {
    match rng.next(100) {
        0..=1 => now.saturating_sub(rng.next(2_000)),
        2..=6 => now + window_ms + rng.next(window_ms),
        7..=40 => now,
        _ => now + rng.next(window_ms / 4 + 1),
    }
}

/// One script run deciding `requests` requests at `now`: the raw
/// `{admitted, remaining, reset_after_ms, retry_after_ms}` and the expiry it set.
async fn run_batch(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    key: &str,
    (limit, window_ms): (u32, u64),
    requests: u32,
    now: u64,
) -> ((u32, u64, u64, u64), Option<u64>) {
    let ttl_key = format!("{key}:ttl");
    let _: () = redis::cmd("DEL")
        .arg(&ttl_key)
        .query_async(conn)
        .await
        .unwrap();
    let (admitted, remaining, reset, retry): (u32, u64, u64, u64) = script
        .key(key)
        .key(&ttl_key)
        .arg(limit)
        .arg(window_ms)
        .arg(requests)
        .arg(now)
        .invoke_async(conn)
        .await
        .unwrap();
    let ttl: Option<u64> = redis::cmd("GET")
        .arg(&ttl_key)
        .query_async(conn)
        .await
        .unwrap();
    ((admitted, remaining, reset, retry), ttl)
}

/// One script run deciding one request.
async fn run(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    key: &str,
    limit: u32,
    window_ms: u64,
    now: u64,
) -> (Outcome, Option<u64>) {
    let ((admitted, remaining, reset_after_ms, retry_after_ms), ttl) =
        run_batch(conn, script, key, (limit, window_ms), 1, now).await;
    assert!(admitted <= 1);
    let outcome = Outcome {
        allowed: admitted == 1,
        remaining,
        reset_after_ms,
        retry_after_ms,
    };
    (outcome, ttl)
}

const SHAPES: [(u32, u64); 5] = [
    (20, 60_000),
    (5, 60_000),
    (7, 10_000),
    (1, 1_000),
    (1_000, 1_000),
];
/// A realistic epoch time in ms, so the large-number arithmetic is exercised.
const T0: u64 = 1_764_000_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn token_bucket_lua_matches_the_rust_model() {
    let redis = RedisServer::start().await.unwrap();
    let mut conn = redis.connection().await.unwrap();
    let script = with_fake_clock(TOKEN_BUCKET_LUA);
    let mut rng = Lcg(7);
    for (limit, window_ms) in SHAPES {
        let key = format!("rl:{{tb-{limit}-{window_ms}:subject}}");
        let mut state: Option<TokenBucketState> = None;
        let mut now = T0;
        for i in 0..400 {
            now = step(&mut rng, now, window_ms);
            let (expected, next) = algorithm::token_bucket(limit, window_ms, state, now);
            let (actual, ttl) = run(&mut conn, &script, &key, limit, window_ms, now).await;
            assert_eq!(actual, expected, "{limit}/{window_ms} step {i} at {now}");
            match next {
                Some(s) => {
                    state = Some(s);
                    assert_eq!(
                        ttl,
                        Some(expected.reset_after_ms.max(1)),
                        "expiry at step {i}"
                    );
                }
                None => assert_eq!(ttl, None, "a denial writes nothing (step {i})"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fixed_window_lua_matches_the_rust_model() {
    let redis = RedisServer::start().await.unwrap();
    let mut conn = redis.connection().await.unwrap();
    let script = with_fake_clock(FIXED_WINDOW_LUA);
    let mut rng = Lcg(11);
    for (limit, window_ms) in SHAPES {
        let key = format!("rl:{{fw-{limit}-{window_ms}:subject}}");
        let mut state: Option<FixedWindowState> = None;
        let mut now = T0;
        for i in 0..400 {
            now = step(&mut rng, now, window_ms);
            let (expected, next) = algorithm::fixed_window(limit, window_ms, state, now);
            let (actual, ttl) = run(&mut conn, &script, &key, limit, window_ms, now).await;
            assert_eq!(actual, expected, "{limit}/{window_ms} step {i} at {now}");
            match next {
                Some(s) => {
                    state = Some(s);
                    assert_eq!(ttl, Some(expected.reset_after_ms), "expiry at step {i}");
                }
                None => assert_eq!(ttl, None, "a denial writes nothing (step {i})"),
            }
        }
    }
}

/// What one run for `n` merged requests must answer: the verdicts of `n`
/// single decisions at the same instant, folded as the script reports them.
fn fold(outcomes: &[Outcome]) -> (u32, u64, u64, u64) {
    let admitted = outcomes.iter().take_while(|o| o.allowed).count();
    assert!(
        outcomes[admitted..].iter().all(|o| !o.allowed),
        "at one instant the admitted ones come first"
    );
    let retry = outcomes.get(admitted).map_or(0, |o| o.retry_after_ms);
    match admitted.checked_sub(1).map(|i| outcomes[i]) {
        Some(last) => (admitted as u32, last.remaining, last.reset_after_ms, retry),
        None => (0, 0, outcomes[0].reset_after_ms, retry),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_merged_run_decides_like_single_runs_at_the_same_instant() {
    let redis = RedisServer::start().await.unwrap();
    let mut conn = redis.connection().await.unwrap();
    let bucket = with_fake_clock(TOKEN_BUCKET_LUA);
    let window = with_fake_clock(FIXED_WINDOW_LUA);
    let mut rng = Lcg(5);
    for (limit, window_ms) in SHAPES {
        let tb_key = format!("rl:{{tbn-{limit}-{window_ms}:subject}}");
        let fw_key = format!("rl:{{fwn-{limit}-{window_ms}:subject}}");
        let mut tb: Option<TokenBucketState> = None;
        let mut fw: Option<FixedWindowState> = None;
        let mut now = T0;
        for i in 0..200 {
            now = step(&mut rng, now, window_ms);
            let n = 1 + rng.next(12) as u32;
            let mut tb_outcomes = Vec::new();
            let mut fw_outcomes = Vec::new();
            for _ in 0..n {
                let (o, next) = algorithm::token_bucket(limit, window_ms, tb, now);
                tb = next.or(tb);
                tb_outcomes.push(o);
                let (o, next) = algorithm::fixed_window(limit, window_ms, fw, now);
                fw = next.or(fw);
                fw_outcomes.push(o);
            }
            let (tb_actual, _) =
                run_batch(&mut conn, &bucket, &tb_key, (limit, window_ms), n, now).await;
            assert_eq!(
                tb_actual,
                fold(&tb_outcomes),
                "bucket {limit}/{window_ms} step {i}, n={n}"
            );
            let (fw_actual, _) =
                run_batch(&mut conn, &window, &fw_key, (limit, window_ms), n, now).await;
            assert_eq!(
                fw_actual,
                fold(&fw_outcomes),
                "window {limit}/{window_ms} step {i}, n={n}"
            );
        }
    }
}

/// `stacked.lua` with the time as its last argument and each key's expiry
/// written to `<key>:ttl`.
fn stacked_with_fake_clock() -> redis::Script {
    assert!(STACKED_LUA.contains(TIME_CALL));
    assert_eq!(
        STACKED_LUA.matches("redis.call('PEXPIRE', key, ").count(),
        3
    );
    let text = STACKED_LUA
        .replace(
            TIME_CALL,
            "local t = {math.floor(tonumber(ARGV[#ARGV]) / 1000), (tonumber(ARGV[#ARGV]) % 1000) * 1000}",
        )
        .replace(
            "redis.call('PEXPIRE', key, ",
            "redis.call('SET', key .. ':ttl', ",
        );
    redis::Script::new(&text)
}

/// Stacked limits of mixed algorithms (sliding windows included), one run
/// per batch of 1 to 6 requests, against `stacked::decide` over long random
/// timelines: the admitted count, every limit's figures, and every expiry.
#[tokio::test(flavor = "multi_thread")]
async fn stacked_lua_matches_the_rust_model() {
    let redis = RedisServer::start().await.unwrap();
    let mut conn = redis.connection().await.unwrap();
    let script = stacked_with_fake_clock();
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ];
    let mut rng = Lcg(13);
    for round in 0..24 {
        let n = 1 + round % 3;
        let shapes: Vec<Shape> = (0..n)
            .map(|i| {
                let (limit, window_ms) = SHAPES[rng.next(SHAPES.len() as u64) as usize];
                Shape {
                    // Every algorithm alone at least once, then mixed.
                    algorithm: if round < 3 {
                        algorithms[round]
                    } else {
                        algorithms[(i + rng.next(3) as usize) % 3]
                    },
                    limit,
                    window_ms,
                }
            })
            .collect();
        let keys: Vec<String> = (0..n).map(|i| format!("rl:{{st-{round}-{i}:s}}")).collect();
        let mut states: Vec<Option<State>> = vec![None; n];
        let mut now = T0;
        for step_no in 0..150 {
            now = step(&mut rng, now, shapes[0].window_ms);
            let requests = 1 + rng.next(6);
            let mut expected = vec![LimitOutcome::default(); n];
            let admitted = stacked::decide(&shapes, &mut states, now, requests, &mut expected);

            let mut invocation = script.prepare_invoke();
            for key in &keys {
                let _: () = redis::cmd("DEL")
                    .arg(format!("{key}:ttl"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                invocation.key(key);
            }
            invocation.arg(requests);
            for s in &shapes {
                let code = match s.algorithm {
                    Algorithm::TokenBucket => 0,
                    Algorithm::FixedWindow => 1,
                    Algorithm::SlidingWindow => 2,
                };
                invocation.arg(code).arg(s.limit).arg(s.window_ms);
            }
            invocation.arg(now);
            let reply: Vec<u64> = invocation.invoke_async(&mut conn).await.unwrap();
            let ctx = format!("{shapes:?} step {step_no} at {now}, {requests} requests");
            assert_eq!(reply[0], admitted, "{ctx}");
            assert_eq!(
                reply[1 + 3 * n],
                now,
                "the decision's time comes last: {ctx}"
            );
            for (i, e) in expected.iter().enumerate() {
                let actual = LimitOutcome {
                    remaining: reply[1 + 3 * i],
                    reset_after_ms: reply[2 + 3 * i],
                    retry_after_ms: reply[3 + 3 * i],
                };
                assert_eq!(actual, *e, "limit {i}: {ctx}");
                let ttl: Option<u64> = redis::cmd("GET")
                    .arg(format!("{}:ttl", keys[i]))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let spent = admitted > 0;
                assert_eq!(
                    ttl,
                    spent.then_some(e.reset_after_ms.max(1)),
                    "expiry of limit {i}: {ctx}"
                );
            }
        }
    }
}

/// The fields a script left in a budget key, sorted (`HGETALL`).
async fn stored(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    fields.sort();
    fields
}

/// The single-limit scripts keep their own copy of the token-bucket and
/// fixed-window arithmetic (one limit needs no loop or tables), so they are
/// run beside `stacked.lua` with that one limit on the same timelines and
/// batches: the same reply, the same expiry, the same stored fields (a
/// policy that gains or loses a stacked limit keeps its budget).
#[tokio::test(flavor = "multi_thread")]
async fn single_limit_scripts_decide_like_stacked_lua_with_one_limit() {
    let redis = RedisServer::start().await.unwrap();
    let mut conn = redis.connection().await.unwrap();
    let stacked = stacked_with_fake_clock();
    let mut rng = Lcg(17);
    for (code, lua) in [(0u8, TOKEN_BUCKET_LUA), (1, FIXED_WINDOW_LUA)] {
        let single = with_fake_clock(lua);
        for (limit, window_ms) in SHAPES {
            let single_key = format!("rl:{{one-{code}-{limit}-{window_ms}:s}}");
            let stacked_key = format!("rl:{{stk-{code}-{limit}-{window_ms}:s}}");
            let mut now = T0;
            for i in 0..200 {
                now = step(&mut rng, now, window_ms);
                let requests = 1 + rng.next(6) as u32;
                let ctx = format!(
                    "algorithm {code}, {limit}/{window_ms} step {i} at {now}, n={requests}"
                );

                let (expected, expected_ttl) = run_batch(
                    &mut conn,
                    &single,
                    &single_key,
                    (limit, window_ms),
                    requests,
                    now,
                )
                .await;

                let ttl_key = format!("{stacked_key}:ttl");
                let _: () = redis::cmd("DEL")
                    .arg(&ttl_key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let reply: Vec<u64> = stacked
                    .key(&stacked_key)
                    .arg(requests)
                    .arg(code)
                    .arg(limit)
                    .arg(window_ms)
                    .arg(now)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                let ttl: Option<u64> = redis::cmd("GET")
                    .arg(&ttl_key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();

                // The limit's three figures, then Redis's time of the decision.
                assert_eq!(reply.len(), 5, "{ctx}");
                assert_eq!(reply[4], now, "{ctx}");
                // The one figure the two define differently: a single script's
                // retry is the wait of its denied requests (0 when all were
                // admitted), stacked.lua's the wait for one more whenever the
                // limit is spent. They agree whenever a request was denied.
                let admitted = reply[0] as u32;
                let retry = if admitted < requests { reply[3] } else { 0 };
                assert_eq!((admitted, reply[1], reply[2], retry), expected, "{ctx}");
                assert_eq!(ttl, expected_ttl, "expiry: {ctx}");
                assert_eq!(
                    stored(&mut conn, &stacked_key).await,
                    stored(&mut conn, &single_key).await,
                    "stored fields: {ctx}"
                );
            }
        }
    }
}
