//! The harnesses of the fuzz targets in `fuzz/` (run by `scripts/fuzz`), and of
//! their regression test (`tests/fuzz_regressions.rs`, which replays every
//! saved input on stable Rust). Each takes arbitrary bytes, runs a parser of
//! the data plane on them and asserts what must hold of its answer; a panic is
//! a finding. Not part of the data plane's API.
//!
//! * [`h1_request`] and [`h1_response`]: the transport's HTTP/1.1 parsers,
//!   and [`proxy_header`]: its PROXY v2 header parser
//!   (`gateway_transport::fuzzing`, re-exported here);
//! * [`normalize_path`]: [`crate::policy::normalize`];
//! * [`config`]: a prost-decoded snapshot through the validation the control
//!   plane applies, and into the data plane's compiler.
//!
//! `gateway_telemetry::fuzzing` and `gateway_jwt::fuzzing` hold the other two.

use std::borrow::Cow;

use prost::Message as _;

pub use gateway_transport::fuzzing::{h1_request, h1_response, proxy_header};

/// Runs the path normaliser on `data` (as UTF-8).
///
/// Holds, of every path it accepts: the answer is the input when it comes
/// back borrowed; it starts with `/`, has no empty, `.` or `..` segment, no
/// backslash or control byte, and only upper-case escapes of bytes that are
/// not unreserved, `/`, `\` or control; a trailing `/` stays; normalising it
/// again gives it back (borrowed when it has no escape: the fast path
/// agrees); and it is what
/// resolving the input's dot-segments by RFC 3986 gives (without `;`, whose
/// treatment is the normaliser's own choice).
pub fn normalize_path(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(out) = crate::policy::normalize::normalize_path(path) else {
        return;
    };
    if let Cow::Borrowed(same) = out {
        assert_eq!(same, path, "borrowed means unchanged");
    }
    let out = out.as_ref();
    assert!(out.starts_with('/'));
    assert!(!out.contains("//"), "no empty segment in {out:?}");
    for segment in out.split('/').skip(1) {
        assert!(
            segment != "." && segment != "..",
            "a dot-segment in {out:?}"
        );
    }
    assert!(!out.contains('\\') && !out.bytes().any(|b| b < 0x20 || b == 0x7f));
    let bytes = out.as_bytes();
    for (i, _) in out.match_indices('%') {
        let escape = bytes.get(i + 1..i + 3).expect("two hex digits");
        assert!(
            escape
                .iter()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b)),
            "upper-case hex in {out:?}"
        );
        let byte = u8::from_str_radix(std::str::from_utf8(escape).expect("hex"), 16).expect("hex");
        assert!(
            !(byte.is_ascii_alphanumeric()
                || b"-._~/\\".contains(&byte)
                || byte < 0x20
                || byte == 0x7f),
            "%{byte:02X} is decoded or refused, never kept, in {out:?}"
        );
    }
    if path.ends_with('/') {
        assert!(
            out.ends_with('/'),
            "a trailing slash stays: {path:?} -> {out:?}"
        );
    }
    match crate::policy::normalize::normalize_path(out) {
        // Any escape takes the slow path, which allocates.
        Ok(Cow::Owned(again)) if out.contains('%') => assert_eq!(again, out),
        Ok(Cow::Borrowed(again)) => assert_eq!(again, out),
        other => panic!("{out:?} normalised again: {other:?}"),
    }
    if !path.contains(';') {
        assert_eq!(Some(out), resolved(path).as_deref(), "{path:?}");
    }
}

/// RFC 3986 §5.2.4 dot-segment removal on `path`, with unreserved escapes
/// decoded, other escapes upper-cased, and empty segments dropped (the
/// gateway's choice); `None` when `..` climbs above the root.
fn resolved(path: &str) -> Option<String> {
    let mut segments: Vec<String> = Vec::new();
    let raw: Vec<&str> = path[1..].split('/').collect();
    let mut trailing = false;
    for (i, segment) in raw.iter().enumerate() {
        let last = i + 1 == raw.len();
        let mut decoded = String::new();
        let mut bytes = segment.bytes();
        while let Some(b) = bytes.next() {
            if b != b'%' {
                decoded.push(char::from(b));
                continue;
            }
            let hex: String = bytes.by_ref().take(2).map(char::from).collect();
            let byte = u8::from_str_radix(&hex, 16).ok()?;
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                decoded.push(char::from(byte));
            } else {
                decoded.push_str(&format!("%{byte:02X}"));
            }
        }
        match decoded.as_str() {
            "" => trailing = last,
            "." => trailing = last,
            ".." => {
                segments.pop()?;
                trailing = last;
            }
            _ => {
                // Non-ASCII bytes were pushed one `char` each: put the UTF-8 back.
                let bytes: Vec<u8> = decoded.chars().map(|c| c as u8).collect();
                segments.push(String::from_utf8(bytes).ok()?);
                trailing = false;
            }
        }
    }
    let mut out = String::new();
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    Some(out)
}

/// Decodes `data` as a `ConfigSnapshot` (what `ApplyConfig` and the config
/// stream carry) and validates it as the control plane does before a commit.
///
/// Holds: a refusal names at least one problem; the content hash never
/// fails; and a configuration that validates compiles in a data plane
/// (`validate_config`'s promise), while one that does not is refused there too.
pub fn config(data: &[u8]) {
    let Ok(snapshot) = gateway_proto::v1::ConfigSnapshot::decode(data) else {
        return;
    };
    let routes = gateway_proto::validate_config(&snapshot.routes, &snapshot.upstreams).map(drop);
    let keys = gateway_proto::validate::validate_api_keys(&snapshot.api_keys);
    let certificates =
        gateway_proto::validate::validate_certificates(&snapshot.certificates).map(drop);
    // Every check the data plane's compile makes, client certificates and JWT
    // issuers included (an empty `JwtIssuer` once passed the three above).
    let client_certificates = gateway_proto::validate::validate_client_certificates(
        &snapshot.upstreams,
        &snapshot.certificates,
    );
    let jwt_issuers =
        gateway_proto::validate::validate_jwt_issuers(&snapshot.jwt_issuers, &snapshot.routes);
    for refused in [
        &routes,
        &keys,
        &certificates,
        &client_certificates,
        &jwt_issuers,
    ] {
        if let Err(e) = refused {
            assert!(!e.problems.is_empty(), "a refusal says why");
        }
    }
    let key = gateway_proto::hash::HashKey::from_bytes([7; gateway_proto::hash::HASH_KEY_LEN]);
    let hash = gateway_proto::config_hash(
        &snapshot.routes,
        &snapshot.upstreams,
        &snapshot.api_keys,
        &snapshot.certificates,
        &key,
    );
    assert!(!hash.is_empty());
    let compiled = crate::config::compile(
        &snapshot,
        &crate::config::Compiled::default(),
        gateway_transport::pool::PoolSettings::default(),
    );
    let valid = routes.is_ok()
        && keys.is_ok()
        && certificates.is_ok()
        && client_certificates.is_ok()
        && jwt_issuers.is_ok();
    match (valid, compiled) {
        (true, Err(e)) => panic!("a validated configuration does not compile: {e}"),
        (false, Ok(_)) => panic!("an invalid configuration compiles"),
        _ => {}
    }
}
