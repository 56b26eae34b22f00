#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use super::*;
use serde_json::json;

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn values_and_lines_of_a_yaml_file() {
    let text = "\
routes:
  - name: users
    pathPrefix: /api/users
    timeoutMs: 1500
    rateLimits:
      - policy: per-user
        limit: 20
  - name: orders
    methods: [GET, POST]
    stripPrefix: true
    note: ~
";
    let doc = read(text, &no_env).unwrap();
    assert_eq!(
        doc.value,
        json!({"routes": [
            {"name": "users", "pathPrefix": "/api/users", "timeoutMs": 1500,
             "rateLimits": [{"policy": "per-user", "limit": 20}]},
            {"name": "orders", "methods": ["GET", "POST"], "stripPrefix": true, "note": null}
        ]})
    );
    assert_eq!(doc.lines["routes[0].name"], 2);
    assert_eq!(doc.lines["routes[0].timeout_ms"], 4);
    assert_eq!(doc.lines["routes[0].rate_limits[0].policy"], 6);
    assert_eq!(doc.lines["routes[1].methods[1]"], 9);
    // An unknown deeper path falls back to the nearest node that has a line.
    assert_eq!(doc.line_of("routes[0].rate_limits[0].window_ms"), Some(6));
    assert_eq!(doc.line_of("routes[1].name"), Some(8));
}

#[test]
fn json_is_read_by_the_same_parser() {
    let text = "{\n  \"upstreams\": [\n    {\"name\": \"u\", \"instances\": [\"http://127.0.0.1:1\"]}\n  ]\n}\n";
    let doc = read(text, &no_env).unwrap();
    assert_eq!(
        doc.value,
        json!({"upstreams": [{"name": "u", "instances": ["http://127.0.0.1:1"]}]})
    );
    assert_eq!(doc.lines["upstreams[0].name"], 3);
}

#[test]
fn quoted_scalars_stay_strings_and_plain_ones_follow_the_core_schema() {
    let doc = read(
        "a: '15'\nb: \"true\"\nc: 15\nd: -3\ne: 2.5\nf: 1e3\ng: yes\nh: 0x10\ni: 18446744073709551615\n",
        &no_env,
    )
    .unwrap();
    assert_eq!(
        doc.value,
        json!({"a": "15", "b": "true", "c": 15, "d": -3, "e": 2.5, "f": 1000.0,
               "g": "yes", "h": "0x10", "i": 18446744073709551615u64})
    );
}

#[test]
fn environment_variables_fill_secret_fields_only_from_gateway_var_names() {
    let env = |name: &str| match name {
        "GATEWAY_VAR_SECRET" => Some("s3cr3t".to_owned()),
        "GATEWAY_TOKEN" => Some("admin-token".to_owned()),
        _ => None,
    };
    let doc = read(
        "upstreams:\n  - identitySigningSecret: ${GATEWAY_VAR_SECRET}\n  - identity_signing_secret: x-${GATEWAY_VAR_SECRET}-y\nc: $${GATEWAY_TOKEN}\n",
        &env,
    )
    .unwrap();
    assert_eq!(
        doc.value,
        json!({"upstreams": [{"identitySigningSecret": "s3cr3t"},
               {"identity_signing_secret": "x-s3cr3t-y"}], "c": "${GATEWAY_TOKEN}"})
    );
    assert_eq!(doc.substituted, ["s3cr3t", "s3cr3t"]);
    assert_eq!(
        doc.redact("got s3cr3t twice: s3cr3t"),
        "got <secret> twice: <secret>"
    );
    // Issue 41, item 11: no other field, no other variable.
    let e = read("a: 1\nb: ${GATEWAY_VAR_SECRET}\n", &env).unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("only in secret fields"), "{e}");
    // A map key named like the secret field elsewhere (a header) is not one.
    let e = read(
        "routes:\n  - requestHeaders:\n      set:\n        identitySigningSecret: ${GATEWAY_VAR_SECRET}\n",
        &env,
    )
    .unwrap_err();
    assert!(e.message.contains("only in secret fields"), "{e}");
    let e = read(
        "upstreams:\n  - identitySigningSecret: ${GATEWAY_TOKEN}\n",
        &env,
    )
    .unwrap_err();
    assert!(
        e.message.contains("only variables named GATEWAY_VAR_*"),
        "{e}"
    );
    assert!(!e.message.contains("admin-token"), "{e}");
    let e = read(
        "upstreams:\n  - identitySigningSecret: ${GATEWAY_VAR_MISSING}\n",
        &env,
    )
    .unwrap_err();
    assert!(e.message.contains("GATEWAY_VAR_MISSING is not set"), "{e}");
    let e = read("b: ${A-B}\n", &env).unwrap_err();
    assert!(e.message.contains("letters, digits and _"), "{e}");
    let e = read("b: ${OPEN\n", &env).unwrap_err();
    assert!(e.message.contains("unclosed"), "{e}");
}

#[test]
fn what_a_configuration_file_has_no_use_for_is_refused_with_its_line() {
    for (text, line, says) in [
        ("a: 1\na: 2\n", 2, "duplicate key \"a\""),
        ("a: &x 1\nb: *x\n", 1, "anchors"),
        ("a: !!str 1\n", 1, "anchors and tags"),
        ("a: 1\n---\nb: 2\n", 1, "more than one YAML document"),
        ("a: [1, 2\n", 2, ""),
        ("? [1]\n: 2\n", 1, "a key must be a string"),
    ] {
        let e = read(text, &no_env).unwrap_err();
        assert_eq!(e.line, line, "{text:?}: {e}");
        assert!(e.message.contains(says), "{text:?}: {e}");
    }
}

#[test]
fn snake_case_of_json_names() {
    assert_eq!(snake_case("rateLimits"), "rate_limits");
    assert_eq!(snake_case("rate_limits"), "rate_limits");
    assert_eq!(snake_case("ipAllow"), "ip_allow");
}
