#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::*;
use crate::response_head::from_head;

/// An upstream's fields kept as bytes (as the HTTP/1.1 client keeps them),
/// with an empty map for the gateway's.
fn upstream() -> Fields {
    Fields::upstream(
        HeaderMap::new(),
        Some(from_head(
            b"HTTP/1.1 200 OK\r\nX-Request-Id: up\r\nVary: Accept\r\nSet-Cookie: a=1\r\n\
Set-Cookie: b=2\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n",
        )),
    )
}

fn values<'a>(fields: &'a Fields, name: &'a str) -> Vec<&'a [u8]> {
    fields.get_all(name).collect()
}

#[test]
fn lookups_see_the_upstreams_fields_kept_as_bytes() {
    let fields = upstream();
    assert!(fields.kept_as_bytes());
    assert_eq!(fields.get("vary"), Some(&b"Accept"[..]));
    assert_eq!(fields.get_str("VARY"), Some("Accept"));
    assert_eq!(values(&fields, "set-cookie"), [&b"a=1"[..], b"b=2"]);
    assert!(fields.contains("content-length"));
    // Hop-by-hop fields are not forwarded, so not seen.
    assert!(!fields.contains("connection"));
    assert_eq!(fields.len(), 5);
}

#[test]
fn the_gateways_fields_replace_the_upstreams_of_the_same_name() {
    let mut fields = upstream();
    fields.insert(
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_static("gw"),
    );
    let mut limits = HeaderMap::new();
    limits.append("ratelimit-policy", HeaderValue::from_static("p1"));
    limits.append("ratelimit-policy", HeaderValue::from_static("p2"));
    limits.append("set-cookie", HeaderValue::from_static("c=3"));
    fields.extend(limits);
    // Still kept as bytes: nothing was copied into the map.
    assert!(fields.kept_as_bytes());
    assert_eq!(values(&fields, "x-request-id"), [&b"gw"[..]]);
    assert_eq!(values(&fields, "ratelimit-policy"), [&b"p1"[..], b"p2"]);
    assert_eq!(values(&fields, "set-cookie"), [&b"c=3"[..]]);
    assert_eq!(fields.get("vary"), Some(&b"Accept"[..]));
    // What the client gets: the upstream's not replaced, in their order and case, then the gateway's.
    let listed: Vec<(String, String)> = fields
        .iter()
        .map(|(n, v)| {
            (
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect();
    let expected = [
        ("Vary", "Accept"),
        ("Content-Length", "2"),
        ("x-request-id", "gw"),
        ("ratelimit-policy", "p1"),
        ("ratelimit-policy", "p2"),
        ("set-cookie", "c=3"),
    ]
    .map(|(n, v)| (n.to_owned(), v.to_owned()));
    assert_eq!(listed, expected);
}

#[test]
fn the_one_map_holds_every_field_with_the_gateways_over_them() {
    let mut fields = upstream();
    fields.insert(
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_static("gw"),
    );
    let before: Vec<(Vec<u8>, Vec<u8>)> = {
        let mut all: Vec<_> = fields
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_vec()))
            .collect();
        all.sort();
        all
    };
    let map = fields.map_mut();
    assert_eq!(
        map.get_all("x-request-id").iter().collect::<Vec<_>>(),
        ["gw"]
    );
    assert_eq!(map.get_all("set-cookie").iter().count(), 2);
    map.append("vary", HeaderValue::from_static("Origin"));
    assert!(!fields.kept_as_bytes());
    assert_eq!(values(&fields, "vary"), [&b"Accept"[..], b"Origin"]);
    // Nothing was lost or added in the change of form but the append.
    let mut after: Vec<(Vec<u8>, Vec<u8>)> = fields
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .filter(|(n, v)| !(n == b"vary" && v == b"Origin"))
        .collect();
    after.sort();
    assert_eq!(after, before);
}

#[test]
fn a_map_of_fields_is_looked_up_as_is() {
    let mut map = HeaderMap::new();
    map.insert("content-type", HeaderValue::from_static("text/plain"));
    let fields = Fields::from(map);
    assert!(!fields.kept_as_bytes());
    assert_eq!(fields.get("Content-Type"), Some(&b"text/plain"[..]));
    assert_eq!(fields.get("vary"), None);
    assert!(!fields.is_empty());
    assert!(Fields::default().is_empty());
}

#[test]
fn into_http_gives_every_field_and_the_status() {
    let mut resp = Response::from_parts(StatusCode::CREATED, upstream(), "body");
    resp.fields_mut().insert(
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_static("gw"),
    );
    let http = resp.into_http();
    assert_eq!(http.status(), StatusCode::CREATED);
    assert_eq!(http.headers()["x-request-id"], "gw");
    assert_eq!(http.headers()["vary"], "Accept");
    assert_eq!(http.headers().get_all("set-cookie").iter().count(), 2);
    assert_eq!(*http.body(), "body");
    let back = Response::from(http);
    assert_eq!(back.fields().get("vary"), Some(&b"Accept"[..]));
}

#[test]
fn append_keeps_the_values_a_name_had() {
    let mut fields = upstream();
    // A name the upstream did not send: the kept fields stay bytes.
    fields.append(
        HeaderName::from_static("x-new"),
        HeaderValue::from_static("1"),
    );
    assert!(fields.kept_as_bytes());
    // One it sent: its values stay, the new one after them.
    fields.append(header_name("vary"), HeaderValue::from_static("Origin"));
    assert_eq!(values(&fields, "vary"), [&b"Accept"[..], b"Origin"]);
    assert_eq!(values(&fields, "x-new"), [&b"1"[..]]);
    assert_eq!(values(&fields, "set-cookie"), [&b"a=1"[..], b"b=2"]);
}

fn header_name(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}
