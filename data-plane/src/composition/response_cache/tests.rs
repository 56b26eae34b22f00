use super::*;

fn entry(auth: Auth, shared: bool, vary: &[&str]) -> RouteCacheEntry {
    let c = RouteCache {
        ttl_seconds: 60,
        max_body_bytes: 0,
        vary: vary.iter().map(|v| (*v).to_owned()).collect(),
        shared,
        ..Default::default()
    };
    RouteCacheEntry::compile("orders", auth, &c)
}

fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut b = http::Request::get(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).unwrap().into_parts().0
}

#[test]
fn the_key_holds_host_path_query_and_the_listed_headers() {
    let e = entry(Auth::None, false, &["accept-language"]);
    let key = |uri: &str, h: &[(&str, &str)]| e.key(&parts(uri, h), uri.split('?').next().unwrap());
    let base = key("/orders/1", &[("host", "a")]);
    assert_eq!(base, key("/orders/1", &[("host", "a"), ("accept", "x")]));
    assert_ne!(base, key("/orders/1", &[("host", "b")]));
    assert_ne!(base, key("/orders/2", &[("host", "a")]));
    assert_ne!(
        base,
        key("/orders/1?", &[("host", "a")]),
        "empty query is a query"
    );
    assert_ne!(base, key("/orders/1?a=1", &[("host", "a")]));
    assert_ne!(
        base,
        key("/orders/1", &[("host", "a"), ("accept-language", "fr")])
    );
    // Identity is not part of the key of an unauthenticated route.
    assert_eq!(
        base,
        key("/orders/1", &[("host", "a"), ("x-user-id", "u1")])
    );
}

/// Issue 41, item 3: the scheme and every forwarding field are in the key,
/// whatever order or repetition the request has them in.
#[test]
fn the_key_holds_the_scheme_and_the_forwarding_fields() {
    let e = entry(Auth::None, false, &[]);
    let key = |h: &[(&str, &str)]| e.key(&parts("/o", h), "/o");
    let http = key(&[("host", "a"), ("x-forwarded-proto", "http")]);
    let https = key(&[("host", "a"), ("x-forwarded-proto", "https")]);
    assert_ne!(
        http, https,
        "an answer for cleartext is never served to HTTPS"
    );
    for (name, value) in [
        ("x-forwarded-host", "evil.example"),
        ("x-forwarded-prefix", "/evil"),
        ("x-forwarded-port", "1"),
        ("x-forwarded-scheme", "https"),
        ("x-original-url", "/admin"),
        ("x-rewrite-url", "/admin"),
        ("forwarded", "host=evil.example"),
    ] {
        let poisoned = key(&[("host", "a"), ("x-forwarded-proto", "http"), (name, value)]);
        assert_ne!(http, poisoned, "{name}");
        // Order does not matter; a repeat gives its own key, never another's.
        assert_eq!(
            poisoned,
            key(&[(name, value), ("host", "a"), ("x-forwarded-proto", "http")]),
            "{name}"
        );
        let twice = key(&[
            ("host", "a"),
            ("x-forwarded-proto", "http"),
            (name, value),
            (name, value),
        ]);
        assert_ne!(twice, poisoned, "{name}");
        assert_ne!(twice, http, "{name}");
    }
}

/// Issue 41, item 2: requests with credentials the key does not hold bypass
/// the cache unless the route says its answers do not depend on them.
#[test]
fn credentials_are_allowed_only_when_keyed_or_declared_shared() {
    let plain = entry(Auth::None, false, &[]);
    assert_eq!(plain.credentials_allowed, 0);
    let keyed = entry(Auth::None, false, &["Cookie", "x-api-key"]);
    assert_eq!(keyed.credentials_allowed, 0b101);
    let declared = RouteCacheEntry::compile(
        "orders",
        Auth::None,
        &RouteCache {
            ttl_seconds: 60,
            shared_with_credentials: true,
            ..Default::default()
        },
    );
    assert_eq!(declared.credentials_allowed, u8::MAX);
    let creds = |h: &[(&str, &str)]| RouteCacheEntry::credentials_of(&parts("/o", h).headers);
    // The pass's `match` keeps CREDENTIALS' order.
    for (i, name) in CREDENTIALS.iter().enumerate() {
        assert_eq!(creds(&[(name.as_str(), "v")]), 1 << i, "{name}");
    }
    assert_eq!(creds(&[("accept", "x")]), 0);
    assert_eq!(creds(&[("cookie", "s=1")]), 0b001);
    assert_eq!(creds(&[("authorization", "Basic x")]), 0b010);
    assert_eq!(creds(&[("x-api-key", "k"), ("cookie", "s=1")]), 0b101);
    // A cookie the key holds is fine; an API key it does not hold is not.
    assert_eq!(0b001 & !keyed.credentials_allowed, 0);
    assert_ne!(0b010 & !keyed.credentials_allowed, 0);
}

#[test]
fn authenticated_routes_key_by_identity_unless_shared() {
    let private = entry(Auth::Jwt, false, &[]);
    let shared = entry(Auth::Jwt, true, &[]);
    let alice = parts("/o", &[("x-user-id", "alice"), ("x-user-role", "user")]);
    let bob = parts("/o", &[("x-user-id", "bob"), ("x-user-role", "user")]);
    assert_ne!(private.key(&alice, "/o"), private.key(&bob, "/o"));
    assert_eq!(shared.key(&alice, "/o"), shared.key(&bob, "/o"));
}

#[test]
fn a_matching_if_none_match_turns_an_answer_into_304() {
    let mut fields = HeaderMap::new();
    fields.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
    fields.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=60"),
    );
    fields.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    let answer = || {
        Response::from_parts(
            StatusCode::OK,
            Fields::from(fields.clone()),
            ResponseBody::full(Bytes::from_static(b"hello")),
        )
    };
    let inm = HeaderValue::from_static("\"v0\", W/\"v1\"");
    let resp = conditional(answer(), Some(&inm));
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(resp.fields().get("etag"), Some(&b"\"v1\""[..]));
    assert_eq!(resp.fields().get("cache-control"), Some(&b"max-age=60"[..]));
    assert!(!resp.fields().contains("content-type"));
    let other = HeaderValue::from_static("\"v2\"");
    assert_eq!(conditional(answer(), Some(&other)).status(), StatusCode::OK);
    assert_eq!(conditional(answer(), None).status(), StatusCode::OK);
}

#[test]
fn vary_star_is_not_stored_and_names_are_collected() {
    let mut h = HeaderMap::new();
    h.append(
        header::VARY,
        HeaderValue::from_static("Accept-Language, accept"),
    );
    h.append(header::VARY, HeaderValue::from_static("accept"));
    let names = vary_names(&Fields::from(h)).unwrap();
    assert_eq!(&*names, &[header::ACCEPT_LANGUAGE, header::ACCEPT]);
    let mut h = HeaderMap::new();
    h.insert(header::VARY, HeaderValue::from_static("*"));
    assert!(vary_names(&Fields::from(h)).is_none());
}

#[test]
fn age_values_are_the_ages_asked_for() {
    for secs in [0, 5, 69, 5, 64, 0, 3600, 1 << 40] {
        assert_eq!(age_value(secs), HeaderValue::from(secs), "{secs}");
    }
}
