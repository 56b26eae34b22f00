//! Extracting a bearer token from `Authorization` (RFC 6750 §2.1).

use http::HeaderMap;
use http::header::AUTHORIZATION;

/// The token of a single `Authorization: Bearer <token>` header, or `None` when the header is
/// absent, repeated, not `Bearer`, empty, or contains characters a token cannot have.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    bearer_candidate(headers).filter(|t| is_b64token(t))
}

/// [`bearer_token`] without the character check: what stands after `Bearer ` in a
/// single `Authorization` header, trimmed and not empty. For a caller that looks
/// the token up among verified ones first (a hit needs no check) and calls
/// [`is_b64token`] before verifying anything new.
pub fn bearer_candidate(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        // Two Authorization headers: ambiguous, refuse rather than pick one.
        return None;
    }
    let value = value.as_bytes();
    let space = value.iter().position(|&b| b == b' ')?;
    if !value[..space].eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let rest = &value[space + 1..];
    let start = rest.iter().position(|&b| b != b' ')?;
    let end = rest.iter().rposition(|&b| b != b' ')? + 1;
    // A header value's bytes are not always UTF-8 (obs-text): such a value is no token.
    std::str::from_utf8(&rest[start..end]).ok()
}

/// True when `token` is a b64token (RFC 6750 §2.1):
/// `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="` (the `=`
/// placement is left to the JWT decoder). One table load per byte.
pub fn is_b64token(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| B64TOKEN[usize::from(b)])
}

/// The bytes a b64token may hold (RFC 6750 §2.1).
static B64TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        table[i] = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=');
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn bearer_token_table() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&[], None),
            (&["Bearer abc.def.ghi"], Some("abc.def.ghi")),
            (&["bearer abc"], Some("abc")),
            (&["BEARER  abc  "], Some("abc")),
            (&["Basic dXNlcjpwdw=="], None),
            (&["Bearer"], None),
            (&["Bearer "], None),
            (&["Bearerabc"], None),
            (&["Bearer a b"], None),
            (&["Bearer a\"b"], None),
            (&["Bearer abc", "Bearer def"], None),
            (&["Bearer abc\t"], None),
            (&["Bearer\tabc"], None),
            (&["Bearer a~b+c/d=="], Some("a~b+c/d==")),
        ];
        for (values, want) in cases {
            assert_eq!(bearer_token(&headers(values)), *want, "{values:?}");
        }
        // Bytes beyond ASCII (obs-text) are never part of a token.
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_bytes(b"Bearer ab\xffc").unwrap(),
        );
        assert_eq!(bearer_token(&h), None);
    }
}
