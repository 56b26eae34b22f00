//! HTTP/1.1 message body framing (RFC 9112 §6, §7.1): the decoder of a body
//! framed by `Content-Length` or by chunked transfer coding, over a read
//! buffer. The upstream client reads response bodies with it
//! ([`crate::h1::H1Body`]) and the server reads request bodies with it
//! ([`crate::h1_server`]), so both sides accept exactly the same framing.
//!
//! Strict where a lenient reading could be read differently by the next hop:
//! chunk-size lines end in CRLF (a bare LF is not a line end, so the line
//! fails to parse as a size), a size is 1–16 hex digits, chunk data is
//! followed by CRLF, every line is at most [`MAX_LINE_BYTES`] and the trailer
//! section at most [`MAX_TRAILER_BYTES`] in all. Chunk extensions are
//! allowed and ignored; trailer fields are read and dropped.

use bytes::{Buf as _, Bytes, BytesMut};

/// Longest chunk-size line or trailer field, in bytes.
pub const MAX_LINE_BYTES: usize = 8 * 1024;
/// Largest trailer section, in bytes (every trailer line counted, CRLFs included).
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Where a body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// This many bytes of a `Content-Length` body are still to come.
    Length(u64),
    /// Expecting a chunk-size line.
    ChunkSize,
    /// This many bytes of the current chunk are still to come.
    ChunkData(u64),
    /// Expecting the CRLF after a chunk's data.
    ChunkEnd,
    /// Reading (and dropping) trailer fields up to the empty line; this many
    /// bytes of trailer section are still allowed.
    Trailers(usize),
    /// Complete.
    Done,
}

/// What one [`Decoder::step`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Body bytes, taken off the front of the buffer (never empty).
    Data(Bytes),
    /// The buffer holds no more of the body: read more bytes into it.
    More,
    /// The body is complete; what follows it in the buffer is not touched.
    Done,
}

impl Decoder {
    /// A body of `n` bytes (`Content-Length: n`).
    pub fn length(n: u64) -> Self {
        if n == 0 { Self::Done } else { Self::Length(n) }
    }

    /// A chunked body.
    pub fn chunked() -> Self {
        Self::ChunkSize
    }

    /// Whether the body is complete.
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done)
    }

    /// The bytes still to come, when the framing says (a `Content-Length` body).
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Self::Length(n) => Some(*n),
            Self::Done => Some(0),
            _ => None,
        }
    }

    /// Decodes from the front of `buf`: the next body bytes there, or what is
    /// needed next. Consumes framing bytes as it goes; never consumes a byte
    /// beyond the body's end.
    #[inline]
    pub fn step(&mut self, buf: &mut BytesMut) -> Result<Step, &'static str> {
        loop {
            match *self {
                Self::Done => return Ok(Step::Done),
                Self::Length(rem) | Self::ChunkData(rem) => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let take = rem.min(buf.len() as u64);
                    let data = buf.split_to(take as usize).freeze();
                    let left = rem - take;
                    *self = match (*self, left) {
                        (Self::Length(_), 0) => Self::Done,
                        (Self::Length(_), _) => Self::Length(left),
                        (_, 0) => Self::ChunkEnd,
                        (_, _) => Self::ChunkData(left),
                    };
                    return Ok(Step::Data(data));
                }
                Self::ChunkEnd => {
                    if buf.len() < 2 {
                        return Ok(Step::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("chunk data not followed by CRLF");
                    }
                    buf.advance(2);
                    *self = Self::ChunkSize;
                }
                Self::ChunkSize => {
                    let Some(line) = line(buf)? else {
                        return Ok(Step::More);
                    };
                    *self = match chunk_size(&line)? {
                        0 => Self::Trailers(MAX_TRAILER_BYTES),
                        n => Self::ChunkData(n),
                    };
                }
                Self::Trailers(budget) => {
                    let Some(line) = line(buf)? else {
                        if buf.len() > budget {
                            return Err("trailer section too large");
                        }
                        return Ok(Step::More);
                    };
                    let used = line.len() + 2;
                    if used > budget {
                        return Err("trailer section too large");
                    }
                    *self = if line.is_empty() {
                        Self::Done
                    } else {
                        Self::Trailers(budget - used)
                    };
                }
            }
        }
    }
}

/// Takes one CRLF-terminated line off the front of `buf` (without the CRLF).
fn line(buf: &mut BytesMut) -> Result<Option<Bytes>, &'static str> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(at) if at > MAX_LINE_BYTES => Err("chunk line too long"),
        Some(at) => {
            let line = buf.split_to(at).freeze();
            buf.advance(2);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE_BYTES => Err("chunk line too long"),
        None => Ok(None),
    }
}

/// A chunk-size line's size: 1–16 hex digits, then optional extensions after `;`.
pub fn chunk_size(line: &[u8]) -> Result<u64, &'static str> {
    let digits = line
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 16 {
        return Err("invalid chunk size");
    }
    let mut n: u64 = 0;
    for &d in digits {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => return Err("invalid chunk size"),
        };
        n = n << 4 | u64::from(v);
    }
    Ok(n)
}

/// A `Content-Length` value: one or more decimal digits, within `u64`.
pub fn content_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        if !d.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in reads of `step` bytes: the body, and whether it ended.
    fn decode(mut decoder: Decoder, wire: &[u8], step: usize) -> Result<(Vec<u8>, bool), String> {
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut fed = 0;
        loop {
            match decoder.step(&mut buf).map_err(String::from)? {
                Step::Data(d) => {
                    assert!(!d.is_empty());
                    body.extend_from_slice(&d);
                }
                Step::Done => return Ok((body, true)),
                Step::More if fed == wire.len() => return Ok((body, false)),
                Step::More => {
                    let end = (fed + step).min(wire.len());
                    buf.extend_from_slice(&wire[fed..end]);
                    fed = end;
                }
            }
        }
    }

    #[test]
    fn lengths_and_chunks_decode_the_same_whatever_the_reads() {
        let chunked = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, 1000] {
            assert_eq!(
                decode(Decoder::chunked(), chunked, step),
                Ok((b"hello world".to_vec(), true)),
                "reads of {step}"
            );
            assert_eq!(
                decode(Decoder::length(5), b"hello", step),
                Ok((b"hello".to_vec(), true))
            );
        }
        assert_eq!(decode(Decoder::length(0), b"", 1), Ok((vec![], true)));
        assert_eq!(
            decode(Decoder::length(5), b"hel", 1),
            Ok((b"hel".to_vec(), false))
        );
    }

    #[test]
    fn nothing_beyond_the_body_is_consumed() {
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n"[..]);
        let mut d = Decoder::chunked();
        assert_eq!(d.step(&mut buf), Ok(Step::Data(Bytes::from_static(b"abc"))));
        assert_eq!(d.step(&mut buf), Ok(Step::Done));
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");
        let mut buf = BytesMut::from(&b"abcdef"[..]);
        let mut d = Decoder::length(4);
        assert_eq!(
            d.step(&mut buf),
            Ok(Step::Data(Bytes::from_static(b"abcd")))
        );
        assert_eq!(d.step(&mut buf), Ok(Step::Done));
        assert_eq!(&buf[..], b"ef");
    }

    #[test]
    fn malformed_chunking_is_refused() {
        for wire in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"g\r\n",
            b"-1\r\n",
            b"\r\n",
            b"11111111111111111\r\n",
        ] {
            assert!(
                decode(Decoder::chunked(), wire, 1).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
        let long = vec![b'1'; MAX_LINE_BYTES + 1];
        assert!(decode(Decoder::chunked(), &long, 4096).is_err());
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..(MAX_TRAILER_BYTES / 10 + 1) {
            trailers.extend_from_slice(b"x-t: 123\r\n");
        }
        assert_eq!(
            decode(Decoder::chunked(), &trailers, 100),
            Err("trailer section too large".to_string())
        );
    }

    #[test]
    fn sizes_and_lengths_parse_strictly() {
        assert_eq!(chunk_size(b"1f"), Ok(31));
        assert_eq!(chunk_size(b"A;name=value"), Ok(10));
        assert_eq!(chunk_size(b"1aF"), Ok(0x1af));
        assert_eq!(chunk_size(b"ffffffffffffffff"), Ok(u64::MAX));
        for bad in [&b""[..], b"zz", b"0x1", b"11111111111111111"] {
            assert!(chunk_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(content_length(b"42"), Some(42));
        assert_eq!(content_length(b"00012"), Some(12));
        assert_eq!(content_length(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"+1",
            b"-1",
            b"1 2",
            b"18446744073709551616",
            b"0x10",
            b"1.0",
        ] {
            assert_eq!(content_length(bad), None, "{bad:?}");
        }
    }
}
