use super::*;
use std::convert::Infallible;

use futures::{StreamExt as _, stream};
use http::Request;
use http_body::Frame;
use http_body_util::StreamBody;

fn head(method: Method, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut b = Request::builder().method(method).uri(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).unwrap().into_parts().0
}

fn key(method: Method, uri: &str, headers: &[(&str, &str)]) -> Option<Key> {
    let parts = head(method, uri, headers);
    let path = parts.uri.path().to_owned();
    Key::of(&parts, &path)
}

fn get(uri: &str, headers: &[(&str, &str)]) -> Key {
    key(Method::GET, uri, headers).expect("a coalescable GET")
}

#[test]
fn identical_requests_share_a_key_whatever_else_differs() {
    let alice = [
        ("x-user-id", "alice"),
        ("x-user-role", "user"),
        ("accept", "application/json"),
    ];
    let a = get("/users/1?x=1", &alice);
    let mut other = alice.to_vec();
    other.extend([
        ("x-request-id", "r-2"),
        ("user-agent", "curl"),
        ("traceparent", "00-x"),
    ]);
    assert_eq!(a, get("/users/1?x=1", &other));
}

#[test]
fn method_path_query_identity_and_representation_are_in_the_key() {
    let base = get(
        "/users/1?x=1",
        &[("x-user-id", "alice"), ("accept", "application/json")],
    );
    let different = [
        key(
            Method::HEAD,
            "/users/1?x=1",
            &[("x-user-id", "alice"), ("accept", "application/json")],
        ),
        key(
            Method::GET,
            "/users/2?x=1",
            &[("x-user-id", "alice"), ("accept", "application/json")],
        ),
        key(
            Method::GET,
            "/users/1?x=2",
            &[("x-user-id", "alice"), ("accept", "application/json")],
        ),
        key(
            Method::GET,
            "/users/1",
            &[("x-user-id", "alice"), ("accept", "application/json")],
        ),
        key(
            Method::GET,
            "/users/1?x=1",
            &[("x-user-id", "bob"), ("accept", "application/json")],
        ),
        key(
            Method::GET,
            "/users/1?x=1",
            &[("accept", "application/json")],
        ),
        key(
            Method::GET,
            "/users/1?x=1",
            &[
                ("x-user-id", "alice"),
                ("x-user-role", "admin"),
                ("accept", "application/json"),
            ],
        ),
        key(
            Method::GET,
            "/users/1?x=1",
            &[("x-user-id", "alice"), ("accept", "text/html")],
        ),
        key(
            Method::GET,
            "/users/1?x=1",
            &[
                ("x-user-id", "alice"),
                ("accept", "application/json"),
                ("accept-encoding", "gzip"),
            ],
        ),
        key(
            Method::GET,
            "/users/1?x=1",
            &[
                ("x-user-id", "alice"),
                ("accept", "application/json"),
                ("cookie", "s=1"),
            ],
        ),
        key(
            Method::GET,
            "/users/1?x=1",
            &[
                ("x-user-id", "alice"),
                ("accept", "application/json"),
                ("authorization", "Basic x"),
            ],
        ),
    ];
    for (i, k) in different.into_iter().enumerate() {
        assert_ne!(
            k.expect("coalescable"),
            base,
            "variant {i} must not share the key"
        );
    }
}

#[test]
fn authority_range_and_conditional_headers_are_in_the_key() {
    let base = get("/users/1", &[("host", "a.example")]);
    // The same request again shares the key.
    assert_eq!(base, get("/users/1", &[("host", "a.example")]));
    let different = [
        get("/users/1", &[("host", "b.example")]),
        get("/users/1", &[]),
        get("http://a.example/users/1", &[("host", "a.example")]),
        get("http://b.example/users/1", &[("host", "a.example")]),
        get(
            "/users/1",
            &[("host", "a.example"), ("accept-language", "fr")],
        ),
        get("/users/1", &[("host", "a.example"), ("range", "bytes=0-9")]),
        get(
            "/users/1",
            &[
                ("host", "a.example"),
                ("range", "bytes=0-9"),
                ("if-range", "\"v1\""),
            ],
        ),
        get(
            "/users/1",
            &[("host", "a.example"), ("if-none-match", "\"v1\"")],
        ),
        get(
            "/users/1",
            &[
                ("host", "a.example"),
                ("if-modified-since", "Sat, 01 Jan 2000 00:00:00 GMT"),
            ],
        ),
        get("/users/1", &[("host", "a.example"), ("if-match", "\"v1\"")]),
        get(
            "/users/1",
            &[
                ("host", "a.example"),
                ("if-unmodified-since", "Sat, 01 Jan 2000 00:00:00 GMT"),
            ],
        ),
    ];
    for (i, k) in different.iter().enumerate() {
        assert_ne!(*k, base, "variant {i} must not share the key");
    }
    // Identical conditional requests still share one call.
    assert_eq!(
        get(
            "/users/1",
            &[("host", "a.example"), ("if-none-match", "\"v1\"")]
        ),
        different[7]
    );
    assert_ne!(
        get(
            "/users/1",
            &[("host", "a.example"), ("if-none-match", "\"v2\"")]
        ),
        different[7]
    );
}

#[test]
fn an_empty_query_is_not_no_query_and_fields_cannot_run_into_each_other() {
    assert_ne!(get("/a?", &[]), get("/a", &[]));
    // The same bytes split differently between path and query, or between headers.
    assert_ne!(get("/ab?c", &[]), get("/a?bc", &[]));
    assert_ne!(
        get("/a", &[("x-user-id", "ab"), ("x-user-role", "c")]),
        get("/a", &[("x-user-id", "a"), ("x-user-role", "bc")])
    );
    assert_ne!(
        get("/a", &[("accept", "a"), ("accept", "b")]),
        get("/a", &[("accept", "ab")])
    );
}

#[test]
fn only_get_and_head_without_no_cache_are_coalesced() {
    assert!(key(Method::HEAD, "/a", &[]).is_some());
    for m in [
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
        Method::PATCH,
    ] {
        assert!(key(m.clone(), "/a", &[]).is_none(), "{m}");
    }
    for cc in [
        "no-cache",
        "No-Cache",
        "max-age=0, no-cache",
        "no-cache=\"set-cookie\"",
    ] {
        assert!(
            key(Method::GET, "/a", &[("cache-control", cc)]).is_none(),
            "{cc}"
        );
    }
    for cc in ["max-age=0", "no-store", "no-cachex"] {
        assert!(
            key(Method::GET, "/a", &[("cache-control", cc)]).is_some(),
            "{cc}"
        );
    }
}

fn coalescer(max_waiters: usize) -> Arc<Coalescer> {
    Arc::new(Coalescer::new(CoalesceLimits {
        max_waiters,
        max_body: MAX_SHARED_BODY,
    }))
}

fn snapshot(body: &'static str) -> Outcome {
    Outcome::Shared(Arc::new(Snapshot {
        status: StatusCode::OK,
        fields: Fields::default(),
        body: Bytes::from_static(body.as_bytes()),
    }))
}

#[test]
fn the_first_request_leads_and_waiters_are_bounded() {
    let c = coalescer(2);
    let k = get("/a", &[]);
    let Join::Leader(lead) = c.join(k.clone()) else {
        panic!("first request leads");
    };
    assert!(matches!(c.join(k.clone()), Join::Follower(_)));
    assert!(matches!(c.join(k.clone()), Join::Follower(_)));
    assert!(
        matches!(c.join(k.clone()), Join::Full),
        "third waiter over the bound"
    );
    // Another key has its own flight.
    assert!(matches!(c.join(get("/b", &[])), Join::Leader(_)));
    assert_eq!(c.in_flight(), 1, "the /b lead was dropped at once");
    lead.finish(Outcome::Alone);
    assert_eq!(c.in_flight(), 0);
    assert!(
        matches!(c.join(k), Join::Leader(_)),
        "a new flight after the end"
    );
}

#[tokio::test(start_paused = true)]
async fn followers_get_the_leaders_outcome_even_if_they_joined_just_before_it_ended() {
    let c = coalescer(10);
    let k = get("/a", &[]);
    let Join::Leader(lead) = c.join(k.clone()) else {
        panic!("leads");
    };
    let Join::Follower(early) = c.join(k.clone()) else {
        panic!("follows");
    };
    let waiter = tokio::spawn(wait(early));
    let Join::Follower(late) = c.join(k.clone()) else {
        panic!("follows");
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "waits for the leader");
    lead.finish(snapshot("hello"));
    for got in [waiter.await.unwrap(), wait(late).await] {
        let Some(Outcome::Shared(s)) = got else {
            panic!("shared outcome expected, got {got:?}");
        };
        let resp = s.response();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.into_body().collect().await.unwrap().to_bytes(),
            "hello"
        );
    }
}

#[tokio::test]
async fn a_follower_that_leaves_cancels_nothing_and_a_lost_leader_frees_its_followers() {
    let c = coalescer(10);
    let k = get("/a", &[]);
    let Join::Leader(lead) = c.join(k.clone()) else {
        panic!("leads");
    };
    let Join::Follower(gone) = c.join(k.clone()) else {
        panic!("follows");
    };
    drop(gone);
    let Join::Follower(stays) = c.join(k.clone()) else {
        panic!("follows");
    };
    // The leader's task died without an outcome (a panic): the flight is
    // removed and its followers go upstream on their own.
    drop(lead);
    assert_eq!(c.in_flight(), 0);
    assert!(wait(stays).await.is_none());
}

fn chunks(parts: &[&'static str]) -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
        .iter()
        .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
        .collect();
    StreamBody::new(stream::iter(frames))
}

#[tokio::test(start_paused = true)]
async fn a_body_within_the_limit_is_read_whole() {
    let deadline = Instant::now() + Duration::from_secs(1);
    match read(chunks(&["ab", "cd"]), 4, deadline).await {
        Read::Complete(b) => assert_eq!(b, "abcd"),
        Read::Stopped { read, .. } => panic!("complete expected, stopped after {read:?}"),
        Read::Failed(e) => match e {},
    }
}

#[tokio::test(start_paused = true)]
async fn past_the_limit_the_read_bytes_and_the_rest_make_the_leaders_body() {
    let deadline = Instant::now() + Duration::from_secs(1);
    let Read::Stopped {
        read: first,
        rest,
        timed_out,
    } = read(chunks(&["ab", "cd", "ef"]), 3, deadline).await
    else {
        panic!("stopped expected");
    };
    assert!(!timed_out);
    assert_eq!(first, "abcd");
    let rest = rest.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "ef");

    // The leader's body replays what was read, then streams the rest.
    let resumed = ResponseBody::Resumed(
        Some(Bytes::from_static(b"abcd")),
        Box::new(ResponseBody::full("ef")),
    );
    assert_eq!(resumed.size_hint().exact(), Some(6));
    assert_eq!(resumed.collect().await.unwrap().to_bytes(), "abcdef");
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stalls_past_the_deadline_is_handed_back() {
    let started = Instant::now();
    let deadline = started + Duration::from_millis(300);
    let first: Result<Frame<Bytes>, Infallible> = Ok(Frame::data(Bytes::from_static(b"ab")));
    let stalled = StreamBody::new(stream::iter([first]).chain(stream::pending()));
    let Read::Stopped {
        read: got,
        timed_out,
        ..
    } = read(stalled, 100, deadline).await
    else {
        panic!("stopped expected");
    };
    assert!(timed_out);
    assert_eq!(got, "ab");
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}

#[test]
fn an_error_snapshot_is_the_problem_response() {
    let s = Snapshot::of_error(&ProxyError::Upstream(UpstreamError::timeout(
        Duration::from_secs(1),
    )));
    let resp = s.response();
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        resp.fields().get_str("content-type"),
        Some("application/problem+json")
    );
    assert!(
        s.body
            .starts_with(b"{\"type\":\"urn:gateway:problem:upstream-timeout\"")
    );
}
