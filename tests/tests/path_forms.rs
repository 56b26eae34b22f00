//! Path forms that backends resolve differently from the gateway (issue 25,
//! item 14), sent as raw bytes through a real data plane to a real mock:
//! `;` path parameters (`..;`, which Tomcat, Jetty and Spring read as `..`),
//! `%25` double encoding and backslashes are refused with 400 `bad-path`
//! before routing, and the mock never sees them; the forms that stay legal
//! reach the mock in their one normalised spelling.
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use anyhow::{Context, Result, ensure};
use devstack::Stack;
use gateway_tests::{mock_requests, open_route, raw_request, upsert_route_synced};

/// `/open/users` → the users mock (one instance, so `/stats` counts every call).
async fn stack() -> Result<Stack> {
    let stack = Stack::new().data_planes(1).auth(false).start().await?;
    upsert_route_synced(
        &stack,
        open_route("open-users", "/open/users", "users", "/users"),
    )
    .await?;
    Ok(stack)
}

#[tokio::test(flavor = "multi_thread")]
async fn path_parameters_double_encoding_and_backslashes_are_refused_before_the_backend()
-> Result<()> {
    let stack = stack().await?;
    let gw = &stack.gateways()[0];
    let mock = stack.ports().users_1;
    let before = mock_requests(mock).await?;

    for path in [
        // `;` path parameters: Tomcat/Jetty/Spring strip `;...` from each
        // segment, so these are /open/admin, /open/users/7 and /open/users/admin to them.
        "/open/users/..;/admin",
        "/open/users/..;x=1/admin",
        "/open/users/.;/7",
        "/open/users;x/admin",
        "/open/users/7;jsessionid=0123",
        "/open/users/..%3B/admin",
        "/open/users/..%3b/admin",
        // `%25` double encoding: one more decoding makes `..`, `/`, `\`.
        "/open/users/%252e%252e/admin",
        "/open/users/%252E%252E/%252E%252E/etc/passwd",
        "/open/users/a%252fb",
        "/open/users/a%255cb",
        "/open/users/%25%32%65%25%32%65/admin",
        "/open/users/a%252541",
        // Backslashes, encoded (a literal one is tested below).
        "/open/users/..%5C..%5Cadmin",
        "/open/users/a%5cb",
    ] {
        let r = raw_request(gw, &format!("GET {path} HTTP/1.1\r\nHost: gw\r\n")).await?;
        ensure!(r.status == 400, "{path}: status {}", r.status);
        ensure!(
            r.header("content-type") == Some("application/problem+json"),
            "{path}: {:?}",
            r.headers
        );
        let doc = r.json()?;
        ensure!(
            doc["type"] == "urn:gateway:problem:bad-path",
            "{path}: {doc}"
        );
        ensure!(r.header("x-instance-id").is_none(), "{path} reached a mock");
    }
    // A literal backslash: refused (by the HTTP parser or the normaliser), never forwarded.
    for path in ["/open/users/..\\..\\admin", "/open/users/a\\b"] {
        let r = raw_request(gw, &format!("GET {path} HTTP/1.1\r\nHost: gw\r\n")).await?;
        ensure!(r.status == 400, "{path}: status {}", r.status);
        ensure!(r.header("x-instance-id").is_none(), "{path} reached a mock");
    }
    ensure!(
        mock_requests(mock).await? == before,
        "a refused path reached the mock"
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn legal_neighbours_of_the_refused_forms_reach_the_backend_normalised() -> Result<()> {
    let stack = stack().await?;
    let gw = &stack.gateways()[0];

    for (sent, seen) in [
        // A `%25` that is not followed by two hex digits is data.
        ("/open/users/100%25", "/users/100%25"),
        ("/open/users/50%25off", "/users/50%25off"),
        // Unreserved escapes decoded, others kept upper-case, dot-segments resolved.
        ("/open/users/x/../%37", "/users/7"),
        ("/open/users/a%3fb", "/users/a%3Fb"),
        ("/open/users//7", "/users/7"),
    ] {
        let r = raw_request(gw, &format!("GET {sent} HTTP/1.1\r\nHost: gw\r\n")).await?;
        ensure!(r.status == 200, "{sent}: status {}", r.status);
        let doc = r.json()?;
        let path = doc["path"].as_str().context("the mock echoes its path")?;
        ensure!(path == seen, "{sent}: the mock saw {path}, want {seen}");
    }
    stack.shutdown().await;
    Ok(())
}
