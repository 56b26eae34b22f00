//! Request path normalisation (docs/data-plane.md, "Sanitise").
//!
//! The gateway routes on, and forwards, one canonical form of the path, so the
//! upstream can never see a path that the router did not see. The rules:
//!
//! * percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded,
//!   every other escape is kept with upper-case hex (`%3a` → `%3A`);
//! * `%2F` (`/`), `%5C` (`\`), `%00` and a literal `\`, NUL or control byte are refused:
//!   proxies and servers disagree about them, which is how path confusion attacks work;
//! * a `;`, literal or `%3B`, is refused: Tomcat, Jetty and Spring cut "path
//!   parameters" (`;jsessionid=...`) out of each segment before resolving dot-segments,
//!   so `/open/orders/..;/admin` is `/open/admin` to them while the router saw a
//!   segment named `..;` under `/open/orders` (and `/a/admin;x` is `/a/admin` to them but
//!   not to the router's whole-segment prefixes). `%3B` goes too because a proxy in front
//!   of such a backend (nginx with a URI in `proxy_pass`) decodes it into a `;`;
//! * `%25` followed by two hex digits (`%252e`, `%255c`, `%252f`, `%2525`...) is refused:
//!   it is an escape after one more decoding, and backends or frameworks that decode twice
//!   would see a dot-segment, backslash or slash the router never saw. A `%25` not
//!   followed by two hex digits (`/100%25`, `/50%25off`) is ordinary data and kept;
//! * runs of `/` collapse to one and `.` segments disappear;
//! * `..` removes the previous segment; one that would climb above the root is refused;
//! * a dot-segment spelled with escapes (`%2e%2e`, `.%2E`) is refused: no legitimate
//!   client encodes those, and encoded dot-segments are the classic way to slip a
//!   traversal past one component and have another resolve it;
//! * a trailing `/` is kept (it is meaningful to many upstreams), the query is not touched.
//!
//! The common case, a path that is already canonical, costs one byte scan and no allocation.

use std::borrow::Cow;

use gateway_hex::nibble as hex_value;

/// Why a path cannot be normalised safely. Every variant becomes a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NormalizeError {
    /// The path is not in origin form (does not start with `/`).
    #[error("the request path must start with \"/\"")]
    NotOriginForm,
    /// `%2F` would turn into a segment separator after decoding.
    #[error("the request path contains an encoded slash (%2F)")]
    EncodedSlash,
    /// A backslash, literal or `%5C`.
    #[error("the request path contains a backslash")]
    Backslash,
    /// NUL or another control character, literal or encoded as `%00`.
    #[error("the request path contains a NUL or control character")]
    ControlCharacter,
    /// A `%` not followed by two hex digits.
    #[error("the request path contains a malformed percent-escape")]
    BadEscape,
    /// A `.` or `..` segment written with percent-escapes.
    #[error("the request path contains an encoded dot-segment")]
    EncodedDotSegment,
    /// A `..` segment that would climb above the root.
    #[error("the request path climbs above the root with \"..\"")]
    EscapesRoot,
    /// A `;` (path parameters), literal or `%3B`.
    #[error("the request path contains a ';' (path parameters are not accepted)")]
    Semicolon,
    /// `%25` followed by two hex digits: an escape once decoded again.
    #[error("the request path contains a double-encoded escape (%25 followed by two hex digits)")]
    DoubleEncoded,
}

/// True for RFC 3986 unreserved characters, whose escapes are decoded.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Normalises a request path (without its query). Returns the input unchanged,
/// borrowed, when it is already canonical.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, NormalizeError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(NormalizeError::NotOriginForm);
    }
    if is_canonical(bytes)? {
        return Ok(Cow::Borrowed(path));
    }
    normalize_slow(bytes).map(Cow::Owned)
}

/// One scan: refuses forbidden literal bytes and reports whether any rewriting is needed
/// (an escape, an empty segment, or a `.`/`..` segment).
fn is_canonical(bytes: &[u8]) -> Result<bool, NormalizeError> {
    let mut canonical = true;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\\' => return Err(NormalizeError::Backslash),
            b';' => return Err(NormalizeError::Semicolon),
            0..=0x1f | 0x7f => return Err(NormalizeError::ControlCharacter),
            b'%' => canonical = false,
            b'/' if i > 0 && bytes[i - 1] == b'/' => canonical = false,
            b'.' if bytes[i - 1] == b'/' => {
                // "/." or "/.." followed by "/" or the end is a dot-segment.
                let rest = &bytes[i + 1..];
                let dots = matches!(rest, [] | [b'/', ..] | [b'.'] | [b'.', b'/', ..]);
                if dots {
                    canonical = false;
                }
            }
            _ => {}
        }
    }
    Ok(canonical)
}

fn normalize_slow(bytes: &[u8]) -> Result<String, NormalizeError> {
    // `out` holds "/seg/seg" (no trailing slash while building); empty means the root.
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut trailing_slash = false;
    let segments = bytes[1..].split(|&b| b == b'/');
    let count = bytes[1..].iter().filter(|&&b| b == b'/').count() + 1;
    for (n, raw) in segments.enumerate() {
        let last = n + 1 == count;
        if raw.is_empty() {
            // Duplicate slashes collapse; an empty last segment is a trailing slash.
            trailing_slash = last;
            continue;
        }
        let start = out.len();
        out.push(b'/');
        let encoded_dot = decode_segment(raw, &mut out)?;
        let seg = &out[start + 1..];
        // Checked on the decoded segment: `%25%32%65` becomes `%252e` here.
        if is_double_encoded(seg) {
            return Err(NormalizeError::DoubleEncoded);
        }
        let (is_dot, is_dotdot) = (seg == b".", seg == b"..");
        if (is_dot || is_dotdot) && encoded_dot {
            return Err(NormalizeError::EncodedDotSegment);
        }
        if is_dot {
            out.truncate(start);
            trailing_slash = last;
        } else if is_dotdot {
            out.truncate(start);
            if out.is_empty() {
                return Err(NormalizeError::EscapesRoot);
            }
            let parent = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
            out.truncate(parent);
            trailing_slash = last;
        } else {
            trailing_slash = false;
        }
    }
    if out.is_empty() || trailing_slash {
        out.push(b'/');
    }
    // Only ASCII was written: escapes of non-ASCII bytes stay escaped.
    Ok(String::from_utf8(out).expect("normalised path is ASCII"))
}

/// True when `seg` holds `%25` followed by two hex digits.
fn is_double_encoded(seg: &[u8]) -> bool {
    seg.windows(5)
        .any(|w| w.starts_with(b"%25") && hex_value(w[3]).is_some() && hex_value(w[4]).is_some())
}

/// Appends one segment to `out`, decoding escapes of unreserved characters.
/// Returns whether a `.` came from an escape (to detect encoded dot-segments).
fn decode_segment(raw: &[u8], out: &mut Vec<u8>) -> Result<bool, NormalizeError> {
    let mut encoded_dot = false;
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            raw.get(i + 1).copied().and_then(hex_value),
            raw.get(i + 2).copied().and_then(hex_value),
        ) else {
            return Err(NormalizeError::BadEscape);
        };
        let decoded = hi << 4 | lo;
        match decoded {
            b'/' => return Err(NormalizeError::EncodedSlash),
            b'\\' => return Err(NormalizeError::Backslash),
            b';' => return Err(NormalizeError::Semicolon),
            0..=0x1f | 0x7f => return Err(NormalizeError::ControlCharacter),
            d if is_unreserved(d) => {
                encoded_dot |= d == b'.';
                out.push(d);
            }
            _ => out.extend_from_slice(&[b'%', HEX_UPPER[hi as usize], HEX_UPPER[lo as usize]]),
        }
        i += 3;
    }
    Ok(encoded_dot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use NormalizeError::*;
        let cases: &[(&str, Result<&str, NormalizeError>)] = &[
            // already canonical: borrowed, unchanged
            ("/", Ok("/")),
            ("/api/orders/7", Ok("/api/orders/7")),
            ("/api/orders/", Ok("/api/orders/")),
            ("/a.b/c..d/.e/..f", Ok("/a.b/c..d/.e/..f")),
            // duplicate slashes
            ("//", Ok("/")),
            ("/api//orders///7", Ok("/api/orders/7")),
            ("/api/orders//", Ok("/api/orders/")),
            // safe dot segments
            ("/api/./orders", Ok("/api/orders")),
            ("/api/x/../orders", Ok("/api/orders")),
            ("/api/orders/.", Ok("/api/orders/")),
            ("/api/orders/..", Ok("/api/")),
            ("/a/..", Ok("/")),
            ("/.", Ok("/")),
            ("/a/b/../../c", Ok("/c")),
            // unreserved escapes decoded, others kept upper-case
            ("/%61pi/%7Euser", Ok("/api/~user")),
            ("/file%2etxt", Ok("/file.txt")),
            ("/a%3ab", Ok("/a%3Ab")),
            ("/caf%c3%a9", Ok("/caf%C3%A9")),
            ("/a%20b", Ok("/a%20b")),
            // refused
            ("", Err(NotOriginForm)),
            ("*", Err(NotOriginForm)),
            ("api", Err(NotOriginForm)),
            ("/a%2Fb", Err(EncodedSlash)),
            ("/a%2fb", Err(EncodedSlash)),
            ("/a%5Cb", Err(Backslash)),
            ("/a%5cb", Err(Backslash)),
            ("/a\\b", Err(Backslash)),
            ("/a%00b", Err(ControlCharacter)),
            ("/a\0b", Err(ControlCharacter)),
            ("/a%0Ab", Err(ControlCharacter)),
            ("/a%zzb", Err(BadEscape)),
            ("/a%2", Err(BadEscape)),
            ("/..", Err(EscapesRoot)),
            ("/../x", Err(EscapesRoot)),
            ("/a/../../x", Err(EscapesRoot)),
            ("/a/./../../x", Err(EscapesRoot)),
            ("/%2e%2e/x", Err(EncodedDotSegment)),
            ("/api/%2e%2e/x", Err(EncodedDotSegment)),
            ("/api/.%2E/x", Err(EncodedDotSegment)),
            ("/api/%2E./x", Err(EncodedDotSegment)),
            ("/api/%2e/x", Err(EncodedDotSegment)),
            (
                "/api/orders/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                Err(EncodedDotSegment),
            ),
            // path parameters, literal or encoded, anywhere in a segment
            ("/open/orders/..;/admin", Err(Semicolon)),
            ("/open/orders/.;/admin", Err(Semicolon)),
            ("/open/orders;x/admin", Err(Semicolon)),
            ("/open/orders/7;jsessionid=abc", Err(Semicolon)),
            ("/;", Err(Semicolon)),
            ("/open/orders/..%3B/admin", Err(Semicolon)),
            ("/open/orders/..%3b/admin", Err(Semicolon)),
            ("/a//;/b", Err(Semicolon)),
            // double encoding: %25 and two hex digits, whatever they decode to
            ("/open/%252e%252e/admin", Err(DoubleEncoded)),
            ("/open/%252E%252E/admin", Err(DoubleEncoded)),
            ("/open/a%252fb", Err(DoubleEncoded)),
            ("/open/a%255cb", Err(DoubleEncoded)),
            ("/open/a%2541", Err(DoubleEncoded)),
            ("/open/a%252525", Err(DoubleEncoded)),
            ("/open/a%25%32%65", Err(DoubleEncoded)),
            ("/open/a%25%34%31/b", Err(DoubleEncoded)),
            // a %25 that is not followed by two hex digits is data
            ("/open/100%25", Ok("/open/100%25")),
            ("/open/50%25off", Ok("/open/50%25off")),
            ("/open/a%25a", Ok("/open/a%25a")),
            ("/open/a%25a/", Ok("/open/a%25a/")),
            ("/open/%25%20", Ok("/open/%25%20")),
            // other reserved escapes stay escaped
            ("/open/a%3Fb%23c", Ok("/open/a%3Fb%23c")),
        ];
        for (input, want) in cases {
            let got = normalize_path(input);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(&g, w, "input {input:?}"),
                (Err(g), Err(w)) => assert_eq!(g, *w, "input {input:?}"),
                (g, w) => panic!("input {input:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        assert!(matches!(
            normalize_path("/api/orders/7"),
            Ok(Cow::Borrowed(_))
        ));
        assert!(matches!(normalize_path("/api//orders"), Ok(Cow::Owned(_))));
    }

    #[test]
    fn normalising_is_idempotent() {
        for p in ["/a//b/./c/../d/", "/%61%2e%41", "/x/%3a/..", "/caf%c3%a9//"] {
            let once = normalize_path(p).unwrap().into_owned();
            let twice = normalize_path(&once).unwrap();
            assert_eq!(once, twice, "{p}");
        }
    }
}
