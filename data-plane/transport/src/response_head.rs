//! An upstream response's header fields, kept in the bytes they came in (issue 8).
//!
//! Turning each field of an upstream's answer into a `HeaderMap` entry (a name
//! lookup, a reference count on the head's bytes, a hash insert), removing the
//! hop-by-hop ones from the map, and writing the map out again for the client
//! was about an eighth of the plain route's user time (BENCHMARKS.md). A head
//! whose fields pass the checks below is kept as [`RawFields`] instead: the
//! head's bytes and where each forwarded field sits in them, the hop-by-hop
//! fields already left out. [`crate::h1_server`] copies those fields to the
//! client as they came, the case of their names included.
//!
//! They travel in the response's [`Fields`](crate::response::Fields), whose
//! lookups see them and the gateway's own fields alike; its map then holds
//! only what the gateway adds on the way back (`X-Request-Id`, the rate
//! limiter's fields, `traceresponse`), and a name there replaces every
//! upstream field of that name, as `HeaderMap::insert` and `extend` on the
//! whole map did. Whatever changes the upstream's fields otherwise (response
//! header transforms, CORS, request coalescing, and hyper's server, which
//! writes HTTP/2 answers and those to requests with a body) asks for the one
//! map ([`Fields::map_mut`](crate::response::Fields::map_mut)), which is built
//! then, with the gateway's fields applied over the upstream's.
//!
//! A head is turned into a map from the start, as before, when it has more than
//! [`MAX_FIELDS`] forwarded fields, or when its `Connection` names fields to
//! drop other than the hop-by-hop ones.

use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderMap;

use crate::h1::{fields_map, is_hop_by_hop, name_is};

/// Most forwarded fields a head kept as bytes may have.
pub const MAX_FIELDS: usize = 16;

/// Where the forwarded fields of a response head sit in its bytes, found while
/// the head is still in the read buffer ([`Kept::scan`]).
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    /// Name start, name length, value start, value length of each field.
    spans: [[u16; 4]; MAX_FIELDS],
    count: u8,
    /// Bit `i`: field `i` is a `Content-Length`.
    lengths: u16,
}

/// The forwarded header fields of an upstream response head, as bytes.
#[derive(Debug, Clone)]
pub struct RawFields {
    /// The head's bytes, status line first.
    head: Bytes,
    kept: Kept,
}

impl Kept {
    /// The fields of `fields` (parsed by httparse from `buf`, which starts with
    /// the head) to forward: all but the hop-by-hop ones, and but
    /// `Content-Length` when `drop_length` (a `Transfer-Encoding` overrides it).
    /// `None` when the head must become a map instead: too many fields, or a
    /// `Connection` that names other fields to drop.
    ///
    /// Names and values are not checked again: httparse accepts exactly the
    /// bytes `HeaderName` and `HeaderValue` do (`httparse_accepts_what_the_http_crate_does`).
    pub(crate) fn scan(
        buf: &[u8],
        fields: &[httparse::Header<'_>],
        drop_length: bool,
    ) -> Option<Self> {
        let base = buf.as_ptr() as usize;
        let mut kept = Self {
            spans: [[0; 4]; MAX_FIELDS],
            count: 0,
            lengths: 0,
        };
        for f in fields {
            let name = f.name.as_bytes();
            if is_hop_by_hop(name) {
                let connection = name_is(name, b"connection") || name_is(name, b"proxy-connection");
                if connection && !names_only_hop_by_hop(f.value) {
                    return None;
                }
                continue;
            }
            let length = name_is(name, b"content-length");
            if length && drop_length {
                continue;
            }
            let i = usize::from(kept.count);
            if i == MAX_FIELDS {
                return None;
            }
            let at = |s: &[u8]| u16::try_from(s.as_ptr() as usize - base).ok();
            let len = |s: &[u8]| u16::try_from(s.len()).ok();
            kept.spans[i] = [at(name)?, len(name)?, at(f.value)?, len(f.value)?];
            if length {
                kept.lengths |= 1 << i;
            }
            kept.count += 1;
        }
        Some(kept)
    }

    /// The fields, in `head` (the scanned buffer's bytes, frozen); behind an
    /// `Arc`, to keep the response that carries them small to move and cheap
    /// to copy (a cached answer is copied for every caller).
    pub(crate) fn into_fields(self, head: Bytes) -> Arc<RawFields> {
        Arc::new(RawFields { head, kept: self })
    }
}

impl RawFields {
    /// Each field's name and value as they came, and whether it is a
    /// `Content-Length` (which only a HEAD answer forwards: framing is the server's).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8], bool)> + '_ {
        let kept = &self.kept;
        kept.spans[..usize::from(kept.count)]
            .iter()
            .enumerate()
            .map(move |(i, &[ns, nl, vs, vl])| {
                let (ns, nl, vs, vl) = (ns as usize, nl as usize, vs as usize, vl as usize);
                (
                    &self.head[ns..ns + nl],
                    &self.head[vs..vs + vl],
                    kept.lengths & (1 << i) != 0,
                )
            })
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        usize::from(self.kept.count)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.kept.count == 0
    }

    /// The fields as a header map (values share the head's bytes), with room
    /// for `room` more.
    pub fn header_map(&self, room: usize) -> HeaderMap {
        let spans = self.kept.spans[..self.len()]
            .iter()
            .map(|s| s.map(usize::from));
        fields_map(&self.head, spans, room)
            .expect("httparse accepts in a field only bytes HeaderName and HeaderValue accept")
    }
}

/// The fields of a whole response head, kept (its length not overridden).
#[cfg(test)]
pub(crate) fn from_head(head: &'static [u8]) -> Arc<RawFields> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut fields);
    assert!(res.parse(head).expect("a valid head").is_complete());
    Kept::scan(head, res.headers, false)
        .expect("fields kept as bytes")
        .into_fields(Bytes::from_static(head))
}

/// Whether a `Connection` value names no field other than the hop-by-hop
/// ones (which go anyway): `close`, `keep-alive`, or such names only.
fn names_only_hop_by_hop(value: &[u8]) -> bool {
    value.split(|b| *b == b',').all(|token| {
        let token = token.trim_ascii();
        token.is_empty() || token.eq_ignore_ascii_case(b"close") || is_hop_by_hop(token)
    })
}

#[cfg(test)]
mod tests;
