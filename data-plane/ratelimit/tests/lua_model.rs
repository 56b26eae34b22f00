//! The Lua scripts compute exactly what `algorithm.rs` computes.
//!
//! Redis's clock cannot be set, so each script is run with its one `TIME`
//! call replaced by a time passed as an argument, and its `PEXPIRE` replaced
//! by a write of the expiry to a second key (a real expiry would fire on the
//! real clock, in the middle of a simulated timeline). Everything else is the
//! production text, run by a real `redis-server`, step by step beside the
//! Rust model over long pseudo-random timelines (including the clock going
//! backwards), comparing every outcome, the stored state's effect, and the expiry.

mod support;

use gateway_ratelimit::algorithm::{self, FixedWindowState, Outcome, TokenBucketState};
use gateway_ratelimit::{FIXED_WINDOW_LUA, TOKEN_BUCKET_LUA};
use support::RedisServer;

const TIME_CALL: &str = "local t = redis.call('TIME')";
const FAKE_TIME: &str =
    "local t = {math.floor(tonumber(ARGV[3]) / 1000), (tonumber(ARGV[3]) % 1000) * 1000}";

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

async fn run(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    key: &str,
    limit: u32,
    window_ms: u64,
    now: u64,
) -> (Outcome, Option<u64>) {
    let ttl_key = format!("{key}:ttl");
    let _: () = redis::cmd("DEL")
        .arg(&ttl_key)
        .query_async(conn)
        .await
        .unwrap();
    let (allowed, remaining, reset, retry): (i64, i64, i64, i64) = script
        .key(key)
        .key(&ttl_key)
        .arg(limit)
        .arg(window_ms)
        .arg(now)
        .invoke_async(conn)
        .await
        .unwrap();
    let ttl: Option<u64> = redis::cmd("GET")
        .arg(&ttl_key)
        .query_async(conn)
        .await
        .unwrap();
    (
        Outcome {
            allowed: allowed == 1,
            remaining: remaining as u64,
            reset_after_ms: reset as u64,
            retry_after_ms: retry as u64,
        },
        ttl,
    )
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
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
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
    let redis = RedisServer::start().await;
    let mut conn = redis.connection().await;
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
