//! Proxy workers: one OS thread per core, each with its own single-threaded
//! tokio runtime and its own listening socket (`SO_REUSEPORT`), the way nginx
//! and Envoy run their workers.
//!
//! Why not one work-stealing runtime: a proxied request is two connections
//! (client and upstream) whose tasks hand the exchange to each other. On a
//! shared runtime those hand-offs often cross threads (a wake-up through the
//! other worker, a cache line moving between cores); on a worker the whole
//! exchange stays on one thread. The kernel spreads new client connections
//! over the workers' sockets, and each worker keeps its own idle upstream
//! connections ([`crate::pool`] files them under [`current`]). Shared state —
//! the configuration snapshot, breakers, health, counters — is the same for
//! every worker. BENCHMARKS.md has the measured difference.
//!
//! A worker out of ready tasks yields its core once before it sleeps in
//! epoll, but only when none of its requests is waiting for an answer
//! ([`Busy`]). A worker that answers without an upstream (a cache HIT, a
//! redirect, a refusal) otherwise drains its ready connections faster than a
//! client sharing its cores sends, sleeps, and is woken for each few
//! requests; having yielded, it finds the next requests already there. On two
//! cores shared with wrk, 8 rounds side by side: cache HITs +26 % per second,
//! plain +2 %, full −2 % (BENCHMARKS.md, twenty-second session). It yields
//! only then: yielding at every park (eighth session), under the kernel's
//! EEVDF scheduler, where `sched_yield` moves the caller's deadline a slice
//! later, a worker waiting for an upstream lost its core to nearly every task
//! TCP woke there, and served fewer requests in 13 of 17 rounds (tenth
//! session).
//!
//! Everything that is not request serving (the config stream, health checks,
//! the ops listener, the Redis connection) stays on the process's main runtime.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use http::Request;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::body::{ClientBody, ResponseBody};
use crate::conn_limit::Connections;
use crate::proxy_protocol::ProxyProtocol;
use crate::response::Response;
use crate::server::{self, HttpSettings, Scheme};
use crate::tls::TlsAcceptor;

thread_local! {
    /// Requests this thread's connections are answering now (from the
    /// handler's call to the answer), [`Busy`].
    static BUSY: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One request counted in [`BUSY`] until dropped: the servers hold one from
/// calling the handler until they have its answer.
#[derive(Debug)]
pub(crate) struct Busy(());

impl Busy {
    pub(crate) fn enter() -> Self {
        BUSY.set(BUSY.get().saturating_add(1));
        Busy(())
    }
}

impl Drop for Busy {
    /// On a worker the guard drops on the thread that made it. On a
    /// work-stealing runtime (tests) it may not: the counts are then only
    /// wrong for the yield above, never below zero.
    fn drop(&mut self) {
        BUSY.set(BUSY.get().saturating_sub(1));
    }
}

/// Runs before a worker sleeps in epoll: with no request being answered, it
/// yields its core once first (module documentation).
fn yield_when_idle() {
    if BUSY.get() == 0 {
        std::thread::yield_now();
    }
}

/// A proxy worker's index: `1..=n` for the workers [`spawn`] starts; `0`
/// stands for any other thread (the main runtime, tests). Passed down the
/// request path explicitly (pool idle lists, kept timers, retry-budget
/// stripes are per worker).
pub type Worker = usize;

/// The index of calls made off the proxy workers.
pub const OFF_WORKER: Worker = 0;

/// The number of workers `requested` stands for: itself, or with `0` one per
/// core the process may use.
pub fn count(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Binds `n` listening sockets to `addr`, all with `SO_REUSEPORT` so the
/// kernel balances new connections across them. With port 0 the first socket
/// picks the port and the others join it. Returns the sockets and the address.
pub fn bind(addr: SocketAddr, n: usize) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let mut sockets = Vec::with_capacity(n);
    let mut bound = addr;
    for _ in 0..n.max(1) {
        let socket = Socket::new(
            Domain::for_address(bound),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&bound.into())?;
        socket.listen(1024)?;
        let listener: std::net::TcpListener = socket.into();
        bound = listener.local_addr()?;
        sockets.push(listener);
    }
    Ok((sockets, bound))
}

/// The HTTPS side of the workers: one socket per worker (from [`bind`]) and
/// the acceptor they share (one ticket key and session cache per replica).
#[derive(Debug)]
pub struct TlsListeners {
    /// One per worker, in worker order.
    pub sockets: Vec<std::net::TcpListener>,
    /// The handshake every worker runs.
    pub acceptor: Arc<TlsAcceptor>,
}

/// Starts one worker thread per listener, each serving its listener (and,
/// with `tls`, its HTTPS socket) with the handlers `handler_for` makes for
/// its [`Worker`] index and each [`Scheme`] until `shutdown` turns true and
/// then draining ([`server::serve`], [`server::serve_tls`]). With
/// `proxy_protocol`, both listeners read a PROXY v2 header from the peers it
/// trusts. The returned task ends when every worker has stopped.
pub fn spawn<M, F, Fut>(
    listeners: Vec<std::net::TcpListener>,
    tls: Option<TlsListeners>,
    settings: HttpSettings,
    connections: Arc<Connections>,
    proxy_protocol: Option<ProxyProtocol>,
    handler_for: M,
    shutdown: &watch::Receiver<bool>,
) -> io::Result<JoinHandle<()>>
where
    M: Fn(Worker, Scheme) -> F,
    F: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let (mut tls_sockets, acceptor) = match tls {
        Some(t) => (t.sockets.into_iter().map(Some).collect(), Some(t.acceptor)),
        None => (Vec::new(), None),
    };
    tls_sockets.resize_with(listeners.len(), || None);
    let mut done = Vec::with_capacity(listeners.len());
    for (i, (listener, tls_socket)) in listeners.into_iter().zip(tls_sockets).enumerate() {
        let index: Worker = i + 1;
        let handler = handler_for(index, Scheme::Http);
        let https = tls_socket
            .zip(acceptor.clone())
            .map(|(socket, acceptor)| (socket, acceptor, handler_for(index, Scheme::Https)));
        let shutdown = shutdown.clone();
        let connections = connections.clone();
        let proxy_protocol = proxy_protocol.clone();
        let (finished, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(yield_when_idle)
            .build()?;
        std::thread::Builder::new()
            .name(format!("dp-worker-{index}"))
            .spawn(move || {
                // Dropped when this thread ends, however it ends.
                let _finished = finished;
                runtime.block_on(async move {
                    let https = async {
                        let Some((socket, acceptor, handler)) = https else {
                            return;
                        };
                        match TcpListener::from_std(socket) {
                            Ok(listener) => server::serve_tls(listener, settings, acceptor, connections.clone(), proxy_protocol.clone(), handler, shutdown.clone()).await,
                            Err(e) => tracing::error!(error = %e, worker = index, "worker cannot use its HTTPS socket"),
                        }
                    };
                    let http = async {
                        match TcpListener::from_std(listener) {
                            Ok(listener) => server::serve(listener, settings, connections.clone(), proxy_protocol.clone(), handler, shutdown.clone()).await,
                            Err(e) => tracing::error!(error = %e, worker = index, "worker cannot use its socket"),
                        }
                    };
                    tokio::join!(http, https);
                });
                // The attempts' kept timers go before the runtime that files them.
                crate::deadline::clear();
            })?;
        done.push(stopped);
    }
    Ok(tokio::spawn(async move {
        for stopped in done {
            let _ = stopped.await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_counts_the_requests_being_answered() {
        assert_eq!(BUSY.get(), 0);
        let a = Busy::enter();
        let b = Busy::enter();
        assert_eq!(BUSY.get(), 2);
        drop(a);
        assert_eq!(BUSY.get(), 1);
        drop(b);
        assert_eq!(BUSY.get(), 0);
        yield_when_idle();
        // Dropped on another thread: that thread's count stays at zero.
        let c = Busy::enter();
        std::thread::spawn(move || {
            drop(c);
            assert_eq!(BUSY.get(), 0);
        })
        .join()
        .unwrap();
        assert_eq!(BUSY.get(), 1);
    }

    #[test]
    fn sockets_share_one_port() {
        let (sockets, addr) = bind("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_eq!(sockets.len(), 3);
        assert_ne!(addr.port(), 0);
        for s in &sockets {
            assert_eq!(s.local_addr().unwrap(), addr);
        }
    }

    #[test]
    fn a_port_in_use_without_reuseport_is_refused() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = bind(taken.local_addr().unwrap(), 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn zero_means_one_per_core() {
        assert_eq!(count(3), 3);
        assert!(count(0) >= 1);
    }

    #[tokio::test]
    async fn every_worker_serves_and_all_stop() {
        let (sockets, addr) = bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let (stop, stopped) = watch::channel(false);
        let settings = HttpSettings {
            header_read_timeout: std::time::Duration::from_secs(5),
            write_timeout: std::time::Duration::from_secs(5),
            h2_idle_timeout: std::time::Duration::from_secs(5),
            h2_keep_alive: std::time::Duration::from_secs(5),
            max_header_bytes: 16 * 1024,
            shutdown_grace: std::time::Duration::from_secs(5),
            refusal: |_| Response::new(ResponseBody::full("refused")),
        };
        let handle = spawn(
            sockets,
            None,
            settings,
            Connections::new("proxy", 100),
            None,
            |worker, _scheme| {
                move |_req, _peer| async move {
                    Response::new(ResponseBody::full(format!("worker {worker}")))
                }
            },
            &stopped,
        )
        .unwrap();
        // Each request on a new connection; the kernel picks the socket, so only
        // the answer's shape is asserted, plus that some worker (index ≥ 1) answered.
        for _ in 0..4 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            let worker: usize = out
                .rsplit("worker ")
                .next()
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert!((1..=2).contains(&worker), "{out}");
        }
        stop.send(true).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), handle)
            .await
            .expect("workers stop")
            .unwrap();
    }
}
