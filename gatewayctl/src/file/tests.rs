#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn a_jwt_issuers_section_is_read_and_checked_against_the_routes() {
    let text = "\
routes:
  - name: sso
    pathPrefix: /sso
    upstream: users
    auth: AUTH_JWT
    jwtIssuers: [keycloak]
upstreams:
  - name: users
    instances:
      - id: users-1
        url: http://127.0.0.1:7001
jwtIssuers:
  - name: keycloak
    issuer: https://sso.example.com/realms/acme
    discoveryUrl: https://sso.example.com/realms/acme/.well-known/openid-configuration
    audiences: [gateway]
    roleClaim: realm_access.roles
";
    let file = parse("gw.yaml", text, &no_env).unwrap();
    assert_eq!(file.jwt_issuers.len(), 1);
    assert_eq!(file.jwt_issuers[0].role_claim, "realm_access.roles");
    file.validate().unwrap();
    let bad = text.replace("audiences: [gateway]", "audiences: []");
    let p = problems(&bad);
    assert!(
        p.iter()
            .any(|p| p.contains("jwt issuer \"keycloak\": audiences must list")),
        "{p:?}"
    );
}

fn problems(text: &str) -> Vec<String> {
    let file = match parse("gw.yaml", text, &no_env) {
        Ok(file) => file,
        Err(CtlError::Invalid(p)) => return p,
        Err(e) => panic!("{e}"),
    };
    match file.validate() {
        Err(CtlError::Invalid(p)) => p,
        other => panic!("expected problems, got {other:?}"),
    }
}

const GOOD: &str = "\
routes:
  - name: users
    pathPrefix: /api/users
    upstream: users
    auth: AUTH_NONE
    rate_limits:
      - policy: per-ip
        algorithm: TOKEN_BUCKET
        key: KEY_IP
        limit: 10
        windowSeconds: 1
upstreams:
  - name: users
    instances:
      - id: users-1
        url: http://127.0.0.1:7001
";

#[test]
fn a_good_file_reads_in_either_field_spelling_and_validates() {
    let file = parse("gw.yaml", GOOD, &no_env).unwrap();
    assert_eq!(file.routes.len(), 1);
    assert_eq!(file.routes[0].path_prefix, "/api/users");
    assert_eq!(file.routes[0].rate_limits[0].limit, 10);
    assert_eq!(file.upstreams[0].instances[0].url, "http://127.0.0.1:7001");
    file.validate().unwrap();
}

#[test]
fn unknown_fields_and_sections_are_refused_at_their_line() {
    let text = GOOD.replace(
        "        windowSeconds: 1",
        "        windowSeconds: 1\n        windw: 3",
    );
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("gw.yaml:12: routes[0].rate_limits[0].windw"),
        "{p:?}"
    );
    assert!(p[0].contains("unknown field `windw`"), "{p:?}");

    let p = problems(&format!("{GOOD}dryRun: true\n"));
    assert_eq!(
        p,
        [
            "gw.yaml:17: unknown section `dryRun` (a file has `routes`, `upstreams` and `jwtIssuers`)"
        ]
    );
}

#[test]
fn wrong_types_name_the_field_and_line() {
    let text = GOOD.replace("limit: 10", "limit: ten");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("gw.yaml:10: routes[0].rate_limits[0].limit: "),
        "{p:?}"
    );
    let p = problems(&GOOD.replace("auth: AUTH_NONE", "auth: AUTH_MAYBE"));
    assert!(p[0].starts_with("gw.yaml:5: routes[0].auth: "), "{p:?}");
}

#[test]
fn validation_problems_point_at_the_route_and_field() {
    // A route to an upstream that does not exist: the line of its `upstream`.
    let text = GOOD.replace("    upstream: users", "    upstream: nope");
    let p = problems(&text);
    assert_eq!(
        p,
        ["gw.yaml:4: route \"users\": upstream \"nope\" does not exist"]
    );
    // A problem that names no field of the route: the route's line.
    let text = GOOD.replace(
        "    auth: AUTH_NONE\n",
        "    auth: AUTH_NONE\n    timeoutMs: 999999999\n",
    );
    let p = problems(&text);
    assert!(
        p[0].starts_with("gw.yaml:6: route \"users\": timeout_ms"),
        "{p:?}"
    );
    // A bad field: its line.
    let p = problems(&GOOD.replace("limit: 10", "limit: 0"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("gw.yaml:10: route \"users\": rate_limits[0].limit"),
        "{p:?}"
    );
    // An upstream's problem: the upstream's field.
    let p = problems(&GOOD.replace("http://127.0.0.1:7001", "ftp://x"));
    assert_eq!(
        p,
        [
            "gw.yaml:16: upstream \"users\": instance \"users-1\": url \"ftp://x\" must be http://host:port or https://host:port (no path, query or credentials)"
        ]
    );
}

#[test]
fn what_is_not_a_configuration_is_said_so() {
    assert_eq!(
        problems(""),
        ["gw.yaml:1: the file is empty; it needs `routes:` and `upstreams:`"]
    );
    assert_eq!(
        problems("- 1\n"),
        ["gw.yaml:1: the file must be a mapping with `routes:` and `upstreams:`"]
    );
    assert_eq!(
        problems("routes: 3\n"),
        ["gw.yaml:1: `routes` must be a list"]
    );
    let p = problems("routes:\n  - name: a\n    pathPrefix: [1\n");
    assert!(p[0].starts_with("gw.yaml:"), "{p:?}");
}

#[test]
fn environment_variables_fill_secrets() {
    let text = format!("{GOOD}    identitySigningSecret: ${{GATEWAY_VAR_SIGNING}}\n");
    let line = text.lines().count();
    let env = |n: &str| {
        (n == "GATEWAY_VAR_SIGNING").then(|| "0123456789abcdef0123456789abcdef".to_owned())
    };
    let file = parse("gw.yaml", &text, &env).unwrap();
    assert_eq!(
        file.upstreams[0].identity_signing_secret,
        "0123456789abcdef0123456789abcdef"
    );
    let e = parse("gw.yaml", &text, &no_env).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "gw.yaml:{line}: environment variable GATEWAY_VAR_SIGNING is not set (the file says ${{GATEWAY_VAR_SIGNING}})"
        )
    );
}
