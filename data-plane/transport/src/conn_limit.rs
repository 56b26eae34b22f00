//! The per-replica cap on open client connections (`--max-connections`).
//!
//! Every worker's accept loop takes a slot before it serves a connection and
//! the connection gives it back when it ends. Past the cap a new connection is
//! closed at once (before any byte is read) and counted, so a flood of idle
//! connections cannot exhaust the replica's file descriptors or memory: what
//! is left of the descriptor limit stays for upstream connections.
//!
//! The default is sized from the process's descriptor limit (`ulimit -n`):
//! three quarters of it, at most 100,000. `/metrics` shows the counters
//! ([`crate::metrics::write_connections`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Most connections the automatic default allows, whatever the descriptor limit.
pub const AUTO_MAX: usize = 100_000;

/// Open client connections of one listener kind, and the cap on them.
#[derive(Debug)]
pub struct Connections {
    /// Label in metrics (`proxy`, `ops`).
    listener: &'static str,
    max: usize,
    open: AtomicUsize,
    refused: AtomicU64,
}

/// A connection's slot; given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<Connections>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connections {
    /// A cap of `max` open connections (at least 1) for the listener named `listener`.
    pub fn new(listener: &'static str, max: usize) -> Arc<Self> {
        Arc::new(Self {
            listener,
            max: max.max(1),
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// A slot for a new connection, or `None` (counted) when the cap is reached.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        if self.open.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.open.fetch_sub(1, Ordering::Relaxed);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Slot(self.clone()))
    }

    /// The listener's label in metrics (`proxy`, `ops`).
    pub fn listener(&self) -> &'static str {
        self.listener
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections closed at once because the cap was reached.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The process's soft limit on open descriptors (`Max open files` in
/// `/proc/self/limits`), or `None` where that cannot be read.
pub fn fd_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_fd_limit(&limits)
}

fn parse_fd_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The automatic `--max-connections`: three quarters of the descriptor limit
/// (a quarter stays for upstream connections, Redis, logs), at most [`AUTO_MAX`].
pub fn auto_max(fd_limit: Option<u64>) -> usize {
    let fds = fd_limit.unwrap_or(1024);
    usize::try_from(fds / 4 * 3).map_or(AUTO_MAX, |n| n.clamp(64, AUTO_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_connections_are_refused_and_counted_and_slots_come_back() {
        let c = Connections::new("proxy", 2);
        let a = c.admit().expect("first");
        let b = c.admit().expect("second");
        assert!(c.admit().is_none());
        assert!(c.admit().is_none());
        assert_eq!((c.open(), c.refused()), (2, 2));
        drop(a);
        let again = c.admit().expect("a freed slot is reused");
        assert_eq!(c.open(), 2);
        drop((b, again));
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn the_automatic_cap_follows_the_descriptor_limit() {
        assert_eq!(auto_max(Some(1024)), 768);
        assert_eq!(auto_max(Some(14_096)), 10_572);
        assert_eq!(auto_max(Some(1 << 20)), AUTO_MAX);
        assert_eq!(auto_max(Some(10)), 64);
        assert_eq!(auto_max(None), 768);
        assert!(fd_limit().is_some_and(|n| n > 0));
        let text = "Max cpu time              unlimited            unlimited            seconds\nMax open files            14096                14096                files\n";
        assert_eq!(parse_fd_limit(text), Some(14_096));
        assert_eq!(
            parse_fd_limit("Max open files  unlimited unlimited files"),
            None
        );
    }
}
