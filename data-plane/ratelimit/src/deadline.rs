//! A decision deadline that tolerates the wake-up order after a CPU stall.

use std::time::Duration;

use futures::FutureExt;
use tokio::time::timeout;

/// Runs `future` for at most `deadline`, like [`tokio::time::timeout`], with
/// one difference: when the timer fires, the future is polled again after
/// each of up to two yields to the runtime.
///
/// On a busy host this task and the Redis connection's reader task are often
/// woken together after a CPU stall (timer and socket share one driver). If
/// this task runs first, the answer is already in the socket but not yet
/// parsed; a plain timeout would call that a miss and decide locally, which
/// over-admits. Yielding lets the reader deliver it, at no extra wall time.
pub(crate) async fn within_deadline<F: Future>(
    deadline: Duration,
    future: F,
) -> Result<F::Output, Elapsed> {
    let mut future = std::pin::pin!(future);
    if let Ok(output) = timeout(deadline, future.as_mut()).await {
        return Ok(output);
    }
    for _ in 0..2 {
        tokio::task::yield_now().await;
        if let Some(output) = future.as_mut().now_or_never() {
            return Ok(output);
        }
    }
    Err(Elapsed)
}

/// The decision deadline passed without an answer.
#[derive(Debug)]
pub(crate) struct Elapsed;
