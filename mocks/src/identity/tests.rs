use super::*;
use http::HeaderValue;

const SECRET: &str = "0123456789abcdef0123456789abcdef";
/// The gateway's known-answer vectors (data-plane/src/policy/signature.rs), computed with
/// Python's hmac: `hmac.new(SECRET, b"".join(len(f).to_bytes(4, "big") + f for f in FIELDS),
/// sha256).hexdigest()` with FIELDS `[b"x-gateway-signature-v3", b"1700000000",
/// b"0123456789abcdef0123456789abcdef", b"users", b"0", b"GET", b"api.example",
/// b"/users/7?x=1", b"alice", b"admin", b"", b""]`: a body the gateway streamed.
const KNOWN_V3: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
     v3=15045b67488f76b821a3768a22d2b61562183d824f0447c119f995e4d5c17511";
/// The same with the last field `hashlib.sha256(b"").hexdigest().encode()` (no body, covered).
const KNOWN_V3_NO_BODY: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
     v3=fece2348e358b8fccde29657bb3bf929e7a4c2a21bf6cf7e8e738c2d4a597bae";
/// A POST to `/users` with the covered body [`POST_BODY`].
const KNOWN_V3_POST: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
     v3=d82d2a470c9ed68ee5ee66570def61a760a442427e1f26c1bf354934e84f40a2";
const POST_BODY: &[u8] = br#"{"name":"alice"}"#;
/// [`KNOWN_V3`] as a mirror copy to the shadow: audience `users-shadow`, mirror `1`.
const KNOWN_V3_SHADOW: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
     v3=861c4af7e8666d3da6fb737209eb3618b05c5f2a13c4a1a28d6605232b92ea9c";
/// The previous release's vectors.
const KNOWN_V2: &str = "t=1700000000,id=0123456789abcdef0123456789abcdef,\
     v2=0da8f92987adf82b1a259915f1a48d5a183b85ea7effb0bb468e93f47f78709d";
const KNOWN_V1: &str =
    "t=1700000000,v1=5f666c26655b77ca111cd84631aee8bc23f13431e7695b14e9a861f5bb3ae1c0";
/// What the vectors sign: GET api.example /users/7?x=1 as alice/admin, no API key.
const TARGET: &str = "/users/7?x=1";
const NOW: u64 = 1_700_000_000;

fn headers(signature: &str, user: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(SIGNATURE_HEADER, HeaderValue::from_str(signature).unwrap());
    h.insert("host", HeaderValue::from_static("api.example"));
    if let Some(u) = user {
        h.insert("x-user-id", HeaderValue::from_str(u).unwrap());
        h.insert("x-user-role", HeaderValue::from_static("admin"));
    }
    h
}

/// The primary `users`' verifier.
fn verifier() -> IdentityVerifier {
    IdentityVerifier::new(SECRET, "users").unwrap()
}

/// A v3 header for `request`, signed by `v`.
fn sign(v: &IdentityVerifier, request: &SignedRequest<'_>) -> String {
    format!("t={},id={},v3={}", request.t, request.id, v.v3_hex(request))
}

fn request<'a>() -> SignedRequest<'a> {
    SignedRequest {
        t: "1700000000",
        id: "0123456789abcdef0123456789abcdef",
        mirror: false,
        method: "GET",
        host: b"api.example",
        target: TARGET,
        user_id: b"alice",
        user_role: b"admin",
        api_key_name: b"",
        body_sha256: b"",
    }
}

#[test]
fn accepts_the_v3_known_answer_once_within_the_window() {
    let v = verifier();
    assert_eq!(sign(&v, &request()), KNOWN_V3);
    let h = headers(KNOWN_V3, Some("alice"));
    assert_eq!(v.verify(&h, "GET", TARGET, None, NOW + 60), Ok(()));
    // The same request id again is a replay, whenever it comes.
    for now in [NOW, NOW + 60, NOW - 60] {
        assert_eq!(
            v.verify(&h, "GET", TARGET, None, now),
            Err(IdentityError::Replayed),
            "now {now}"
        );
    }
    // Another id (a new request) is accepted, in any key order.
    let other = SignedRequest {
        id: "fedcba9876543210fedcba9876543210",
        ..request()
    };
    let reordered = format!("v3={},id={},t={}", v.v3_hex(&other), other.id, other.t);
    assert_eq!(
        v.verify(
            &headers(&reordered, Some("alice")),
            "GET",
            TARGET,
            None,
            NOW
        ),
        Ok(())
    );
    assert_eq!(v.replay_cache().len(), 2);
}

#[test]
fn a_covered_body_is_checked_against_the_body_received() {
    let v = verifier();
    // No body, covered: the digest of no bytes.
    let h = headers(KNOWN_V3_NO_BODY, Some("alice"));
    assert_eq!(
        v.verify(&h, "GET", TARGET, None, NOW),
        Err(IdentityError::BodyNeeded)
    );
    assert_eq!(
        v.verify(&h, "GET", TARGET, Some(b"smuggled"), NOW),
        Err(IdentityError::Mismatch)
    );
    assert_eq!(v.verify(&h, "GET", TARGET, Some(b""), NOW), Ok(()));
    // A POST whose body the gateway held (the same id: another verifier).
    let v = verifier();
    let h = headers(KNOWN_V3_POST, Some("alice"));
    assert_eq!(
        v.verify(&h, "POST", "/users", None, NOW),
        Err(IdentityError::BodyNeeded)
    );
    for changed in [&br#"{"name":"mallory"}"#[..], b"", br#"{"name":"alice"} "#] {
        assert_eq!(
            v.verify(&h, "POST", "/users", Some(changed), NOW),
            Err(IdentityError::Mismatch),
            "{}",
            String::from_utf8_lossy(changed)
        );
    }
    assert_eq!(v.verify(&h, "POST", "/users", Some(POST_BODY), NOW), Ok(()));
    // The digest signed is the one a backend computes.
    let digest = gateway_hex::encode(Sha256::digest(POST_BODY));
    let post = SignedRequest {
        method: "POST",
        target: "/users",
        body_sha256: digest.as_bytes(),
        ..request()
    };
    assert_eq!(sign(&v, &post), KNOWN_V3_POST);
    // A streamed body is not covered: any body passes (the documented limit).
    let v = verifier();
    assert_eq!(
        v.verify(
            &headers(KNOWN_V3, Some("alice")),
            "GET",
            TARGET,
            Some(b"anything"),
            NOW
        ),
        Ok(())
    );
}

#[test]
fn a_shadows_copy_replayed_to_the_primary_is_refused() {
    // The shadow `users-shadow` shares the primary's secret (which validation now refuses,
    // and which v2 could not tell apart): what it received does not pass at the primary.
    let shadow = IdentityVerifier::new(SECRET, "users-shadow")
        .unwrap()
        .shadow(true);
    let mut copy = headers(KNOWN_V3_SHADOW, Some("alice"));
    copy.insert(MIRROR_HEADER, HeaderValue::from_static("1"));
    assert_eq!(
        sign(
            &shadow,
            &SignedRequest {
                mirror: true,
                ..request()
            }
        ),
        KNOWN_V3_SHADOW
    );
    assert_eq!(shadow.verify(&copy, "GET", TARGET, None, NOW), Ok(()));
    // At the primary, as it came: a mirror copy.
    let primary = verifier();
    assert_eq!(
        primary.verify(&copy, "GET", TARGET, None, NOW),
        Err(IdentityError::MirrorCopy)
    );
    // Without the marker: the mirror field and the audience differ.
    copy.remove(MIRROR_HEADER);
    assert_eq!(
        primary.verify(&copy, "GET", TARGET, Some(b""), NOW),
        Err(IdentityError::Mismatch)
    );
    // Even a primary that accepts copies refuses another upstream's.
    let lenient = verifier().shadow(true);
    copy.insert(MIRROR_HEADER, HeaderValue::from_static("1"));
    assert_eq!(
        lenient.verify(&copy, "GET", TARGET, Some(b""), NOW),
        Err(IdentityError::Mismatch)
    );
    // And the primary's own request does not pass at the shadow.
    let shadow = IdentityVerifier::new(SECRET, "users-shadow")
        .unwrap()
        .shadow(true);
    assert_eq!(
        shadow.verify(
            &headers(KNOWN_V3, Some("alice")),
            "GET",
            TARGET,
            Some(b""),
            NOW
        ),
        Err(IdentityError::Mismatch)
    );
    // The mirror flag is signed: the primary's request with the marker added does not match.
    let mut marked = headers(KNOWN_V3, Some("alice"));
    marked.insert(MIRROR_HEADER, HeaderValue::from_static("1"));
    assert_eq!(
        verifier()
            .shadow(true)
            .verify(&marked, "GET", TARGET, Some(b""), NOW),
        Err(IdentityError::Mismatch)
    );
}

#[test]
fn v2_only_while_told_and_v1_no_more() {
    let h = headers(KNOWN_V2, Some("alice"));
    assert_eq!(
        verifier().verify(&h, "GET", TARGET, None, NOW),
        Err(IdentityError::Outdated("v2"))
    );
    let upgrading = verifier().accept_v2(true);
    assert_eq!(
        upgrading.v2_hex(&request()),
        KNOWN_V2.rsplit_once("v2=").unwrap().1
    );
    assert_eq!(upgrading.verify(&h, "GET", TARGET, None, NOW), Ok(()));
    assert_eq!(
        upgrading.verify(&h, "GET", TARGET, None, NOW),
        Err(IdentityError::Replayed)
    );
    assert_eq!(
        upgrading.verify(
            &headers(KNOWN_V2, Some("alice")),
            "GET",
            "/users/7?x=2",
            None,
            NOW
        ),
        Err(IdentityError::Mismatch)
    );
    assert_eq!(
        upgrading.verify(
            &headers(KNOWN_V1, Some("alice")),
            "GET",
            "/users/7",
            None,
            NOW
        ),
        Err(IdentityError::Outdated("v1"))
    );
    // With several versions, the newest decides.
    let both =
        format!("{KNOWN_V3},v2=0da8f92987adf82b1a259915f1a48d5a183b85ea7effb0bb468e93f47f78709d");
    assert_eq!(
        verifier()
            .accept_v2(true)
            .verify(&headers(&both, Some("alice")), "GET", TARGET, None, NOW),
        Ok(())
    );
}

#[test]
fn refuses_any_change_to_what_was_signed() {
    let now = NOW;
    /// Changes the request's headers and gives its method and target.
    type Change = fn(&mut HeaderMap) -> (&'static str, &'static str);
    let changed: [(&str, Change); 10] = [
        ("method", |_| ("POST", TARGET)),
        ("path", |_| ("GET", "/users/8?x=1")),
        ("query", |_| ("GET", "/users/7?x=2")),
        ("no query", |_| ("GET", "/users/7")),
        ("host", |h| {
            h.insert("host", HeaderValue::from_static("evil.example"));
            ("GET", TARGET)
        }),
        ("user", |h| {
            h.insert("x-user-id", HeaderValue::from_static("mallory"));
            ("GET", TARGET)
        }),
        ("role", |h| {
            h.insert("x-user-role", HeaderValue::from_static("user"));
            ("GET", TARGET)
        }),
        ("api key name", |h| {
            h.insert("x-api-key-name", HeaderValue::from_static("billing"));
            ("GET", TARGET)
        }),
        ("anonymous", |h| {
            h.remove("x-user-id");
            h.remove("x-user-role");
            ("GET", TARGET)
        }),
        ("mirror", |h| {
            h.insert(MIRROR_HEADER, HeaderValue::from_static("1"));
            ("GET", TARGET)
        }),
    ];
    for (what, change) in changed {
        let v = verifier().shadow(true);
        let mut h = headers(KNOWN_V3, Some("alice"));
        let (method, target) = change(&mut h);
        assert_eq!(
            v.verify(&h, method, target, Some(b""), now),
            Err(IdentityError::Mismatch),
            "{what}"
        );
        // A refused request burns no id: the genuine one still passes.
        let genuine = headers(KNOWN_V3, Some("alice"));
        assert_eq!(
            v.verify(&genuine, "GET", TARGET, None, now),
            Ok(()),
            "{what}"
        );
    }
    let v = verifier();
    // Another id in the header, one flipped hex digit, another secret, another audience.
    let other_id = KNOWN_V3.replace("id=0123", "id=1123");
    let tampered = KNOWN_V3.replace("v3=1504", "v3=2504");
    for bad in [other_id, tampered] {
        assert_eq!(
            v.verify(&headers(&bad, Some("alice")), "GET", TARGET, Some(b""), now),
            Err(IdentityError::Mismatch),
            "{bad}"
        );
    }
    for other in [
        IdentityVerifier::new(&"z".repeat(32), "users").unwrap(),
        IdentityVerifier::new(SECRET, "orders").unwrap(),
    ] {
        assert_eq!(
            other.verify(
                &headers(KNOWN_V3, Some("alice")),
                "GET",
                TARGET,
                Some(b""),
                now
            ),
            Err(IdentityError::Mismatch),
            "{other:?}"
        );
    }
}

#[test]
fn refuses_expired_and_future_signatures() {
    let v = verifier();
    let h = headers(KNOWN_V3, Some("alice"));
    assert_eq!(
        v.verify(&h, "GET", TARGET, None, NOW + 61),
        Err(IdentityError::Expired(61))
    );
    assert_eq!(
        v.verify(&h, "GET", TARGET, None, NOW - 61),
        Err(IdentityError::Future(61))
    );
}

#[test]
fn refuses_missing_and_malformed_headers() {
    let v = verifier();
    assert_eq!(
        v.verify(&HeaderMap::new(), "GET", "/", None, 0),
        Err(IdentityError::Missing)
    );
    let mac = "15045b67488f76b821a3768a22d2b61562183d824f0447c119f995e4d5c17511";
    for bad in [
        "v3=00".to_owned(),
        format!("t=,id=abc,v3={mac}"),
        format!("t=12x,id=abc,v3={mac}"),
        format!("t=1700000000,id=abc,v3={}", mac.to_uppercase()),
        "t=1700000000,id=abc,v3=c86d".to_owned(),
        format!("t=1700000000;id=abc;v3={mac}"),
        // v3 without an id, with an empty or invalid one, repeated keys.
        format!("t=1700000000,v3={mac}"),
        format!("t=1700000000,id=,v3={mac}"),
        format!("t=1700000000,id=a b,v3={mac}"),
        format!("t=1700000000,id={},v3={mac}", "a".repeat(129)),
        format!("t=1700000000,t=1700000001,id=abc,v3={mac}"),
        format!("t=1700000000,id=abc,id=abd,v3={mac}"),
        format!("t=1700000000,id=abc,v3={mac},v3={mac}"),
        // No version at all, or a pair without '='.
        "t=1700000000,id=abc".to_owned(),
        format!("t=1700000000,id=abc,v3={mac},junk"),
    ] {
        assert_eq!(
            v.verify(&headers(&bad, None), "GET", "/", None, NOW),
            Err(IdentityError::Malformed),
            "{bad}"
        );
    }
    // Unknown keys are room for later versions.
    let later = format!("{KNOWN_V3},v4=whatever");
    assert_eq!(
        v.verify(&headers(&later, Some("alice")), "GET", TARGET, None, NOW),
        Ok(())
    );
}

#[test]
fn the_replay_cache_forgets_ids_once_their_window_has_passed() {
    let cache = ReplayCache::default();
    assert!(cache.insert("a", 100, 50));
    assert!(!cache.insert("a", 100, 100));
    // Past its window the id may come again (its t would be refused anyway).
    assert!(cache.insert("a", 200, 101));
    // Expired entries are swept as the map grows: memory follows the traffic of one window.
    for i in 0..5000 {
        assert!(cache.insert(&format!("old-{i}"), 1000, 900));
    }
    for i in 0..5000 {
        assert!(cache.insert(&format!("new-{i}"), 3000, 2000));
    }
    assert!(cache.len() <= 5000 + 1024, "{}", cache.len());
}

#[test]
fn secrets_must_match_the_gateway_rules_and_an_audience_is_required() {
    assert!(IdentityVerifier::new(&"s".repeat(31), "users").is_none());
    assert!(IdentityVerifier::new(&"s".repeat(257), "users").is_none());
    assert!(IdentityVerifier::new(&format!("{} ", "s".repeat(32)), "users").is_none());
    assert!(IdentityVerifier::new(&"s".repeat(32), "").is_none());
    assert!(IdentityVerifier::new(&"s".repeat(32), "users").is_some());
    let shown = format!("{:?}", verifier());
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(shown.contains("\"users\""), "{shown}");
}
