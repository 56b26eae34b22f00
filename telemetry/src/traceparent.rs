//! W3C Trace Context `traceparent` / `traceresponse` (level 1, plus the level 2
//! `random` flag): strict parsing, allocation-free formatting, id generation.
//!
//! Format: `version "-" trace-id "-" parent-id "-" trace-flags`, e.g.
//! `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
//!
//! Rules enforced by [`TraceContext::parse`]:
//! * every field is lowercase hex of its exact width (upper case is invalid);
//! * version `ff` is invalid; version `00` must be exactly 55 bytes;
//! * a higher version is parsed by its first three fields when the value is at
//!   least 55 bytes long and, if longer, byte 55 is `-` (forward compatibility);
//! * an all-zero trace id or parent id is invalid.
//!
//! An invalid header means the caller starts a new trace and drops `tracestate`
//! (see [`crate::propagation::extract`]).

use std::fmt;

use rand::{RngCore, SeedableRng, rngs::SmallRng};

/// Length of a version-00 `traceparent` / `traceresponse` value.
pub const TRACEPARENT_LEN: usize = 55;

/// Why a `traceparent` value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TraceparentError {
    /// Wrong length for the version (00 needs exactly 55 bytes; others at least 55).
    #[error("traceparent has length {0}, expected 55")]
    Length(usize),
    /// The version field is not two lowercase hex digits.
    #[error("traceparent version is not two lowercase hex digits")]
    Version,
    /// Version `ff` is forbidden by the specification.
    #[error("traceparent version ff is invalid")]
    ForbiddenVersion,
    /// A `-` separator is missing (or, for a future version, byte 55 is not `-`).
    #[error("traceparent separator missing at byte {0}")]
    Separator(usize),
    /// The trace id is not 32 lowercase hex digits.
    #[error("traceparent trace-id is not 32 lowercase hex digits")]
    TraceId,
    /// The parent id is not 16 lowercase hex digits.
    #[error("traceparent parent-id is not 16 lowercase hex digits")]
    SpanId,
    /// The flags are not two lowercase hex digits.
    #[error("traceparent trace-flags is not two lowercase hex digits")]
    Flags,
    /// The trace id is all zeros.
    #[error("traceparent trace-id is all zeros")]
    ZeroTraceId,
    /// The parent id is all zeros.
    #[error("traceparent parent-id is all zeros")]
    ZeroSpanId,
}

/// One position in a trace: the ids and flags carried by `traceparent`
/// (where `span_id` is the *parent* id) or by `traceresponse`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// 16-byte trace id, never all zeros.
    pub trace_id: [u8; 16],
    /// 8-byte span id, never all zeros.
    pub span_id: [u8; 8],
    /// Trace flags; only the bits the gateway understands ([`FLAG_SAMPLED`],
    /// [`FLAG_RANDOM`]) are kept, as the specification asks of propagators.
    ///
    /// [`FLAG_SAMPLED`]: TraceContext::FLAG_SAMPLED
    /// [`FLAG_RANDOM`]: TraceContext::FLAG_RANDOM
    pub flags: u8,
}

impl TraceContext {
    /// Level 1 `sampled` flag: the caller may have recorded this trace.
    pub const FLAG_SAMPLED: u8 = 0x01;
    /// Level 2 `random` flag: the right-most 7 bytes of the trace id are random.
    pub const FLAG_RANDOM: u8 = 0x02;
    const KNOWN_FLAGS: u8 = Self::FLAG_SAMPLED | Self::FLAG_RANDOM;

    /// Parses a `traceparent` header value strictly (see the module docs).
    pub fn parse(value: &[u8]) -> Result<Self, TraceparentError> {
        if value.len() < TRACEPARENT_LEN {
            return Err(TraceparentError::Length(value.len()));
        }
        let version = hex_u8(value[0], value[1]).ok_or(TraceparentError::Version)?;
        if version == 0xff {
            return Err(TraceparentError::ForbiddenVersion);
        }
        if version == 0 {
            if value.len() != TRACEPARENT_LEN {
                return Err(TraceparentError::Length(value.len()));
            }
        } else if value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-' {
            return Err(TraceparentError::Separator(TRACEPARENT_LEN));
        }
        for at in [2, 35, 52] {
            if value[at] != b'-' {
                return Err(TraceparentError::Separator(at));
            }
        }
        let mut trace_id = [0u8; 16];
        decode_hex(&value[3..35], &mut trace_id).ok_or(TraceparentError::TraceId)?;
        let mut span_id = [0u8; 8];
        decode_hex(&value[36..52], &mut span_id).ok_or(TraceparentError::SpanId)?;
        let flags = hex_u8(value[53], value[54]).ok_or(TraceparentError::Flags)?;
        if trace_id == [0; 16] {
            return Err(TraceparentError::ZeroTraceId);
        }
        if span_id == [0; 8] {
            return Err(TraceparentError::ZeroSpanId);
        }
        Ok(Self {
            trace_id,
            span_id,
            flags: flags & Self::KNOWN_FLAGS,
        })
    }

    /// Starts a new trace: random trace and span ids, the `random` flag set,
    /// and `sampled` as given.
    pub fn new_root(sampled: bool) -> Self {
        with_rng(|rng| {
            // Whole words: `random::<[u8; N]>()` draws a word per byte.
            let mut trace_id = [0u8; 16];
            trace_id[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
            trace_id[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
            if trace_id == [0; 16] {
                trace_id[15] = 1;
            }
            Self {
                trace_id,
                span_id: nonzero_span_id(rng),
                flags: Self::FLAG_RANDOM | if sampled { Self::FLAG_SAMPLED } else { 0 },
            }
        })
    }

    /// A new span in the same trace (same trace id and flags, fresh span id).
    pub fn child(&self) -> Self {
        Self {
            trace_id: self.trace_id,
            span_id: with_rng(nonzero_span_id),
            flags: self.flags,
        }
    }

    /// The same ids with the `sampled` flag set or cleared.
    pub fn with_sampled(mut self, sampled: bool) -> Self {
        if sampled {
            self.flags |= Self::FLAG_SAMPLED;
        } else {
            self.flags &= !Self::FLAG_SAMPLED;
        }
        self
    }

    /// Whether the `sampled` flag is set.
    pub fn is_sampled(&self) -> bool {
        self.flags & Self::FLAG_SAMPLED != 0
    }

    /// Formats as a version-00 `traceparent` (or `traceresponse`) value into a
    /// stack buffer; always valid ASCII.
    pub fn encode(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [b'-'; TRACEPARENT_LEN];
        out[0] = b'0';
        out[1] = b'0';
        gateway_hex::encode_to_slice(&self.trace_id, &mut out[3..35]);
        gateway_hex::encode_to_slice(&self.span_id, &mut out[36..52]);
        gateway_hex::encode_to_slice(&[self.flags], &mut out[53..55]);
        out
    }

    /// The value as an [`http::HeaderValue`] (for `traceparent` on an
    /// outgoing request or `traceresponse` on a response).
    pub fn to_header_value(&self) -> http::HeaderValue {
        let buf = self.encode();
        // The buffer is hex digits and dashes only, which is always a valid header value.
        http::HeaderValue::from_bytes(&buf)
            .unwrap_or_else(|_| unreachable!("hex is a valid header"))
    }

    /// The trace id as 32 lowercase hex digits, formatted lazily (no allocation).
    pub fn trace_id_hex(&self) -> TraceIdHex {
        TraceIdHex(self.trace_id)
    }

    /// The span id as 16 lowercase hex digits, formatted lazily (no allocation).
    pub fn span_id_hex(&self) -> SpanIdHex {
        SpanIdHex(self.span_id)
    }
}

impl fmt::Display for TraceContext {
    /// Writes the version-00 `traceparent` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let buf = self.encode();
        f.write_str(ascii(&buf))
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceContext({self})")
    }
}

impl std::str::FromStr for TraceContext {
    type Err = TraceparentError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s.as_bytes())
    }
}

/// A trace id that displays as 32 lowercase hex digits (for log fields).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceIdHex(pub [u8; 16]);

impl fmt::Display for TraceIdHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 32];
        gateway_hex::encode_to_slice(&self.0, &mut buf);
        f.write_str(ascii(&buf))
    }
}

impl fmt::Debug for TraceIdHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A span id that displays as 16 lowercase hex digits (for log fields).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanIdHex(pub [u8; 8]);

impl fmt::Display for SpanIdHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 16];
        gateway_hex::encode_to_slice(&self.0, &mut buf);
        f.write_str(ascii(&buf))
    }
}

impl fmt::Debug for SpanIdHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Random 8-byte id that is never all zeros (used for span ids).
pub fn random_span_id() -> [u8; 8] {
    with_rng(nonzero_span_id)
}

fn nonzero_span_id(rng: &mut SmallRng) -> [u8; 8] {
    loop {
        let id = rng.next_u64().to_le_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

thread_local! {
    // A per-thread non-cryptographic generator: ids must be unique, not secret,
    // and this costs a few nanoseconds instead of ThreadRng's ChaCha block refills.
    static RNG: std::cell::RefCell<SmallRng> = std::cell::RefCell::new(SmallRng::from_rng(&mut rand::rng()));
}

fn with_rng<T>(f: impl FnOnce(&mut SmallRng) -> T) -> T {
    RNG.with(|rng| f(&mut rng.borrow_mut()))
}

/// Decodes lowercase hex into `out`; `None` on any other byte (W3C trace
/// context allows no upper case, so this is not `gateway_hex::decode_to_slice`).
fn decode_hex(hex: &[u8], out: &mut [u8]) -> Option<()> {
    for (pair, byte) in hex.chunks_exact(2).zip(out.iter_mut()) {
        *byte = hex_u8(pair[0], pair[1])?;
    }
    Some(())
}

fn hex_u8(hi: u8, lo: u8) -> Option<u8> {
    Some(nibble(hi)? << 4 | nibble(lo)?)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn ascii(buf: &[u8]) -> &str {
    // Only ever called on buffers filled by `encode_hex` and dashes.
    std::str::from_utf8(buf).unwrap_or_else(|_| unreachable!("hex output is ASCII"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_spec_example() {
        let ctx = TraceContext::parse(VALID.as_bytes()).unwrap();
        assert_eq!(
            ctx.trace_id_hex().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(ctx.span_id_hex().to_string(), "00f067aa0ba902b7");
        assert_eq!(ctx.flags, 0x01);
        assert!(ctx.is_sampled());
        assert_eq!(ctx.to_string(), VALID);
        assert_eq!(ctx.to_header_value(), VALID);
    }

    #[test]
    fn table() {
        use TraceparentError::*;
        let long_future = format!("{}-what-the-future-holds", VALID.replacen("00", "cc", 1));
        let cases: &[(&str, &str, Result<u8, TraceparentError>)] = &[
            ("valid sampled", VALID, Ok(0x01)),
            (
                "valid unsampled",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                Ok(0x00),
            ),
            (
                "level 2 random flag kept",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03",
                Ok(0x03),
            ),
            (
                "unknown flag bits dropped",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff",
                Ok(0x03),
            ),
            (
                "future version, exact length",
                "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Ok(0x01),
            ),
            (
                "future version, extra fields",
                long_future.as_str(),
                Ok(0x01),
            ),
            (
                "future version, extra data without dash",
                "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                Err(Separator(55)),
            ),
            (
                "future version, too short",
                "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                Err(Length(54)),
            ),
            (
                "version 00 with trailing data",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                Err(Length(61)),
            ),
            ("empty", "", Err(Length(0))),
            (
                "too short",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
                Err(Length(54)),
            ),
            (
                "version ff",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Err(ForbiddenVersion),
            ),
            (
                "version not hex",
                "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Err(Version),
            ),
            (
                "version upper case",
                "AA-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Err(Version),
            ),
            (
                "upper-case trace id",
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                Err(TraceId),
            ),
            (
                "upper-case span id",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
                Err(SpanId),
            ),
            (
                "non-hex trace id",
                "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",
                Err(TraceId),
            ),
            (
                "non-hex flags",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
                Err(Flags),
            ),
            (
                "upper-case flags",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
                Err(Flags),
            ),
            (
                "zero trace id",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                Err(ZeroTraceId),
            ),
            (
                "zero span id",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                Err(ZeroSpanId),
            ),
            (
                "wrong separator after version",
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Err(Separator(2)),
            ),
            (
                "wrong separator after trace id",
                "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
                Err(Separator(35)),
            ),
            (
                "wrong separator before flags",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7.01",
                Err(Separator(52)),
            ),
            (
                "shifted fields",
                "00-4bf92f3577b34da6a3ce929d0e0e47360-0f067aa0ba902b7-01",
                Err(Separator(35)),
            ),
            (
                "leading space",
                " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Err(Version),
            ),
        ];
        for (name, input, want) in cases {
            let got = TraceContext::parse(input.as_bytes()).map(|c| c.flags);
            assert_eq!(&got, want, "case {name:?}: {input:?}");
        }
    }

    #[test]
    fn future_version_is_reformatted_as_version_00() {
        let ctx =
            TraceContext::parse(b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-zz")
                .unwrap();
        assert_eq!(ctx.to_string(), VALID);
    }

    #[test]
    fn new_roots_are_random_valid_and_flagged() {
        let a = TraceContext::new_root(true);
        let b = TraceContext::new_root(false);
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.span_id, b.span_id);
        assert_eq!(
            a.flags,
            TraceContext::FLAG_RANDOM | TraceContext::FLAG_SAMPLED
        );
        assert_eq!(b.flags, TraceContext::FLAG_RANDOM);
        for ctx in [a, b] {
            assert_eq!(TraceContext::parse(&ctx.encode()), Ok(ctx));
        }
        let child = a.child();
        assert_eq!(child.trace_id, a.trace_id);
        assert_eq!(child.flags, a.flags);
        assert_ne!(child.span_id, a.span_id);
        assert!(!a.with_sampled(false).is_sampled());
        assert!(b.with_sampled(true).is_sampled());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = TraceContext::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_on_near_valid_input(
            s in "[0-9a-fA-F]{2}-[0-9a-fxX]{32}-[0-9a-fA-F]{16}-[0-9a-f]{2}(-[ -~]{0,8})?"
        ) {
            if let Ok(ctx) = TraceContext::parse(s.as_bytes()) {
                // Whatever parses re-encodes to a canonical value that parses to the same context.
                prop_assert_eq!(TraceContext::parse(&ctx.encode()), Ok(ctx));
            }
        }

        #[test]
        fn format_then_parse_round_trips(
            trace_id in any::<[u8; 16]>().prop_filter("non-zero", |id| *id != [0; 16]),
            span_id in any::<[u8; 8]>().prop_filter("non-zero", |id| *id != [0; 8]),
            flags in 0u8..4,
        ) {
            let ctx = TraceContext { trace_id, span_id, flags };
            let encoded = ctx.encode();
            prop_assert_eq!(TraceContext::parse(&encoded), Ok(ctx));
            let text = ctx.to_string();
            prop_assert_eq!(text.as_bytes(), &encoded[..]);
        }
    }
}
