//! Body types of the proxy: the client's request body on its way upstream (with
//! the size limit and a "was it touched" flag for retries), and the response
//! body sent back (an upstream stream, or a small static problem document).
//!
//! Both stream frame by frame; nothing here ever collects a whole body.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::h1::H1Body;
use crate::h1_server::PipedBody;
use crate::h2_client::H2Stream;
use crate::in_flight::InFlight;
use crate::pool::Checkin;
use crate::tee::Tee;
use crate::upstream_error::{Failure, UpstreamError};

/// Why the client's request body could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    /// The body grew beyond `--max-body-bytes` (seen while streaming; a declared
    /// `Content-Length` over the limit is refused before any forwarding).
    #[error("request body exceeds {limit} bytes")]
    TooLarge {
        /// The configured limit.
        limit: u64,
    },
    /// Reading from the client failed (it went away or sent a malformed body).
    #[error("reading the request body from the client failed")]
    Client(#[source] ClientBodyError),
    /// The client sent no byte of its body for this long (`--body-read-timeout-ms`).
    #[error("the request body stalled for {0:?}")]
    Stalled(Duration),
}

impl RequestBodyError {
    /// The same error, taken from behind a reference (hyper keeps the one
    /// an HTTP/2 upstream exchange failed with): a failed read of the
    /// client's connection keeps its kind, not its cause.
    pub(crate) fn copied(&self) -> Self {
        match self {
            Self::TooLarge { limit } => Self::TooLarge { limit: *limit },
            Self::Stalled(d) => Self::Stalled(*d),
            Self::Client(ClientBodyError::Malformed(why)) => {
                Self::Client(ClientBodyError::Malformed(why))
            }
            Self::Client(_) => Self::Client(ClientBodyError::Incomplete),
        }
    }
}

/// Why reading the client's request body failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientBodyError {
    /// hyper's reading failed (HTTP/2, or a connection left to hyper).
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    /// The body's framing is malformed (a bad chunk-size line, a chunk not
    /// followed by CRLF, a trailer section too large).
    #[error("malformed request body: {0}")]
    Malformed(&'static str),
    /// The client's connection ended before its body did.
    #[error("the client's connection ended before its request body did")]
    Incomplete,
}

/// The client's request body as a listener hands it to the pipeline: none,
/// the whole of it (read with the head by [`crate::h1_server`]), streamed from
/// an HTTP/1.1 connection [`crate::h1_server`] serves, or hyper's (HTTP/2,
/// and requests [`crate::h1_server`] leaves to hyper).
#[derive(Debug, Default)]
pub struct ClientBody(Source);

#[derive(Debug, Default)]
enum Source {
    #[default]
    Empty,
    Full(Bytes),
    Piped(PipedBody),
    Hyper(Incoming),
}

impl ClientBody {
    /// No body.
    pub fn empty() -> Self {
        Self(Source::Empty)
    }

    /// A body already read whole (empty bytes make an empty body).
    pub fn full(bytes: Bytes) -> Self {
        Self(if bytes.is_empty() {
            Source::Empty
        } else {
            Source::Full(bytes)
        })
    }

    /// A body streamed from an HTTP/1.1 connection as it is read.
    pub(crate) fn piped(body: PipedBody) -> Self {
        Self(Source::Piped(body))
    }

    /// hyper's body of the request.
    pub fn hyper(body: Incoming) -> Self {
        Self(Source::Hyper(body))
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = self.get_mut();
        match &mut this.0 {
            Source::Empty => Poll::Ready(None),
            Source::Full(_) => {
                let Source::Full(data) = std::mem::take(&mut this.0) else {
                    return Poll::Ready(None);
                };
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Source::Piped(body) => Pin::new(body).poll_frame(cx),
            Source::Hyper(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(ClientBodyError::Hyper),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Source::Empty => true,
            Source::Full(_) => false,
            Source::Piped(body) => body.is_end_stream(),
            Source::Hyper(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Source::Empty => SizeHint::with_exact(0),
            Source::Full(data) => SizeHint::with_exact(data.len() as u64),
            Source::Piped(body) => body.size_hint(),
            Source::Hyper(body) => body.size_hint(),
        }
    }
}

/// The client's request body, forwarded as it arrives.
#[derive(Debug)]
pub struct RequestBody {
    /// The client's body (empty for a replayed bodiless request or a buffered one).
    inner: ClientBody,
    /// A body buffered so that it can be sent again (retrying routes), sent as one frame.
    buffered: Option<Bytes>,
    limit: u64,
    seen: u64,
    polled: bool,
    /// Longest wait for the client's next frame.
    read_timeout: Duration,
    /// The wait's timer, made the first time the client keeps the body waiting
    /// (most bodies arrive with their head and never need one).
    stall: Option<Pin<Box<Sleep>>>,
    /// The timer runs for the wait now under way.
    waiting: bool,
    /// A copy of the body taken as it streams (a mirrored request); `None` for others.
    tee: Option<Box<Tee>>,
}

impl RequestBody {
    /// Wraps the client's body with a size limit in bytes and the longest
    /// wait for its next bytes.
    pub fn new(inner: ClientBody, limit: u64, read_timeout: Duration) -> Self {
        Self {
            inner,
            buffered: None,
            limit,
            seen: 0,
            polled: false,
            read_timeout,
            stall: None,
            waiting: false,
            tee: None,
        }
    }

    /// An empty body, for replaying a request that had none.
    pub fn empty() -> Self {
        Self {
            inner: ClientBody::empty(),
            buffered: None,
            limit: 0,
            seen: 0,
            polled: false,
            read_timeout: Duration::MAX,
            stall: None,
            waiting: false,
            tee: None,
        }
    }

    /// The client kept the body waiting: starts (or polls) the stall timer.
    fn stalled(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let limit = self.read_timeout;
        if !self.waiting {
            let Some(deadline) = Instant::now().checked_add(limit) else {
                return Poll::Pending;
            };
            self.waiting = true;
            match &mut self.stall {
                Some(stall) => stall.as_mut().reset(deadline),
                None => self.stall = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let Some(stall) = self.stall.as_mut() else {
            return Poll::Pending;
        };
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(RequestBodyError::Stalled(limit)))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// A complete body already read from the client (a retrying route keeps
    /// it to send it again). Empty bytes make an empty body.
    pub fn buffered(bytes: Bytes) -> Self {
        Self {
            buffered: (!bytes.is_empty()).then_some(bytes),
            ..Self::empty()
        }
    }

    /// The same body, copied into `tee` as it is read (every data frame, then
    /// the end), without holding the reader back.
    pub fn with_tee(mut self, tee: Tee) -> Self {
        self.tee = Some(Box::new(tee));
        self
    }

    /// Feeds the tee, if any, what was just read.
    #[cold]
    fn feed_tee(&mut self, frame: Option<&Frame<Bytes>>) {
        let Some(tee) = self.tee.as_mut() else {
            return;
        };
        if let Some(data) = frame.and_then(Frame::data_ref)
            && !tee.data(data)
        {
            self.tee = None;
            return;
        }
        if (frame.is_none() || self.inner.is_end_stream())
            && let Some(tee) = self.tee.take()
        {
            tee.end();
        }
    }

    /// True once anything has tried to read the body. A request whose body was
    /// never polled can be sent again elsewhere without losing data.
    pub fn was_polled(&self) -> bool {
        self.polled
    }

    /// Whole body read now (a retrying route keeps it to send it again),
    /// within the same limits as when it streams.
    pub async fn read_all(self) -> Result<Bytes, RequestBodyError> {
        use http_body_util::BodyExt as _;
        Ok(self.collect().await?.to_bytes())
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let this = self.get_mut();
        this.polled = true;
        if let Some(data) = this.buffered.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if polled.is_ready() {
            this.waiting = false;
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if this.seen > this.limit {
                        return Poll::Ready(Some(Err(RequestBodyError::TooLarge {
                            limit: this.limit,
                        })));
                    }
                }
                if this.tee.is_some() {
                    this.feed_tee(Some(&frame));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(RequestBodyError::Client(e)))),
            Poll::Ready(None) => {
                if this.tee.is_some() {
                    this.feed_tee(None);
                }
                Poll::Ready(None)
            }
            Poll::Pending => this.stalled(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.buffered.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.buffered {
            Some(b) => SizeHint::with_exact(b.len() as u64),
            None => self.inner.size_hint(),
        }
    }
}

/// A response body streamed from an upstream instance. When it ends, its
/// connection goes back to the instance's pool; when it is dropped early the
/// connection is closed instead (HTTP/1.1 cannot abandon half a response).
/// An HTTP/2 instance's body (data, then trailers) holds its stream on a
/// shared connection until it ends or is dropped (the stream is reset).
#[derive(Debug)]
pub struct UpstreamBody {
    /// The response's stream; `None` once it ended (an HTTP/1.1 connection
    /// went back to its pool, an HTTP/2 stream was released).
    inner: Option<Stream>,
    checkin: Option<Checkin>,
    _in_flight: InFlight,
}

/// Where an upstream response body is read from.
#[derive(Debug)]
enum Stream {
    /// An HTTP/1.1 connection ([`crate::h1`]).
    H1(H1Body),
    /// A stream of an HTTP/2 connection ([`crate::h2_client`]), held until the body ends.
    H2 {
        body: Incoming,
        /// Released (dropped) with the body.
        _stream: H2Stream,
    },
}

impl UpstreamBody {
    /// Wraps an upstream response body. `checkin` returns the connection to its
    /// pool at the end of the body; `in_flight` counts the request until then.
    pub fn new(inner: H1Body, checkin: Checkin, in_flight: InFlight) -> Self {
        Self::started(Stream::H1(inner), Some(checkin), in_flight)
    }

    /// Wraps the body of an HTTP/2 instance's response, read on `stream`,
    /// which is released when the body ends; `in_flight` counts the request until then.
    pub fn h2(inner: Incoming, stream: H2Stream, in_flight: InFlight) -> Self {
        Self::started(
            Stream::H2 {
                body: inner,
                _stream: stream,
            },
            None,
            in_flight,
        )
    }

    fn started(inner: Stream, checkin: Option<Checkin>, in_flight: InFlight) -> Self {
        let mut body = Self {
            inner: Some(inner),
            checkin,
            _in_flight: in_flight,
        };
        // Bodiless responses (HEAD, 204, 304) may never be polled: return now.
        if body.is_end_stream() {
            body.finish();
        }
        body
    }

    /// Wraps the body of a response whose connection is never pooled (the
    /// non-101 answer to an upgrade request): the connection closes with it.
    pub fn unpooled(inner: H1Body, in_flight: InFlight) -> Self {
        Self {
            inner: Some(Stream::H1(inner)),
            checkin: None,
            _in_flight: in_flight,
        }
    }

    /// The body is complete: its HTTP/1.1 connection goes back to the pool,
    /// if it can; an HTTP/2 stream is released.
    fn finish(&mut self) {
        match self.inner.take() {
            Some(Stream::H1(body)) => {
                if let Some(c) = self.checkin.take()
                    && let Some(conn) = body.take_conn()
                {
                    c.checkin(conn);
                }
            }
            Some(Stream::H2 { .. }) | None => {}
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = self.get_mut();
        let polled = match &mut this.inner {
            Some(Stream::H1(b)) => Pin::new(b).poll_frame(cx),
            Some(Stream::H2 { body, .. }) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|e| UpstreamError::sent(Failure::Http2(e))),
            None => Poll::Ready(None),
        };
        match &polled {
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Ok(_))) if this.is_end_stream() => this.finish(),
            Poll::Ready(Some(Err(_))) => this.checkin = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(Stream::H1(b)) => b.is_end_stream(),
            Some(Stream::H2 { body, .. }) => body.is_end_stream(),
            None => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(Stream::H1(b)) => b.size_hint(),
            Some(Stream::H2 { body, .. }) => body.size_hint(),
            None => SizeHint::with_exact(0),
        }
    }
}

/// Every response body the proxy listener sends.
#[derive(Debug)]
pub enum ResponseBody {
    /// Streamed from an upstream instance.
    Upstream(UpstreamBody),
    /// A complete small body produced by the gateway (problem documents, ops
    /// output), or shared by request coalescing.
    Full(Option<Bytes>),
    /// An upstream body whose first bytes were already read (request coalescing
    /// buffers a response to share it and gives up past its size limit): those
    /// bytes first, then the rest as it streams.
    Resumed(Option<Bytes>, Box<ResponseBody>),
}

impl ResponseBody {
    /// A complete body from static or already-built bytes.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full(Some(bytes.into()))
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::Full(None)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        match self.get_mut() {
            Self::Upstream(b) => Pin::new(b).poll_frame(cx),
            Self::Full(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
            Self::Resumed(read, rest) => match read.take() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => Pin::new(&mut **rest).poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Upstream(b) => b.is_end_stream(),
            Self::Full(b) => b.is_none(),
            Self::Resumed(read, rest) => read.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Upstream(b) => b.size_hint(),
            Self::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |d| d.len() as u64)),
            Self::Resumed(read, rest) => {
                let read = read.as_ref().map_or(0, |d| d.len() as u64);
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + read);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + read);
                }
                hint
            }
        }
    }
}
