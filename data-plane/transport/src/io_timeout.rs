//! A write deadline for the client connections hyper serves (HTTP/1.1 after
//! handover, h2c): a write the client's socket takes no byte of for the
//! write timeout fails with `TimedOut`, and hyper then closes the connection.
//! A client that stops reading its answers therefore cannot keep an upstream
//! connection, an in-flight count or a stream's buffers for ever.
//! [`crate::h1_server`] has the same deadline on the connections it serves
//! itself.
//!
//! The timer is armed only when a write finds the socket full, so a write the
//! kernel takes at once costs nothing.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `io` whose writes fail after `limit` without progress.
#[derive(Debug)]
pub struct WriteTimeout<I> {
    io: I,
    limit: Duration,
    timer: Pin<Box<Sleep>>,
    /// The timer runs for the write now waiting.
    armed: bool,
}

impl<I> WriteTimeout<I> {
    /// Wraps `io`.
    pub fn new(io: I, limit: Duration) -> Self {
        Self {
            io,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
            armed: false,
        }
    }

    /// A write found the socket full: the deadline runs from its first such
    /// attempt until one makes progress.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if !self.armed {
            self.armed = true;
            self.timer.as_mut().reset(Instant::now() + self.limit);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no byte within the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(&mut self, r: io::Result<T>) -> Poll<io::Result<T>> {
        self.armed = false;
        Poll::Ready(r)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteTimeout<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.as_mut().get_mut();
        match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.as_mut().get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.as_mut().get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.as_mut().get_mut();
        match Pin::new(&mut this.io).poll_shutdown(cx) {
            Poll::Ready(r) => this.progressed(r),
            Poll::Pending => this.stalled(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_never_reads_fails_the_write_after_the_limit() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut w = WriteTimeout::new(near, Duration::from_secs(30));
        let started = Instant::now();
        let err = w.write_all(&[0u8; 1024]).await.expect_err("nobody reads");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(30), "{waited:?}");
        assert!(waited < Duration::from_secs(31), "{waited:?}");
        // What the peer got before the stall is intact.
        let mut got = [0u8; 64];
        far.read_exact(&mut got).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_taking_bytes_is_not_cut_off() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut w = WriteTimeout::new(near, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            let mut total = 0;
            let mut chunk = [0u8; 64];
            while total < 4096 {
                // Slower than the whole write could go, faster than the limit per chunk.
                tokio::time::sleep(Duration::from_secs(20)).await;
                total += far.read(&mut chunk).await.unwrap();
            }
            total
        });
        w.write_all(&[7u8; 4096])
            .await
            .expect("progress every 20 s");
        assert_eq!(reader.await.unwrap(), 4096);
    }
}
