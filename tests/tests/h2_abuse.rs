//! HTTP/2 abuse (issue 25) against the h2c listener of a real data plane
//! (the proxy port: a connection that opens with the HTTP/2 preface is h2c).
//! Each attack is written as raw frames (`gateway_tests::h2_frames`) or, for
//! the window stall, with a real client library (`h2`) that answers PINGs
//! but never opens its window:
//!
//! * rapid reset (CVE-2023-44487): HEADERS then RST_STREAM, over and over;
//! * CONTINUATION flood: HEADERS without END_HEADERS, then CONTINUATION without end;
//! * SETTINGS flood and PING flood: thousands of frames, the ACKs never read;
//! * window stall: streams for 1 MiB answers with a zero window, no WINDOW_UPDATE.
//!
//! For each: the abuser is told to go (GOAWAY) or hung up on within a
//! deadline, the replica's CPU time and resident memory stay bounded
//! (`/proc/PID/stat` and `/proc/PID/status` before and after), and an
//! ordinary client (a new HTTP/1.1 connection per request, so every worker
//! is reached, plus one well-behaved h2 connection) is served every time
//! within a deadline while the attack runs. Each test prints its figures
//! (`cargo test --test h2_abuse -- --nocapture`); BENCHMARKS.md keeps them.
//! Every frame-level attack (all but the window stall of a real client) runs
//! on the HTTPS listener too (issue 27: TLS with ALPN `h2`), with the same checks.
//!
//! Needs the binaries built (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use devstack::Stack;
use futures::FutureExt;
use gateway_tests::h2_frames::{self, GoAway, Seen, flag, kind};
use gateway_tests::{cpu_seconds, metric_sum, open_route, rss_kib, upsert_route_synced};
use rustls::pki_types::pem::PemObject as _;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The path the ordinary client asks for (users mock through an open route).
const GOOD_PATH: &str = "/open/users/1";
/// How long one ordinary request may take while an attack runs.
const GOOD_DEADLINE: Duration = Duration::from_secs(5);
/// How long an attack on one connection may go on before the server must have
/// told the abuser to go or hung up. Generous for a debug build on a shared box:
/// the figures the tests print are far lower.
const DISCONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// The cheap attacks (rapid reset, CONTINUATION) are repeated on new
/// connections for this long, so the CPU figure is that of a sustained attack.
const SUSTAINED: Duration = Duration::from_secs(3);
/// Most CPU the replica may spend per second of attack (a 2-core box has 2).
const MAX_CPU_PER_SECOND: f64 = 1.0;
/// Most the replica's resident memory may grow during one attack.
const MAX_RSS_GROWTH_KIB: u64 = 32 * 1024;

/// One data plane (no auth service: the routes here are open) with
/// `/open/users` → the users mock.
struct Target {
    stack: Stack,
    /// "127.0.0.1:P", the proxy port.
    addr: String,
    /// The data plane's process id.
    pid: u32,
}

/// HTTP/2 keep-alive of the replica under test (`--h2-keep-alive-ms`; 20 s
/// by default): a PING after this much silence, disconnected when its ACK
/// does not come within as long again.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Longest a write to a client may wait for it to take a byte
/// (`--write-timeout-ms`; 30 s by default).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The replica runs with [`KEEP_ALIVE`] and [`WRITE_TIMEOUT`] rather than
/// the defaults, so the slow attacks end in seconds; what is tested is that
/// these deadlines reach HTTP/2 connections, whatever their length.
async fn target() -> Result<Target> {
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .data_plane_arg(format!("--h2-keep-alive-ms={}", KEEP_ALIVE.as_millis()))
        .data_plane_arg(format!("--write-timeout-ms={}", WRITE_TIMEOUT.as_millis()))
        .start()
        .await?;
    upsert_route_synced(
        &stack,
        open_route("open-users", "/open/users", "users", "/users"),
    )
    .await?;
    let addr = stack.gateways()[0]
        .strip_prefix("http://")
        .context("gateway URL")?
        .to_owned();
    let pid = stack.pid("data-plane-1").context("data plane pid")?;
    Ok(Target { stack, addr, pid })
}

/// CPU seconds and RSS of the replica at one moment.
#[derive(Debug, Clone, Copy)]
struct Usage {
    at: Instant,
    cpu: f64,
    rss_kib: u64,
}

impl Usage {
    fn now(pid: u32) -> Result<Self> {
        Ok(Self {
            at: Instant::now(),
            cpu: cpu_seconds(pid)?,
            rss_kib: rss_kib(pid)?,
        })
    }
}

/// What the ordinary client saw while an attack ran.
#[derive(Debug, Default)]
struct GoodReport {
    h1_ok: u64,
    h2_ok: u64,
    failures: Vec<String>,
    slowest: Duration,
}

impl GoodReport {
    fn requests(&self) -> u64 {
        self.h1_ok + self.h2_ok + self.failures.len() as u64
    }
}

/// An ordinary client that keeps asking for [`GOOD_PATH`] until stopped:
/// alternately on a new HTTP/1.1 connection (the kernel spreads new
/// connections over the replica's workers) and on one h2 connection opened
/// before the attack. Every answer must be 200 within [`GOOD_DEADLINE`].
struct GoodClient {
    stop: watch::Sender<bool>,
    task: JoinHandle<GoodReport>,
}

impl GoodClient {
    async fn start(addr: &str) -> Result<Self> {
        let http1 = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(GOOD_DEADLINE)
            .build()?;
        let tcp = TcpStream::connect(addr).await?;
        let (mut h2, connection) = h2::client::handshake(tcp).await?;
        tokio::spawn(connection);
        let url = format!("http://{addr}{GOOD_PATH}");
        let uri: http::Uri = url.parse()?;
        // Prove both paths work before any attack starts.
        let first = http1.get(&url).send().await?.status();
        ensure!(
            first == 200,
            "ordinary HTTP/1.1 request before the attack: {first}"
        );
        h2_get(&mut h2, &uri).await?;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut report = GoodReport::default();
            while !*stopped.borrow() {
                for use_h2 in [false, true] {
                    let started = Instant::now();
                    let outcome = if use_h2 {
                        tokio::time::timeout(GOOD_DEADLINE, h2_get(&mut h2, &uri))
                            .await
                            .unwrap_or_else(|_| {
                                Err(anyhow::anyhow!("no answer within {GOOD_DEADLINE:?}"))
                            })
                    } else {
                        match http1.get(&url).send().await {
                            Ok(r) if r.status() == 200 => {
                                r.bytes().await.map(drop).map_err(Into::into)
                            }
                            Ok(r) => Err(anyhow::anyhow!("status {}", r.status())),
                            Err(e) => Err(e.into()),
                        }
                    };
                    report.slowest = report.slowest.max(started.elapsed());
                    match outcome {
                        Ok(()) if use_h2 => report.h2_ok += 1,
                        Ok(()) => report.h1_ok += 1,
                        Err(e) => report
                            .failures
                            .push(format!("{} {e:#}", if use_h2 { "h2" } else { "HTTP/1.1" })),
                    }
                }
                // Pace the client: it stands for ordinary traffic, not a second load.
                tokio::select! {
                    _ = stopped.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            report
        });
        Ok(Self { stop, task })
    }

    async fn finish(self) -> Result<GoodReport> {
        let _ = self.stop.send(true);
        Ok(self.task.await?)
    }
}

/// One GET on an h2 connection; Ok when it answered 200 and its body was read.
async fn h2_get(h2: &mut h2::client::SendRequest<Bytes>, uri: &http::Uri) -> Result<()> {
    let request = http::Request::get(uri.clone()).body(())?;
    let (response, _) = h2.clone().ready().await?.send_request(request, true)?;
    let response = response.await?;
    ensure!(response.status() == 200, "status {}", response.status());
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
    }
    Ok(())
}

/// How one abusive connection ended.
#[derive(Debug)]
struct Abuse {
    frames_sent: u64,
    /// Time from the attack's first frame to the GOAWAY or the hang-up.
    disconnected_after: Duration,
    goaway: Option<GoAway>,
}

/// A connection that is never read: (server port, client port), its write
/// side, and its read side (kept, unread, until the attack ends).
type Unread = (
    (u16, u16),
    Box<dyn AsyncWrite + Unpin + Send>,
    Box<dyn Send>,
);

/// Where an attack connects: the cleartext listener (h2c with prior
/// knowledge) or the HTTPS one (TLS, ALPN `h2`), the same attacks on both.
#[derive(Clone)]
enum Listener {
    /// "127.0.0.1:P".
    Clear(String),
    /// The HTTPS listener's port, and a client trusting the stack's edge CA.
    Tls(u16, tokio_rustls::TlsConnector),
}

impl Listener {
    /// The target's listener of this kind.
    fn of(t: &Target, tls: bool) -> Result<Self> {
        if !tls {
            return Ok(Self::Clear(t.addr.clone()));
        }
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(t.stack.edge_ca())?;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(c?)?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self::Tls(
            t.stack.ports().gateways_tls[0],
            tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
        ))
    }

    /// A new connection whose client never reads after the handshake (its
    /// receive buffer shrunk to 4 KiB, so the server's writes soon block): the
    /// server's and the client's ports, the write side, and the read side,
    /// kept unread.
    async fn open_unread(&self) -> Result<Unread> {
        let (addr, connector) = match self {
            Self::Clear(addr) => (addr.clone(), None),
            Self::Tls(port, connector) => (format!("127.0.0.1:{port}"), Some(connector)),
        };
        let tcp = h2_frames::connect(&addr, Some(4096)).await?;
        let ports = (tcp.peer_addr()?.port(), tcp.local_addr()?.port());
        let Some(connector) = connector else {
            let (read, write) = tcp.into_split();
            return Ok((ports, Box::new(write), Box::new(read)));
        };
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        let (read, write) = tokio::io::split(connector.connect(name, tcp).await?);
        Ok((ports, Box::new(write), Box::new(read)))
    }

    /// A new connection: a reader task's view of what the server sends, and the write side.
    async fn open(&self) -> Result<(watch::Receiver<Seen>, Box<dyn AsyncWrite + Unpin + Send>)> {
        match self {
            Self::Clear(addr) => {
                let (read, write) = h2_frames::connect(addr, None).await?.into_split();
                Ok((h2_frames::read_frames(read), Box::new(write)))
            }
            Self::Tls(port, connector) => {
                let tcp = h2_frames::connect(&format!("127.0.0.1:{port}"), None).await?;
                let name = rustls::pki_types::ServerName::try_from("localhost")?;
                let tls = connector.connect(name, tcp).await?;
                ensure!(
                    tls.get_ref().1.alpn_protocol() == Some(b"h2"),
                    "the HTTPS listener did not choose h2"
                );
                let (read, write) = tokio::io::split(tls);
                Ok((h2_frames::read_frames(read), Box::new(write)))
            }
        }
    }
}

/// Opens an HTTP/2 connection on `listener` (preface and empty SETTINGS),
/// reads everything the server sends in a task, and keeps writing `batch()`
/// until the server says GOAWAY or hangs up. Fails if it has not within
/// [`DISCONNECT_DEADLINE`].
async fn abuse_reading(
    listener: &Listener,
    mut batch: impl FnMut(&mut Vec<u8>) -> u64,
) -> Result<Abuse> {
    let (seen, mut write) = listener.open().await?;
    let mut out = h2_frames::PREFACE.to_vec();
    h2_frames::settings(&mut out, &[]);
    write.write_all(&out).await?;
    let started = Instant::now();
    let mut frames_sent = 0;
    loop {
        if let Some(abuse) = ended(&seen.borrow(), frames_sent, started) {
            return Ok(abuse);
        }
        if started.elapsed() > DISCONNECT_DEADLINE {
            bail!(
                "not disconnected after {frames_sent} frames in {:?}; the server sent {:?}",
                started.elapsed(),
                seen.borrow()
            );
        }
        out.clear();
        let n = batch(&mut out);
        let written = async {
            write.write_all(&out).await?;
            write.flush().await
        };
        match tokio::time::timeout(Duration::from_millis(500), written).await {
            Ok(Ok(())) => frames_sent += n,
            // The server hung up (reset): wait for the reader to see how.
            Ok(Err(_)) => {
                let mut seen = seen.clone();
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    seen.wait_for(|s| s.closed.is_some()),
                )
                .await;
                return ended(&seen.borrow(), frames_sent, started)
                    .context("a write failed but the reader saw no end");
            }
            // The server stopped reading for now: see whether it has said why.
            Err(_) => {}
        }
    }
}

fn ended(seen: &Seen, frames_sent: u64, started: Instant) -> Option<Abuse> {
    seen.disconnected_after().map(|_| Abuse {
        frames_sent,
        // The reader's clock started a moment before `started`; measure here.
        disconnected_after: started.elapsed(),
        goaway: seen.goaway.as_ref().map(|(g, _)| g.clone()),
    })
}

/// Repeats `attack` on new connections for [`SUSTAINED`], each connection
/// required to be disconnected; returns every connection's outcome.
async fn sustained<F>(listener: &Listener, mut attack: F) -> Result<Vec<Abuse>>
where
    F: AsyncFnMut(&Listener) -> Result<Abuse>,
{
    let started = Instant::now();
    let mut all = Vec::new();
    while started.elapsed() < SUSTAINED {
        all.push(
            attack(listener)
                .await
                .with_context(|| format!("connection {}", all.len() + 1))?,
        );
    }
    Ok(all)
}

/// The checks every attack shares: bounded CPU and memory, every ordinary
/// request served. Prints the figures.
fn check_bounded(
    name: &str,
    before: Usage,
    after: Usage,
    good: &GoodReport,
    abuses: &[Abuse],
) -> Result<()> {
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    let cpu = after.cpu - before.cpu;
    let rss_growth = after.rss_kib as i64 - before.rss_kib as i64;
    let frames: u64 = abuses.iter().map(|a| a.frames_sent).sum();
    let slowest_disconnect = abuses
        .iter()
        .map(|a| a.disconnected_after)
        .max()
        .unwrap_or_default();
    let goaways: Vec<String> = abuses
        .iter()
        .filter_map(|a| a.goaway.as_ref())
        .map(|g| format!("0x{:x} {}", g.code, g.debug))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    println!(
        "{name}: {} connection(s), {frames} frames sent, disconnected after at most {slowest_disconnect:?} \
         (GOAWAY: {goaways:?}); replica CPU {cpu:.2} s in {seconds:.1} s, RSS {} -> {} KiB ({rss_growth:+} KiB); \
         ordinary client {}/{} ok (HTTP/1.1 {}, h2 {}), slowest {:?}",
        abuses.len(),
        before.rss_kib,
        after.rss_kib,
        good.requests() - good.failures.len() as u64,
        good.requests(),
        good.h1_ok,
        good.h2_ok,
        good.slowest,
    );
    ensure!(
        good.failures.is_empty(),
        "{name}: ordinary requests failed during the attack: {:?}",
        good.failures
    );
    ensure!(
        good.h1_ok > 0 && good.h2_ok > 0,
        "{name}: the ordinary client made no request: {good:?}"
    );
    ensure!(
        cpu <= MAX_CPU_PER_SECOND * seconds.max(1.0),
        "{name}: the replica spent {cpu:.2} s of CPU in {seconds:.1} s"
    );
    ensure!(
        rss_growth <= MAX_RSS_GROWTH_KIB as i64,
        "{name}: the replica's RSS grew by {rss_growth} KiB"
    );
    Ok(())
}

/// HEADERS for `/open/users/1` then RST_STREAM(CANCEL) for the same stream,
/// 100 pairs per write, until the server says GOAWAY. Reset streams must not
/// turn into upstream requests either.
#[tokio::test(flavor = "multi_thread")]
async fn rapid_reset_is_cut_off() -> Result<()> {
    rapid_reset(false).await
}

/// [`rapid_reset_is_cut_off`] on the HTTPS listener (issue 27).
#[tokio::test(flavor = "multi_thread")]
async fn rapid_reset_over_tls_is_cut_off() -> Result<()> {
    rapid_reset(true).await
}

async fn rapid_reset(tls: bool) -> Result<()> {
    let t = target().await?;
    let listener = Listener::of(&t, tls)?;
    let users_port = t.stack.ports().users_1;
    let backend_before = gateway_tests::mock_requests(users_port).await?;
    let good = GoodClient::start(&t.addr).await?;
    let before = Usage::now(t.pid)?;
    let block = h2_frames::get_block(&t.addr, GOOD_PATH);
    let abuses = sustained(&listener, async |listener: &Listener| {
        let mut stream = 1u32;
        abuse_reading(listener, |out| {
            for _ in 0..100 {
                h2_frames::get(out, stream, &block);
                h2_frames::rst_stream(out, stream, h2_frames::CANCEL);
                stream += 2;
            }
            200
        })
        .await
    })
    .await?;
    let after = Usage::now(t.pid)?;
    let good = good.finish().await?;
    check_bounded("rapid reset", before, after, &good, &abuses)?;
    let backend = gateway_tests::mock_requests(users_port).await? - backend_before;
    let reset_streams: u64 = abuses.iter().map(|a| a.frames_sent / 2).sum();
    println!(
        "rapid reset: {reset_streams} streams opened and reset; the users mock served {backend} requests (the ordinary client's included)"
    );
    ensure!(
        backend <= good.requests() + reset_streams / 10,
        "{backend} upstream requests for {reset_streams} reset streams"
    );
    for a in &abuses {
        let goaway = a.goaway.as_ref().context("disconnected without GOAWAY")?;
        ensure!(
            goaway.code == 0xb,
            "GOAWAY {goaway:?}: expected ENHANCE_YOUR_CALM"
        );
    }
    // Nothing stays in flight once the abusers are gone.
    let ops = &t.stack.gateway_admins()[0];
    gateway_tests::poll(Duration::from_secs(10), "no request in flight", || async {
        match metric_sum(ops, "gateway_upstream_in_flight").await {
            Ok(0.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

/// HEADERS without END_HEADERS, then CONTINUATION frames (each one more
/// small header field) without end.
#[tokio::test(flavor = "multi_thread")]
async fn continuation_flood_is_cut_off() -> Result<()> {
    continuation_flood(false).await
}

/// [`continuation_flood_is_cut_off`] on the HTTPS listener (issue 27).
#[tokio::test(flavor = "multi_thread")]
async fn continuation_flood_over_tls_is_cut_off() -> Result<()> {
    continuation_flood(true).await
}

async fn continuation_flood(tls: bool) -> Result<()> {
    let t = target().await?;
    let listener = Listener::of(&t, tls)?;
    let good = GoodClient::start(&t.addr).await?;
    let before = Usage::now(t.pid)?;
    let block = h2_frames::get_block(&t.addr, GOOD_PATH);
    // One literal field without indexing, new name: x-a: b.
    let field = [0x00, 3, b'x', b'-', b'a', 1, b'b'];
    let abuses = sustained(&listener, async |listener: &Listener| {
        let mut opened = false;
        abuse_reading(listener, |out| {
            let mut n = 0;
            if !opened {
                h2_frames::frame(out, kind::HEADERS, flag::END_STREAM, 1, &block);
                opened = true;
                n += 1;
            }
            for _ in 0..100 {
                h2_frames::frame(out, kind::CONTINUATION, 0, 1, &field);
                n += 1;
            }
            n
        })
        .await
    })
    .await?;
    let after = Usage::now(t.pid)?;
    let good = good.finish().await?;
    check_bounded("CONTINUATION flood", before, after, &good, &abuses)?;
    for a in &abuses {
        let goaway = a.goaway.as_ref().context("disconnected without GOAWAY")?;
        ensure!(
            goaway.code == 0xb,
            "GOAWAY {goaway:?}: expected ENHANCE_YOUR_CALM"
        );
    }
    Ok(())
}

/// The state of the server's side of the connection from `client_port` to
/// `server_port` on 127.0.0.1, from `/proc/net/tcp` (hex, `01` established);
/// `None` once the socket is gone. Reading the kernel's table shows that the
/// server closed a connection even when the client, which never reads, could
/// not see its FIN or GOAWAY behind the data queued for it.
fn server_side_state(server_port: u16, client_port: u16) -> Result<Option<u8>> {
    let table = std::fs::read_to_string("/proc/net/tcp").context("reading /proc/net/tcp")?;
    let local = format!("0100007F:{server_port:04X}");
    let remote = format!("0100007F:{client_port:04X}");
    Ok(table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let (l, r, st) = (fields.next()?, fields.next()?, fields.next()?);
        (l == local && r == remote).then(|| u8::from_str_radix(st, 16).ok())?
    }))
}

/// TCP_ESTABLISHED in `/proc/net/tcp`.
const ESTABLISHED: u8 = 0x01;

/// Opens an h2c connection with a 4 KiB receive buffer that it never reads,
/// and keeps writing `batch()` (writes that block for a while are retried)
/// until the server has closed its side. Fails if it has not within `deadline`.
async fn abuse_not_reading(
    listener: &Listener,
    deadline: Duration,
    mut batch: impl FnMut(&mut Vec<u8>) -> u64,
) -> Result<Abuse> {
    let ((server_port, client_port), mut write, _unread) = listener.open_unread().await?;
    let mut out = h2_frames::PREFACE.to_vec();
    h2_frames::settings(&mut out, &[]);
    write.write_all(&out).await?;
    write.flush().await?;
    let started = Instant::now();
    let mut frames_sent = 0;
    let mut pending = Vec::new();
    loop {
        let state = server_side_state(server_port, client_port)?;
        if state != Some(ESTABLISHED) {
            return Ok(Abuse {
                frames_sent,
                disconnected_after: started.elapsed(),
                goaway: None,
            });
        }
        if started.elapsed() > deadline {
            bail!(
                "not disconnected after {frames_sent} frames in {:?}",
                started.elapsed()
            );
        }
        if pending.is_empty() {
            frames_sent += batch(&mut pending);
        }
        // A write the server does not take within 200 ms is retried after the check above.
        let written = async {
            write.write_all(&pending).await?;
            write.flush().await
        };
        match tokio::time::timeout(Duration::from_millis(200), written).await {
            Ok(Ok(())) => pending.clear(),
            Ok(Err(_)) => {
                return Ok(Abuse {
                    frames_sent,
                    disconnected_after: started.elapsed(),
                    goaway: None,
                });
            }
            // Part of `pending` may have gone out; resending the rest exactly is not
            // needed (the server has stopped reading), only that writes keep coming.
            Err(_) => {}
        }
    }
}

/// How long a client that stopped reading may hold a connection: the write
/// timeout once the server's writes block, or at the latest the keep-alive
/// PING and its ACK timeout, plus slack for a loaded machine.
const NOT_READING_DEADLINE: Duration = Duration::from_secs(25);

/// Thousands of empty SETTINGS frames, the server's ACKs never read.
#[tokio::test(flavor = "multi_thread")]
async fn settings_flood_without_reading_is_cut_off() -> Result<()> {
    settings_flood(false).await
}

/// [`settings_flood_without_reading_is_cut_off`] on the HTTPS listener (issue 27).
#[tokio::test(flavor = "multi_thread")]
async fn settings_flood_over_tls_without_reading_is_cut_off() -> Result<()> {
    settings_flood(true).await
}

async fn settings_flood(tls: bool) -> Result<()> {
    let t = target().await?;
    let listener = Listener::of(&t, tls)?;
    let good = GoodClient::start(&t.addr).await?;
    let before = Usage::now(t.pid)?;
    let abuse = abuse_not_reading(&listener, NOT_READING_DEADLINE, |out| {
        for _ in 0..1000 {
            h2_frames::settings(out, &[]);
        }
        1000
    })
    .await?;
    let after = Usage::now(t.pid)?;
    let good = good.finish().await?;
    check_bounded("SETTINGS flood", before, after, &good, &[abuse])
}

/// Thousands of PING frames, the server's ACKs never read.
#[tokio::test(flavor = "multi_thread")]
async fn ping_flood_without_reading_is_cut_off() -> Result<()> {
    ping_flood(false).await
}

/// [`ping_flood_without_reading_is_cut_off`] on the HTTPS listener (issue 27).
#[tokio::test(flavor = "multi_thread")]
async fn ping_flood_over_tls_without_reading_is_cut_off() -> Result<()> {
    ping_flood(true).await
}

async fn ping_flood(tls: bool) -> Result<()> {
    let t = target().await?;
    let listener = Listener::of(&t, tls)?;
    let good = GoodClient::start(&t.addr).await?;
    let before = Usage::now(t.pid)?;
    let mut n = 0u64;
    let abuse = abuse_not_reading(&listener, NOT_READING_DEADLINE, |out| {
        for _ in 0..1000 {
            n += 1;
            h2_frames::ping(out, n);
        }
        1000
    })
    .await?;
    let after = Usage::now(t.pid)?;
    let good = good.finish().await?;
    check_bounded("PING flood", before, after, &good, &[abuse])
}

/// Streams opened for large answers.
const STALLED_STREAMS: u32 = 100;
/// The answer each stalled stream asks for (1 MiB from the users mock).
const LARGE_PATH: &str = "/open/users/1?bytes=1048576";

/// A raw client announces a zero stream window, opens [`STALLED_STREAMS`]
/// streams for 1 MiB answers, and then neither reads nor sends WINDOW_UPDATE.
#[tokio::test(flavor = "multi_thread")]
async fn zero_window_without_reading_is_cut_off() -> Result<()> {
    zero_window(false).await
}

/// [`zero_window_without_reading_is_cut_off`] on the HTTPS listener (issue 27).
#[tokio::test(flavor = "multi_thread")]
async fn zero_window_over_tls_without_reading_is_cut_off() -> Result<()> {
    zero_window(true).await
}

async fn zero_window(tls: bool) -> Result<()> {
    let t = target().await?;
    let listener = Listener::of(&t, tls)?;
    let good = GoodClient::start(&t.addr).await?;
    let before = Usage::now(t.pid)?;
    let block = h2_frames::get_block(&t.addr, LARGE_PATH);
    let mut opened = false;
    let abuse = abuse_not_reading(&listener, NOT_READING_DEADLINE, |out| {
        if opened {
            return 0;
        }
        opened = true;
        h2_frames::settings(out, &[(h2_frames::SETTINGS_INITIAL_WINDOW_SIZE, 0)]);
        for i in 0..STALLED_STREAMS {
            h2_frames::get(out, 1 + 2 * i, &block);
        }
        1 + u64::from(STALLED_STREAMS)
    })
    .await?;
    let after = Usage::now(t.pid)?;
    let good = good.finish().await?;
    check_bounded("zero window, not reading", before, after, &good, &[abuse])?;
    no_request_left_in_flight(&t).await
}

/// Waits until the replica has no upstream request in flight: what a
/// disconnected abuser held is given back.
async fn no_request_left_in_flight(t: &Target) -> Result<()> {
    let ops = &t.stack.gateway_admins()[0];
    gateway_tests::poll(Duration::from_secs(10), "no request in flight", || async {
        match metric_sum(ops, "gateway_upstream_in_flight").await {
            Ok(0.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// How long the live-client window stalls are watched.
const STALL_WATCH: Duration = Duration::from_secs(15);

/// What a live client's window stall did.
struct Stall {
    /// When the server ended the connection (GOAWAY or close), if it did
    /// within [`STALL_WATCH`].
    ended_after: Option<Duration>,
    /// DATA bytes the client received.
    received: u64,
    /// Upstream requests the replica had in flight at the end of the watch.
    in_flight: f64,
}

/// A real h2 client (it answers PINGs and SETTINGS like any library does)
/// with a stream window of `window` bytes opens [`STALLED_STREAMS`] streams
/// for 1 MiB answers; with `trickle` it then takes what has come every
/// 100 ms and gives that much window back (so a stream moves at most
/// `window` bytes per 100 ms), without it it never reads, for [`STALL_WATCH`] or until the server
/// ends the connection. The client is gone when this returns.
async fn window_stall(t: &Target, window: u32, trickle: bool) -> Result<Stall> {
    let tcp = TcpStream::connect(&t.addr).await?;
    let (h2, mut connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await?;
    let started = Instant::now();
    let uri: http::Uri = format!("http://{}{LARGE_PATH}", t.addr).parse()?;
    let requests = async {
        let mut bodies = Vec::new();
        for _ in 0..STALLED_STREAMS {
            let request = http::Request::get(uri.clone()).body(())?;
            let (response, _) = h2.clone().ready().await?.send_request(request, true)?;
            bodies.push(response);
        }
        let mut streams = Vec::new();
        for response in bodies {
            let response = response.await?;
            ensure!(response.status() == 200, "status {}", response.status());
            streams.push(response.into_body());
        }
        anyhow::Ok(streams)
    };
    // The connection task must run for the requests to go out.
    let mut streams = tokio::select! {
        streams = requests => streams?,
        ended = &mut connection => bail!("the connection ended before the answers' heads came: {ended:?}"),
    };
    let mut received = 0u64;
    let trickling = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if !trickle {
                continue;
            }
            // Take what has come and give exactly that much window back.
            for body in &mut streams {
                while let Some(Some(Ok(chunk))) = body.data().now_or_never() {
                    received += chunk.len() as u64;
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
            }
        }
    };
    let ended_after = tokio::select! {
        ended = &mut connection => {
            // The client library itself must not be what gave up.
            if let Err(e) = &ended {
                ensure!(e.is_remote() || e.is_io(), "the client ended the connection: {e}");
            }
            Some(started.elapsed())
        }
        () = trickling => unreachable!("the trickle never ends"),
        () = tokio::time::sleep(STALL_WATCH) => None,
    };
    let ops = &t.stack.gateway_admins()[0];
    let in_flight = metric_sum(ops, "gateway_upstream_in_flight").await?;
    Ok(Stall {
        ended_after,
        received,
        in_flight,
    })
}

/// The live-client stalls: what they may hold is bounded (one upstream
/// request per stream, and streams are capped at the server's
/// `max_concurrent_streams`), the replica's CPU and memory stay bounded,
/// others are served, and everything held is given back once the client goes.
///
/// A client that takes nothing (`trickle` false) is disconnected once it has
/// taken nothing for the write timeout, although it answers PINGs; one that
/// reads slowly but reads is served at its pace, like a slow HTTP/1.1 reader.
async fn live_stall(name: &str, window: u32, trickle: bool) -> Result<()> {
    let t = target().await?;
    let good = GoodClient::start(&t.addr).await?;
    let before = Usage::now(t.pid)?;
    let stall = window_stall(&t, window, trickle).await?;
    let after = Usage::now(t.pid)?;
    let good = good.finish().await?;
    println!(
        "{name}: {STALLED_STREAMS} streams, {} bytes of DATA received, {} upstream requests in flight at the end, server ended it: {:?}",
        stall.received, stall.in_flight, stall.ended_after
    );
    let abuse = Abuse {
        frames_sent: u64::from(STALLED_STREAMS),
        disconnected_after: stall.ended_after.unwrap_or(STALL_WATCH),
        goaway: None,
    };
    check_bounded(name, before, after, &good, &[abuse])?;
    if !trickle {
        // No byte for the write timeout; noticed within as long again.
        let ended = stall.ended_after.with_context(|| {
            format!("{name}: the connection was not ended within {STALL_WATCH:?}")
        })?;
        ensure!(
            ended >= WRITE_TIMEOUT && ended <= 2 * WRITE_TIMEOUT + Duration::from_secs(2),
            "{name}: ended after {ended:?}, the write timeout is {WRITE_TIMEOUT:?}"
        );
    }
    // The ordinary client, still running when the gauge was read, has at most one in flight.
    ensure!(
        stall.in_flight <= f64::from(STALLED_STREAMS) + 1.0,
        "{name}: {} upstream requests in flight for {STALLED_STREAMS} streams",
        stall.in_flight
    );
    no_request_left_in_flight(&t).await
}

/// A real client with a zero stream window that never gives any back.
#[tokio::test(flavor = "multi_thread")]
async fn zero_window_with_a_live_client_stays_bounded() -> Result<()> {
    live_stall("zero window, live client", 0, false).await
}

/// A real client with a 512-byte stream window that reads and gives the
/// window back every 100 ms: at most 5 KiB/s a stream (1 MiB takes 3.4 minutes). Smaller steps
/// would trip the client library's own guard against tiny DATA frames.
#[tokio::test(flavor = "multi_thread")]
async fn trickled_window_updates_stay_bounded() -> Result<()> {
    live_stall("trickled window", 512, true).await
}
