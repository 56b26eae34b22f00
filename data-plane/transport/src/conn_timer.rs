//! hyper's header read timer, one reusable tokio timer per connection.
//!
//! hyper's HTTP/1 server arms the header read timeout each time it starts
//! waiting for a request head and drops it once the head is in, so with a plain
//! `TokioTimer` every request registers a fresh timer in the runtime's wheel
//! and removes it again (two driver locks), and, whenever it is the earliest
//! timer, wakes the I/O driver through its eventfd: a `write` system call for
//! about a third of the requests (measured with `perf`, BENCHMARKS.md).
//!
//! [`ConnTimer`] keeps the connection's tokio `Sleep` when hyper drops it and
//! hands it out again for the next head. Re-arming a registered timer for a
//! later deadline only moves its expiry forward (tokio re-files it lazily when
//! the old slot comes up), so a keep-alive connection re-arms without a lock,
//! a wheel insertion or a wake-up. Behaviour is unchanged: the deadline is
//! exactly the one hyper asks for.

use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

type Spare = Mutex<Option<Pin<Box<tokio::time::Sleep>>>>;

/// A [`hyper::rt::Timer`] for ONE connection (make one per connection).
#[derive(Debug, Default)]
pub struct ConnTimer {
    spare: Arc<Spare>,
}

impl ConnTimer {
    /// A timer with no tokio timer yet (the first head creates it).
    pub fn new() -> Self {
        Self::default()
    }

    fn armed(&self, deadline: Instant) -> RecycledSleep {
        let deadline = tokio::time::Instant::from_std(deadline);
        let spare = self.spare.lock().take();
        RecycledSleep {
            inner: Some(crate::deadline::rearm(spare, deadline)),
            home: self.spare.clone(),
        }
    }
}

impl hyper::rt::Timer for ConnTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.armed(self.now() + duration))
    }

    /// tokio's clock (the same as `Instant::now()` unless a test paused it).
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.armed(deadline))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<RecycledSleep>() {
            Some(mut ours) => {
                if let Some(inner) = ours.inner.as_mut() {
                    inner
                        .as_mut()
                        .reset(tokio::time::Instant::from_std(new_deadline));
                }
            }
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// A tokio `Sleep` on loan from its connection's [`ConnTimer`]; given back on drop.
struct RecycledSleep {
    inner: Option<Pin<Box<tokio::time::Sleep>>>,
    home: Arc<Spare>,
}

impl Future for RecycledSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut().inner.as_mut() {
            Some(inner) => inner.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl hyper::rt::Sleep for RecycledSleep {}

impl Drop for RecycledSleep {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            *self.home.lock() = Some(inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer as _;

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_deadline_asked_for() {
        let timer = ConnTimer::new();
        timer.sleep(Duration::from_millis(300)).await;
        // Paused time advances exactly to the next timer.
        let first = tokio::time::Instant::now();
        let mut s = timer.sleep(Duration::from_millis(500));
        assert!(timer.spare.lock().is_none(), "the spare is on loan");
        s.as_mut().await;
        assert!(tokio::time::Instant::now() - first >= Duration::from_millis(500));
        drop(s);
        assert!(timer.spare.lock().is_some(), "given back when dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_timer_rearmed_later_or_earlier_keeps_the_new_deadline() {
        let timer = ConnTimer::new();
        // Armed for 10 s, dropped unfired: its tokio timer stays registered.
        drop(timer.sleep(Duration::from_secs(10)));
        let t0 = tokio::time::Instant::now();
        // Re-armed earlier than before: must not wait for the old 10 s.
        timer.sleep(Duration::from_millis(100)).await;
        assert_eq!(tokio::time::Instant::now() - t0, Duration::from_millis(100));
        // Re-armed later (the keep-alive case), through hyper's reset as well.
        let t1 = tokio::time::Instant::now();
        let mut s = timer.sleep(Duration::from_millis(100));
        timer.reset(&mut s, timer.now() + Duration::from_secs(20));
        s.as_mut().await;
        assert!(tokio::time::Instant::now() - t1 >= Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_sleep_does_not_fire_early() {
        let timer = ConnTimer::new();
        let s = timer.sleep(Duration::from_secs(5));
        let early = tokio::time::timeout(Duration::from_secs(4), s).await;
        assert!(early.is_err(), "fired before its deadline");
    }
}
