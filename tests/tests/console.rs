//! The control plane's web console (`--console-listen`, docs/console.md)
//! against real processes: a devstack control plane with its console, and
//! real data planes. The same pages in a real browser: console_browser.rs.
//!
//! Needs every binary built in the same target directory (as tests/dataplane.rs).
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use std::time::Duration;

use devstack::Stack;
use gateway_proto::v1::{DataPlaneState, ListDataPlanesRequest, UpsertRouteRequest};
use gateway_tests::console::ConsoleClient;
use gateway_tests::{
    client, data_planes_without_auth, open_route, poll, secrets_in_logs, upsert_route_synced,
};

/// Deadline for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);

/// The pages every signed-in role sees.
const PAGES: [&str; 6] = [
    "/overview",
    "/config",
    "/health",
    "/versions",
    "/api-keys",
    "/certificates",
];

/// The status each gateway answers `GET /open/orders/7` with.
async fn open_orders_status(gateways: &[String]) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for gw in gateways {
        let r = client()
            .get(format!("{gw}/open/orders/7"))
            .send()
            .await
            .unwrap();
        out.push((gw.clone(), r.status().as_u16()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_every_page_and_no_write_control() {
    let stack = data_planes_without_auth(2).await;
    // A second version, so the history has something to roll back to.
    let v2 = upsert_route_synced(
        &stack,
        open_route("open-orders", "/open/orders", "orders", "/orders"),
    )
    .await
    .unwrap();

    let mut viewer = ConsoleClient::new(&stack.console_url());
    // Not signed in: every page sends to the sign-in form.
    let page = viewer.get("/overview").await.unwrap();
    assert_eq!(page.status, 303);
    assert_eq!(page.header("location"), Some("/signin"));

    let signed_in = viewer.sign_in(stack.viewer_token()).await.unwrap();
    assert_eq!(signed_in.status, 303, "{}", signed_in.body);
    assert_eq!(signed_in.header("location"), Some("/overview"));

    for path in PAGES {
        let page = viewer.get(path).await.unwrap();
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(page.body.contains("devstack-viewer"), "{path}");
        // The one form a viewer gets is sign-out.
        assert_eq!(
            page.body.matches("method=\"post\"").count(),
            1,
            "{path}: {}",
            page.body
        );
        for write in [
            "/versions/rollback",
            "action=\"/api-keys\"",
            "/api-keys/revoke",
        ] {
            assert!(!page.body.contains(write), "{path} offers {write}");
        }
    }

    // The overview: the current version, its author, every data plane SYNCED to it.
    let overview = viewer.get("/overview").await.unwrap().body;
    assert!(
        overview.contains(&format!("<dd class=\"version\">{v2}</dd>")),
        "{overview}"
    );
    assert!(overview.contains("devstack-admin"), "{overview}");
    for name in stack.data_plane_names() {
        assert!(overview.contains(&name), "{name} missing: {overview}");
    }
    assert!(overview.contains("2 of 2 synced"), "{overview}");
    assert_eq!(overview.matches(">SYNCED<").count(), 2, "{overview}");

    // Routes and upstreams with their policies; the signing secret only as "set".
    let config = viewer.get("/config").await.unwrap().body;
    for name in ["open-orders", "users", "orders", "orders-1", "orders-2"] {
        assert!(config.contains(name), "{name}: {config}");
    }

    // The diff between the two versions, per field.
    let diff = viewer
        .get(&format!("/versions?from={}&to={v2}", v2 - 1))
        .await
        .unwrap()
        .body;
    assert!(diff.contains("open-orders"), "{diff}");
    assert!(diff.contains("<code>pathPrefix</code>"), "{diff}");
    assert!(diff.contains("&quot;/open/orders&quot;"), "{diff}");

    // Every upstream instance as each data plane reports it.
    let health = poll(SOON, "every data plane reporting its instances", || {
        let mut viewer = ConsoleClient::new(&stack.console_url());
        let token = stack.viewer_token().to_owned();
        let planes = stack.data_plane_names();
        async move {
            viewer.sign_in(&token).await.map_err(|e| e.to_string())?;
            let body = viewer.get("/health").await.map_err(|e| e.to_string())?.body;
            let complete =
                planes.iter().all(|p| body.contains(p.as_str())) && body.contains("orders-2");
            if complete { Ok(body) } else { Err(body) }
        }
    })
    .await
    .unwrap();
    assert!(health.contains(">healthy<"), "{health}");
    assert!(health.contains(">closed<"), "{health}");
    assert!(!health.contains(">unhealthy<"), "{health}");

    // A viewer's forged rollback, with its own valid CSRF token: refused by role.
    let csrf = viewer
        .get("/overview")
        .await
        .unwrap()
        .hidden("csrf")
        .unwrap();
    let refused = viewer
        .post(
            "/versions/rollback",
            &[
                ("csrf", &csrf),
                ("version", "1"),
                ("expected_version", &v2.to_string()),
            ],
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(
        viewer
            .get("/versions/rollback?version=1")
            .await
            .unwrap()
            .status,
        403
    );
    let mut admin = stack.admin_client().await;
    let planes = admin
        .list_data_planes(ListDataPlanesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(planes.current_version, v2);
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_rolls_back_and_every_data_plane_reaches_it() {
    let stack = data_planes_without_auth(2).await;
    let gateways = stack.gateways();
    let v1 = stack.seeded_version();
    let v2 = upsert_route_synced(
        &stack,
        open_route("open-orders", "/open/orders", "orders", "/orders"),
    )
    .await
    .unwrap();
    for (gw, status) in open_orders_status(&gateways).await {
        assert_eq!(status, 200, "{gw}");
    }

    let mut console = ConsoleClient::new(&stack.console_url());
    assert_eq!(
        console.sign_in(stack.admin_token()).await.unwrap().status,
        303
    );
    let versions = console.get("/versions").await.unwrap().body;
    assert!(
        versions.contains(&format!("href=\"/versions/rollback?version={v1}\"")),
        "{versions}"
    );
    // The confirmation step: what would change, and the form with the current version.
    let confirm = console
        .get(&format!("/versions/rollback?version={v1}"))
        .await
        .unwrap();
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(confirm.body.contains("open-orders"), "{}", confirm.body);
    assert_eq!(confirm.hidden("expected_version"), Some(v2.to_string()));
    let csrf = confirm.hidden("csrf").unwrap();

    // Without the CSRF token, or with another one: 403, nothing committed.
    for fields in [
        vec![
            ("version", v1.to_string()),
            ("expected_version", v2.to_string()),
        ],
        vec![
            ("csrf", "0".repeat(64)),
            ("version", v1.to_string()),
            ("expected_version", v2.to_string()),
        ],
    ] {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let page = console.post("/versions/rollback", &fields).await.unwrap();
        assert_eq!(page.status, 403, "{}", page.body);
        assert!(page.body.contains("CSRF"), "{}", page.body);
    }

    let done = console
        .post(
            "/versions/rollback",
            &[
                ("csrf", &csrf),
                ("version", &v1.to_string()),
                ("expected_version", &v2.to_string()),
            ],
        )
        .await
        .unwrap();
    assert_eq!(done.status, 303, "{}", done.body);
    let v3 = v2 + 1;
    stack.wait_synced(v3).await.unwrap();
    for (gw, status) in open_orders_status(&gateways).await {
        assert_eq!(status, 404, "{gw} still routes /open/orders");
    }
    let overview = console.get("/overview").await.unwrap().body;
    assert!(overview.contains(&format!("<dd class=\"version\">{v3}</dd>")));
    assert!(overview.contains("2 of 2 synced"), "{overview}");
    assert!(overview.contains("rollback to version"), "{overview}");
    // Each data plane's last ACK is of the rolled-back version.
    assert_eq!(
        overview.matches(&format!("(version {v3})")).count(),
        2,
        "{overview}"
    );

    // A rollback confirmed after someone else committed is refused, not applied over it.
    let confirm = console
        .get(&format!("/versions/rollback?version={v2}"))
        .await
        .unwrap();
    let expected = confirm.hidden("expected_version").unwrap();
    assert_eq!(expected, v3.to_string());
    stack
        .admin_client()
        .await
        .upsert_route(UpsertRouteRequest {
            route: Some(open_route("open-users", "/open/users", "users", "/users")),
            expected_version: None,
        })
        .await
        .unwrap();
    let refused = console
        .post(
            "/versions/rollback",
            &[
                ("csrf", &csrf),
                ("version", &v2.to_string()),
                ("expected_version", &expected),
            ],
        )
        .await
        .unwrap();
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(
        refused
            .body
            .contains(&format!("expected version {v3}, current is {}", v3 + 1)),
        "{}",
        refused.body
    );
    let planes = stack
        .admin_client()
        .await
        .list_data_planes(ListDataPlanesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(planes.current_version, v3 + 1);

    // API keys: created (shown once), listed without the key, revoked.
    let keys = console.get("/api-keys").await.unwrap();
    let created = console
        .post(
            "/api-keys",
            &[
                ("csrf", &keys.hidden("csrf").unwrap()),
                ("name", "partner"),
                ("subject", "partner-7"),
                ("role", "partner"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(created.status, 200, "{}", created.body);
    let start = created.body.find("<p class=\"secret\"><code>").unwrap() + 24;
    let key = &created.body[start..start + created.body[start..].find('<').unwrap()];
    assert!(key.len() >= 32, "{key}");
    let listed = console.get("/api-keys").await.unwrap().body;
    assert!(listed.contains("partner-7"));
    assert!(!listed.contains(key), "the key is shown again");
    let revoked = console
        .post("/api-keys/revoke", &[("csrf", &csrf), ("name", "partner")])
        .await
        .unwrap();
    assert_eq!(revoked.status, 303, "{}", revoked.body);
    assert!(
        !console
            .get("/api-keys")
            .await
            .unwrap()
            .body
            .contains("partner-7")
    );

    // Sign-out ends the session on the server: the old cookie no longer works.
    let old = console.cookie("console_session").unwrap().to_owned();
    assert_eq!(
        console
            .post("/signout", &[("csrf", &csrf)])
            .await
            .unwrap()
            .status,
        303
    );
    let mut replay = ConsoleClient::new(&stack.console_url());
    replay.insert_cookie("console_session", &old);
    let page = replay.get("/overview").await.unwrap();
    assert_eq!(page.status, 303);
    let states: Vec<i32> = planes.data_planes.iter().map(|d| d.status).collect();
    assert!(states.iter().all(|s| *s != DataPlaneState::Nacked as i32));

    // No token, key, session id or CSRF token in any process's log.
    let (scanned, leaks) = secrets_in_logs(
        &stack.log_dir(),
        &[
            ("the admin token".into(), stack.admin_token().to_owned()),
            ("the new API key".into(), key.to_owned()),
            ("the session id".into(), old.clone()),
            ("the CSRF token".into(), csrf.clone()),
        ],
    )
    .unwrap();
    assert!(scanned >= 3, "{scanned} logs");
    assert!(leaks.is_empty(), "{leaks:#?}");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_refusals_are_generic_and_cookies_are_strict() {
    let stack = data_planes_without_auth(1).await;
    let url = stack.console_url();

    // The sign-in form: no script, the strict policy on every answer.
    let mut browser = ConsoleClient::new(&url);
    let form = browser.get("/signin").await.unwrap();
    assert_eq!(form.status, 200);
    assert!(!form.body.contains("<script"));
    let csp = form.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(form.header("x-frame-options"), Some("DENY"));
    let pairing = form.set_cookie("console_signin").unwrap();
    assert!(
        pairing.contains("HttpOnly") && pairing.contains("SameSite=Strict"),
        "{pairing}"
    );
    assert!(!pairing.contains("Secure"), "plain HTTP: {pairing}");

    // Wrong token, a data plane's token, an empty one: the same words, no session.
    let mut bodies = Vec::new();
    for token in [
        "not-a-token",
        stack.data_plane_token(),
        "",
        &stack.admin_token()[1..],
    ] {
        let mut b = ConsoleClient::new(&url);
        let page = b.sign_in(token).await.unwrap();
        assert_eq!(page.status, 401, "{}", page.body);
        assert!(page.body.contains("Sign-in failed."), "{}", page.body);
        assert!(page.set_cookie("console_session").is_none());
        let start = page.body.find("role=\"alert\">").unwrap();
        bodies.push(page.body[start..start + 40].to_owned());
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");

    // A sign-in without the form's pairing cookie (another site's form): 403.
    let mut forged = ConsoleClient::new(&url);
    let page = forged
        .post(
            "/signin",
            &[("csrf", "abc"), ("token", stack.admin_token())],
        )
        .await
        .unwrap();
    assert_eq!(page.status, 403);
    assert!(page.set_cookie("console_session").is_none());

    // The session cookie: HttpOnly, SameSite=Strict, a bounded lifetime.
    let ok = browser.sign_in(stack.admin_token()).await.unwrap();
    assert_eq!(ok.status, 303, "{}", ok.body);
    let cookie = ok.set_cookie("console_session").unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=28800"] {
        assert!(cookie.contains(attribute), "{attribute}: {cookie}");
    }
    // A POST without a session, and one without the CSRF field: 403.
    let mut anonymous = ConsoleClient::new(&url);
    let page = anonymous
        .post("/api-keys/revoke", &[("name", "x")])
        .await
        .unwrap();
    assert_eq!(page.status, 403);
    let page = browser
        .post(
            "/api-keys",
            &[("name", "x"), ("subject", "s"), ("role", "r")],
        )
        .await
        .unwrap();
    assert_eq!(page.status, 403, "{}", page.body);
    assert!(!browser.get("/api-keys").await.unwrap().body.contains(">x<"));
    stack.shutdown().await;
}

/// `GET path` over TLS to the console of a `.tls(true)` stack, trusting its
/// CA, with `cookie`; the whole answer (head and body) as text.
async fn tls_get(stack: &Stack, path: &str, cookie: Option<&str>) -> String {
    use rustls::pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(&stack.pki().unwrap().ca).unwrap();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", stack.ports().console))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let cookie = cookie.map_or_else(String::new, |c| format!("Cookie: {c}\r\n"));
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{cookie}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    // The server closes after its answer (Connection: close); a TLS close
    // without close_notify would be an error worth seeing.
    tls.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_console_uses_the_control_planes_certificate_and_secure_cookies() {
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .tls(true)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"));
    assert!(stack.console_url().starts_with("https://localhost:"));
    let answer = tls_get(&stack, "/signin", None).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        head.contains("strict-transport-security: max-age=31536000"),
        "{head}"
    );
    let pairing = head
        .lines()
        .find(|l| l.starts_with("set-cookie: console_signin="))
        .unwrap();
    assert!(pairing.ends_with("; secure"), "{pairing}");
    // Plain HTTP on the TLS port gets no page.
    let plain = client()
        .get(format!("http://127.0.0.1:{}/signin", stack.ports().console))
        .send()
        .await;
    assert!(plain.map_or(true, |r| r.status() != 200));
    // Not signed in: sent to the sign-in form.
    let overview = tls_get(&stack, "/overview", Some("console_session=nope")).await;
    assert!(overview.starts_with("HTTP/1.1 303"), "{overview}");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_health_shows_an_instance_that_stopped_answering() {
    let stack = data_planes_without_auth(1).await;
    upsert_route_synced(
        &stack,
        open_route("open-orders", "/open/orders", "orders", "/orders"),
    )
    .await
    .unwrap();
    stack.kill("orders-1").await.unwrap();
    let gateway = stack.gateways()[0].clone();
    let row = poll(SOON, "orders-1's breaker open on the health page", || {
        let mut viewer = ConsoleClient::new(&stack.console_url());
        let token = stack.viewer_token().to_owned();
        let gateway = gateway.clone();
        async move {
            // Traffic that reaches orders-1 fails to connect (and is retried on orders-2).
            for _ in 0..4 {
                let _ = client()
                    .get(format!("{gateway}/open/orders/7"))
                    .send()
                    .await;
            }
            viewer.sign_in(&token).await.map_err(|e| e.to_string())?;
            let body = viewer.get("/health").await.map_err(|e| e.to_string())?.body;
            let row = body
                .split("<tr>")
                .find(|r| r.contains("<code>orders-1</code>"))
                .ok_or_else(|| format!("no orders-1 row: {body}"))?
                .to_owned();
            if row.contains(">open<") {
                Ok(row)
            } else {
                Err(row)
            }
        }
    })
    .await
    .unwrap();
    // The failed attempts show in its error rate (100 %: nothing it was sent succeeded),
    // unless the report came after the breaker had already stopped sending it anything.
    assert!(
        row.contains("100.0 %") || row.contains("no requests"),
        "{row}"
    );
    stack.shutdown().await;
}
