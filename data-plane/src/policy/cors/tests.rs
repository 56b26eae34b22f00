use super::*;

fn policy(origins: &[&str], credentials: bool) -> CorsPolicy {
    CorsPolicy::compile(Some(&v1::Cors {
        allow_origins: origins.iter().map(|s| (*s).to_owned()).collect(),
        allow_methods: vec!["GET".into(), "PUT".into()],
        allow_headers: vec!["Content-Type".into(), "x-requested-with".into()],
        expose_headers: vec!["X-Request-Id".into(), "x-ratelimit-remaining".into()],
        allow_credentials: credentials,
        max_age_seconds: 600,
    }))
    .unwrap()
    .unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn preflight(origin: &str, method: &str, asked: Option<&str>) -> HeaderMap {
    let mut h = headers(&[
        ("origin", origin),
        ("access-control-request-method", method),
    ]);
    if let Some(a) = asked {
        h.insert(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_str(a).unwrap(),
        );
    }
    h
}

#[test]
fn preflights_are_recognised_by_method_origin_and_requested_method() {
    let h = preflight("https://app.example", "PUT", None);
    assert_eq!(preflight_method(&Method::OPTIONS, &h), Some(Method::PUT));
    assert_eq!(preflight_method(&Method::GET, &h), None);
    let no_origin = headers(&[("access-control-request-method", "PUT")]);
    assert_eq!(preflight_method(&Method::OPTIONS, &no_origin), None);
    let plain = headers(&[("origin", "https://app.example")]);
    assert_eq!(preflight_method(&Method::OPTIONS, &plain), None);
}

#[test]
fn an_allowed_preflight_gets_204_with_every_header() {
    let p = policy(&["https://app.example"], true);
    let h = preflight(
        "https://app.example",
        "PUT",
        Some("content-type, X-Requested-With"),
    );
    let Cors::Preflight(resp) = p.check(&Method::OPTIONS, &h) else {
        panic!("not answered");
    };
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = resp.into_http();
    let r = resp.headers();
    assert_eq!(r["access-control-allow-origin"], "https://app.example");
    assert_eq!(r["access-control-allow-methods"], "GET, PUT");
    assert_eq!(
        r["access-control-allow-headers"],
        "content-type, x-requested-with"
    );
    assert_eq!(r["access-control-allow-credentials"], "true");
    assert_eq!(r["access-control-max-age"], "600");
    assert_eq!(r["vary"], "origin");
}

#[test]
fn preflights_from_other_origins_or_for_other_methods_or_headers_are_refused() {
    let p = policy(&["https://app.example"], false);
    for h in [
        preflight("https://evil.example", "PUT", None),
        preflight("https://app.example.evil", "GET", None),
        preflight("http://app.example", "GET", None),
        preflight("https://app.example", "DELETE", None),
        preflight("https://app.example", "GET", Some("x-secret")),
        preflight("https://app.example", "GET", Some("content-type, x-secret")),
    ] {
        assert!(
            matches!(p.check(&Method::OPTIONS, &h), Cors::Refused),
            "{h:?}"
        );
    }
}

#[test]
fn any_origin_answers_star_unless_credentials() {
    let any = CorsPolicy::compile(Some(&v1::Cors {
        allow_origins: vec!["*".into()],
        ..Default::default()
    }))
    .unwrap()
    .unwrap();
    let Cors::Preflight(resp) = any.check(
        &Method::OPTIONS,
        &preflight("https://x.example", "POST", None),
    ) else {
        panic!("not answered");
    };
    let resp = resp.into_http();
    let r = resp.headers();
    assert_eq!(r["access-control-allow-origin"], "*");
    assert_eq!(r["access-control-allow-methods"], "GET, HEAD, POST");
    assert!(r.get("access-control-allow-headers").is_none());
    assert!(r.get("access-control-allow-credentials").is_none());
    assert!(r.get("access-control-max-age").is_none());
    // The default methods are the safelisted ones.
    assert!(matches!(
        any.check(
            &Method::OPTIONS,
            &preflight("https://x.example", "PUT", None)
        ),
        Cors::Refused
    ));
}

#[test]
fn actual_requests_note_the_allowed_origin_and_get_decorated() {
    let p = policy(&["https://app.example"], true);
    let Cors::Actual(Some(origin)) =
        p.check(&Method::GET, &headers(&[("origin", "https://app.example")]))
    else {
        panic!("origin not allowed");
    };
    let mut out = headers(&[
        ("vary", "accept-encoding"),
        ("access-control-allow-origin", "*"),
    ]);
    p.decorate(&mut out, Some(&origin));
    assert_eq!(out["access-control-allow-origin"], "https://app.example");
    assert_eq!(out["access-control-allow-credentials"], "true");
    assert_eq!(
        out["access-control-expose-headers"],
        "x-request-id, x-ratelimit-remaining"
    );
    let vary: Vec<_> = out.get_all("vary").iter().collect();
    assert_eq!(vary, ["accept-encoding", "origin"]);

    // Another origin, or none: not allowed, and only Vary is added.
    for h in [
        headers(&[("origin", "https://evil.example")]),
        HeaderMap::new(),
    ] {
        let Cors::Actual(allowed) = p.check(&Method::POST, &h) else {
            panic!("not an actual request");
        };
        assert!(allowed.is_none());
        let mut out = HeaderMap::new();
        p.decorate(&mut out, allowed.as_ref());
        assert_eq!(out.len(), 1);
        assert_eq!(out["vary"], "origin");
    }
}

#[test]
fn no_settings_compile_to_nothing() {
    assert!(CorsPolicy::compile(None).unwrap().is_none());
}
