//! A non-blocking, batching stderr writer for log lines.
//!
//! Request threads only copy the formatted line into a shared buffer (a short
//! mutex-protected `memcpy`); one background thread writes whole batches to
//! stderr, so under load thousands of lines cost one `write` syscall instead of
//! one each. If stderr blocks (a full pipe) and the buffer reaches its bound,
//! new lines are dropped and counted instead of stalling requests.
//!
//! Wake-ups are rare on purpose: an idle writer is woken by the first line,
//! then collects for [`FLUSH_INTERVAL`] (or until [`HIGH_WATER`] bytes wait)
//! before writing, so a busy request thread makes no syscall per line.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// Default bound of unwritten log bytes.
pub const DEFAULT_BUFFER_BYTES: usize = 4 << 20;
/// Longest a line waits in the buffer once the writer is awake.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(10);
/// Buffered bytes that make the writer write at once.
pub const HIGH_WATER: usize = 256 << 10;

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
    limit: usize,
}

struct State {
    buf: Vec<u8>,
    closed: bool,
    /// The writer sleeps until notified (nothing was buffered).
    idle: bool,
    /// A high-water wake-up was already sent for the current batch.
    urged: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

/// The [`MakeWriter`] handed to `tracing-subscriber`; clone freely.
#[derive(Clone)]
pub struct NonBlocking {
    shared: Arc<Shared>,
}

/// Keeps the writer thread alive; dropping it writes what is buffered and
/// stops the thread. Keep it in `main` until the end.
#[must_use = "dropping the guard stops log output"]
pub struct WriterGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl NonBlocking {
    /// Starts the writer thread on `out` with a bound of `limit` unwritten bytes.
    pub fn new<W: Write + Send + 'static>(
        mut out: W,
        limit: usize,
    ) -> io::Result<(Self, WriterGuard)> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buf: Vec::with_capacity(64 << 10),
                closed: false,
                idle: false,
                urged: false,
            }),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
            limit,
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || {
                let shared = thread_shared;
                let mut batch = Vec::with_capacity(64 << 10);
                loop {
                    let closed = {
                        let mut state = shared.lock();
                        while state.buf.is_empty() && !state.closed {
                            // Asleep for good: the next line wakes it (see `write`).
                            state.idle = true;
                            shared.wake.wait(&mut state);
                        }
                        // Awake: collect for FLUSH_INTERVAL, unless a high-water
                        // wake-up or shutdown says to write now.
                        shared.wake.wait_while_for(
                            &mut state,
                            |s| !s.closed && s.buf.len() < HIGH_WATER,
                            FLUSH_INTERVAL,
                        );
                        state.urged = false;
                        std::mem::swap(&mut state.buf, &mut batch);
                        state.closed
                    };
                    if !batch.is_empty() {
                        // Nowhere to report a failing stderr; keep going.
                        let _ = out.write_all(&batch).and_then(|()| out.flush());
                        batch.clear();
                    }
                    if closed && shared.lock().buf.is_empty() {
                        return;
                    }
                }
            })?;
        Ok((
            Self {
                shared: shared.clone(),
            },
            WriterGuard {
                shared,
                thread: Some(thread),
            },
        ))
    }

    /// Lines dropped because the buffer was full.
    pub fn dropped_lines(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl WriterGuard {
    /// Lines dropped because the buffer was full.
    pub fn dropped_lines(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for WriterGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Write for NonBlocking {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let mut state = self.shared.lock();
        if state.closed {
            // After shutdown (e.g. a late line during process exit): write it directly.
            drop(state);
            return io::stderr().write(line);
        }
        if state.buf.len() + line.len() > self.shared.limit {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(line.len());
        }
        state.buf.extend_from_slice(line);
        // Wake the writer only when it sleeps for good, or once when the batch got big.
        let wake = if state.idle {
            state.idle = false;
            true
        } else if state.buf.len() >= HIGH_WATER && !state.urged {
            state.urged = true;
            true
        } else {
            false
        };
        drop(state);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for NonBlocking {
    type Writer = NonBlocking;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn writes_everything_in_order_by_shutdown() {
        let out = Capture::default();
        let (mut w, guard) = NonBlocking::new(out.clone(), 1 << 20).unwrap();
        for i in 0..1000 {
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        drop(guard);
        let text = String::from_utf8(out.0.lock().clone()).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines[999], "line 999");
        assert_eq!(w.dropped_lines(), 0);
    }

    /// A long-running process's lines reach the output soon after they are
    /// written, not only at high water or at shutdown (a log tailed by a
    /// person, or scanned by a test, while the process runs).
    #[test]
    fn lines_are_written_while_the_process_runs() {
        let out = Capture::default();
        let (mut w, _guard) = NonBlocking::new(out.clone(), 1 << 20).unwrap();
        for round in 0..3 {
            let line = format!("round {round}\n");
            w.write_all(line.as_bytes()).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !String::from_utf8_lossy(&out.0.lock()).contains(&line) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{line:?} not written within 5 s"
                );
                std::thread::yield_now();
            }
        }
    }

    /// An output that blocks until released, like a full pipe.
    struct Stuck(Arc<(Mutex<bool>, Condvar)>);
    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, cv) = &*self.0;
            let mut open = lock.lock();
            while !*open {
                cv.wait(&mut open);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_blocked_output_drops_and_counts_instead_of_blocking() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (mut w, guard) = NonBlocking::new(Stuck(gate.clone()), 1000).unwrap();
        let started = std::time::Instant::now();
        for _ in 0..10_000 {
            w.write_all(&[b'x'; 99]).unwrap();
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // At most one batch is stuck in the writer and 10 lines fit the buffer.
        assert!(w.dropped_lines() >= 10_000 - 20, "{}", w.dropped_lines());
        *gate.0.lock() = true;
        gate.1.notify_all();
        drop(guard);
    }
}
