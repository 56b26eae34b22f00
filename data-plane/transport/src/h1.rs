//! The upstream side of a proxied exchange: an HTTP/1.1 client connection of
//! our own (docs/data-plane.md, "Proxy and retries"; issue 8).
//!
//! hyper's client runs each connection as a task of its own: the request is
//! handed to it through a channel, the response head comes back through a
//! oneshot, and every body frame through another channel. On this proxy that
//! was a quarter of the user-space instructions of a plain request
//! (BENCHMARKS.md). Here the request's own task writes the head, reads the
//! response head, and the response body reads the socket as hyper's server
//! polls it, so an exchange is two system calls on the upstream socket (one
//! write, one read) and no hand-off between tasks.
//!
//! What it implements of RFC 9112, client side:
//! * the request head in origin form, with `Host` (the instance's authority
//!   when the request has none) and framing of our own: `Content-Length`
//!   when the body's length is known, `Transfer-Encoding: chunked` otherwise,
//!   `Content-Length: 0` for an empty POST/PUT/PATCH; the client's own framing
//!   headers are never forwarded as they came; request trailers are dropped;
//! * the body is sent while the response is awaited: an upstream that answers
//!   before it has read the whole body gets its answer forwarded, and the
//!   connection is closed afterwards;
//! * interim 1xx responses are skipped; a 101 is refused, except as the
//!   answer to an upgrade request ([`Conn::upgrade`], which hands the
//!   connection over to the new protocol);
//! * response framing: none for HEAD, 204 and 304; chunked when it is the last
//!   transfer coding (trailers are read and dropped); otherwise
//!   `Content-Length` (every value must agree), or the body runs until the
//!   upstream closes;
//! * persistence: HTTP/1.1 keeps the connection unless `Connection: close`,
//!   HTTP/1.0 only with `Connection: keep-alive`; a connection goes back to
//!   its pool only after a complete response with no byte beyond it.
//!
//! Limits: a response head of at most [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`]
//! fields (502 beyond), chunk-size lines and trailers of at most
//! [`crate::framing::MAX_LINE_BYTES`] each, the trailer section at most
//! [`crate::framing::MAX_TRAILER_BYTES`] ([`crate::framing`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWriteExt as _;
use tokio_util::io::poll_read_buf;

use crate::body::RequestBody;
use crate::framing::{Decoder, Step, content_length};
use crate::response::{Fields, Response};
use crate::response_head::{Kept, RawFields};
use crate::rewind::Rewind;
use crate::upstream_error::{Failure, SendError, UpstreamError};
use crate::upstream_io::UpstreamIo;

/// Most header fields a response head may have.
pub const MAX_HEADERS: usize = 100;
/// Largest response head, in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 8 * 1024;

/// One HTTP/1.1 connection to an upstream instance, idle between exchanges.
/// Always boxed (one allocation per connection, not per exchange), so the
/// response body that owns it stays small to move.
#[derive(Debug)]
pub struct Conn {
    pub(crate) io: UpstreamIo,
    /// Bytes read and not yet consumed (empty while idle).
    pub(crate) buf: BytesMut,
    /// The request head being written (kept for its allocation).
    head: Vec<u8>,
}

/// How the request body is framed.
#[derive(Debug, Clone, Copy)]
enum ReqFraming {
    /// No body.
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

impl Conn {
    /// A connection over `io` (connected, `TCP_NODELAY` set by the caller;
    /// for TLS, the handshake done).
    pub fn new(io: impl Into<UpstreamIo>) -> Box<Self> {
        Box::new(Self {
            io: io.into(),
            buf: BytesMut::new(),
            head: Vec::new(),
        })
    }

    /// Whether an idle connection can carry another request: the upstream
    /// has neither closed it nor sent anything unasked. Costs a system call
    /// only when the socket has become readable since its last read.
    pub fn is_reusable(&self) -> bool {
        self.buf.is_empty() && self.io.is_idle_open()
    }

    /// Sends `req` (origin-form URI) and reads the response head. `authority`
    /// is the `Host` sent when the request has none.
    pub fn send<'a>(
        self: Box<Self>,
        req: Box<Request<RequestBody>>,
        authority: &'a str,
    ) -> impl Future<Output = Result<Response<H1Body>, SendError>> + Send + 'a {
        self.exchange(req, authority, false)
    }

    /// [`Conn::send`]; with `upgrade`, a 101 is the answer (the request is
    /// bodiless then).
    async fn exchange(
        mut self: Box<Self>,
        mut req: Box<Request<RequestBody>>,
        authority: &str,
        upgrade: bool,
    ) -> Result<Response<H1Body>, SendError> {
        let framing = if req.body().is_end_stream() {
            ReqFraming::Empty
        } else {
            match req.body().size_hint().exact() {
                Some(n) => ReqFraming::Length(n),
                None => ReqFraming::Chunked,
            }
        };
        encode_head(&mut self.head, &req, framing, authority);
        let mut written = 0;
        while written < self.head.len() {
            let e = match self.io.write(&self.head[written..]).await {
                Ok(0) => Failure::Io(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    written += n;
                    continue;
                }
                Err(e) => Failure::Io(e),
            };
            return Err(if written == 0 {
                SendError::not_sent(req, e)
            } else {
                failed(e, req, framing)
            });
        }
        // A TLS stream may hold the last record of the head (a TCP stream holds nothing).
        if self.io.buffers()
            && let Err(e) = self.io.flush().await
        {
            return Err(failed(Failure::Io(e), req, framing));
        }
        let head_request = req.method() == Method::HEAD;
        let mut early = false;
        let head = match framing {
            ReqFraming::Empty => {
                read_head(&mut self.io, &mut self.buf, head_request, upgrade).await
            }
            _ => {
                let (mut rd, mut wr) = self.io.split();
                let mut sending = std::pin::pin!(write_body(&mut wr, req.body_mut(), framing));
                let mut sent = false;
                // Writing failed, but the upstream may have answered before it
                // stopped reading (a 413, say): that answer is still forwarded.
                let mut write_failed = None;
                loop {
                    tokio::select! {
                        biased;
                        done = &mut sending, if !sent => {
                            sent = true;
                            match done {
                                Ok(()) => {}
                                // The client's body failed: nothing to wait for.
                                Err(e @ Failure::ClientBody(_)) => {
                                    return Err(SendError::sent(e, None));
                                }
                                Err(e) => write_failed = Some(e),
                            }
                        }
                        head = read_head(&mut rd, &mut self.buf, head_request, false) => {
                            // An answer before the whole body: forward it, then close.
                            early = !sent || write_failed.is_some();
                            break head.map_err(|e| write_failed.take().unwrap_or(e));
                        }
                    }
                }
            }
        };
        match head {
            // An upgrade's connection is never reused, whatever the answer.
            Ok(head) => Ok(self.response(head, early || upgrade)),
            Err(e) => Err(failed(e, req, framing)),
        }
    }

    /// The response whose `head` was read; its body reads this connection.
    fn response(self: Box<Self>, head: Head, early: bool) -> Response<H1Body> {
        // The version read is not forwarded: the gateway answers in its own.
        let Head {
            status,
            version: _,
            headers,
            fields,
            framing,
            keep_alive,
        } = head;
        let body = H1Body::new(self, framing, keep_alive && !early);
        Response::from_parts(status, Fields::upstream(headers, fields), body)
    }

    /// Sends an upgrade request (bodiless; origin-form URI, `Connection:
    /// upgrade` and `Upgrade` set by the caller) and reads the answer. A 101
    /// hands the connection over ([`Upgrade::Switched`]); any other answer is
    /// read as a response whose connection is never reused.
    pub async fn upgrade(
        self: Box<Self>,
        req: Box<Request<RequestBody>>,
        authority: &str,
    ) -> Result<Upgrade, SendError> {
        let resp = self.exchange(req, authority, true).await?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            // Never pooled: the connection closes with the body.
            return Ok(Upgrade::Answered(resp));
        }
        let (status, fields, body) = resp.into_parts();
        let conn = body.conn;
        Ok(Upgrade::Switched(
            Response::from_parts(status, fields, ()),
            Rewind::new(conn.buf.freeze(), conn.io),
        ))
    }
}

/// What an upgrade request got back ([`Conn::upgrade`]).
#[derive(Debug)]
pub enum Upgrade {
    /// 101 Switching Protocols: the connection is the new protocol's now,
    /// the bytes read past the head in front.
    Switched(Response<()>, Rewind<UpstreamIo>),
    /// Any other answer, as a response (its connection closes with the body).
    Answered(Response<H1Body>),
}

impl Upgrade {
    /// The answer's status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Switched(resp, _) => resp.status(),
            Self::Answered(resp) => resp.status(),
        }
    }
}

/// A failure after the request was (partly) written: a bodiless request comes back.
fn failed(e: Failure, req: Box<Request<RequestBody>>, framing: ReqFraming) -> SendError {
    let back = matches!(framing, ReqFraming::Empty).then_some(req);
    SendError::sent(e, back)
}

/// Writes the request line and header fields into `out` (cleared first).
fn encode_head(
    out: &mut Vec<u8>,
    req: &Request<RequestBody>,
    framing: ReqFraming,
    authority: &str,
) {
    out.clear();
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(if target.is_empty() { "/" } else { target }.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let headers = req.headers();
    if !headers.contains_key(header::HOST) {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(authority.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let mut had_length = false;
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH {
            had_length = true;
            continue;
        }
        if name == header::TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        ReqFraming::Empty => {
            let expects_body = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH);
            if had_length || expects_body {
                out.extend_from_slice(b"content-length: 0\r\n");
            }
        }
        ReqFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        ReqFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Streams the request body after its head.
async fn write_body<W: tokio::io::AsyncWrite + Unpin>(
    wr: &mut W,
    body: &mut RequestBody,
    framing: ReqFraming,
) -> Result<(), Failure> {
    let mut sent: u64 = 0;
    let mut chunk = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let frame = frame.map_err(Failure::ClientBody)?;
        // Trailers are not forwarded.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        sent += data.len() as u64;
        match framing {
            ReqFraming::Length(n) if sent > n => return Err(Failure::BodyLength),
            ReqFraming::Chunked => {
                chunk.clear();
                chunk_line(&mut chunk, data.len());
                chunk.extend_from_slice(&data);
                chunk.extend_from_slice(b"\r\n");
                wr.write_all(&chunk).await.map_err(Failure::Io)?;
                wr.flush().await.map_err(Failure::Io)?;
                continue;
            }
            _ => {}
        }
        wr.write_all(&data).await.map_err(Failure::Io)?;
        wr.flush().await.map_err(Failure::Io)?;
    }
    match framing {
        ReqFraming::Length(n) if sent != n => Err(Failure::BodyLength),
        ReqFraming::Chunked => {
            wr.write_all(b"0\r\n\r\n").await.map_err(Failure::Io)?;
            wr.flush().await.map_err(Failure::Io)
        }
        _ => Ok(()),
    }
}

/// Whether `name` (any case) is a hop-by-hop field, removed from every
/// message a proxy forwards (RFC 9110 §7.6.1): `Connection`,
/// `Proxy-Connection`, `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`,
/// `Upgrade`, `Proxy-Authorization`, `Proxy-Authenticate`. The fixed list,
/// not what a `Connection` names; `crate::sanitize` removes the same (its
/// tests check the two lists agree).
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    // The lengths of the hop-by-hop names: most fields go no further.
    if !matches!(name.len(), 2 | 7 | 10 | 16..=19) {
        return false;
    }
    let mut buf = [0u8; 19];
    let lower = &mut buf[..name.len()];
    for (l, b) in lower.iter_mut().zip(name) {
        *l = b.to_ascii_lowercase();
    }
    matches!(
        &*lower,
        b"connection"
            | b"proxy-connection"
            | b"keep-alive"
            | b"te"
            | b"trailer"
            | b"transfer-encoding"
            | b"upgrade"
            | b"proxy-authorization"
            | b"proxy-authenticate"
    )
}

/// Appends a chunk-size line (lower-case hex and CRLF) for a chunk of `len` bytes.
pub(crate) fn chunk_line(out: &mut Vec<u8>, len: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(HEX[(len >> (4 * i)) & 0xf]);
    }
    out.extend_from_slice(b"\r\n");
}

/// A parsed response head: its fields as bytes, or (when they cannot stay
/// bytes, [`crate::response_head`]) as a map.
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) fields: Option<Arc<RawFields>>,
    pub(crate) framing: RespFraming,
    pub(crate) keep_alive: bool,
}

/// How the response body is framed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RespFraming {
    Length(u64),
    Chunked,
    UntilClose,
}

/// Reads until a final (non-1xx) response head is complete. Cancel-safe:
/// whatever was read stays in `buf`.
async fn read_head<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    head_request: bool,
    upgrade: bool,
) -> Result<Head, Failure> {
    loop {
        if !buf.is_empty()
            && let Some(head) = parse_head(buf, head_request, upgrade)?
        {
            return Ok(head);
        }
        buf.reserve(READ_CHUNK);
        let n = std::future::poll_fn(|cx| poll_read_buf(Pin::new(&mut *rd), cx, buf))
            .await
            .map_err(Failure::Io)?;
        if n == 0 {
            return Err(Failure::Closed);
        }
    }
}

/// Parses a response head at the start of `buf` and consumes it; interim
/// (1xx) heads are consumed and skipped, except a 101 to an `upgrade`
/// request, which is the final head (any other 101 is invalid). `None`: more
/// bytes are needed.
pub(crate) fn parse_head(
    buf: &mut BytesMut,
    head_request: bool,
    upgrade: bool,
) -> Result<Option<Head>, Failure> {
    loop {
        // Uninitialised: a response head is parsed per exchange, and zeroing
        // room for 100 fields cost more than parsing a short head.
        let mut fields = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut res,
            buf,
            &mut fields,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
                return Err(Failure::Invalid("response head too large"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(Failure::Invalid("too many response header fields"));
            }
            Err(_) => return Err(Failure::Invalid("malformed response head")),
        };
        if len > MAX_HEAD_BYTES {
            return Err(Failure::Invalid("response head too large"));
        }
        let code = res.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| Failure::Invalid("invalid response status"))?;
        let version = if res.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        let switched = status == StatusCode::SWITCHING_PROTOCOLS;
        if status.is_informational() && !(switched && upgrade) {
            if switched {
                return Err(Failure::Invalid("unexpected 101 Switching Protocols"));
            }
            buf.advance(len);
            if buf.is_empty() {
                return Ok(None);
            }
            continue;
        }
        let (framing, keep_alive, drop_length) = if switched {
            // What follows a 101 is the new protocol's, not a body.
            (RespFraming::Length(0), false, false)
        } else {
            framing_of(status, version, res.headers, head_request)?
        };
        // The fields stay bytes when they can ([`crate::response_head`]), else
        // become a map; a 101's become a map whole (its hop-by-hop fields are
        // the handshake).
        let kept = if switched {
            None
        } else {
            Kept::scan(buf, res.headers, drop_length)
        };
        let (headers, fields) = match kept {
            Some(kept) => {
                let head = buf.split_to(len).freeze();
                (HeaderMap::new(), Some(kept.into_fields(head)))
            }
            None => {
                let spans = FieldSpans::new(buf, res.headers);
                let head = buf.split_to(len).freeze();
                // The proxy adds `X-Request-Id` and `traceresponse`.
                let mut headers = spans.header_map(&head, 2)?;
                if drop_length {
                    headers.remove(header::CONTENT_LENGTH);
                }
                (headers, None)
            }
        };
        return Ok(Some(Head {
            status,
            version,
            headers,
            fields,
            framing,
            keep_alive,
        }));
    }
}

/// Where each header field of a parsed head sits in the head's bytes (name
/// start, name length, value start, value length), so that once the head is
/// frozen the values can share its bytes: on the stack for the usual few fields.
pub(crate) struct FieldSpans {
    few: [[u32; 4]; 24],
    many: Vec<[u32; 4]>,
    count: usize,
}

impl FieldSpans {
    /// The spans of `fields`, which httparse found in `buf`.
    pub(crate) fn new(buf: &[u8], fields: &[httparse::Header<'_>]) -> Self {
        let base = buf.as_ptr() as usize;
        let span = |f: &httparse::Header<'_>| {
            [
                (f.name.as_ptr() as usize - base) as u32,
                f.name.len() as u32,
                (f.value.as_ptr() as usize - base) as u32,
                f.value.len() as u32,
            ]
        };
        let mut spans = Self {
            few: [[0; 4]; 24],
            many: Vec::new(),
            count: fields.len(),
        };
        if fields.len() <= spans.few.len() {
            for (slot, f) in spans.few.iter_mut().zip(fields) {
                *slot = span(f);
            }
        } else {
            spans.many = fields.iter().map(span).collect();
        }
        spans
    }

    fn as_slice(&self) -> &[[u32; 4]] {
        if self.count <= self.few.len() {
            &self.few[..self.count]
        } else {
            &self.many
        }
    }

    /// The fields as a header map whose values share `head` (the head's bytes,
    /// frozen, starting where the parsed buffer started), with room for
    /// `room` more fields: those the proxy adds go in without the map
    /// growing (a rehash of every field was ~1.1k instructions per request).
    pub(crate) fn header_map(&self, head: &Bytes, room: usize) -> Result<HeaderMap, Failure> {
        let spans = self.as_slice().iter().map(|s| s.map(|n| n as usize));
        fields_map(head, spans, room)
    }
}

/// A header map of the fields at `spans` (name start, name length, value
/// start, value length) in `head`, whose values share `head`'s bytes, with
/// room for `room` more fields.
pub(crate) fn fields_map(
    head: &Bytes,
    spans: impl ExactSizeIterator<Item = [usize; 4]>,
    room: usize,
) -> Result<HeaderMap, Failure> {
    let mut headers = HeaderMap::with_capacity(spans.len() + room);
    for [ns, nl, vs, vl] in spans {
        let name = HeaderName::from_bytes(&head[ns..ns + nl])
            .map_err(|_| Failure::Invalid("invalid header field name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(vs..vs + vl))
            .map_err(|_| Failure::Invalid("invalid header field value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Whether a field name as httparse accepts it (a token) is `lower`, a
/// lower-case name of letters, digits and `-`, in any case.
///
/// `| 0x20` lower-cases a letter and leaves a digit or `-` as it is, and no
/// other token byte becomes a letter, digit or `-` by it
/// (`name_is_eq_ignore_ascii_case_on_tokens`), so one pass without branches
/// compares the two: `eq_ignore_ascii_case` lower-cases both sides byte by
/// byte, which was a fifth of parsing an upstream's head (callgrind,
/// BENCHMARKS.md). Not for bytes that may fall outside a token (field values).
#[inline]
pub(crate) fn name_is(name: &[u8], lower: &[u8]) -> bool {
    name.len() == lower.len()
        && name
            .iter()
            .zip(lower)
            .fold(0u8, |diff, (n, l)| diff | ((n | 0x20) ^ l))
            == 0
}

/// Whether `value` (a comma-separated list) holds `token`, case-insensitively.
pub(crate) fn has_token(value: &HeaderValue, token: &str) -> bool {
    list_has_token(value.as_bytes(), token)
}

/// [`has_token`] on a field value's raw bytes.
pub(crate) fn list_has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// The response body's framing, whether the connection persists after it, and
/// whether its `Content-Length` fields are to be dropped (a `Transfer-Encoding`
/// overrides them). One pass over the fields, names compared by length first.
fn framing_of(
    status: StatusCode,
    version: Version,
    fields: &[httparse::Header<'_>],
    head_request: bool,
) -> Result<(RespFraming, bool, bool), Failure> {
    let mut keep_alive = version == Version::HTTP_11;
    let mut transfer_coding: Option<&[u8]> = None;
    let mut length: Option<u64> = None;
    let (mut length_seen, mut invalid, mut conflicting) = (false, false, false);
    for f in fields {
        let name = f.name.as_bytes();
        if name_is(name, b"connection") {
            if list_has_token(f.value, "close") {
                keep_alive = false;
            } else if version == Version::HTTP_10 && list_has_token(f.value, "keep-alive") {
                keep_alive = true;
            }
        } else if name_is(name, b"transfer-encoding") {
            transfer_coding = Some(f.value);
        } else if name_is(name, b"content-length") {
            length_seen = true;
            // Every value, and every part of a list, must be the same number.
            for part in f.value.split(|b| *b == b',') {
                match content_length(part.trim_ascii()) {
                    None => invalid = true,
                    Some(n) if length.is_some_and(|l| l != n) => conflicting = true,
                    Some(n) => length = Some(n),
                }
            }
        }
    }
    let drop_length = transfer_coding.is_some();
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((RespFraming::Length(0), keep_alive, drop_length));
    }
    if let Some(last) = transfer_coding {
        let chunked = last
            .rsplit(|b| *b == b',')
            .next()
            .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        // With both, Transfer-Encoding wins and the connection is not reused (RFC 9112 §6.3).
        if length_seen {
            keep_alive = false;
        }
        return Ok(if chunked {
            (RespFraming::Chunked, keep_alive, true)
        } else {
            (RespFraming::UntilClose, false, true)
        });
    }
    if invalid {
        return Err(Failure::Invalid("invalid content-length"));
    }
    if conflicting {
        return Err(Failure::Invalid("conflicting content-length values"));
    }
    Ok(match length {
        Some(n) => (RespFraming::Length(n), keep_alive, false),
        None => (RespFraming::UntilClose, false, false),
    })
}

/// Where a response body's reader is.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Framed by `Content-Length` or chunked coding.
    Framed(Decoder),
    /// Until the upstream closes.
    UntilClose,
}

/// A response body read straight from its upstream connection. At its end
/// the connection can be taken back ([`H1Body::take_conn`]) for the pool.
#[derive(Debug)]
pub struct H1Body {
    pub(crate) conn: Box<Conn>,
    state: State,
    keep_alive: bool,
}

impl H1Body {
    pub(crate) fn new(conn: Box<Conn>, framing: RespFraming, keep_alive: bool) -> Self {
        let state = match framing {
            RespFraming::Length(n) => State::Framed(Decoder::length(n)),
            RespFraming::Chunked => State::Framed(Decoder::chunked()),
            RespFraming::UntilClose => State::UntilClose,
        };
        Self {
            conn,
            state,
            keep_alive,
        }
    }

    /// The connection, if the body is complete and it may carry another
    /// request (persistent, nothing read beyond the response).
    pub fn take_conn(self) -> Option<Box<Conn>> {
        (self.is_done() && self.keep_alive && self.conn.buf.is_empty()).then_some(self.conn)
    }

    fn is_done(&self) -> bool {
        matches!(self.state, State::Framed(Decoder::Done))
    }

    /// Reads more bytes into the buffer; `Closed` at end of stream.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        self.conn.buf.reserve(READ_CHUNK);
        let n = ready!(poll_read_buf(
            Pin::new(&mut self.conn.io),
            cx,
            &mut self.conn.buf
        ))
        .map_err(Failure::Io)?;
        Poll::Ready(if n == 0 { Err(Failure::Closed) } else { Ok(()) })
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Framed(decoder) => match decoder.step(&mut this.conn.buf) {
                    Ok(Step::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Step::Done) => return Poll::Ready(None),
                    Ok(Step::More) => {
                        if let Err(e) = ready!(this.fill(cx)) {
                            return Poll::Ready(Some(Err(e.into())));
                        }
                    }
                    Err(why) => return Poll::Ready(Some(Err(Failure::Invalid(why).into()))),
                },
                State::UntilClose => {
                    if this.conn.buf.is_empty() {
                        match ready!(this.fill(cx)) {
                            Ok(()) => {}
                            Err(Failure::Closed) => {
                                this.state = State::Framed(Decoder::Done);
                                this.keep_alive = false;
                                return Poll::Ready(None);
                            }
                            Err(e) => return Poll::Ready(Some(Err(e.into()))),
                        }
                    }
                    let data = this.conn.buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Framed(d) => d
                .remaining()
                .map_or_else(SizeHint::default, SizeHint::with_exact),
            State::UntilClose => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use tokio::net::TcpStream;

    #[test]
    fn name_is_eq_ignore_ascii_case_on_tokens() {
        // Every byte httparse takes in a field name, against every byte a
        // lower-case name given to `name_is` may hold.
        let token = |b: u8| {
            let head = [&b"HTTP/1.1 200 OK\r\n"[..], &[b], b": v\r\n\r\n"].concat();
            let mut fields = [httparse::EMPTY_HEADER; 1];
            let mut res = httparse::Response::new(&mut fields);
            matches!(res.parse(&head), Ok(httparse::Status::Complete(_)))
                && res
                    .headers
                    .first()
                    .is_some_and(|f| f.name.as_bytes() == [b])
        };
        let lower: Vec<u8> = (b'a'..=b'z').chain(b'0'..=b'9').chain([b'-']).collect();
        let mut tokens = 0;
        for n in (0..=u8::MAX).filter(|&b| token(b)) {
            tokens += 1;
            for &l in &lower {
                assert_eq!(
                    name_is(&[n], &[l]),
                    [n].eq_ignore_ascii_case(&[l]),
                    "{:?} against {:?}",
                    n as char,
                    l as char
                );
            }
        }
        assert_eq!(tokens, 77, "the token bytes of RFC 9110");
        assert!(name_is(b"Content-Length", b"content-length"));
        assert!(name_is(b"CONNECTION", b"connection"));
        assert!(!name_is(b"Content-Lengt", b"content-length"));
        assert!(!name_is(b"Content_Length", b"content-length"));
        assert!(!name_is(b"connectioN ", b"connection"));
    }
    use tokio::io::AsyncReadExt as _;
    use tokio::net::TcpListener;

    /// A one-connection upstream: reads one request head (and `body_bytes`
    /// more), answers `answer`, and reports what it received.
    async fn upstream(
        answer: &'static [u8],
        body_bytes: usize,
    ) -> (Box<Conn>, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "client closed early");
                got.extend_from_slice(&buf[..n]);
            }
            let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            while got.len() < head_end + body_bytes {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer).await.unwrap();
            // Keep the socket open until the client is done with it.
            let _ = s.read(&mut buf).await;
            got
        });
        let io = TcpStream::connect(addr).await.unwrap();
        (Conn::new(io), server)
    }

    /// An upstream that reads once, writes `answer` and hangs up (`None`:
    /// hangs up without answering), for each of `connections` connections.
    async fn one_shot(answer: Option<&'static [u8]>, connections: usize) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for _ in 0..connections {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                if let Some(answer) = answer {
                    s.write_all(answer).await.unwrap();
                }
            }
        });
        addr
    }

    fn get(uri: &str) -> Box<Request<RequestBody>> {
        Box::new(Request::get(uri).body(RequestBody::empty()).unwrap())
    }

    /// The response's header fields as a map, wherever they are kept.
    fn headers_of(resp: &mut Response<H1Body>) -> HeaderMap {
        resp.fields_mut().map_mut().clone()
    }

    async fn body_of(resp: Response<H1Body>) -> (Bytes, Option<Box<Conn>>) {
        let mut body = resp.into_body();
        let mut all = BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Ok(d) = frame.unwrap().into_data() {
                all.extend_from_slice(&d);
            }
        }
        (all.freeze(), body.take_conn())
    }

    #[tokio::test]
    async fn a_content_length_response_and_a_reusable_connection() {
        let (conn, server) = upstream(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello",
            0,
        )
        .await;
        let mut resp = conn.send(get("/a/b?c=1"), "up:80").await.unwrap();
        assert_eq!(resp.status(), 200);
        let headers = headers_of(&mut resp);
        let values: Vec<_> = headers.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        let (body, conn) = body_of(resp).await;
        assert_eq!(body, "hello");
        let conn = conn.expect("keep-alive connection comes back");
        assert!(conn.is_reusable());
        drop(conn);
        let got = String::from_utf8(server.await.unwrap()).unwrap();
        assert!(
            got.starts_with("GET /a/b?c=1 HTTP/1.1\r\nhost: up:80\r\n"),
            "{got}"
        );
        assert!(!got.contains("content-length"), "{got}");
    }

    #[tokio::test]
    async fn a_head_with_many_fields_keeps_every_one() {
        let mut answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n".to_vec();
        for i in 0..40 {
            answer.extend_from_slice(format!("x-f{i}: v{i}\r\n").as_bytes());
        }
        answer.extend_from_slice(b"\r\n");
        let answer: &'static [u8] = Box::leak(answer.into_boxed_slice());
        let (conn, _server) = upstream(answer, 0).await;
        let resp = conn.send(get("/"), "up").await.unwrap();
        assert_eq!(resp.fields().len(), 41);
        for i in 0..40 {
            assert_eq!(
                resp.fields().get_str(&format!("x-f{i}")),
                Some(format!("v{i}").as_str())
            );
        }
    }

    #[tokio::test]
    async fn chunked_responses_are_decoded_and_trailers_dropped() {
        let (conn, _server) = upstream(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\nA\r\n, world!!!\r\n0\r\nX-T: 1\r\n\r\n",
            0,
        )
        .await;
        let resp = conn.send(get("/"), "up").await.unwrap();
        let (body, conn) = body_of(resp).await;
        assert_eq!(body, "hello, world!!!");
        assert!(conn.is_some());
    }

    #[tokio::test]
    async fn interim_responses_are_skipped_and_close_means_close() {
        let (conn, _server) = upstream(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
            0,
        )
        .await;
        let resp = conn.send(get("/"), "up").await.unwrap();
        assert_eq!(resp.status(), 201);
        let (body, conn) = body_of(resp).await;
        assert_eq!(body, "ok");
        assert!(conn.is_none(), "Connection: close is not pooled");
    }

    #[tokio::test]
    async fn a_body_without_framing_runs_until_close_and_is_not_pooled() {
        let addr = one_shot(Some(b"HTTP/1.0 200 OK\r\n\r\nall of it"), 1).await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let resp = conn.send(get("/"), "up").await.unwrap();
        let (body, conn) = body_of(resp).await;
        assert_eq!(body, "all of it");
        assert!(conn.is_none());
    }

    #[tokio::test]
    async fn a_head_answer_has_no_body_whatever_its_length() {
        let (conn, _server) = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", 0).await;
        let req = Request::head("/").body(RequestBody::empty()).unwrap();
        let mut resp = conn.send(Box::new(req), "up").await.unwrap();
        assert!(resp.body().is_end_stream());
        assert_eq!(headers_of(&mut resp)["content-length"], "1000");
        assert!(resp.into_body().take_conn().is_some());
    }

    #[tokio::test]
    async fn a_known_length_body_is_sent_with_its_length_and_an_empty_post_says_zero() {
        let (conn, server) = upstream(b"HTTP/1.1 204 No Content\r\n\r\n", 3).await;
        let req = Request::put("/x")
            .header("host", "gw")
            .header("content-length", "3")
            .body(RequestBody::buffered(Bytes::from_static(b"abc")))
            .unwrap();
        let resp = conn.send(Box::new(req), "up").await.unwrap();
        assert_eq!(resp.status(), 204);
        drop(resp);
        let got = String::from_utf8(server.await.unwrap()).unwrap();
        assert!(got.starts_with("PUT /x HTTP/1.1\r\nhost: gw\r\n"), "{got}");
        assert!(got.ends_with("content-length: 3\r\n\r\nabc"), "{got}");

        let (conn, server) = upstream(b"HTTP/1.1 204 No Content\r\n\r\n", 0).await;
        let req = Request::post("/y").body(RequestBody::empty()).unwrap();
        drop(conn.send(Box::new(req), "up").await.unwrap());
        let got = String::from_utf8(server.await.unwrap()).unwrap();
        assert!(got.ends_with("content-length: 0\r\n\r\n"), "{got}");
    }

    #[tokio::test]
    async fn malformed_and_oversized_heads_are_refused() {
        for (answer, want) in [
            (&b"HTTP/1.1 abc\r\n\r\n"[..], "malformed"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
                "content-length",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "conflicting",
            ),
            (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "101"),
        ] {
            let answer: &'static [u8] = Box::leak(answer.to_vec().into_boxed_slice());
            let (conn, _server) = upstream(answer, 0).await;
            match conn.send(get("/"), "up").await {
                Err(SendError { error: e, .. }) if !e.never_reached() => {
                    assert!(e.to_string().contains(want), "{e} for {answer:?}")
                }
                other => panic!("{other:?}"),
            }
        }
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        while big.len() <= MAX_HEAD_BYTES {
            big.extend_from_slice(b"x-filler: 0123456789012345678901234567890123456789\r\n");
        }
        let big: &'static [u8] = Box::leak(big.into_boxed_slice());
        let (conn, _server) = upstream(big, 0).await;
        match conn.send(get("/"), "up").await {
            Err(SendError { error: e, .. }) if !e.never_reached() => {
                assert!(e.to_string().contains("too"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_response_cut_short_is_an_error_and_an_idle_close_is_seen() {
        let addr = one_shot(Some(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"), 1).await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let mut body = conn.send(get("/"), "up").await.unwrap().into_body();
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "abc"
        );
        assert!(matches!(
            body.frame().await.unwrap().map_err(|e| e.failure().to_string()),
            Err(e) if e == Failure::Closed.to_string()
        ));

        // An idle connection the upstream closed is not reusable.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let closer = tokio::spawn(async move { drop(listener.accept().await.unwrap()) });
        let io = TcpStream::connect(addr).await.unwrap();
        closer.await.unwrap();
        // Wait (with a deadline) until the FIN has arrived.
        let mut probe = [0u8; 1];
        tokio::time::timeout(std::time::Duration::from_secs(5), io.peek(&mut probe))
            .await
            .unwrap()
            .unwrap();
        assert!(!Conn::new(io).is_reusable());
    }

    #[tokio::test]
    async fn a_bodiless_request_comes_back_when_the_upstream_hangs_up_without_answering() {
        let addr = one_shot(None, 2).await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let req = Request::get("/again")
            .header("x-k", "v")
            .body(RequestBody::empty())
            .unwrap();
        match conn.send(Box::new(req), "up").await {
            Err(SendError {
                error,
                request: Some(back),
            }) if matches!(error.failure(), Failure::Closed) && !error.never_reached() => {
                assert_eq!(back.uri(), "/again");
                assert_eq!(back.headers()["x-k"], "v");
                assert!(!back.body().was_polled());
            }
            other => panic!("{other:?}"),
        }
        // One with a body does not come back: it was (partly) consumed.
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let req = Request::put("/b")
            .body(RequestBody::buffered(Bytes::from_static(b"xyz")))
            .unwrap();
        assert!(matches!(
            conn.send(Box::new(req), "up").await,
            Err(SendError { request: None, .. })
        ));
    }

    #[tokio::test]
    async fn an_answer_before_the_body_is_forwarded_and_the_connection_closed() {
        // The upstream refuses after the head, without reading the body: 32 MiB,
        // more than loopback socket buffers hold, so the write cannot finish first.
        let addr = one_shot(
            Some(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbig"),
            1,
        )
        .await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let req = Request::post("/upload")
            .body(RequestBody::buffered(Bytes::from(vec![b'x'; 32 << 20])))
            .unwrap();
        let resp = conn.send(Box::new(req), "up").await.unwrap();
        assert_eq!(resp.status(), 413);
        let (body, conn) = body_of(resp).await;
        assert_eq!(body, "big");
        assert!(
            conn.is_none(),
            "a half-sent request's connection is not reused"
        );
    }

    #[tokio::test]
    async fn an_upgrade_hands_the_connection_over_with_the_bytes_after_the_101() {
        let switched: &[u8] =
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nearly";
        let addr = one_shot(Some(switched), 1).await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let Upgrade::Switched(resp, mut io) = conn.upgrade(get("/ws"), "up").await.unwrap() else {
            panic!("not switched");
        };
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(resp.fields().get_str("upgrade"), Some("websocket"));
        assert_eq!(resp.fields().get_str("connection"), Some("upgrade"));
        let mut rest = Vec::new();
        io.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"early", "bytes after the 101 are the new protocol's");
        // Any other answer is a response whose connection is never pooled.
        let addr = one_shot(
            Some(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno"),
            1,
        )
        .await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let Upgrade::Answered(resp) = conn.upgrade(get("/ws"), "up").await.unwrap() else {
            panic!("a 403 switched");
        };
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let (body, conn) = body_of(resp).await;
        assert_eq!(body, "no");
        assert!(conn.is_none(), "an upgrade's connection is never reused");
        // A 101 to a request that asked for no upgrade is invalid.
        let addr = one_shot(Some(switched), 1).await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let failed = conn.send(get("/"), "up").await.unwrap_err();
        assert!(
            matches!(failed.error.failure(), Failure::Invalid(_)) && !failed.error.never_reached(),
            "{failed:?}"
        );
    }
}
