//! Request bodies on the connections [`crate::h1_server`] serves.
//!
//! The connection's task reads the body from the socket ([`Feeder`]) and
//! hands it, one piece at a time, to the request's body ([`PipedBody`]),
//! which the pipeline reads as it forwards it. Reading is driven by demand:
//! the socket is read only when the body's reader is waiting, so a body
//! nobody reads is never read (and a request whose body was never polled can
//! still be retried elsewhere), and `Expect: 100-continue` is answered with
//! `100 Continue` at the first demand, not before (RFC 9110 §10.1.1).
//!
//! Both ends are polled by the connection's one task (the pipeline runs
//! inside it), so the lock is never contended.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::io::poll_read_buf;

use crate::body::ClientBodyError;
use crate::framing::{Decoder, Step};

/// Room made in the read buffer before each body read.
const BODY_READ: usize = 16 * 1024;
/// The interim answer to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How a body's end went.
#[derive(Debug, Clone, Copy)]
enum End {
    Complete,
    Malformed(&'static str),
    Incomplete,
}

/// What both ends share.
#[derive(Debug, Default)]
struct Shared {
    /// Bytes read and not yet taken by the reader.
    piece: Option<Bytes>,
    end: Option<End>,
    /// The reader is waiting for bytes.
    wanted: bool,
    reader: Option<Waker>,
    feeder: Option<Waker>,
    reader_gone: bool,
    feeder_gone: bool,
}

fn store(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// The request's body: what the connection's [`Feeder`] reads for it.
#[derive(Debug)]
pub struct PipedBody {
    shared: Arc<Mutex<Shared>>,
    /// Bytes still to come, when the framing says (`Content-Length`).
    remaining: Option<u64>,
}

impl Body for PipedBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = self.get_mut();
        let mut shared = this.shared.lock();
        if let Some(piece) = shared.piece.take() {
            if let Some(n) = this.remaining.as_mut() {
                *n = n.saturating_sub(piece.len() as u64);
            }
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        match shared.end {
            Some(End::Complete) => return Poll::Ready(None),
            Some(End::Malformed(why)) => {
                return Poll::Ready(Some(Err(ClientBodyError::Malformed(why))));
            }
            Some(End::Incomplete) => return Poll::Ready(Some(Err(ClientBodyError::Incomplete))),
            None if shared.feeder_gone => {
                return Poll::Ready(Some(Err(ClientBodyError::Incomplete)));
            }
            None => {}
        }
        shared.wanted = true;
        store(&mut shared.reader, cx);
        if let Some(feeder) = shared.feeder.take() {
            feeder.wake();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        self.remaining
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

impl Drop for PipedBody {
    fn drop(&mut self) {
        let mut shared = self.shared.lock();
        shared.reader_gone = true;
        if let Some(feeder) = shared.feeder.take() {
            feeder.wake();
        }
    }
}

/// How feeding a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fed {
    /// The whole body was read and handed over.
    Complete,
    /// The reader is gone before the end: the rest is unread.
    Abandoned,
    /// The framing is malformed: the connection cannot be read on.
    Malformed,
    /// The client's connection ended (or failed) before the body did.
    ClientGone,
}

/// The connection's side of a request body: reads it from the socket as the
/// [`PipedBody`] asks for it.
#[derive(Debug)]
pub(crate) struct Feeder {
    decoder: Decoder,
    shared: Arc<Mutex<Shared>>,
    /// Bytes of `100 Continue` already written, while one is owed.
    continue_sent: Option<usize>,
}

impl Feeder {
    /// A body framed as `decoder` says; `expect_continue`: the client waits
    /// for `100 Continue` before sending it.
    pub(crate) fn new(decoder: Decoder, expect_continue: bool) -> (Self, PipedBody) {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let body = PipedBody {
            shared: shared.clone(),
            remaining: decoder.remaining(),
        };
        let feeder = Self {
            decoder,
            shared,
            continue_sent: expect_continue.then_some(0),
        };
        (feeder, body)
    }

    /// Ends the body for the reader.
    fn end(&self, end: End) {
        let mut shared = self.shared.lock();
        shared.end = Some(end);
        if let Some(reader) = shared.reader.take() {
            reader.wake();
        }
    }

    /// Whether the reader wants bytes now: `Ready(false)` once it is gone.
    fn poll_demand(&self, cx: &Context<'_>) -> Poll<bool> {
        let mut shared = self.shared.lock();
        if shared.reader_gone {
            return Poll::Ready(false);
        }
        if shared.wanted && shared.piece.is_none() {
            return Poll::Ready(true);
        }
        store(&mut shared.feeder, cx);
        Poll::Pending
    }

    fn hand(&self, piece: Bytes) {
        let mut shared = self.shared.lock();
        shared.piece = Some(piece);
        shared.wanted = false;
        if let Some(reader) = shared.reader.take() {
            reader.wake();
        }
    }

    /// Reads the body from `buf` and `io` as the reader asks for it, until it
    /// is complete, abandoned or broken.
    pub(crate) fn poll_feed<IO: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut IO,
        buf: &mut BytesMut,
    ) -> Poll<Fed> {
        loop {
            match self.poll_demand(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(false) => return Poll::Ready(Fed::Abandoned),
                Poll::Ready(true) => {}
            }
            if let Some(sent) = self.continue_sent {
                // Written, then flushed (a TLS stream may keep the record otherwise).
                let step = if sent < CONTINUE.len() {
                    Pin::new(&mut *io).poll_write(cx, &CONTINUE[sent..])
                } else {
                    Pin::new(&mut *io).poll_flush(cx).map_ok(|()| 1)
                };
                match step {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(n)) if n > 0 => {
                        self.continue_sent = if sent < CONTINUE.len() {
                            Some(sent + n)
                        } else {
                            None
                        };
                        continue;
                    }
                    Poll::Ready(_) => {
                        self.end(End::Incomplete);
                        return Poll::Ready(Fed::ClientGone);
                    }
                }
            }
            match self.decoder.step(buf) {
                Ok(Step::Data(piece)) => self.hand(piece),
                Ok(Step::Done) => {
                    self.end(End::Complete);
                    return Poll::Ready(Fed::Complete);
                }
                Ok(Step::More) => {
                    if buf.capacity() - buf.len() < BODY_READ / 4 {
                        buf.reserve(BODY_READ);
                    }
                    match poll_read_buf(Pin::new(&mut *io), cx, buf) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(n)) if n > 0 => {}
                        Poll::Ready(_) => {
                            self.end(End::Incomplete);
                            return Poll::Ready(Fed::ClientGone);
                        }
                    }
                }
                Err(why) => {
                    self.end(End::Malformed(why));
                    return Poll::Ready(Fed::Malformed);
                }
            }
        }
    }

    /// After the answer: reads the rest of an unread body from what is
    /// already buffered, discarding it. `true`: the body is complete and the
    /// connection can carry the next request.
    pub(crate) fn discard_buffered(&mut self, buf: &mut BytesMut) -> bool {
        loop {
            match self.decoder.step(buf) {
                Ok(Step::Data(_)) => {}
                Ok(Step::Done) => return true,
                Ok(Step::More) | Err(_) => return false,
            }
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        let mut shared = self.shared.lock();
        shared.feeder_gone = true;
        if let Some(reader) = shared.reader.take() {
            reader.wake();
        }
    }
}

/// Reads and drops what the client still sends, for a moment, after the
/// connection's last answer when part of a body was left unread: closing a
/// socket with unread bytes makes the kernel send a reset, which can destroy
/// the answer before the client has read it (RFC 9112 §9.6).
pub(crate) async fn linger<IO: AsyncRead + Unpin>(io: &mut IO, limit: std::time::Duration) {
    const MOST: usize = 1 << 20;
    let drain = async {
        // On the heap: an array here would sit in every connection's future
        // (serve awaits this), 4 KiB per idle connection.
        let mut sink = vec![0u8; 4096];
        let mut total = 0;
        while total < MOST {
            match tokio::io::AsyncReadExt::read(io, &mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(limit, drain).await;
}
