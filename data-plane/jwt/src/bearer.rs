//! Extracting a bearer token from `Authorization` (RFC 6750 §2.1).

use http::HeaderMap;
use http::header::AUTHORIZATION;

/// The token of a single `Authorization: Bearer <token>` header, or `None` when the header is
/// absent, repeated, not `Bearer`, empty, or contains characters a token cannot have.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        // Two Authorization headers: ambiguous, refuse rather than pick one.
        return None;
    }
    let value = value.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_matches(' ');
    // b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
    let valid = !token.is_empty()
        && token.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
        });
    valid.then_some(token)
}

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
        ];
        for (values, want) in cases {
            assert_eq!(bearer_token(&headers(values)), *want, "{values:?}");
        }
    }
}
