//! Hex for the whole workspace: trace and request ids on every proxied
//! request, SHA-256 digests in configuration and credentials, random tokens.
//!
//! The encoder writes four bytes at a time in one 64-bit word (no table, no
//! branch per digit); a digit at a time cost about 200 more instructions per
//! `traceparent`, and every proxied request writes two of them (callgrind,
//! BENCHMARKS.md). Output is always lower case; the decoder takes either case.

/// Writes `bytes` as lower-case hex into `out`, two digits per byte, four
/// bytes at a time.
///
/// # Panics
/// When `out.len() != 2 * bytes.len()` (a caller's sizing bug).
///
/// ```
/// let mut out = [0u8; 8];
/// gateway_hex::encode_to_slice(&[0xde, 0xad, 0xbe, 0xef], &mut out);
/// assert_eq!(&out, b"deadbeef");
/// ```
#[inline]
pub fn encode_to_slice(bytes: &[u8], out: &mut [u8]) {
    assert_eq!(out.len(), 2 * bytes.len(), "hex output is twice the input");
    let mut quads = bytes.chunks_exact(4);
    let mut octets = out.chunks_exact_mut(8);
    for (quad, octet) in (&mut quads).zip(&mut octets) {
        octet.copy_from_slice(&hex_u32(u32::from_be_bytes([
            quad[0], quad[1], quad[2], quad[3],
        ])));
    }
    let rest = octets.into_remainder().chunks_exact_mut(2);
    for (byte, pair) in quads.remainder().iter().zip(rest) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

/// `bytes` as a lower-case hex string.
///
/// ```
/// assert_eq!(gateway_hex::encode([0x00, 0x7f, 0xff]), "007fff");
/// ```
pub fn encode(bytes: impl AsRef<[u8]>) -> String {
    let bytes = bytes.as_ref();
    let mut out = vec![0u8; 2 * bytes.len()];
    encode_to_slice(bytes, &mut out);
    // Every byte written is an ASCII digit or letter.
    out.into_iter().map(char::from).collect()
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `x` as 8 lower-case hex digits, computed in one 64-bit word: each nibble is
/// spread into a byte of its own (most significant first), then `'0'` is added
/// to every byte, and `'a' - '0' - 10` more to those above 9 (a nibble plus 6
/// carries into bit 4 exactly when it is above 9; no byte overflows).
#[inline]
fn hex_u32(x: u32) -> [u8; 8] {
    let mut x = u64::from(x);
    x = (x | x << 16) & 0x0000_ffff_0000_ffff;
    x = (x | x << 8) & 0x00ff_00ff_00ff_00ff;
    x = (x | x << 4) & 0x0f0f_0f0f_0f0f_0f0f;
    let above_nine = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (x + 0x3030_3030_3030_3030 + above_nine * u64::from(b'a' - b'0' - 10)).to_be_bytes()
}

/// Why hex text could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The text does not have two digits for every output byte.
    #[error("expected {expected} hex digits, got {got}")]
    Length {
        /// Twice the number of bytes wanted.
        expected: usize,
        /// The length of the text.
        got: usize,
    },
    /// A byte that is not a hex digit.
    #[error("not a hex digit at offset {index}")]
    Digit {
        /// Its offset in the text.
        index: usize,
    },
}

/// Decodes hex text (either case) into `out`, which it must fill exactly.
///
/// ```
/// let mut out = [0u8; 2];
/// gateway_hex::decode_to_slice("BEef", &mut out).unwrap();
/// assert_eq!(out, [0xbe, 0xef]);
/// assert!(gateway_hex::decode_to_slice("beefff", &mut out).is_err());
/// ```
pub fn decode_to_slice(hex: impl AsRef<[u8]>, out: &mut [u8]) -> Result<(), DecodeError> {
    let hex = hex.as_ref();
    if hex.len() != 2 * out.len() {
        return Err(DecodeError::Length {
            expected: 2 * out.len(),
            got: hex.len(),
        });
    }
    for (i, (pair, byte)) in hex.chunks_exact(2).zip(out.iter_mut()).enumerate() {
        let hi = nibble(pair[0]).ok_or(DecodeError::Digit { index: 2 * i })?;
        let lo = nibble(pair[1]).ok_or(DecodeError::Digit { index: 2 * i + 1 })?;
        *byte = hi << 4 | lo;
    }
    Ok(())
}

/// Decodes hex text (either case) of any even length.
pub fn decode(hex: impl AsRef<[u8]>) -> Result<Vec<u8>, DecodeError> {
    let hex = hex.as_ref();
    let mut out = vec![0u8; hex.len() / 2];
    if hex.len() % 2 != 0 {
        return Err(DecodeError::Length {
            expected: hex.len() + 1,
            got: hex.len(),
        });
    }
    decode_to_slice(hex, &mut out)?;
    Ok(out)
}

/// The value of one hex digit, either case (`None` for any other byte).
pub fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What `encode_to_slice` must write: `{:02x}` of every byte.
    fn reference(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn hex_of_every_byte_value_in_every_position() {
        for len in 1..=9 {
            for position in 0..len {
                for value in 0..=255u8 {
                    let mut bytes = vec![0x5a; len];
                    bytes[position] = value;
                    assert_eq!(encode(&bytes), reference(&bytes), "{bytes:?}");
                }
            }
        }
    }

    #[test]
    fn empty_input_is_empty_text() {
        assert_eq!(encode([]), "");
        assert_eq!(decode(""), Ok(Vec::new()));
    }

    #[test]
    #[should_panic(expected = "twice the input")]
    fn a_wrongly_sized_output_is_a_bug() {
        encode_to_slice(&[1, 2], &mut [0u8; 3]);
    }

    #[test]
    fn decoding_rejects_wrong_lengths_and_non_digits() {
        let mut out = [0u8; 2];
        assert_eq!(
            decode_to_slice("abc", &mut out),
            Err(DecodeError::Length {
                expected: 4,
                got: 3
            })
        );
        assert_eq!(
            decode_to_slice("ab0g", &mut out),
            Err(DecodeError::Digit { index: 3 })
        );
        assert_eq!(
            decode("0"),
            Err(DecodeError::Length {
                expected: 2,
                got: 1
            })
        );
        assert_eq!(decode("zz"), Err(DecodeError::Digit { index: 0 }));
        assert_eq!(decode("00FFaB"), Ok(vec![0x00, 0xff, 0xab]));
    }

    proptest! {
        #[test]
        fn encoding_matches_format(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            prop_assert_eq!(encode(&bytes), reference(&bytes));
        }

        #[test]
        fn decoding_inverts_encoding_in_either_case(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            prop_assert_eq!(decode(encode(&bytes)).unwrap(), bytes.clone());
            prop_assert_eq!(decode(encode(&bytes).to_uppercase()).unwrap(), bytes);
        }
    }
}
