//! The harnesses of the HTTP/1.1 fuzz targets in `fuzz/` (run by
//! `scripts/fuzz`, replayed on stable Rust by the data plane's
//! `tests/fuzz_regressions.rs`; `data_plane::fuzzing` re-exports them). Each
//! takes arbitrary bytes, runs a parser on them and asserts what must hold
//! of its answer; a panic is a finding. Not part of the crate's API.
//!
//! * [`h1_request`]: the HTTP/1.1 server's head parser and the request body
//!   framing after it ([`crate::h1_server`], [`crate::framing`]);
//! * [`h1_response`]: an upstream's response head and body framing, the
//!   chunked decoder included ([`crate::h1`], [`crate::response_head`]);
//! * [`proxy_header`]: the PROXY v2 header a trusted proxy sends first
//!   ([`crate::proxy_protocol`]).

use std::cell::RefCell;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, StatusCode, Uri, Version};
use http_body::Body as _;

use crate::h1::{self, H1Body, RespFraming};
use crate::h1_server::{self, Parsed};

/// The data plane's default `--max-header-bytes`.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Runs the HTTP/1.1 fast path on `data` as the bytes a client sent, with the
/// default head limit and with one the input exceeds, whole and cut in two.
///
/// Holds: a head left for hyper (or not yet complete) leaves the buffer
/// exactly as it was; a head served here is a complete HTTP/1.1 head of at
/// most the limit, without an upgrade or `CONNECT`, whose request has
/// httparse's method, target and every field, and whose body framing is its
/// one `Content-Length` or plain chunked coding (the body is then decoded
/// with [`crate::framing`] before the next head, as the connection does); and
/// what was decided on the first bytes stands once the rest arrives.
pub fn h1_request(data: &[u8]) {
    let cut = data
        .first()
        .map_or(0, |&b| usize::from(b) * data.len() / 256);
    for max in [MAX_HEAD_BYTES, data.len() / 2] {
        let whole = requests(data, max);
        let early = requests(&data[..cut], max);
        assert!(
            whole.served.starts_with(&early.served),
            "heads served from the first {cut} bytes ({early:?}) are served from all of them ({whole:?})"
        );
        if early.handed_over {
            assert_eq!(
                early, whole,
                "a connection handed to hyper on its first {cut} bytes is handed over with all of them"
            );
        }
    }
}

/// What the fast path made of a buffer: the length of each head it served,
/// and whether it then handed the connection to hyper (or waited for more).
#[derive(Debug, PartialEq, Eq)]
struct Served {
    served: Vec<usize>,
    handed_over: bool,
}

fn requests(data: &[u8], max: usize) -> Served {
    let mut buf = BytesMut::from(data);
    let mut served = Vec::new();
    loop {
        let before = Bytes::copy_from_slice(&buf);
        match h1_server::parse(&mut buf, max) {
            Parsed::Partial => {
                assert_eq!(buf, before, "an incomplete head stays in the buffer");
                assert!(buf.len() <= max, "an incomplete head within the limit");
                return Served {
                    served,
                    handed_over: false,
                };
            }
            Parsed::Refused(_) => {
                assert_eq!(
                    buf, before,
                    "a refused head is answered 400, nothing consumed"
                );
                return Served {
                    served,
                    handed_over: true,
                };
            }
            Parsed::Hyper => {
                assert_eq!(buf, before, "hyper gets every byte back, in order");
                return Served {
                    served,
                    handed_over: true,
                };
            }
            Parsed::Request(req, exchange) => {
                let len = before.len() - buf.len();
                assert!(len > 0 && len <= max, "a head of {len} bytes (limit {max})");
                assert_eq!(buf, before[len..], "only the head is consumed");
                check_request(&before[..len], &req, exchange);
                served.push(len);
                if let Some(mut body) = exchange.body {
                    loop {
                        match body.step(&mut buf) {
                            Ok(crate::framing::Step::Data(d)) => assert!(!d.is_empty()),
                            Ok(crate::framing::Step::Done) => break,
                            // The body is incomplete or broken: nothing more is read.
                            Ok(crate::framing::Step::More) | Err(_) => {
                                return Served {
                                    served,
                                    handed_over: false,
                                };
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `req` is what httparse reads in `head`, and the fast path may serve it.
fn check_request(
    head: &[u8],
    req: &http::Request<crate::body::ClientBody>,
    exchange: h1_server::Exchange,
) {
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut parsed = httparse::Request::new(&mut fields);
    assert_eq!(
        parsed.parse(head),
        Ok(httparse::Status::Complete(head.len())),
        "a served head is one complete head"
    );
    assert_eq!(parsed.version, Some(1));
    assert_eq!(req.version(), Version::HTTP_11);
    assert_eq!(Some(req.method().as_str()), parsed.method);
    assert_ne!(req.method(), Method::CONNECT);
    assert_eq!(exchange.head, req.method() == Method::HEAD);
    let target = parsed.path.expect("a complete head has a target");
    assert_eq!(
        Some(req.uri()),
        Uri::try_from(target).ok().as_ref(),
        "the target's bytes"
    );
    let mut close = false;
    let mut framing = None;
    let mut expect = false;
    for f in parsed.headers.iter() {
        let name = f.name.to_ascii_lowercase();
        match name.as_str() {
            "content-length" => {
                assert!(framing.is_none(), "one framing field");
                let n = crate::framing::content_length(f.value.trim_ascii())
                    .expect("a served length is decimal digits");
                framing = Some(crate::framing::Decoder::length(n));
            }
            "transfer-encoding" => {
                assert!(framing.is_none(), "one framing field");
                assert!(f.value.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                framing = Some(crate::framing::Decoder::chunked());
            }
            "expect" => {
                assert!(f.value.trim_ascii().eq_ignore_ascii_case(b"100-continue"));
                expect = true;
            }
            "upgrade" => panic!("{name} is hyper's"),
            "connection" => close |= h1::list_has_token(f.value, "close"),
            _ => {}
        }
    }
    let framing = framing.filter(|d| !d.is_done());
    assert_eq!(exchange.body, framing, "the body's framing");
    assert_eq!(exchange.expect_continue, expect && framing.is_some());
    assert_eq!(exchange.close, close, "Connection: close is seen");
    same_fields(
        req.headers(),
        parsed.headers.iter().map(|f| (f.name.as_bytes(), f.value)),
    );
}

/// `map` holds exactly `fields`, each name's values in their order.
fn same_fields<'a>(map: &HeaderMap, fields: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone) {
    assert_eq!(map.len(), fields.clone().count(), "every field, once");
    for (name, _) in fields.clone() {
        let want: Vec<&[u8]> = fields
            .clone()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
            .collect();
        let name = std::str::from_utf8(name).expect("a token is ASCII");
        let got: Vec<&[u8]> = map.get_all(name).iter().map(|v| v.as_bytes()).collect();
        assert_eq!(got, want, "the values of {name}");
    }
}

/// Runs the upstream side on `data` as the bytes an upstream answered: the
/// response head (to a GET and to a HEAD), then its body with the framing the
/// head gave, whole and in small reads; then `data` as a chunked body on its
/// own; and `data` encoded in chunks, which must decode to itself.
///
/// Holds: the head consumed is the last of the 1xx heads and the final one;
/// its fields are kept exactly (as bytes: all but the hop-by-hop ones; as a
/// map: all), a `Content-Length` dropped when a `Transfer-Encoding` overrides
/// it; a body framed by neither never leaves its connection reusable; a body
/// never yields more bytes than arrived, a `Content-Length` body exactly its
/// length; and how the bytes were split into reads changes nothing.
pub fn h1_response(data: &[u8]) {
    for head_request in [false, true] {
        let mut buf = BytesMut::from(data);
        let Ok(Some(head)) = h1::parse_head(&mut buf, head_request, false) else {
            continue;
        };
        let consumed = data.len() - buf.len();
        check_response_head(&data[..consumed], &head, head_request);
        let body = &data[consumed..];
        let whole = read_body(body, head.framing, head.keep_alive, body.len());
        if let RespFraming::Length(n) = head.framing {
            assert!(whole.data.len() as u64 <= n, "no more than the length");
            if whole.end == BodyEnd::Done {
                assert_eq!(whole.data.len() as u64, n, "a complete body is its length");
            }
        }
        if body.len() <= crate::framing::MAX_LINE_BYTES {
            assert_eq!(read_body(body, head.framing, head.keep_alive, 7), whole);
        }
    }
    // The chunked decoder on every input, no head needed to reach it.
    let whole = read_body(data, RespFraming::Chunked, true, data.len());
    if data.len() <= crate::framing::MAX_LINE_BYTES {
        for piece in [1, 3] {
            assert_eq!(read_body(data, RespFraming::Chunked, true, piece), whole);
        }
    }
    chunked_round_trip(data);
}

/// The final head of `head` (after any interim 1xx ones) is what `parsed` says.
fn check_response_head(mut heads: &[u8], parsed: &h1::Head, head_request: bool) {
    let mut fields = [httparse::EMPTY_HEADER; h1::MAX_HEADERS];
    let (res, len) = loop {
        let mut res = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(len)) = res.parse(heads) else {
            panic!("every consumed head parses");
        };
        if (100..200).contains(&res.code.unwrap_or(0)) {
            heads = &heads[len..];
            continue;
        }
        break (res, len);
    };
    assert_eq!(len, heads.len(), "nothing after the final head is consumed");
    assert_eq!(Some(parsed.status.as_u16()), res.code);
    let http10 = res.version == Some(0);
    assert_eq!(parsed.version == Version::HTTP_10, http10);
    let named = |n: &'static str| {
        res.headers
            .iter()
            .filter(move |f| f.name.eq_ignore_ascii_case(n))
    };
    let transfer_coding = named("transfer-encoding").next().is_some();
    let lengths: Vec<&[u8]> = named("content-length").map(|f| f.value).collect();
    // Forwarded fields: a Transfer-Encoding overrides every Content-Length.
    let forwarded = res
        .headers
        .iter()
        .filter(|f| !(transfer_coding && f.name.eq_ignore_ascii_case("content-length")))
        .map(|f| (f.name.as_bytes(), f.value));
    match &parsed.fields {
        Some(raw) => {
            assert!(parsed.headers.is_empty(), "fields are kept in one place");
            let want: Vec<_> = forwarded
                .filter(|(n, _)| !h1::is_hop_by_hop(n))
                .map(|(n, v)| (n, v, n.eq_ignore_ascii_case(b"content-length")))
                .collect();
            let got: Vec<_> = raw.iter().collect();
            assert_eq!(got, want, "fields kept as bytes");
            same_fields(&raw.header_map(0), want.iter().map(|&(n, v, _)| (n, v)));
        }
        None => same_fields(&parsed.headers, forwarded),
    }
    let bodiless = head_request
        || parsed.status == StatusCode::NO_CONTENT
        || parsed.status == StatusCode::NOT_MODIFIED;
    match parsed.framing {
        RespFraming::Length(n) if bodiless => assert_eq!(n, 0),
        RespFraming::Length(n) => {
            assert!(
                !transfer_coding,
                "Transfer-Encoding wins over Content-Length"
            );
            assert!(!lengths.is_empty(), "a length comes from Content-Length");
            for value in lengths {
                for part in value.split(|b| *b == b',') {
                    let part = std::str::from_utf8(part.trim_ascii()).expect("digits");
                    assert_eq!(part.parse::<u64>().ok(), Some(n), "every length agrees");
                }
            }
        }
        RespFraming::Chunked => assert!(transfer_coding),
        RespFraming::UntilClose => {
            assert!(
                !parsed.keep_alive,
                "a body read until close ends its connection"
            );
        }
    }
    if transfer_coding && !bodiless && named("content-length").next().is_some() {
        assert!(
            !parsed.keep_alive,
            "both framings: not reused (RFC 9112 §6.3)"
        );
    }
}

/// How reading a body ended.
#[derive(Debug, PartialEq, Eq)]
enum BodyEnd {
    /// Complete.
    Done,
    /// Refused, with this message.
    Failed(String),
    /// Waiting for bytes that never came.
    Waiting,
}

/// What a body yielded.
#[derive(Debug, PartialEq, Eq)]
struct BodyRead {
    data: Vec<u8>,
    end: BodyEnd,
    /// Bytes left in the buffer after a complete body.
    left: usize,
}

/// Reads `bytes` as a body with `framing`, `piece` bytes arriving at a time.
fn read_body(bytes: &[u8], framing: RespFraming, keep_alive: bool, piece: usize) -> BodyRead {
    with_idle_socket(|io| {
        let mut body = H1Body::new(h1::Conn::new(io), framing, keep_alive);
        let mut pieces = bytes.chunks(piece.max(1));
        if let Some(first) = pieces.next() {
            body.conn.buf.extend_from_slice(first);
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut data = Vec::new();
        let end = loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(None) => break BodyEnd::Done,
                Poll::Ready(Some(Ok(frame))) => {
                    let chunk = frame.into_data().expect("no trailers are forwarded");
                    assert!(!chunk.is_empty(), "no empty data frames");
                    data.extend_from_slice(&chunk);
                }
                Poll::Ready(Some(Err(e))) => break BodyEnd::Failed(e.to_string()),
                // The socket has nothing: the next read brings the next piece.
                Poll::Pending => match pieces.next() {
                    Some(next) => body.conn.buf.extend_from_slice(next),
                    None => break BodyEnd::Waiting,
                },
            }
        };
        assert!(data.len() <= bytes.len(), "no more bytes than arrived");
        assert_eq!(body.is_end_stream(), end == BodyEnd::Done);
        if end == BodyEnd::Done {
            assert_eq!(body.size_hint().exact(), Some(0));
        }
        let left = body.conn.buf.len() + pieces.map(<[u8]>::len).sum::<usize>();
        let read = BodyRead { data, end, left };
        let crate::upstream_io::UpstreamIo::Tcp(io) = body.conn.io else {
            unreachable!("the harness's connection is TCP")
        };
        (read, io)
    })
}

/// `data`, cut into chunks whose sizes its own bytes choose, encoded with the
/// data plane's chunk-size lines and decoded again, is `data`.
fn chunked_round_trip(data: &[u8]) {
    let mut wire = Vec::new();
    let mut rest = data;
    while let Some(&b) = rest.first() {
        let n = (usize::from(b) % 17 + 1).min(rest.len());
        h1::chunk_line(&mut wire, n);
        wire.extend_from_slice(&rest[..n]);
        wire.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let read = read_body(&wire, RespFraming::Chunked, true, 5);
    assert_eq!(read.end, BodyEnd::Done);
    assert_eq!(read.data, data);
    assert_eq!(read.left, 0);
}

/// A connected socket whose peer never sends: an upstream connection's reads
/// then always wait, so a body is read from its buffer alone. One per thread,
/// lent to `f` and given back: connecting per input would exhaust local ports.
fn with_idle_socket<T>(f: impl FnOnce(tokio::net::TcpStream) -> (T, tokio::net::TcpStream)) -> T {
    thread_local! {
        static IDLE: RefCell<Option<IdleSocket>> = const { RefCell::new(None) };
    }
    IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let idle = idle.get_or_insert_with(IdleSocket::new);
        let io = idle.io.take().expect("one body at a time per thread");
        let (out, io) = f(io);
        idle.io = Some(io);
        out
    })
}

struct IdleSocket {
    io: Option<tokio::net::TcpStream>,
    /// The other end, kept open (and silent).
    _peer: std::net::TcpStream,
    /// The socket's I/O driver; never driven, so no read ever becomes ready.
    _runtime: tokio::runtime::Runtime,
}

impl IdleSocket {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("a runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let io = std::net::TcpStream::connect(listener.local_addr().expect("its address"))
            .expect("a connection");
        let (peer, _) = listener.accept().expect("its other end");
        io.set_nonblocking(true).expect("non-blocking");
        let io = {
            let _entered = runtime.enter();
            tokio::net::TcpStream::from_std(io).expect("registered")
        };
        Self {
            io: Some(io),
            _peer: peer,
            _runtime: runtime,
        }
    }
}

/// Parses `data` as the first bytes of a trusted proxy's connection
/// ([`proxy_protocol::parse`]).
///
/// Holds: a header is taken only when `data` starts with the version 2
/// signature and version, and it is exactly the fixed part and the length it
/// announces (nothing after it is consumed, so the client's first byte is
/// the next one); `PROXY` names a client only over TCP/IPv4 or TCP/IPv6, with
/// the addresses and ports at their offsets; what is refused as missing does
/// not start with the signature, and what is cut short is shorter than the
/// header it announces. A longer input gives the same answer on its prefix.
pub fn proxy_header(data: &[u8]) {
    use crate::proxy_protocol::{self, Error, FIXED_LEN, Header, SIGNATURE};
    let announced = data
        .get(14..16)
        .map(|l| FIXED_LEN + usize::from(u16::from_be_bytes([l[0], l[1]])));
    match proxy_protocol::parse(data) {
        Ok((header, len)) => {
            assert!(data.starts_with(&SIGNATURE), "a header needs the signature");
            assert_eq!(data[12] >> 4, 2, "only version 2");
            assert_eq!(
                Some(len),
                announced,
                "the fixed part and its announced length"
            );
            assert!(len <= data.len());
            match header {
                Header::Local => assert_eq!(data[12] & 0x0f, 0, "LOCAL is command 0"),
                Header::Proxy {
                    source,
                    destination,
                } => {
                    assert_eq!(data[12] & 0x0f, 1, "PROXY is command 1");
                    let a = &data[FIXED_LEN..];
                    let (ip_len, ports) = match data[13] {
                        0x11 => (4, 8),
                        0x21 => (16, 32),
                        f => panic!("family {f:#04x} named a client"),
                    };
                    let octets = |ip: std::net::IpAddr| match ip {
                        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
                        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
                    };
                    assert_eq!(octets(source.ip()), &a[..ip_len]);
                    assert_eq!(octets(destination.ip()), &a[ip_len..2 * ip_len]);
                    assert_eq!(source.port().to_be_bytes(), a[ports..ports + 2]);
                    assert_eq!(destination.port().to_be_bytes(), a[ports + 2..ports + 4]);
                }
            }
            // The header alone, or with anything after it: the same answer.
            let alone = proxy_protocol::parse(&data[..len]).expect("the header alone");
            assert_eq!(alone, (header, len));
        }
        Err(Error::Missing) => assert!(!data.starts_with(&SIGNATURE)),
        Err(Error::Io(_)) => assert!(
            data.len() < FIXED_LEN || announced.is_some_and(|l| data.len() < l),
            "cut short only when shorter than the header"
        ),
        Err(Error::Version(v)) => assert!(v != 2),
        Err(Error::Command(c)) => assert!(c > 1),
        Err(Error::Family(f)) => assert!(f != 0x11 && f != 0x21 && data[12] & 0x0f == 1),
        Err(Error::Short { len, needed }) => assert!(len < needed),
        Err(Error::Timeout(_)) => panic!("parsing bytes has no deadline"),
    }
}
