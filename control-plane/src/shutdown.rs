//! The shutdown signal shared by the server's tasks: a `watch` channel that turns `true` once.

use tokio::sync::watch;

/// Completes once `rx` has turned true (or its sender is gone).
pub(crate) async fn requested(rx: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`; drop it here, before any other await.
    let _ = rx.wait_for(|stop| *stop).await;
}
