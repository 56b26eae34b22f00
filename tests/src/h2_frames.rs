//! Raw HTTP/2 frames for the abuse suite (`tests/h2_abuse.rs`): an h2c client
//! with prior knowledge that writes frames exactly as told, which a
//! conforming client library refuses to do (a stream reset right after its
//! HEADERS thousands of times a second, CONTINUATION frames without end,
//! SETTINGS and PING floods, a window that never opens), and a reader that
//! records what the server answered and when it hung up.
//!
//! Header blocks are HPACK without the dynamic table and without Huffman
//! coding (RFC 7541 §6.1 indexed fields and §6.2.2 literals without
//! indexing), which every decoder must accept.

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types (RFC 9113 §6).
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// PING.
    pub const PING: u8 = 0x6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags (RFC 9113 §6).
pub mod flag {
    /// END_STREAM (DATA, HEADERS).
    pub const END_STREAM: u8 = 0x1;
    /// ACK (SETTINGS, PING).
    pub const ACK: u8 = 0x1;
    /// END_HEADERS (HEADERS, CONTINUATION).
    pub const END_HEADERS: u8 = 0x4;
}

/// SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113 §6.5.2).
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// The CANCEL error code (RFC 9113 §7), what a client's RST_STREAM says.
pub const CANCEL: u32 = 0x8;

/// Appends one frame to `out`.
pub fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("frame payload fits 24 bits");
    assert!(len < 1 << 24, "frame payload fits 24 bits");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends a SETTINGS frame with `values` (identifier, value).
pub fn settings(out: &mut Vec<u8>, values: &[(u16, u32)]) {
    let mut payload = Vec::with_capacity(values.len() * 6);
    for (id, value) in values {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
    }
    frame(out, kind::SETTINGS, 0, 0, &payload);
}

/// Appends a PING frame (not an ACK) carrying `data`.
pub fn ping(out: &mut Vec<u8>, data: u64) {
    frame(out, kind::PING, 0, 0, &data.to_be_bytes());
}

/// Appends an RST_STREAM frame for `stream` with error `code`.
pub fn rst_stream(out: &mut Vec<u8>, stream: u32, code: u32) {
    frame(out, kind::RST_STREAM, 0, stream, &code.to_be_bytes());
}

/// Appends a WINDOW_UPDATE frame (`stream` 0: the connection's window).
pub fn window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    frame(
        out,
        kind::WINDOW_UPDATE,
        0,
        stream,
        &increment.to_be_bytes(),
    );
}

/// Appends an HPACK integer with an `prefix_bits`-bit prefix whose other
/// bits are `first` (RFC 7541 §5.1).
fn hpack_int(out: &mut Vec<u8>, prefix_bits: u32, first: u8, value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// Appends a literal field without indexing whose name is static-table entry
/// `name_index`, the value a plain (not Huffman-coded) string (RFC 7541 §6.2.2).
fn hpack_literal(out: &mut Vec<u8>, name_index: usize, value: &str) {
    hpack_int(out, 4, 0x00, name_index);
    hpack_int(out, 7, 0x00, value.len());
    out.extend_from_slice(value.as_bytes());
}

/// The header block of `GET http://{authority}{path}`: `:method GET` and
/// `:scheme http` from the static table, `:path` and `:authority` literal.
pub fn get_block(authority: &str, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http (static 2 and 6)
    hpack_literal(&mut block, 4, path); // :path
    hpack_literal(&mut block, 1, authority); // :authority
    block
}

/// Appends a HEADERS frame opening `stream` with `block` whole (END_HEADERS)
/// and no body (END_STREAM).
pub fn get(out: &mut Vec<u8>, stream: u32, block: &[u8]) {
    frame(
        out,
        kind::HEADERS,
        flag::END_HEADERS | flag::END_STREAM,
        stream,
        block,
    );
}

/// Opens a TCP connection to `addr` ("127.0.0.1:P"); `recv_buffer` (bytes)
/// shrinks its receive buffer first, so a client that never reads fills it
/// (and stops the server's writes) after a few kilobytes.
pub async fn connect(addr: &str, recv_buffer: Option<u32>) -> anyhow::Result<TcpStream> {
    let addr: std::net::SocketAddr = addr.parse().with_context(|| format!("address {addr}"))?;
    let socket = tokio::net::TcpSocket::new_v4()?;
    if let Some(size) = recv_buffer {
        socket.set_recv_buffer_size(size)?;
    }
    let stream = socket
        .connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A GOAWAY the server sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoAway {
    /// Last stream id the server says it processed.
    pub last_stream: u32,
    /// Error code (0x0 NO_ERROR, 0x1 PROTOCOL_ERROR, 0xb ENHANCE_YOUR_CALM, …).
    pub code: u32,
    /// The debug data, as text.
    pub debug: String,
}

/// What a [`read_frames`] task has seen so far.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Frames read, by type (index = type; unknown types are not counted).
    pub frames: [u64; 10],
    /// DATA payload bytes read.
    pub data_bytes: u64,
    /// The first GOAWAY and how long after the reader started it came.
    pub goaway: Option<(GoAway, Duration)>,
    /// The connection ended (EOF or an error, as text) and when, after the reader started.
    pub closed: Option<(String, Duration)>,
}

impl Seen {
    /// When the server told the client to go (GOAWAY) or hung up, whichever came first.
    pub fn disconnected_after(&self) -> Option<Duration> {
        let goaway = self.goaway.as_ref().map(|(_, t)| *t);
        let closed = self.closed.as_ref().map(|(_, t)| *t);
        match (goaway, closed) {
            (Some(g), Some(c)) => Some(g.min(c)),
            (g, c) => g.or(c),
        }
    }
}

/// Reads frames from `read` until the connection ends, publishing what it
/// saw after every frame. The task ends with the connection.
pub fn read_frames<R>(mut read: R) -> watch::Receiver<Seen>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let (tx, rx) = watch::channel(Seen::default());
    let started = Instant::now();
    tokio::spawn(async move {
        let mut head = [0u8; 9];
        let mut payload = Vec::new();
        let ended = loop {
            if let Err(e) = read.read_exact(&mut head).await {
                break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    "EOF".to_owned()
                } else {
                    e.to_string()
                };
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            payload.resize(len, 0);
            if let Err(e) = read.read_exact(&mut payload).await {
                break e.to_string();
            }
            let kind = head[3];
            tx.send_modify(|seen| {
                if let Some(n) = seen.frames.get_mut(usize::from(kind)) {
                    *n += 1;
                }
                if kind == kind::DATA {
                    seen.data_bytes += len as u64;
                }
                if kind == kind::GOAWAY && seen.goaway.is_none() && payload.len() >= 8 {
                    let word = |i: usize| {
                        u32::from_be_bytes([
                            payload[i],
                            payload[i + 1],
                            payload[i + 2],
                            payload[i + 3],
                        ])
                    };
                    let goaway = GoAway {
                        last_stream: word(0) & 0x7fff_ffff,
                        code: word(4),
                        debug: String::from_utf8_lossy(&payload[8..]).into_owned(),
                    };
                    seen.goaway = Some((goaway, started.elapsed()));
                }
            });
        };
        tx.send_modify(|seen| seen.closed = Some((ended, started.elapsed())));
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_the_nine_byte_head() {
        let mut out = Vec::new();
        rst_stream(&mut out, 3, CANCEL);
        assert_eq!(out, [0, 0, 4, 3, 0, 0, 0, 0, 3, 0, 0, 0, 8]);
    }

    #[test]
    fn hpack_integers_continue_past_the_prefix() {
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        hpack_int(&mut out, 5, 0, 1337);
        assert_eq!(out, [31, 154, 10]);
        let mut out = Vec::new();
        hpack_int(&mut out, 7, 0, 10);
        assert_eq!(out, [10]);
    }

    #[test]
    fn a_get_block_is_plain_literals() {
        let block = get_block("a:1", "/x");
        assert_eq!(
            block,
            [0x82, 0x86, 0x04, 2, b'/', b'x', 0x01, 3, b'a', b':', b'1']
        );
    }
}
