use super::*;
use crate::upstream::breaker::BreakerSettings;
use http::StatusCode;

fn uri(template: &str, rest: &str, query: Option<&str>) -> String {
    PathTemplate::parse(template)
        .uri(rest, query)
        .expect("valid URI")
        .to_string()
}

#[test]
fn rest_is_replaced_and_the_callers_query_appended() {
    assert_eq!(uri("/users/{rest}", "7", None), "/users/7");
    assert_eq!(uri("/users/{rest}", "7", Some("a=1")), "/users/7?a=1");
    assert_eq!(uri("/users/{rest}/x", "a/b", None), "/users/a/b/x");
    assert_eq!(uri("/users/{rest}", "", None), "/users/");
    assert_eq!(uri("/static", "7", Some("a=1")), "/static?a=1");
    assert_eq!(
        uri("/orders/{rest}?status=500", "7", Some("a=1&b=2")),
        "/orders/7?status=500&a=1&b=2"
    );
    assert_eq!(uri("/orders?x=1", "", None), "/orders?x=1");
    // An empty query ("/x?") adds nothing.
    assert_eq!(uri("/orders", "", Some("")), "/orders");
    assert_eq!(uri("/orders?", "", None), "/orders");
}

#[test]
fn a_rest_that_is_not_uri_material_gives_no_uri() {
    assert!(PathTemplate::parse("/u/{rest}").uri("a b", None).is_none());
}

#[test]
fn parts_get_the_callers_identity_but_not_body_framing_compression_or_conditionals() {
    let mut caller = HeaderMap::new();
    caller.insert("x-user-id", HeaderValue::from_static("alice"));
    caller.insert("x-user-role", HeaderValue::from_static("user"));
    caller.insert("x-request-id", HeaderValue::from_static("r-1"));
    caller.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
    caller.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
    caller.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    caller.insert(header::RANGE, HeaderValue::from_static("bytes=0-1"));
    caller.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"x\""));
    let h = part_headers(&caller);
    assert_eq!(h["x-user-id"], "alice");
    assert_eq!(h["x-user-role"], "user");
    assert_eq!(h["x-request-id"], "r-1");
    assert_eq!(h[header::ACCEPT], "application/json");
    for gone in [
        header::ACCEPT_ENCODING,
        header::CONTENT_LENGTH,
        header::RANGE,
        header::IF_NONE_MATCH,
    ] {
        assert!(!h.contains_key(&gone), "{gone} must not reach parts");
    }
}

fn part(name: &str, required: bool) -> Part {
    let upstream = Arc::new(UpstreamEntry::new(
        "u",
        vec![],
        BreakerSettings::default(),
        None,
    ));
    Part::new(
        name,
        upstream,
        "/x/{rest}",
        required,
        Duration::from_secs(1),
        Arc::default(),
    )
}

async fn body_of(resp: Response<ResponseBody>) -> serde_json::Value {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).expect("the aggregate is JSON")
}

#[tokio::test]
async fn the_answer_is_an_object_of_part_bodies_in_order_with_nulls_for_failures() {
    let parts = [
        part("user", true),
        part("orders", false),
        part("slow", false),
    ];
    let bodies = [Some(Bytes::from_static(b"{\"id\":\"7\"}\n")), None, None];
    let resp = assemble(&parts, &bodies);
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.fields().get_str("content-type"),
        Some("application/json")
    );
    assert_eq!(
        resp.fields().get_str(X_PARTIAL_FAILURE.as_str()),
        Some("orders,slow")
    );
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(text.starts_with("{\"user\":"), "order kept: {text}");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({"user": {"id": "7"}, "orders": null, "slow": null})
    );
}

#[tokio::test]
async fn no_partial_failure_header_when_every_part_answered() {
    let parts = [part("a", false), part("b", false)];
    let bodies = [
        Some(Bytes::from_static(b"[1,2]")),
        Some(Bytes::from_static(b"\"s\"")),
    ];
    let resp = assemble(&parts, &bodies);
    assert!(!resp.fields().contains(X_PARTIAL_FAILURE.as_str()));
    assert_eq!(
        body_of(resp).await,
        serde_json::json!({"a": [1, 2], "b": "s"})
    );
}

#[test]
fn failures_name_their_outcome_and_reason() {
    assert_eq!(PartFailure::Unavailable.outcome(), PartOutcome::Unavailable);
    assert_eq!(
        PartFailure::Status(StatusCode::NOT_FOUND).to_string(),
        "it answered 404"
    );
    assert_eq!(
        PartFailure::TooLarge {
            limit: MAX_PART_BODY
        }
        .outcome(),
        PartOutcome::TooLarge
    );
    assert!(PartFailure::Timeout.to_string().contains("timeout"));
}

#[tokio::test(start_paused = true)]
async fn a_part_without_an_available_instance_fails_at_once_without_a_network_call() {
    let tracer = gateway_telemetry::Tracer::disabled();
    let span = tracer.server_span(None, &http::Method::GET, "/x");
    let p = part("user", true);
    let started = Instant::now();
    let balance = Balance {
        user: None,
        client: std::net::Ipv4Addr::LOCALHOST.into(),
    };
    let req = Box::new(Request::new(RequestBody::empty()));
    let got = fetch(
        &p,
        req,
        balance,
        &span,
        None,
        gateway_transport::workers::OFF_WORKER,
    )
    .await;
    assert_eq!(got, Err(PartFailure::Unavailable));
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[test]
fn a_callers_query_never_overrides_a_parameter_the_fixed_query_names() {
    // Issue 41, item 18: the caller's `status=200` would come last and win.
    assert_eq!(
        uri("/orders/{rest}?status=500", "7", Some("status=200&a=1")),
        "/orders/7?status=500&a=1"
    );
    // Every spelling of the name goes: repeated, escaped, with `;`, without a value.
    assert_eq!(
        uri(
            "/orders?status=500&limit=5",
            "",
            Some("st%61tus=200&a=1&status&b=2;limit=9&limit=1&c=3")
        ),
        "/orders?status=500&limit=5&a=1&c=3"
    );
    // Only the fixed query's names: others pass, and a caller left with nothing adds nothing.
    assert_eq!(
        uri("/orders?status=500", "", Some("status=1")),
        "/orders?status=500"
    );
    assert_eq!(
        uri("/orders?status=500", "", Some("statusx=1")),
        "/orders?status=500&statusx=1"
    );
    // Without a fixed query the caller's query is kept whole.
    assert_eq!(
        uri("/orders", "", Some("status=1&status=2")),
        "/orders?status=1&status=2"
    );
}

#[test]
fn query_names_are_percent_decoded() {
    let names: Vec<String> = query_names("a=1&%62=2;c&%zz=3&%4")
        .map(|n| n.into_owned())
        .collect();
    assert_eq!(names, ["a", "b", "c", "%zz", "%4"]);
}
