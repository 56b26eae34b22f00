use http::header::{HeaderName, HeaderValue};

use super::*;

/// The fields httparse finds in `head`, kept as [`crate::h1`] keeps them.
fn kept(head: &'static [u8], drop_length: bool) -> Option<Arc<RawFields>> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut res = httparse::Response::new(&mut fields);
    assert!(res.parse(head).unwrap().is_complete());
    let kept = Kept::scan(head, res.headers, drop_length)?;
    Some(kept.into_fields(Bytes::from_static(head)))
}

fn listed(raw: &RawFields) -> Vec<(String, String, bool)> {
    raw.iter()
        .map(|(n, v, l)| {
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            (text(n), text(v), l)
        })
        .collect()
}

/// Whether httparse takes `head` as a response head, and whether the http
/// crate then takes every field it found.
fn both_accept(head: &[u8]) -> (bool, bool) {
    let mut fields = [httparse::EMPTY_HEADER; 4];
    let mut res = httparse::Response::new(&mut fields);
    match res.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return (false, false),
    }
    let http = res.headers.iter().all(|f| {
        HeaderName::from_bytes(f.name.as_bytes()).is_ok()
            && HeaderValue::from_bytes(f.value).is_ok()
    });
    (true, http)
}

/// What [`RawFields::header_map`] relies on: a field httparse parsed always
/// makes a `HeaderName` and a `HeaderValue`.
#[test]
fn httparse_accepts_what_the_http_crate_does() {
    for b in 0..=u8::MAX {
        for head in [
            [&b"HTTP/1.1 200 OK\r\nx"[..], &[b], b"y: v\r\n\r\n"].concat(),
            [&b"HTTP/1.1 200 OK\r\n"[..], &[b], b": v\r\n\r\n"].concat(),
            [&b"HTTP/1.1 200 OK\r\nx: a"[..], &[b], b"b\r\n\r\n"].concat(),
        ] {
            let (parsed, taken) = both_accept(&head);
            assert!(!parsed || taken, "byte {b:#x} in {head:?}");
        }
    }
    assert!(
        !both_accept(b"HTTP/1.1 200 OK\r\n: v\r\n\r\n").0,
        "an empty name"
    );
    assert!(
        !both_accept(b"HTTP/1.1 200 OK\r\nx: a\r\n b\r\n\r\n").0,
        "a folded line"
    );
}

#[test]
fn hop_by_hop_fields_are_left_out_and_names_keep_their_case() {
    let raw = kept(
        b"HTTP/1.1 200 OK\r\nServer: s\r\nConnection: keep-alive, TE\r\nContent-Length: 2\r\n\
Keep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nProxy-Authenticate: Basic\r\nUpgrade: h2c\r\n\
Trailer: X-T\r\nTE: trailers\r\nProxy-Connection: close\r\nX-A: 1\r\nx-a: 2\r\n\r\n",
        false,
    )
    .expect("kept as bytes");
    let own = |n: &str, v: &str, l: bool| (n.to_owned(), v.to_owned(), l);
    assert_eq!(
        listed(&raw),
        [
            own("Server", "s", false),
            own("Content-Length", "2", true),
            own("X-A", "1", false),
            own("x-a", "2", false),
        ]
    );
}

#[test]
fn an_overridden_length_is_left_out() {
    let raw = kept(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n",
        true,
    )
    .unwrap();
    assert_eq!(listed(&raw), [("X-A".to_owned(), "1".to_owned(), false)]);
}

#[test]
fn heads_that_need_a_map_are_not_kept() {
    // `Connection` naming a field to drop.
    assert!(
        kept(
            b"HTTP/1.1 200 OK\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\n\r\n",
            false
        )
        .is_none()
    );
    assert!(
        kept(
            b"HTTP/1.1 200 OK\r\nProxy-Connection: X-Secret\r\n\r\n",
            false
        )
        .is_none()
    );
    // Naming only hop-by-hop fields (or nothing) is fine.
    assert!(
        kept(
            b"HTTP/1.1 200 OK\r\nConnection: close, , Keep-Alive, Upgrade\r\n\r\n",
            false
        )
        .is_some()
    );
    // More fields than fit.
    let mut head = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n".to_vec();
    for i in 0..MAX_FIELDS {
        head.extend_from_slice(format!("x-f{i}: v\r\n").as_bytes());
    }
    let full: &'static [u8] = Box::leak([&head[..], b"\r\n"].concat().into_boxed_slice());
    assert_eq!(kept(full, false).map(|r| r.len()), Some(MAX_FIELDS));
    head.extend_from_slice(b"x-one-more: v\r\n\r\n");
    let over: &'static [u8] = Box::leak(head.into_boxed_slice());
    assert!(kept(over, false).is_none());
}

#[test]
fn the_map_holds_every_forwarded_field() {
    let raw = kept(
        b"HTTP/1.1 200 OK\r\nX-Request-Id: up\r\nVary: Accept\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\
Content-Length: 2\r\nConnection: keep-alive\r\n\r\n",
        false,
    )
    .unwrap();
    let whole = raw.header_map(0);
    assert_eq!(whole.len(), 5);
    assert_eq!(whole["content-length"], "2");
    assert_eq!(
        whole.get_all("set-cookie").iter().collect::<Vec<_>>(),
        ["a=1", "b=2"]
    );

    assert!(!whole.contains_key("connection"));
}
