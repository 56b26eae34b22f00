//! The client side of an HTTP/1.1 connection, for the requests that make up
//! nearly all proxy traffic: HTTP/1.1 requests, with or without a body
//! (issues 8 and 25).
//!
//! hyper's server runs every request through a generic dispatcher: a read
//! buffer it reallocates while the request is in flight, its own head types
//! turned into `http` ones, an encoder, a write queue. On the plain route that
//! was an eighth of the data plane's user-space instructions and of its
//! instruction-cache misses (callgrind, BENCHMARKS.md). Here the connection's
//! task parses the head, calls the pipeline and writes the answer itself:
//! head and the body's first bytes in one write, one read buffer reused from
//! request to request.
//!
//! Request bodies framed by `Content-Length` or `Transfer-Encoding: chunked`
//! are read here too ([`request_body`]): a body that came with its head is
//! handed over whole, a longer one streams to the pipeline as the pipeline
//! reads it, `Expect: 100-continue` is answered when it first does. A body
//! left unread when the answer is ready (a 401 to a POST, an early upstream
//! answer) is read on from what is buffered; when more of it is still to come
//! the answer closes the connection, which lingers briefly so the client
//! reads the answer before the close.
//!
//! A head that does not parse, is too large, or is ambiguous is refused here
//! ([`Refusal`]: 400, 431; a partial head that stalls, 408) with the answer
//! the application writes, and the connection closed.
//!
//! Everything else goes to hyper, with the bytes read so far put back in
//! front of the socket ([`Rewind`]), for one request: upgrades, `CONNECT`,
//! HTTP/1.0, other transfer codings or expectations. hyper serves that one
//! request and closes the connection (`server.rs`), so every later request
//! on a connection is framed here, where an ambiguous head is refused.
//!
//! What it keeps of hyper's behaviour:
//! * the header read timeout runs from the moment a head is awaited (idle
//!   keep-alive time included); a client that has sent part of a head then
//!   gets a 408 ([`Refusal::HeadTimeout`]), an idle one is just closed;
//! * a client that closes its connection while its request is in flight
//!   cancels the request (no half-close), unless it has pipelined bytes
//!   meanwhile, which are kept for the next request;
//! * response framing: none for HEAD, 1xx, 204 and 304 (a HEAD answer keeps
//!   its `Content-Length`); `Content-Length` when the body's length is
//!   known; otherwise `Transfer-Encoding: chunked` (trailers dropped); a
//!   `Date` when the response has none; `Connection: close` when the client
//!   asked for it, and the connection closes after such an answer or one
//!   that says so itself; an upstream's header fields kept as bytes
//!   ([`crate::response_head`]) are written as they came, before the
//!   response map's fields, which replace any of the same name;
//! * graceful shutdown: an idle connection closes at once, a request in
//!   flight is answered first.

use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, Request, StatusCode, Uri, Version};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::io::poll_read_buf;

use crate::body::{ClientBody, ResponseBody};
use crate::framing::{Decoder, content_length};
use crate::h1::{FieldSpans, chunk_line, has_token, list_has_token, name_is};
use crate::response::{Fields, Response};
use crate::response_head::RawFields;
use crate::rewind::Rewind;

mod request_body;

pub use request_body::PipedBody;
use request_body::{Fed, Feeder, linger};

/// Most header fields a request head read here may have (hyper's default;
/// more goes to hyper, which refuses it).
const MAX_HEADERS: usize = 100;
/// Room in a request's header map for the fields the pipeline adds on its way
/// (`X-Request-Id`, `X-Forwarded-For`, `X-Forwarded-Proto`, `traceparent`, and
/// one more), so that they go in without the map growing.
const ADDED_FIELDS: usize = 5;
/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 4096;
/// Largest body frame copied into the head's write; larger ones are written on their own.
const COALESCE_BYTES: usize = 16 * 1024;

/// How serving a connection here ended.
pub enum Ended<IO> {
    /// The connection is finished (closed, or to be dropped).
    Closed,
    /// The rest of the connection is for hyper: the socket with the bytes
    /// already read from it in front.
    Handover(Rewind<IO>),
}

/// What the head at the front of the buffer is.
pub(crate) enum Parsed {
    /// Not complete yet.
    Partial,
    /// A request served here; the head is consumed from the buffer. Boxed
    /// where it is made: the handler and the pipeline pass the pointer on,
    /// where the ~250-byte request was copied at every step (BENCHMARKS.md,
    /// twelfth session).
    Request(Box<Request<ClientBody>>, Exchange),
    /// Something for hyper (the buffer is untouched).
    Hyper,
    /// A head refused here (the buffer is untouched): answered and the
    /// connection closed. Ambiguous framing (issue 25) is refused before
    /// anything could pick one reading of it.
    Refused(Refusal),
}

/// A request head refused before any handler sees it. The application's
/// `refusal` function writes the answer; the connection closes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A malformed head, or one whose framing is ambiguous (400).
    BadRequest(&'static str),
    /// A head larger than the server reads, this many bytes (431).
    HeadTooLarge(usize),
    /// Part of a head, and then nothing for the header read timeout (408).
    HeadTimeout(Duration),
}

/// What the connection needs to know about a request to answer it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exchange {
    pub(crate) head: bool,
    pub(crate) close: bool,
    /// The request's body framing (`None`: no body).
    pub(crate) body: Option<Decoder>,
    /// `Expect: 100-continue`.
    pub(crate) expect_continue: bool,
}

/// What the socket did while a request was in flight.
enum Socket {
    /// The body's feeder finished.
    Fed(Fed),
    /// A read while the request's body is complete: 0 is the client's close.
    Read(io::Result<usize>),
}

/// Where the request in flight's body is.
enum BodyState {
    /// No body, or all of it read.
    Read,
    /// Streaming to the request as it reads it.
    Feeding(Feeder),
    /// Its reader is gone before its end.
    Abandoned(Feeder),
    /// Its framing broke: the connection cannot carry another request.
    Broken,
}

/// Serves HTTP/1.1 requests on `io` with `handler` until the connection
/// ends or needs hyper; `read` holds bytes already read from `io`. A head
/// with ambiguous framing is answered `refusal(why)` and the connection
/// closed. `stop` fires on shutdown.
#[allow(clippy::too_many_arguments)]
pub async fn serve<IO, H, Fut>(
    mut io: IO,
    read: BytesMut,
    peer: SocketAddr,
    header_read_timeout: Duration,
    write_timeout: Duration,
    max_head_bytes: usize,
    refusal: fn(Refusal) -> Response<ResponseBody>,
    handler: &H,
    stop: &watch::Receiver<()>,
) -> Ended<IO>
where
    IO: ClientStream,
    H: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut,
    Fut: Future<Output = Response<ResponseBody>>,
{
    let mut buf = read;
    let mut out: Vec<u8> = Vec::new();
    // One timer for the connection's life, moved forward for each head.
    let mut timer = pin!(tokio::time::sleep(header_read_timeout));
    // One shutdown waiter for the connection's life too: a `changed()` made for
    // every head joined (and on being dropped left) the watch's waiter list under
    // its lock, twice per request.
    let mut watcher = stop.clone();
    let mut stopping = pin!(watcher.changed());
    loop {
        // Shutdown between requests: nothing is in flight, close now.
        if !matches!(stop.has_changed(), Ok(false)) {
            return Ended::Closed;
        }
        timer.as_mut().reset(Instant::now() + header_read_timeout);
        let (mut req, mut exchange) = loop {
            match parse(&mut buf, max_head_bytes) {
                Parsed::Request(req, exchange) => break (req, exchange),
                Parsed::Hyper => return Ended::Handover(Rewind::new(buf.freeze(), io)),
                Parsed::Refused(why) => {
                    let answer = refusal(why);
                    let mut client = Writer::new(&mut io, timer.as_mut(), write_timeout);
                    let _ = respond(&mut client, &mut out, answer, REFUSED).await;
                    let _ = io.shutdown().await;
                    // Bytes may follow the refused head: close without a reset.
                    linger(&mut io, header_read_timeout.min(LINGER)).await;
                    return Ended::Closed;
                }
                Parsed::Partial => {}
            }
            if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                buf.reserve(READ_CHUNK);
            }
            tokio::select! {
                biased;
                read = std::future::poll_fn(|cx| poll_read_buf(Pin::new(&mut io), cx, &mut buf)) => match read {
                    Ok(0) | Err(_) => return Ended::Closed,
                    Ok(_) => {}
                },
                () = timer.as_mut() => {
                    if !buf.is_empty() {
                        let answer = refusal(Refusal::HeadTimeout(header_read_timeout));
                        let mut client = Writer::new(&mut io, timer.as_mut(), write_timeout);
                        let _ = respond(&mut client, &mut out, answer, REFUSED).await;
                        let _ = io.shutdown().await;
                    }
                    return Ended::Closed;
                }
                // Shutdown while waiting: no request is in flight (a partial head is dropped).
                _ = stopping.as_mut() => return Ended::Closed,
            }
        };
        let mut body = match exchange.body {
            None => BodyState::Read,
            // The whole body came with the head: handed over as it is.
            Some(Decoder::Length(n)) if n <= buf.len() as u64 => {
                *req.body_mut() = ClientBody::full(buf.split_to(n as usize).freeze());
                BodyState::Read
            }
            Some(decoder) => {
                let (feeder, piped) = Feeder::new(decoder, exchange.expect_continue);
                *req.body_mut() = ClientBody::piped(piped);
                BodyState::Feeding(feeder)
            }
        };
        let busy = crate::workers::Busy::enter();
        let mut answer = pin!(handler(req, peer));
        // While the request is in flight, its body is read as the pipeline
        // asks for it; after that, the client closing its side cancels it.
        // As in hyper, the socket is only watched while nothing is buffered:
        // bytes the client pipelines are kept for the next request, and once
        // some are there, reading waits for that request.
        let resp = loop {
            let socket = std::future::poll_fn(|cx| match &mut body {
                BodyState::Feeding(feeder) => {
                    feeder.poll_feed(cx, &mut io, &mut buf).map(Socket::Fed)
                }
                BodyState::Read if buf.is_empty() => {
                    poll_read_buf(Pin::new(&mut io), cx, &mut buf).map(Socket::Read)
                }
                _ => Poll::Pending,
            });
            tokio::select! {
                biased;
                resp = answer.as_mut() => break resp,
                event = socket => match event {
                    Socket::Read(Ok(0) | Err(_)) | Socket::Fed(Fed::ClientGone) => return Ended::Closed,
                    Socket::Read(Ok(_)) => {}
                    Socket::Fed(fed) => {
                        body = match (fed, std::mem::replace(&mut body, BodyState::Read)) {
                            (Fed::Complete, _) => BodyState::Read,
                            (Fed::Abandoned, BodyState::Feeding(feeder)) => BodyState::Abandoned(feeder),
                            _ => BodyState::Broken,
                        };
                    }
                },
            }
        };
        drop(busy);
        // A body not read to its end: what is buffered may finish it;
        // otherwise the connection closes after the answer.
        let unread = match body {
            BodyState::Read => false,
            BodyState::Feeding(mut feeder) | BodyState::Abandoned(mut feeder) => {
                !feeder.discard_buffered(&mut buf)
            }
            BodyState::Broken => true,
        };
        exchange.close |= unread;
        let mut client = Writer::new(&mut io, timer.as_mut(), write_timeout);
        match respond(&mut client, &mut out, resp, exchange).await {
            Ok(true) => {}
            Ok(false) => {
                // A FIN after the answer, not a reset that could discard it.
                let _ = io.shutdown().await;
                if unread {
                    linger(&mut io, header_read_timeout.min(LINGER)).await;
                }
                return Ended::Closed;
            }
            Err(_) => return Ended::Closed,
        }
    }
}

/// Longest wait for a client to stop sending the rest of an unread body
/// after the connection's last answer.
const LINGER: Duration = Duration::from_secs(2);

/// How a refused head's answer is written: a whole answer, then the close.
const REFUSED: Exchange = Exchange {
    head: false,
    close: true,
    body: None,
    expect_continue: false,
};

/// Parses the request head at the front of `buf`.
pub(crate) fn parse(buf: &mut BytesMut, max_head_bytes: usize) -> Parsed {
    if buf.is_empty() {
        return Parsed::Partial;
    }
    let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) if len <= max_head_bytes => len,
        Ok(httparse::Status::Partial) if buf.len() <= max_head_bytes => return Parsed::Partial,
        Ok(_) | Err(httparse::Error::TooManyHeaders) => {
            return Parsed::Refused(Refusal::HeadTooLarge(max_head_bytes));
        }
        Err(_) => return Parsed::Refused(Refusal::BadRequest("a malformed request head")),
    };
    let Ok(method) = Method::from_bytes(req.method.unwrap_or_default().as_bytes()) else {
        return Parsed::Refused(Refusal::BadRequest("a malformed request head"));
    };
    if method == Method::CONNECT {
        return Parsed::Hyper;
    }
    // Framing is read from every field before anything is decided: a head
    // with both `Content-Length` and `Transfer-Encoding`, a `Content-Length`
    // list or repeated field, or more than one `Host` is refused (400), as
    // nginx and Envoy do, whoever would serve the rest of it.
    let mut close = false;
    let mut lengths = 0u32;
    let mut length = 0u64;
    let mut hosts = 0u32;
    let mut codings = 0u32;
    let mut chunked = false;
    let mut expect_continue = false;
    let mut for_hyper = false;
    for f in req.headers.iter() {
        let name = f.name.as_bytes();
        if name_is(name, b"content-length") {
            lengths += 1;
            if f.value.contains(&b',') {
                return Parsed::Refused(Refusal::BadRequest("a Content-Length list"));
            }
            match content_length(f.value.trim_ascii()) {
                Some(n) => length = n,
                None => return Parsed::Refused(Refusal::BadRequest("an invalid Content-Length")),
            }
        } else if name_is(name, b"transfer-encoding") {
            codings += 1;
            // Plain chunked is read here; any other coding is hyper's.
            chunked = f.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if name_is(name, b"host") {
            hosts += 1;
        } else if name_is(name, b"expect") {
            if f.value.trim_ascii().eq_ignore_ascii_case(b"100-continue") {
                expect_continue = true;
            } else {
                for_hyper = true;
            }
        } else if name_is(name, b"upgrade") {
            for_hyper = true;
        } else if name_is(name, b"connection") {
            close |= list_has_token(f.value, "close");
        }
    }
    if lengths > 0 && codings > 0 {
        return Parsed::Refused(Refusal::BadRequest(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    if lengths > 1 {
        return Parsed::Refused(Refusal::BadRequest("more than one Content-Length"));
    }
    if hosts > 1 {
        return Parsed::Refused(Refusal::BadRequest("more than one Host"));
    }
    // HTTP/1.0 is hyper's, once its framing was found unambiguous.
    if req.version != Some(1) || for_hyper || (codings > 0 && !(codings == 1 && chunked)) {
        return Parsed::Hyper;
    }
    let body = if chunked {
        Some(Decoder::chunked())
    } else {
        (length > 0).then(|| Decoder::length(length))
    };
    let path = req.path.unwrap_or_default();
    let base = buf.as_ptr() as usize;
    let path_at = path.as_ptr() as usize - base;
    let path_len = path.len();
    let spans = FieldSpans::new(buf, req.headers);
    let head = buf.split_to(len).freeze();
    let Ok(uri) = Uri::from_maybe_shared(head.slice(path_at..path_at + path_len)) else {
        return refuse(buf, head, "an invalid request target");
    };
    let Ok(headers) = spans.header_map(&head, ADDED_FIELDS) else {
        return refuse(buf, head, "an invalid header field");
    };
    let exchange = Exchange {
        head: method == Method::HEAD,
        close,
        body,
        expect_continue: expect_continue && body.is_some(),
    };
    let mut r = Box::new(Request::new(ClientBody::empty()));
    *r.method_mut() = method;
    *r.uri_mut() = uri;
    *r.version_mut() = Version::HTTP_11;
    *r.headers_mut() = headers;
    Parsed::Request(r, exchange)
}

/// Refuses a head already consumed, putting it back in front of the buffer
/// (a refusal leaves the buffer as it found it).
fn refuse(buf: &mut BytesMut, head: Bytes, why: &'static str) -> Parsed {
    let mut whole = BytesMut::with_capacity(head.len() + buf.len());
    whole.extend_from_slice(&head);
    whole.extend_from_slice(buf);
    *buf = whole;
    Parsed::Refused(Refusal::BadRequest(why))
}

/// How the response body is framed on the wire.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// No body is sent.
    None,
    /// Exactly this many bytes.
    Length(u64),
    Chunked,
}

/// Writes `resp`. `Ok(true)`: the connection can carry another request.
async fn respond<IO: ClientStream>(
    io: &mut Writer<'_, IO>,
    out: &mut Vec<u8>,
    resp: Response<ResponseBody>,
    exchange: Exchange,
) -> io::Result<bool> {
    let (status, fields, body) = resp.into_parts();
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if exchange.head || bodiless {
        Framing::None
    } else {
        match body.size_hint().exact() {
            Some(n) => Framing::Length(n),
            None => Framing::Chunked,
        }
    };
    let close = encode_head(out, status, &fields, framing, exchange);
    drop(fields);
    let mut body = pin!(body);
    if matches!(framing, Framing::None) {
        io.write_all(out).await?;
        return Ok(!close);
    }
    let mut sent: u64 = 0;
    // The body's first frame, when it is already there, goes out with the head.
    let mut first = std::future::poll_fn(|cx| Poll::Ready(poll_data(body.as_mut(), cx))).await;
    if let Poll::Ready(Ok(Some(data))) = &first
        && data.len() <= COALESCE_BYTES
        && !matches!(framing, Framing::Length(n) if data.len() as u64 > n)
    {
        sent += data.len() as u64;
        frame_into(out, data, framing);
        first = Poll::Pending;
    }
    io.write_all(out).await?;
    let mut next = match first {
        Poll::Ready(r) => r,
        Poll::Pending => std::future::poll_fn(|cx| poll_data(body.as_mut(), cx)).await,
    };
    loop {
        match next {
            Ok(Some(data)) => {
                sent += data.len() as u64;
                if let Framing::Length(n) = framing
                    && sent > n
                {
                    return Ok(false);
                }
                write_frame(io, out, &data, framing).await?;
            }
            Ok(None) => break,
            // The body failed: the client must not take what it got for the whole answer.
            Err(()) => return Ok(false),
        }
        next = std::future::poll_fn(|cx| poll_data(body.as_mut(), cx)).await;
    }
    match framing {
        Framing::Chunked => io.write_all(b"0\r\n\r\n").await?,
        Framing::Length(n) if sent != n => return Ok(false),
        _ => {}
    }
    Ok(!close)
}

/// The body's next data frame (trailers and empty frames are skipped);
/// `Ok(None)` at its end, `Err` when it failed.
fn poll_data(
    mut body: Pin<&mut ResponseBody>,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Bytes>, ()>> {
    loop {
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if !data.is_empty() => return Poll::Ready(Ok(Some(data))),
                _ => continue,
            },
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!(error = %e, "response body failed; closing the client connection");
                return Poll::Ready(Err(()));
            }
            Poll::Ready(None) => return Poll::Ready(Ok(None)),
            Poll::Pending => return Poll::Pending,
        }
    }
}

/// Appends `data`, framed, to `out`.
fn frame_into(out: &mut Vec<u8>, data: &[u8], framing: Framing) {
    if let Framing::Chunked = framing {
        chunk_line(out, data.len());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(data);
    }
}

/// Writes one body frame after the head.
async fn write_frame<IO: ClientStream>(
    io: &mut Writer<'_, IO>,
    out: &mut Vec<u8>,
    data: &[u8],
    framing: Framing,
) -> io::Result<()> {
    match framing {
        Framing::Chunked => {
            out.clear();
            chunk_line(out, data.len());
            let mut parts = [IoSlice::new(out), IoSlice::new(data), IoSlice::new(b"\r\n")];
            io.write_all_vectored(&mut parts).await
        }
        _ => io.write_all(data).await,
    }
}

/// A client connection's stream as this server writes it. A TCP stream is
/// written with `try_write` (no readiness poll and no cooperative-budget
/// check on the path that nearly always succeeds at once: what `poll_write`
/// adds measured +1 % instructions per proxied request, BENCHMARKS.md
/// nineteenth session) and needs no flush; a TLS stream through
/// `poll_write`, and flushed after each write.
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin {
    /// Whether written bytes may wait in the stream until it is flushed.
    const BUFFERS: bool;

    /// Writes some of `data`, or registers the task for writability.
    fn poll_send(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self).poll_write(cx, data)
    }

    /// [`ClientStream::poll_send`] of several slices.
    fn poll_send_vectored(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self).poll_write_vectored(cx, parts)
    }
}

impl ClientStream for TcpStream {
    const BUFFERS: bool = false;

    fn poll_send(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            match self.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::task::ready!(self.poll_write_ready(cx))?;
                }
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_send_vectored(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            match self.try_write_vectored(parts) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::task::ready!(self.poll_write_ready(cx))?;
                }
                done => return Poll::Ready(done),
            }
        }
    }
}

impl ClientStream for tokio_rustls::server::TlsStream<TcpStream> {
    const BUFFERS: bool = true;
}

/// The client connection's write side with a deadline: a write that takes no
/// byte for `limit` fails with `TimedOut`, so a client that never reads
/// cannot hold the upstream connection and the in-flight count its answer
/// holds. The timer is the connection's header-read timer (idle while an
/// answer is written), armed only when the socket is full: a write the
/// socket takes at once costs no clock reading. Each write is flushed (a
/// TCP stream's flush does nothing; a TLS stream's sends the records it
/// still holds).
struct Writer<'a, IO> {
    io: &'a mut IO,
    timer: Pin<&'a mut tokio::time::Sleep>,
    limit: Duration,
}

impl<'a, IO: ClientStream> Writer<'a, IO> {
    fn new(io: &'a mut IO, timer: Pin<&'a mut tokio::time::Sleep>, limit: Duration) -> Self {
        Self { io, timer, limit }
    }

    /// Polls `step` until it is ready; when the socket makes it wait, the
    /// write timeout starts.
    async fn within<T>(
        &mut self,
        mut step: impl FnMut(Pin<&mut IO>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> io::Result<T> {
        let mut armed = false;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = step(Pin::new(&mut *self.io), cx) {
                return Poll::Ready(r);
            }
            if !armed {
                self.timer.as_mut().reset(Instant::now() + self.limit);
                armed = true;
            }
            match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client took no byte of the answer within the write timeout",
                ))),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            match self
                .within(|io, cx| io.get_mut().poll_send(cx, data))
                .await?
            {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => data = &data[n..],
            }
        }
        self.flush().await
    }

    async fn write_all_vectored(&mut self, mut parts: &mut [IoSlice<'_>]) -> io::Result<()> {
        while !parts.is_empty() {
            match self
                .within(|io, cx| io.get_mut().poll_send_vectored(cx, parts))
                .await?
            {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => IoSlice::advance_slices(&mut parts, n),
            }
        }
        self.flush().await
    }

    /// Sends what a stream that buffers still holds (nothing to do on TCP).
    async fn flush(&mut self) -> io::Result<()> {
        if IO::BUFFERS {
            self.within(|io, cx| io.poll_flush(cx)).await
        } else {
            Ok(())
        }
    }
}

/// Writes the status line and header fields into `out` (cleared first): an
/// upstream's fields kept as bytes (`raw`) as they came, except those the
/// response's map replaces, then the map's.
/// Returns whether the connection closes after this answer: the client asked
/// for it (the answer then says so), or the answer's own `Connection` does.
fn encode_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    fields: &Fields,
    framing: Framing,
    exchange: Exchange,
) -> bool {
    let (raw, headers) = (fields.raw(), fields.map());
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        status
            .canonical_reason()
            .unwrap_or("<unknown status code>")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    let mut has_date = false;
    let mut has_connection = false;
    let mut answer_closes = false;
    for (name, value, is_length) in raw.into_iter().flat_map(RawFields::iter) {
        // Framing is ours (a HEAD answer keeps its length); the gateway's fields replace the upstream's.
        if (is_length && !exchange.head) || replaced(headers, name) {
            continue;
        }
        has_date |= name_is(name, b"date");
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in headers {
        // Framing is ours; a HEAD answer keeps the length of what GET would send.
        if *name == header::TRANSFER_ENCODING || (*name == header::CONTENT_LENGTH && !exchange.head)
        {
            continue;
        }
        has_date |= *name == header::DATE;
        if *name == header::CONNECTION {
            has_connection = true;
            answer_closes |= has_token(value, "close");
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::None => {}
    }
    if exchange.close && !has_connection {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !has_date {
        out.extend_from_slice(b"date: ");
        DATE.with(|d| d.write(out));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    exchange.close || answer_closes
}

/// Whether `headers` has a field named `name` (any case).
fn replaced(headers: &http::HeaderMap, name: &[u8]) -> bool {
    headers
        .keys()
        .any(|k| k.as_str().as_bytes().eq_ignore_ascii_case(name))
}

thread_local! {
    static DATE: CachedDate = const { CachedDate { at: std::cell::Cell::new(0), text: std::cell::Cell::new([0; 29]) } };
}

/// The `Date` value, formatted once per second per thread.
struct CachedDate {
    at: std::cell::Cell<u64>,
    text: std::cell::Cell<[u8; 29]>,
}

impl CachedDate {
    fn write(&self, out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if secs != self.at.get() {
            let mut text = [0u8; 29];
            let formatted = httpdate::fmt_http_date(now);
            let n = formatted.len().min(text.len());
            text[..n].copy_from_slice(&formatted.as_bytes()[..n]);
            self.text.set(text);
            self.at.set(secs);
        }
        out.extend_from_slice(&self.text.get());
    }
}

#[cfg(test)]
mod tests;
