//! The write timeout of an HTTP/2 connection whose client keeps its windows
//! shut.
//!
//! [`crate::io_timeout::WriteTimeout`] ends a connection whose socket takes no
//! byte for the write timeout. A live HTTP/2 client can hold answers without
//! ever filling the socket: it answers PINGs and SETTINGS but gives no
//! flow-control window back, so hyper has nothing it may write and never
//! polls the answers' bodies again, while each stream keeps an upstream
//! request (and its connection) in flight. hyper has no per-stream send
//! deadline, so the connection watches its answers itself:
//!
//! * an answer is *waiting* from the moment its head goes to hyper, and again
//!   each time its body hands hyper a frame, until hyper polls the body again
//!   (hyper polls a body only when the stream has window to send what it
//!   gives). An answer whose body is waiting on its upstream is not waiting.
//! * every poll of any answer's body is *progress*.
//!
//! When some answer is waiting and no body has been polled for the write
//! timeout, the connection has made no progress sending for that long, the
//! HTTP/2 form of a socket that takes no byte; it is closed, and every stream
//! on it with it (their upstream requests are dropped). A client that reads
//! slowly but reads (gives window back) makes progress and is not cut off,
//! like an HTTP/1.1 client that takes a byte within each write timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

/// When something last happened on a connection, cheap to note from any
/// task: milliseconds since the connection started, in one atomic. A watcher
/// compares two readings to tell whether anything happened in between.
#[derive(Debug)]
pub struct LastTouch {
    started: Instant,
    ms: AtomicU64,
}

impl Default for LastTouch {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            ms: AtomicU64::new(0),
        }
    }
}

impl LastTouch {
    /// Notes that something happened now.
    pub fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.ms.store(ms, Ordering::Relaxed);
    }

    /// The last touch, as a reading to compare with a later one.
    pub fn reading(&self) -> u64 {
        self.ms.load(Ordering::Relaxed)
    }

    /// `limit` after the touch that gave `reading`.
    pub fn after(&self, reading: u64, limit: Duration) -> Instant {
        self.started + Duration::from_millis(reading) + limit
    }
}

/// The send progress of one HTTP/2 connection's answers.
#[derive(Debug, Default)]
pub struct SendProgress {
    /// Answers hyper has not polled since their head or their last frame.
    waiting: AtomicUsize,
    /// The last progress.
    last: LastTouch,
}

impl SendProgress {
    /// A connection with no answer yet.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn touch(&self) {
        self.last.touch();
    }

    fn wait(&self) {
        self.touch();
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    fn unwait(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Watches `body`, an answer whose head goes to hyper now.
    pub fn watch<B: Body>(self: &Arc<Self>, body: B) -> Watched<B> {
        let waiting = !body.is_end_stream();
        if waiting {
            self.wait();
        }
        Watched {
            body,
            progress: self.clone(),
            waiting,
        }
    }

    /// Resolves once an answer has been waiting with no progress for `limit`.
    pub async fn stalled_for(&self, limit: Duration) {
        loop {
            let last = self.last.reading();
            tokio::time::sleep_until(self.last.after(last, limit)).await;
            if self.last.reading() != last {
                continue;
            }
            if self.waiting.load(Ordering::Relaxed) > 0 {
                return;
            }
            // Nothing to send. An answer that starts waiting is progress, so
            // looking again one limit later cannot miss a stall by more than that.
            tokio::time::sleep(limit).await;
        }
    }
}

/// An answer's body whose polls count as its connection's progress.
#[derive(Debug)]
pub struct Watched<B> {
    body: B,
    progress: Arc<SendProgress>,
    /// Counted in `progress.waiting`.
    waiting: bool,
}

impl<B: Body + Unpin> Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.waiting {
            this.waiting = false;
            this.progress.unwait();
        }
        this.progress.touch();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(Some(Ok(_)))) && !this.body.is_end_stream() {
            this.waiting = true;
            this.progress.wait();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        if self.waiting {
            self.progress.unwait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full, StreamBody};
    use std::convert::Infallible;

    const LIMIT: Duration = Duration::from_secs(30);

    /// Whether `stalled_for` resolves within `within` (of paused time).
    async fn stalls_within(progress: &SendProgress, within: Duration) -> bool {
        tokio::time::timeout(within, progress.stalled_for(LIMIT))
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_hyper_never_polls_stalls_after_the_limit() {
        let progress = SendProgress::new();
        let _answer = progress.watch(Full::new(Bytes::from_static(b"held")));
        assert!(!stalls_within(&progress, LIMIT - Duration::from_millis(1)).await);
        assert!(stalls_within(&progress, Duration::from_millis(2)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_to_send_never_stalls() {
        let progress = SendProgress::new();
        // An empty answer: hyper sends its head with END_STREAM and never polls it.
        let _empty = progress.watch(Full::new(Bytes::new()));
        assert!(!stalls_within(&progress, 10 * LIMIT).await);
        // A finished answer is no longer waiting.
        let mut done = progress.watch(Full::new(Bytes::from_static(b"x")));
        assert!(done.frame().await.is_some());
        drop(done);
        assert!(!stalls_within(&progress, 10 * LIMIT).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_on_its_upstream_is_not_a_stall() {
        let progress = SendProgress::new();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
        let mut answer = progress.watch(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        // hyper polls; the upstream has nothing yet.
        assert!(
            futures::FutureExt::now_or_never(answer.frame()).is_none(),
            "nothing sent yet"
        );
        assert!(!stalls_within(&progress, 10 * LIMIT).await);
        // A frame comes and hyper takes it: now the answer waits for hyper again.
        tx.send(Ok(Frame::data(Bytes::from_static(b"a"))))
            .await
            .unwrap();
        assert!(answer.frame().await.is_some());
        assert!(stalls_within(&progress, LIMIT + Duration::from_millis(1)).await);
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_on_any_answer_keeps_the_connection() {
        let progress = SendProgress::new();
        let _held = progress.watch(Full::new(Bytes::from_static(b"held")));
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
        let mut moving = progress.watch(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        for _ in 0..5 {
            tokio::time::advance(LIMIT / 2).await;
            tx.send(Ok(Frame::data(Bytes::from_static(b"a"))))
                .await
                .unwrap();
            assert!(moving.frame().await.is_some());
            assert!(!stalls_within(&progress, LIMIT / 2 - Duration::from_millis(1)).await);
        }
        // Once nothing moves, the held answer ends it.
        assert!(stalls_within(&progress, LIMIT).await);
    }
}
