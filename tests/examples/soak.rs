//! Soak (issue 25): a devstack stack (2 data planes, auth service, Redis,
//! mocks) under mixed traffic for a while, then a report of every client
//! error and of every process's memory. Run it with `scripts/soak`.
//!
//! Traffic, paced to `--rps` requests per second in all:
//! * JWT routes without a limit (`/soak/users`, `/soak/orders`), as alice and bob;
//! * the demo's rate-limited `/api/users` (20 per minute per user): 429s expected;
//! * `/soak/churn`, an open route whose configuration changes every 10 s
//!   (`UpsertRoute`, each version waited for on every data plane);
//! * a refresh of each user's token pair every 5 s (`/auth/refresh`), whose
//!   new access token the traffic uses from then on;
//! * `orders-1` killed (SIGKILL) and started again once a minute (in a run
//!   under four minutes, every quarter of the run: twice in 60 s), down for
//!   10 s each time.
//!
//! Expected answers: 200; 429 on the rate-limited route; 502/503/504 on an
//! orders route while `orders-1` is down (from the kill until 5 s after it
//! answers again). Anything else (another status, a transport error, a
//! configuration version that does not reach every data plane within 10 s)
//! is an unexpected error, and any makes the run exit 1.
//!
//! Memory: every process's RSS is sampled every 5 s; the report compares the
//! end with the end of the warm-up (a quarter of the run, at most 60 s). With
//! `--max-rss-growth PCT` a growth above PCT of a gateway process (control
//! plane, data planes, auth service, mocks that were not restarted) also makes
//! the run exit 1; Redis is reported only (it holds every refresh-token
//! family issued, by design).
//!
//! Usage: `soak [--minutes N | --seconds N] [--rps N] [--max-rss-growth PCT] [--json]`
//! (`SOAK_SECONDS` in the environment too). Needs the binaries built
//! (`cargo build --workspace --bins`, same profile) and `redis-server` on PATH.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use devstack::Stack;
use gateway_proto::v1::{AuthMode, Route, UpsertRouteRequest};
use gateway_tests::{open_route, rss_kib, upsert_route_synced};
use serde_json::{Value, json};

/// The backend instance that is killed and restarted.
const VICTIM: &str = "orders-1";
/// How long the victim stays down each time.
const DOWN_FOR: Duration = Duration::from_secs(10);
/// After the victim answers again, 502/503/504 are still expected this long
/// (a health check or a breaker takes a moment to notice).
const DOWN_GRACE: Duration = Duration::from_secs(5);
/// Period of the configuration change.
const CONFIG_EVERY: Duration = Duration::from_secs(10);
/// Period of each user's refresh.
const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// Period of the RSS samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How long one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Command line.
struct Options {
    duration: Duration,
    rps: u32,
    max_rss_growth: Option<f64>,
    json: bool,
}

fn options() -> Result<Options> {
    let mut o = Options {
        duration: match std::env::var("SOAK_SECONDS") {
            Ok(s) => Duration::from_secs(s.parse().context("SOAK_SECONDS")?),
            Err(_) => Duration::from_secs(600),
        },
        rps: 100,
        max_rss_growth: None,
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().with_context(|| format!("{arg} needs {what}"));
        match arg.as_str() {
            "--minutes" => {
                o.duration = Duration::from_secs(60 * value("a number")?.parse::<u64>()?)
            }
            "--seconds" => o.duration = Duration::from_secs(value("a number")?.parse()?),
            "--rps" => o.rps = value("a number")?.parse()?,
            "--max-rss-growth" => o.max_rss_growth = Some(value("a percentage")?.parse()?),
            "--json" => o.json = true,
            "-h" | "--help" => {
                println!(
                    "usage: soak [--minutes N | --seconds N] [--rps N] [--max-rss-growth PCT] [--json]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if o.duration < Duration::from_secs(30) {
        bail!("a soak runs at least 30 s (warm-up, a kill and a restart)");
    }
    if o.rps == 0 {
        bail!("--rps must be at least 1");
    }
    Ok(o)
}

/// What every request, refresh and configuration change came to.
#[derive(Default)]
struct Tally {
    requests: u64,
    ok: u64,
    expected_429: u64,
    expected_down: u64,
    refreshes: u64,
    config_changes: u64,
    restarts: u64,
    /// "what: detail" → count.
    unexpected: BTreeMap<String, u64>,
}

/// State the tasks share.
struct Shared {
    tally: Mutex<Tally>,
    /// Access token per user (index into DEMO_USERS), replaced by each refresh.
    access: Mutex<Vec<String>>,
    /// The victim's last kill and return.
    down: Mutex<DownState>,
}

/// When the victim was last killed, and when it answered again after that
/// (`None` while it is down).
#[derive(Default, Clone, Copy)]
struct DownState {
    killed: Option<Instant>,
    back: Option<Instant>,
}

impl Shared {
    fn unexpected(&self, what: String) {
        *self.tally.lock().unexpected.entry(what).or_default() += 1;
    }

    /// Whether a request that started at `started` overlapped the victim's down time.
    fn victim_was_down(&self, started: Instant) -> bool {
        let d = *self.down.lock();
        match (d.killed, d.back) {
            (Some(_), None) => true,
            (Some(_), Some(back)) => started <= back + DOWN_GRACE,
            _ => false,
        }
    }
}

/// The kinds of request the traffic mixes, in turn.
#[derive(Clone, Copy, Debug)]
enum Kind {
    JwtUsers,
    JwtOrders,
    RateLimited,
    Churn,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::JwtUsers,
        Kind::JwtOrders,
        Kind::RateLimited,
        Kind::Churn,
    ];

    fn path(self, n: u64) -> String {
        let id = n % 50 + 1;
        match self {
            Kind::JwtUsers => format!("/soak/users/{id}"),
            Kind::JwtOrders => format!("/soak/orders/{id}"),
            Kind::RateLimited => format!("/api/users/{id}"),
            Kind::Churn => format!("/soak/churn/{id}"),
        }
    }
}

async fn one_request(http: &reqwest::Client, shared: &Shared, gateway: &str, kind: Kind, n: u64) {
    let user = (n / 4 % 2) as usize;
    let token = shared.access.lock()[user].clone();
    let started = Instant::now();
    let mut request = http.get(format!("{gateway}{}", kind.path(n)));
    if !matches!(kind, Kind::Churn) {
        request = request.bearer_auth(token);
    }
    let outcome = match request.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            // Read the body: an answer counts once it has arrived whole.
            match r.bytes().await {
                Ok(_) => Ok(status),
                Err(e) => Err(format!("body: {}", error_kind(&e))),
            }
        }
        Err(e) => Err(error_kind(&e)),
    };
    let mut tally = shared.tally.lock();
    tally.requests += 1;
    match outcome {
        Ok(200) => tally.ok += 1,
        Ok(429) if matches!(kind, Kind::RateLimited) => tally.expected_429 += 1,
        Ok(502..=504) if matches!(kind, Kind::JwtOrders) && shared.victim_was_down(started) => {
            tally.expected_down += 1
        }
        Ok(status) => {
            *tally
                .unexpected
                .entry(format!("{kind:?}: status {status}"))
                .or_default() += 1
        }
        Err(e) => {
            *tally
                .unexpected
                .entry(format!("{kind:?}: {e}"))
                .or_default() += 1
        }
    }
}

fn error_kind(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect".into()
    } else {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            text = format!("{text}: {s}");
            source = s.source();
        }
        text
    }
}

/// Paces `rps` requests per second over every gateway until `until`.
async fn traffic(stack: &Stack, shared: Arc<Shared>, rps: u32, until: Instant) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("a plain HTTP client always builds");
    let gateways = stack.gateways();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rps);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Each request in its own task, so a slow answer does not slow the pace;
    // at most 256 in flight.
    let limit = Arc::new(tokio::sync::Semaphore::new(256));
    let mut n = 0u64;
    while Instant::now() < until {
        tick.tick().await;
        let permit = limit.clone().acquire_owned().await.expect("never closed");
        let (http, shared) = (http.clone(), shared.clone());
        let gateway = gateways[n as usize % gateways.len()].clone();
        let kind = Kind::ALL[n as usize % Kind::ALL.len()];
        tokio::spawn(async move {
            one_request(&http, &shared, &gateway, kind, n).await;
            drop(permit);
        });
        n += 1;
    }
    // Let the last requests finish.
    let _ = limit.acquire_many(256).await;
}

/// Every user's refresh token is exchanged every [`REFRESH_EVERY`].
async fn refresher(gateway: String, shared: Arc<Shared>, mut refresh: Vec<String>, until: Instant) {
    let http = gateway_tests::client();
    while Instant::now() + REFRESH_EVERY < until {
        tokio::time::sleep(REFRESH_EVERY).await;
        for (user, token) in refresh.iter_mut().enumerate() {
            let answer = http
                .post(format!("{gateway}/auth/refresh"))
                .json(&json!({"refresh_token": token}))
                .send()
                .await;
            let pair: Result<Value, String> = match answer {
                Ok(r) if r.status() == 200 => r.json().await.map_err(|e| e.to_string()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(error_kind(&e)),
            };
            match pair.and_then(|p| {
                let access = p["access_token"]
                    .as_str()
                    .ok_or("no access_token")?
                    .to_owned();
                let next = p["refresh_token"]
                    .as_str()
                    .ok_or("no refresh_token")?
                    .to_owned();
                Ok((access, next))
            }) {
                Ok((access, next)) => {
                    shared.access.lock()[user] = access;
                    *token = next;
                    shared.tally.lock().refreshes += 1;
                }
                Err(e) => shared.unexpected(format!("refresh: {e}")),
            }
        }
    }
}

/// The churn route's configuration for generation `generation`: its timeout
/// and a request header alternate, so every change is a new version.
fn churn_route(generation: u64) -> Route {
    let mut route = open_route("soak-churn", "/soak/churn", "users", "/users");
    route.timeout_ms = 5_000 + (generation % 2) as u32 * 1_000;
    route
}

/// A configuration change every [`CONFIG_EVERY`], each waited for on every data plane.
async fn config_changer(stack: &Stack, shared: Arc<Shared>, until: Instant) {
    let mut generation = 1;
    while Instant::now() + CONFIG_EVERY < until {
        tokio::time::sleep(CONFIG_EVERY).await;
        generation += 1;
        let change = async {
            let version = stack
                .admin_client()
                .await
                .upsert_route(UpsertRouteRequest {
                    route: Some(churn_route(generation)),
                    expected_version: None,
                })
                .await
                .context("UpsertRoute")?
                .into_inner()
                .version;
            stack
                .wait_synced(version)
                .await
                .context("data planes syncing")
        };
        match tokio::time::timeout(Duration::from_secs(10), change).await {
            Ok(Ok(())) => shared.tally.lock().config_changes += 1,
            Ok(Err(e)) => shared.unexpected(format!("config change: {e:#}")),
            Err(_) => {
                shared.unexpected("config change: not on every data plane within 10 s".into())
            }
        }
    }
}

/// Kills the victim every `every` and starts it again [`DOWN_FOR`] later, as
/// long as the restart and its grace fit in the run.
async fn chaos(
    stack: &Stack,
    shared: Arc<Shared>,
    started: Instant,
    every: Duration,
    until: Instant,
) {
    let mut next = started + every;
    while next + DOWN_FOR + DOWN_GRACE < until {
        tokio::time::sleep_until(next.into()).await;
        *shared.down.lock() = DownState {
            killed: Some(Instant::now()),
            back: None,
        };
        if let Err(e) = stack.kill(VICTIM).await {
            shared.unexpected(format!("killing {VICTIM}: {e}"));
        }
        tokio::time::sleep(DOWN_FOR).await;
        match stack.start_process(VICTIM).await {
            Ok(()) => shared.tally.lock().restarts += 1,
            Err(e) => shared.unexpected(format!("restarting {VICTIM}: {e}")),
        }
        shared.down.lock().back = Some(Instant::now());
        next += every;
    }
}

/// RSS samples: process → (seconds since start, KiB).
type Samples = BTreeMap<String, Vec<(f64, u64)>>;

async fn sampler(stack: &Stack, samples: Arc<Mutex<Samples>>, started: Instant, until: Instant) {
    loop {
        for name in stack.process_names() {
            if let Some(kib) = stack.pid(&name).and_then(|pid| rss_kib(pid).ok()) {
                samples
                    .lock()
                    .entry(name)
                    .or_default()
                    .push((started.elapsed().as_secs_f64(), kib));
            }
        }
        if Instant::now() >= until {
            return;
        }
        tokio::time::sleep(SAMPLE_EVERY.min(until - Instant::now())).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let o = options()?;
    eprintln!(
        "soak: starting a stack (2 data planes) for {:?} at {} requests/s",
        o.duration, o.rps
    );
    let stack = Stack::new().data_planes(2).start().await?;
    let gateway = stack.gateways()[0].clone();
    for (name, prefix, upstream, rewrite) in [
        ("soak-users", "/soak/users", "users", "/users"),
        ("soak-orders", "/soak/orders", "orders", "/orders"),
    ] {
        let mut route = open_route(name, prefix, upstream, rewrite);
        route.auth = AuthMode::AuthJwt as i32;
        upsert_route_synced(&stack, route).await?;
    }
    upsert_route_synced(&stack, churn_route(1)).await?;
    // One login per user (the login route allows 5 a minute per address).
    let mut access = Vec::new();
    let mut refresh = Vec::new();
    let http = gateway_tests::client();
    for (user, _, password) in devstack::DEMO_USERS {
        let pair: Value = http
            .post(format!("{gateway}/auth/login"))
            .json(&json!({"username": user, "password": password}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        access.push(
            pair["access_token"]
                .as_str()
                .context("access_token")?
                .to_owned(),
        );
        refresh.push(
            pair["refresh_token"]
                .as_str()
                .context("refresh_token")?
                .to_owned(),
        );
    }
    let shared = Arc::new(Shared {
        tally: Mutex::default(),
        access: Mutex::new(access),
        down: Mutex::default(),
    });
    let samples = Arc::new(Mutex::new(Samples::new()));
    let started = Instant::now();
    let until = started + o.duration;
    let warmup = (o.duration / 4).min(Duration::from_secs(60));
    // Once a minute, or every quarter of a run under four minutes.
    let kill_every = Duration::from_secs(60).min(o.duration / 4);
    eprintln!(
        "soak: traffic until {:?} from now; warm-up {warmup:?}; {VICTIM} killed every {kill_every:?}; logs in {}",
        o.duration,
        stack.log_dir().display()
    );
    tokio::join!(
        traffic(&stack, shared.clone(), o.rps, until),
        refresher(gateway.clone(), shared.clone(), refresh, until),
        config_changer(&stack, shared.clone(), until),
        chaos(&stack, shared.clone(), started, kill_every, until),
        sampler(&stack, samples.clone(), started, until),
    );
    for exited in stack.reap_exited() {
        shared.unexpected(format!("process exited: {exited:?}"));
    }
    let tally = std::mem::take(&mut *shared.tally.lock());
    let samples = std::mem::take(&mut *samples.lock());
    let failed = report(&o, &tally, &samples, warmup.as_secs_f64());
    stack.shutdown().await;
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// Prints the report; true when the run failed.
fn report(o: &Options, tally: &Tally, samples: &Samples, warmup: f64) -> bool {
    let unexpected: u64 = tally.unexpected.values().sum();
    println!(
        "soak: {:.0} s, {} requests: {} ok, {} expected 429, {} expected 502-504 while {VICTIM} was down, {unexpected} unexpected",
        o.duration.as_secs_f64(),
        tally.requests,
        tally.ok,
        tally.expected_429,
        tally.expected_down
    );
    println!(
        "soak: {} refreshes, {} configuration changes, {} restarts of {VICTIM}",
        tally.refreshes, tally.config_changes, tally.restarts
    );
    for (what, n) in &tally.unexpected {
        println!("soak: unexpected: {what}: {n}");
    }
    let mut failed = unexpected > 0;
    let mut rss = Vec::new();
    println!("soak: RSS (KiB) at the end of the warm-up ({warmup:.0} s) and at the end:");
    for (name, points) in samples {
        let restarted = name == VICTIM && tally.restarts > 0;
        let Some(&(_, base)) = points.iter().find(|(t, _)| *t >= warmup) else {
            continue;
        };
        let &(_, end) = points.last().expect("found one above");
        let growth = (end as f64 - base as f64) * 100.0 / base as f64;
        let peak = points.iter().map(|(_, k)| *k).max().unwrap_or(end);
        let checked = o.max_rss_growth.is_some() && !restarted && name != "redis";
        let over = o.max_rss_growth.is_some_and(|max| checked && growth > max);
        failed |= over;
        println!(
            "soak:   {name:<16} {base:>8} -> {end:>8} ({growth:+.1} %, peak {peak}){}{}",
            if restarted {
                " restarted, not compared"
            } else {
                ""
            },
            if over { " OVER THE LIMIT" } else { "" }
        );
        rss.push(
            json!({"process": name, "warm_kib": base, "end_kib": end, "peak_kib": peak,
            "growth_pct": (growth * 10.0).round() / 10.0, "restarted": restarted}),
        );
    }
    if o.json {
        println!(
            "{}",
            json!({
                "seconds": o.duration.as_secs(), "rps": o.rps, "requests": tally.requests, "ok": tally.ok,
                "expected_429": tally.expected_429, "expected_down": tally.expected_down,
                "unexpected": tally.unexpected, "refreshes": tally.refreshes,
                "config_changes": tally.config_changes, "restarts": tally.restarts, "rss": rss,
            })
        );
    }
    println!("soak: {}", if failed { "FAILED" } else { "passed" });
    failed
}
