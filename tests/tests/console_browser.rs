//! The web console in a real browser: headless Chromium driven over the
//! DevTools protocol ([`gateway_tests::cdp`]) signs in by typing a token into
//! the form and pressing Enter, then opens every page. The browser enforces
//! the Content-Security-Policy and reports what it blocks: no page may log an
//! error or a warning, and an inline script is refused.
//!
//! With `CONSOLE_SCREENSHOTS=DIR` it also writes the PNGs the README shows
//! (`console-overview.png`, `console-health.png`, `console-versions.png`) into DIR.
//!
//! Needs `chromium` on PATH (scripts/test installs it) and every binary built
//! in the same target directory (as tests/dataplane.rs).
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use gateway_tests::cdp::Browser;
use gateway_tests::{data_planes_without_auth, open_route, upsert_route_synced};
use serde_json::json;

/// Writes `png` as `DIR/console-NAME.png` when `CONSOLE_SCREENSHOTS=DIR` is set.
fn keep_screenshot(name: &str, png: &[u8]) {
    if let Ok(dir) = std::env::var("CONSOLE_SCREENSHOTS") {
        let path = std::path::Path::new(&dir).join(format!("console-{name}.png"));
        std::fs::write(&path, png).unwrap();
        eprintln!("wrote {}", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_and_renders_every_page_without_csp_violations() {
    let stack = data_planes_without_auth(3).await;
    let v2 = upsert_route_synced(
        &stack,
        open_route("open-orders", "/open/orders", "orders", "/orders"),
    )
    .await
    .unwrap();
    let console = stack.console_url();

    let mut browser = Browser::launch().await.unwrap();
    let page = browser.new_page(1280, 860).await.unwrap();

    // The sign-in page renders, with its stylesheet, and logs nothing.
    browser
        .navigate(&page, &format!("{console}/signin"))
        .await
        .unwrap();
    let html = browser.html(&page).await.unwrap();
    assert!(html.contains("Admin or viewer token"), "{html}");
    assert_eq!(browser.problems(), Vec::<String>::new());

    // A wrong token: the form again, with the one generic message.
    browser
        .type_into(&page, "#token", "wrong-token")
        .await
        .unwrap();
    browser.press_enter_and_wait(&page).await.unwrap();
    let html = browser.html(&page).await.unwrap();
    assert!(html.contains("Sign-in failed."), "{html}");
    assert!(browser.url(&page).await.unwrap().ends_with("/signin"));
    // The browser logs the 401 itself; nothing else.
    let logged = browser.problems();
    assert!(
        logged.len() == 1 && logged[0].contains("status of 401"),
        "{logged:?}"
    );

    // The viewer's token, typed and submitted: the overview.
    browser
        .type_into(&page, "#token", stack.viewer_token())
        .await
        .unwrap();
    browser.press_enter_and_wait(&page).await.unwrap();
    assert_eq!(
        browser.url(&page).await.unwrap(),
        format!("{console}/overview")
    );
    let html = browser.html(&page).await.unwrap();
    assert!(
        html.contains(&format!("<dd class=\"version\">{v2}</dd>")),
        "{html}"
    );
    assert!(html.contains("3 of 3 synced"), "{html}");
    assert_eq!(html.matches(">SYNCED<").count(), 3, "{html}");
    assert_eq!(browser.problems(), Vec::<String>::new());
    let overview = browser.screenshot(&page, false).await.unwrap();
    assert!(overview.starts_with(b"\x89PNG"), "not a PNG");
    keep_screenshot("overview", &overview);

    // Every other page, as the viewer: rendered, no write control, nothing logged.
    for (path, name) in [
        ("/config", "config"),
        ("/health", "health"),
        (&format!("/versions?from={}&to={v2}", v2 - 1), "versions"),
        ("/api-keys", "api-keys"),
        ("/certificates", "certificates"),
    ] {
        browser
            .navigate(&page, &format!("{console}{path}"))
            .await
            .unwrap();
        let html = browser.html(&page).await.unwrap();
        assert!(html.contains("devstack-viewer"), "{path}: {html}");
        assert!(!html.contains("Roll back"), "{path}");
        assert!(!html.contains("Revoke"), "{path}");
        assert_eq!(browser.problems(), Vec::<String>::new(), "{path}");
        if matches!(name, "health" | "versions") {
            keep_screenshot(name, &browser.screenshot(&page, false).await.unwrap());
        }
    }

    // Signed out (the form in the header), then in as the admin: the write
    // controls render, and log nothing either.
    browser
        .navigate(&page, &format!("{console}/overview"))
        .await
        .unwrap();
    let signout = browser.query(&page, "form.signout button").await.unwrap();
    browser
        .call(Some(&page), "DOM.focus", json!({"nodeId": signout}))
        .await
        .unwrap();
    browser.press_enter_and_wait(&page).await.unwrap();
    assert!(browser.url(&page).await.unwrap().ends_with("/signin"));
    browser
        .navigate(&page, &format!("{console}/overview"))
        .await
        .unwrap();
    assert!(
        browser.url(&page).await.unwrap().ends_with("/signin"),
        "the session ended"
    );
    browser
        .type_into(&page, "#token", stack.admin_token())
        .await
        .unwrap();
    browser.press_enter_and_wait(&page).await.unwrap();
    for (path, control) in [
        ("/versions", "Roll back to 1"),
        ("/versions/rollback?version=1", "Roll back to version 1"),
        ("/api-keys", "New API key"),
    ] {
        browser
            .navigate(&page, &format!("{console}{path}"))
            .await
            .unwrap();
        let html = browser.html(&page).await.unwrap();
        assert!(html.contains(control), "{path}: {html}");
        assert_eq!(browser.problems(), Vec::<String>::new(), "{path}");
    }

    // The policy is enforced: a script added to the page does not run, and
    // the browser reports the violation (so the checks above can see one).
    let ran = browser
        .call(
            Some(&page),
            "Runtime.evaluate",
            json!({"expression": "const s = document.createElement('script'); \
                s.textContent = 'document.title = \"pwned\"'; document.body.appendChild(s); \
                document.title", "returnByValue": true}),
        )
        .await
        .unwrap();
    assert_ne!(ran["result"]["value"], "pwned", "{ran}");
    let reported = browser.event(&page, "Log.entryAdded").await.unwrap();
    assert!(
        reported["entry"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Content Security Policy"),
        "{reported}"
    );

    browser.close().await;
    stack.shutdown().await;
}
