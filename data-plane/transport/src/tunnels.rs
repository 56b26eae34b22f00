//! Connections that outlive their HTTP exchange (WebSocket tunnels), counted
//! per thread (a proxy worker) so that the worker's shutdown waits for them
//! within the same grace period as requests in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The tunnels open on one thread.
#[derive(Debug, Default)]
pub struct Tunnels {
    open: AtomicUsize,
    closed: Notify,
}

thread_local! {
    static TUNNELS: Arc<Tunnels> = Arc::default();
}

/// The tunnel registry of the calling thread.
pub fn tunnels() -> Arc<Tunnels> {
    TUNNELS.with(Arc::clone)
}

impl Tunnels {
    /// Tunnels open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Resolves once no tunnel is open.
    pub async fn drained(&self) {
        loop {
            let notified = self.closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One open tunnel, counted on the calling thread's registry until dropped.
#[derive(Debug)]
pub struct Tunnel(Arc<Tunnels>);

impl Tunnel {
    /// Counts a tunnel opened on this thread.
    pub fn open() -> Self {
        let registry = tunnels();
        registry.open.fetch_add(1, Ordering::Relaxed);
        Self(registry)
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.closed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_registry_drains_when_the_last_tunnel_closes() {
        let registry = tunnels();
        registry.drained().await;
        let tunnel = Tunnel::open();
        assert_eq!(registry.open(), 1);
        let waiter = {
            let registry = registry.clone();
            tokio::spawn(async move { registry.drained().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(tunnel);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("drained")
            .unwrap();
        assert_eq!(registry.open(), 0);
    }
}
