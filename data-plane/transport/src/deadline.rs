//! Attempt deadlines without a timer registration per attempt (issue 8).
//!
//! `tokio::time::timeout_at` makes a new `Sleep` for each attempt: its first
//! poll files it in the runtime's timer wheel and dropping it takes it out
//! again, each under the timer driver's lock, about 450 instructions per
//! proxied request (callgrind, BENCHMARKS.md). A proxy worker instead keeps
//! the `Sleep`s of finished attempts ([`within`]) and moves one forward for
//! the next attempt. While its old deadline has not passed and the new one is
//! no earlier, tokio only rewrites the expiry of the entry already filed (one
//! compare-and-swap), and re-files it once, when the old time comes. With the
//! same route timeout on every request, every new deadline is later.
//!
//! A worker keeps at most [`KEPT`] of them, none still holding the task of
//! the attempt that used it last (see `Kept`'s `Drop`). Other threads (the main runtime's,
//! tests') make one per attempt, as `timeout_at` does: their runtimes come and
//! go, a worker's lives as long as its thread.

use std::cell::RefCell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use tokio::time::{Instant, Sleep};

use crate::workers::{OFF_WORKER, Worker};

/// Most `Sleep`s a worker keeps for later attempts: more than the attempts a
/// worker has in flight at once under a load test.
pub const KEPT: usize = 128;

thread_local! {
    static KEPT_SLEEPS: RefCell<Vec<Pin<Box<Sleep>>>> = const { RefCell::new(Vec::new()) };
}

/// `fut`'s output, or `None` when `deadline` passes first; `fut` is polled
/// first, as by `tokio::time::timeout_at`. On a proxy worker (`worker` ≠
/// [`OFF_WORKER`]) the timer comes from and goes back to the thread's store.
pub async fn within<F: Future>(deadline: Instant, fut: F, worker: Worker) -> Option<F::Output> {
    within_kept(deadline, fut, worker != OFF_WORKER).await
}

/// [`within`], with the thread's store of `Sleep`s (`keep`) or without.
async fn within_kept<F: Future>(deadline: Instant, fut: F, keep: bool) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut timer = Kept::at(deadline, keep);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        timer.poll(cx).map(|()| None)
    })
    .await
}

/// A `Sleep` that goes back to the thread's store when dropped (`keep`).
struct Kept {
    /// Always there until dropped.
    sleep: Option<Pin<Box<Sleep>>>,
    keep: bool,
}

impl Kept {
    fn at(deadline: Instant, keep: bool) -> Self {
        let kept = keep
            .then(|| KEPT_SLEEPS.with(|k| k.borrow_mut().pop()))
            .flatten();
        Self {
            sleep: Some(rearm(kept, deadline)),
            keep,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Kept {
    /// Back to the store, unless it is full. Polled once with a waker that
    /// does nothing first, so that it no longer holds the finished attempt's
    /// task (and with it that task's memory) until it is used again.
    fn drop(&mut self) {
        let Some(mut sleep) = self.sleep.take().filter(|_| self.keep) else {
            return;
        };
        let _ = sleep.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        KEPT_SLEEPS.with(|k| {
            let mut k = k.borrow_mut();
            if k.len() < KEPT {
                k.push(sleep);
            }
        });
    }
}

/// `spare` moved to `deadline`, or a new `Sleep` when there is none. Moving a
/// filed `Sleep` to a later deadline only rewrites its expiry (see the module
/// notes); [`crate::conn_timer`] recycles hyper's header timers the same way.
pub(crate) fn rearm(spare: Option<Pin<Box<Sleep>>>, deadline: Instant) -> Pin<Box<Sleep>> {
    match spare {
        Some(mut sleep) => {
            sleep.as_mut().reset(deadline);
            sleep
        }
        None => Box::pin(tokio::time::sleep_until(deadline)),
    }
}

/// Drops the worker's kept `Sleep`s: called by a worker thread before its
/// runtime goes.
pub fn clear() {
    KEPT_SLEEPS.with(|k| k.borrow_mut().clear());
}

/// How many `Sleep`s this thread keeps (tests).
#[cfg(test)]
fn kept() -> usize {
    KEPT_SLEEPS.with(|k| k.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_future_wins_when_it_is_ready_first() {
        let out = within(
            Instant::now() + Duration::from_secs(1),
            async { 7 },
            OFF_WORKER,
        )
        .await;
        assert_eq!(out, Some(7));
        // Polled first: ready at once beats a deadline already passed.
        let out = within(Instant::now(), async { 8 }, OFF_WORKER).await;
        assert_eq!(out, Some(8));
    }

    /// Pending on its first poll, ready on the second: the timer gets polled (filed).
    async fn after_one_yield() -> u8 {
        tokio::task::yield_now().await;
        1
    }

    #[tokio::test(start_paused = true)]
    async fn kept_sleeps_still_time_out_at_each_new_deadline() {
        let start = Instant::now();
        let secs = Duration::from_secs;
        // Filed at +10 s, then kept.
        assert_eq!(
            within_kept(start + secs(10), after_one_yield(), true).await,
            Some(1)
        );
        assert_eq!(kept(), 1);
        // An earlier deadline than the one filed: filed again, fires on time.
        let out = within_kept(start + secs(1), std::future::pending::<()>(), true).await;
        assert_eq!(out, None);
        assert_eq!(start.elapsed(), secs(1));
        assert_eq!(kept(), 1);
        // Fired, then moved to a later deadline: fires then, not at once.
        let out = within_kept(start + secs(5), std::future::pending::<()>(), true).await;
        assert_eq!(out, None);
        assert_eq!(start.elapsed(), secs(5));
        // Filed again at +30 (it had fired), and kept.
        assert_eq!(
            within_kept(start + secs(30), after_one_yield(), true).await,
            Some(1)
        );
        // Moved later than the time filed (+30 to +40, the compare-and-swap
        // path): fires at +40, not at +30.
        let out = within_kept(start + secs(40), std::future::pending::<()>(), true).await;
        assert_eq!(out, None);
        assert_eq!(start.elapsed(), secs(40));
        // Without `keep` nothing is stored.
        clear();
        assert_eq!(
            within_kept(start + secs(50), after_one_yield(), false).await,
            Some(1)
        );
        assert_eq!(kept(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_thread_keeps_at_most_kept_sleeps() {
        let deadline = Instant::now() + Duration::from_secs(1);
        let many = (0..KEPT + 5).map(|_| within_kept(deadline, after_one_yield(), true));
        let outs = futures::future::join_all(many).await;
        assert!(outs.iter().all(|o| *o == Some(1)));
        assert_eq!(kept(), KEPT);
        clear();
        assert_eq!(kept(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_wins_when_it_passes_first() {
        let start = Instant::now();
        let out = within(
            start + Duration::from_millis(250),
            std::future::pending::<()>(),
            OFF_WORKER,
        )
        .await;
        assert_eq!(out, None);
        assert_eq!(start.elapsed(), Duration::from_millis(250));
    }
}
