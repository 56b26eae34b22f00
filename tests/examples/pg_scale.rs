//! Scale figures of control planes on Postgres (issue 28; BENCHMARKS.md,
//! "Postgres control planes"). Starts a real Postgres with the suites' one
//! starter (`tests/tests/postgres/mod.rs`) and control-plane processes, then:
//!
//! 1. **Push**: `--clients` light xDS clients (default 50; in this process,
//!    each a `StreamConfig` stream that ACKs every push at once, as a data
//!    plane does after applying it), spread evenly over 2 control planes on
//!    one Postgres. `--pushes` times (default 10) a route is committed on the
//!    first control plane; the figure is the time from the commit's answer
//!    (and from the call) to the last client's ACK of that version.
//! 2. **Commits per second**: `--writers` concurrent writers per control
//!    plane (default 4), each upserting its own route with a new timeout
//!    (the configuration keeps its size), for `--seconds` (default 10): on
//!    2 control planes sharing one Postgres, then on 1 control plane on SQLite.
//!
//! Usage (the binaries built in the same profile first):
//! `cargo build --workspace --release --bins --examples &&
//!  target/release/examples/pg_scale [--clients N] [--pushes N] [--writers N] [--seconds N]`.
//! Prints a Markdown table. Needs Postgres (`initdb`, `pg_ctl`), run as root
//! or not, as the test suites do.

#![allow(
    clippy::unwrap_used,
    reason = "a measuring program: unwrap stops it where it failed"
)]

#[path = "../tests/postgres/mod.rs"]
mod postgres;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use devstack::stack::{AdminClient, BearerToken};
use gateway_proto::v1::config_discovery_service_client::ConfigDiscoveryServiceClient;
use gateway_proto::v1::{
    ConfigRequest, Node, Route, UpsertRouteRequest, UpsertUpstreamRequest, Upstream,
};
use parking_lot::Mutex;
use postgres::{ALICE, BOB, ControlPlane, DATA_PLANE_TOKEN, PgServer, work_dir};
use tokio::sync::{mpsc, watch};
use tokio_stream_shim::ReceiverStream;
use tonic::transport::Channel;

/// `tokio_stream`'s receiver wrapper is not a dependency of this crate: a
/// ten-line equivalent over `futures`.
mod tokio_stream_shim {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// An `mpsc::Receiver` as a `Stream`.
    pub(crate) struct ReceiverStream<T>(pub(crate) tokio::sync::mpsc::Receiver<T>);

    impl<T> futures::Stream for ReceiverStream<T> {
        type Item = T;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
}

struct Options {
    clients: usize,
    pushes: usize,
    writers: usize,
    seconds: u64,
}

fn options() -> Result<Options> {
    let mut o = Options {
        clients: 50,
        pushes: 10,
        writers: 4,
        seconds: 10,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--clients" => o.clients = value.parse()?,
            "--pushes" => o.pushes = value.parse()?,
            "--writers" => o.writers = value.parse()?,
            "--seconds" => o.seconds = value.parse()?,
            other => bail!("unknown flag {other}; see the comment at the top of pg_scale.rs"),
        }
    }
    Ok(o)
}

/// When each client ACKed each version.
type Acks = Arc<Mutex<BTreeMap<u64, Vec<Instant>>>>;

/// One light data plane: a config stream that ACKs every push at once.
async fn client(url: String, node: String, acks: Acks, connected: mpsc::Sender<()>) -> Result<()> {
    let channel = Channel::from_shared(url)?.connect().await?;
    let mut cds =
        ConfigDiscoveryServiceClient::with_interceptor(channel, BearerToken::new(DATA_PLANE_TOKEN));
    let (tx, rx) = mpsc::channel(4);
    tx.send(ConfigRequest {
        node: Some(Node {
            id: node.clone(),
            hostname: "pg-scale".into(),
            build_version: "bench".into(),
        }),
        ..Default::default()
    })
    .await?;
    let mut inbound = cds.stream_config(ReceiverStream(rx)).await?.into_inner();
    let _ = connected.send(()).await;
    while let Some(push) = inbound.message().await? {
        tx.send(ConfigRequest {
            node: None,
            version_info: push.version.to_string(),
            response_nonce: push.nonce,
            ..Default::default()
        })
        .await?;
        acks.lock()
            .entry(push.version)
            .or_default()
            .push(Instant::now());
    }
    Ok(())
}

fn route(name: &str, timeout_ms: u32) -> Route {
    gateway_proto::v1::Route {
        timeout_ms,
        ..gateway_tests::open_route(name, &format!("/{name}"), "orders", "/orders")
    }
}

async fn seed(admin: &mut AdminClient) -> Result<()> {
    admin
        .upsert_upstream(UpsertUpstreamRequest {
            upstream: Some(Upstream {
                name: "orders".into(),
                instances: vec![gateway_proto::v1::Instance {
                    id: "orders-1".into(),
                    url: "http://127.0.0.1:9".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            expected_version: None,
        })
        .await?;
    Ok(())
}

/// Commit → last ACK, `pushes` times; returns (from the answer, from the call) per push.
async fn push_figures(
    a: &ControlPlane,
    b: &ControlPlane,
    clients: usize,
    pushes: usize,
) -> Result<Vec<(Duration, Duration)>> {
    let acks: Acks = Arc::default();
    let (connected_tx, mut connected_rx) = mpsc::channel(clients);
    let mut tasks = Vec::new();
    for i in 0..clients {
        let url = if i % 2 == 0 { a.url() } else { b.url() };
        let (acks, connected) = (acks.clone(), connected_tx.clone());
        tasks.push(tokio::spawn(client(
            url,
            format!("light-{i}"),
            acks,
            connected,
        )));
    }
    for _ in 0..clients {
        connected_rx
            .recv()
            .await
            .context("a client failed to connect")?;
    }
    let mut admin = a.admin(ALICE);
    let mut figures = Vec::new();
    for n in 0..pushes {
        let called = Instant::now();
        let version = admin
            .upsert_route(UpsertRouteRequest {
                route: Some(route("pushed", 1000 + n as u32)),
                expected_version: None,
            })
            .await?
            .into_inner()
            .version;
        let answered = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(30);
        let last = loop {
            if let Some(times) = acks.lock().get(&version)
                && times.len() == clients
            {
                break *times.iter().max().unwrap();
            }
            if Instant::now() > deadline {
                bail!("version {version}: not every client ACKed within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        figures.push((
            last.saturating_duration_since(answered),
            last.saturating_duration_since(called),
        ));
    }
    for t in tasks {
        t.abort();
    }
    Ok(figures)
}

/// Commits per second by `writers` writers on each of `planes` for `seconds`.
async fn commit_rate(planes: &[&ControlPlane], writers: usize, seconds: u64) -> Result<f64> {
    let (stop_tx, stop) = watch::channel(false);
    let mut tasks = Vec::new();
    for (p, plane) in planes.iter().enumerate() {
        for w in 0..writers {
            let mut admin = plane.admin(if p == 0 { ALICE } else { BOB });
            let mut stop = stop.clone();
            let name = format!("w-{p}-{w}");
            tasks.push(tokio::spawn(async move {
                let mut commits = 0u64;
                let mut n = 1u32;
                while !*stop.borrow_and_update() {
                    admin
                        .upsert_route(UpsertRouteRequest {
                            route: Some(route(&name, n)),
                            expected_version: None,
                        })
                        .await?;
                    commits += 1;
                    n += 1;
                }
                anyhow::Ok(commits)
            }));
        }
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop_tx.send_replace(true);
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    let median = v[v.len() / 2];
    format!(
        "median {} ms, min {} ms, max {} ms",
        ms(median),
        ms(v[0]),
        ms(v[v.len() - 1])
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let o = options()?;
    let pg = PgServer::start().await?;
    let dir = work_dir()?;
    let a = ControlPlane::start("cp-a", &pg.url(), dir.path(), None).await?;
    let b = ControlPlane::start("cp-b", &pg.url(), dir.path(), None).await?;
    seed(&mut a.admin(ALICE)).await?;

    let pushes = push_figures(&a, &b, o.clients, o.pushes).await?;
    let pg_rate = commit_rate(&[&a, &b], o.writers, o.seconds).await?;
    let one_pg_rate = commit_rate(&[&a], o.writers, o.seconds).await?;

    let sqlite = dir.path().join("sqlite.db");
    let s =
        ControlPlane::start("cp-sqlite", &sqlite.display().to_string(), dir.path(), None).await?;
    seed(&mut s.admin(ALICE)).await?;
    let sqlite_rate = commit_rate(&[&s], o.writers, o.seconds).await?;

    println!(
        "| what | figure |\n|---|---|\n\
         | commit → last ACK, {} light xDS clients over 2 control planes on Postgres, {} pushes, from the commit's answer | {} |\n\
         | same, from the start of the UpsertRoute call | {} |\n\
         | commits/s, 2 control planes on one Postgres, {} writers each, {} s | {:.0} |\n\
         | commits/s, 1 control plane on the same Postgres, {} writers, {} s | {:.0} |\n\
         | commits/s, 1 control plane on SQLite (WAL, synchronous=FULL), {} writers, {} s | {:.0} |",
        o.clients,
        o.pushes,
        summary(pushes.iter().map(|p| p.0).collect()),
        summary(pushes.iter().map(|p| p.1).collect()),
        o.writers,
        o.seconds,
        pg_rate,
        o.writers,
        o.seconds,
        one_pg_rate,
        o.writers,
        o.seconds,
        sqlite_rate,
    );
    Ok(())
}
