//! Caller identity (issue 10) against real processes: API keys on
//! `AUTH_API_KEY` routes across two data planes (identity forwarded, key not
//! forwarded, forged headers stripped, revocation everywhere within one
//! push), and signed identity (`identity_signing_secret` →
//! `X-Gateway-Signature`, verified by a mock started with `MOCK_IDENTITY_SECRET`).
//!
//! Needs every binary built in the same target directory
//! (`cargo build --workspace --bins`) and `redis-server` on PATH.
#![allow(
    clippy::unwrap_used,
    reason = "test code: unwrap stops the test where it failed"
)]

use anyhow::{Context, Result, ensure};
use devstack::Stack;
use gateway_proto::v1::{
    Aggregate, AggregatePart, AuthMode, ConfigSnapshot, CreateApiKeyResponse, GetConfigRequest,
    GetUpstreamRequest, ListConfigVersionsRequest, RevokeApiKeyRequest, Route,
};
use gateway_tests::{
    client, create_api_key_synced, header, metric_sample, open_route, secrets_in_logs,
    upsert_route_synced, upsert_upstream_synced,
};
use mock_service::identity::{IdentityVerifier, SignedRequest, unix_now};
use prost::Message as _;
use serde_json::Value;

/// The identity secret of the `users` upstream and of the users-1 mock.
const SECRET: &str = "it-0123456789abcdef0123456789abcdef";

/// An `AUTH_API_KEY` route `/keyed/users` → users `/users`.
fn keyed_route() -> Route {
    Route {
        auth: AuthMode::AuthApiKey as i32,
        ..open_route("keyed", "/keyed/users", "users", "/users")
    }
}

/// API key `name` for subject `svc-NAME`, role `service`, synced to every data plane.
async fn create_key(stack: &Stack, name: &str) -> Result<CreateApiKeyResponse> {
    create_api_key_synced(stack, name, &format!("svc-{name}"), "service").await
}

/// `GET url` with these headers: (status, problem type or echoed headers).
async fn get(url: &str, headers: &[(&str, &str)]) -> Result<(u16, Value)> {
    let mut req = client().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let challenge = header(&resp, "www-authenticate").map(str::to_owned);
    let body: Value = resp.json().await.context("body is not JSON")?;
    // The gateway's API-key refusals name the header to use.
    if body["type"]
        .as_str()
        .is_some_and(|t| t.starts_with("urn:gateway:problem:api-key"))
    {
        ensure!(
            challenge.as_deref() == Some("ApiKey header=\"X-API-Key\""),
            "401 without the ApiKey challenge: {challenge:?}"
        );
    }
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_admit_forward_identity_and_stop_everywhere_once_revoked() -> Result<()> {
    let stack = Stack::new().data_planes(2).auth(false).start().await?;
    upsert_route_synced(&stack, keyed_route()).await?;
    let created = create_key(&stack, "billing").await?;
    let key = created.key.as_str();
    let gateways = stack.gateways();
    assert_eq!(gateways.len(), 2);

    for gw in &gateways {
        let url = format!("{gw}/keyed/users/7");
        // Admitted: identity forwarded, the key itself and forged identity are not.
        let (status, body) = get(
            &url,
            &[
                ("x-api-key", key),
                ("x-api-key-name", "forged-name"),
                ("x-user-id", "forged-user"),
                ("x-gateway-signature", "t=1,v1=forged"),
            ],
        )
        .await?;
        assert_eq!(status, 200, "{gw}: {body}");
        let seen = &body["headers"];
        assert_eq!(seen["x-user-id"], "svc-billing", "{gw}: {seen}");
        assert_eq!(seen["x-user-role"], "service", "{gw}: {seen}");
        assert_eq!(seen["x-api-key-name"], "billing", "{gw}: {seen}");
        assert!(
            seen.get("x-api-key").is_none(),
            "{gw}: key forwarded: {seen}"
        );
        assert!(seen.get("x-gateway-signature").is_none(), "{gw}: {seen}");

        // Refused: no key, a wrong key.
        let (status, body) = get(&url, &[]).await?;
        assert_eq!(status, 401);
        assert_eq!(body["type"], "urn:gateway:problem:api-key-missing");
        // The key with its last hex digit changed (to another digit, whatever it was).
        let last = if key.ends_with('0') { '1' } else { '0' };
        let wrong = format!("{}{last}", &key[..key.len() - 1]);
        let (status, body) = get(&url, &[("x-api-key", &wrong)]).await?;
        assert_eq!(status, 401);
        assert_eq!(body["type"], "urn:gateway:problem:api-key-invalid");
    }
    for ops in stack.gateway_admins() {
        for reason in ["api_key_missing", "api_key_invalid"] {
            let series =
                format!("gateway_policy_refusals_total{{route=\"keyed\",reason=\"{reason}\"}}");
            assert_eq!(metric_sample(&ops, &series).await?, 1.0, "{ops} {series}");
        }
    }

    // Revoke, wait until every replica has ACKed the new version, then the key fails everywhere.
    let version = stack
        .admin_client()
        .await
        .revoke_api_key(RevokeApiKeyRequest {
            name: "billing".into(),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(version).await?;
    for gw in &gateways {
        let (status, body) = get(&format!("{gw}/keyed/users/7"), &[("x-api-key", key)]).await?;
        assert_eq!(status, 401, "{gw} still admits a revoked key");
        assert_eq!(body["type"], "urn:gateway:problem:api-key-invalid");
    }

    // The key never reached a log.
    let (scanned, leaks) = secrets_in_logs(
        &stack.log_dir(),
        &[("the API key".to_owned(), key.to_owned())],
    )?;
    assert!(scanned > 0);
    assert!(leaks.is_empty(), "{leaks:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn signed_identity_round_trips_and_the_mock_refuses_tampering_and_replays() -> Result<()> {
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .env("users-1", "MOCK_IDENTITY_SECRET", SECRET)
        .start()
        .await?;
    let gw = &stack.gateways()[0];
    let mock = format!("http://127.0.0.1:{}", stack.ports().users_1);

    // Before the upstream signs, the verifying mock refuses what the gateway forwards.
    upsert_route_synced(
        &stack,
        open_route("plain", "/plain/users", "users", "/users"),
    )
    .await?;
    let (status, body) = get(&format!("{gw}/plain/users/1"), &[]).await?;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"], "missing X-Gateway-Signature");

    // Set the secret on the upstream (read-modify-write of what GetUpstream returns).
    let mut admin = stack.admin_client().await;
    let mut users = admin
        .get_upstream(GetUpstreamRequest {
            name: "users".into(),
        })
        .await?
        .into_inner();
    users.identity_signing_secret = SECRET.into();
    upsert_upstream_synced(&stack, users).await?;
    upsert_route_synced(&stack, keyed_route()).await?;
    let created = create_key(&stack, "signer").await?;

    // Reads never show the secret, only that it is set.
    let read = admin
        .get_upstream(GetUpstreamRequest {
            name: "users".into(),
        })
        .await?
        .into_inner();
    assert_eq!(read.identity_signing_secret, "");
    assert!(read.identity_signing_secret_set);
    let config = admin
        .get_config(GetConfigRequest { version: None })
        .await?
        .into_inner();
    assert!(!format!("{config:?}").contains(SECRET));

    // Round trip: the mock verified the signature over the forwarded identity.
    let (status, body) = get(
        &format!("{gw}/keyed/users/7"),
        &[
            ("x-api-key", &created.key),
            ("x-gateway-signature", "t=1,v1=forged"),
        ],
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let seen = &body["headers"];
    assert_eq!(seen["x-user-id"], "svc-signer");
    let signature = seen["x-gateway-signature"]
        .as_str()
        .context("no signature forwarded")?
        .to_owned();
    assert!(
        signature.starts_with("t=") && signature.contains(",id=") && signature.contains(",v3="),
        "{signature}"
    );
    // Anonymous requests are signed too (empty identity).
    let (status, body) = get(&format!("{gw}/plain/users/1"), &[]).await?;
    assert_eq!(status, 200, "{body}");

    // Straight to the mock: the gateway's signature with one hex digit changed.
    let last = signature.chars().last().unwrap();
    let flipped = if last == '0' { '1' } else { '0' };
    let tampered = format!("{}{flipped}", &signature[..signature.len() - 1]);
    let identity = [("x-user-id", "svc-signer"), ("x-user-role", "service")];
    let (status, body) = get(
        &format!("{mock}/users/7"),
        &[identity[0], identity[1], ("x-gateway-signature", &tampered)],
    )
    .await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );
    // The same identity with another user is refused.
    let (status, _) = get(
        &format!("{mock}/users/7"),
        &[
            ("x-user-id", "admin"),
            identity[1],
            ("x-gateway-signature", &signature),
        ],
    )
    .await?;
    assert_eq!(status, 401);

    // A correct MAC over an old timestamp is a replay: refused; the same MAC made now passes.
    // (The mock is the upstream `users`: the audience its signatures bind.)
    let verifier = IdentityVerifier::new(SECRET, "users").context("a valid secret")?;
    let port = stack.ports().users_1;
    let host = format!("127.0.0.1:{port}");
    let sign_at = |t: u64, id: &str| {
        let t = t.to_string();
        let request = SignedRequest {
            t: &t,
            id,
            mirror: false,
            method: "GET",
            host: host.as_bytes(),
            target: "/users/7",
            user_id: b"svc-signer",
            user_role: b"service",
            api_key_name: b"",
            body_sha256: b"",
        };
        format!("t={t},id={id},v3={}", verifier.v3_hex(&request))
    };
    let old = sign_at(unix_now() - 120, "old-1");
    let (status, body) = get(
        &format!("{mock}/users/7"),
        &[identity[0], identity[1], ("x-gateway-signature", &old)],
    )
    .await?;
    assert_eq!(status, 401);
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("X-Gateway-Signature expired"),
        "{body}"
    );
    let fresh = sign_at(unix_now(), "fresh-1");
    let (status, body) = get(
        &format!("{mock}/users/7"),
        &[identity[0], identity[1], ("x-gateway-signature", &fresh)],
    )
    .await?;
    assert_eq!(status, 200, "{body}");

    // v3 straight to the mock: host and query are covered, a request id is accepted once.
    let t = unix_now().to_string();
    let v3 = |id: &'static str, target: &'static str| {
        let request = SignedRequest {
            t: &t,
            id,
            mirror: false,
            method: "GET",
            host: host.as_bytes(),
            target,
            user_id: b"svc-signer",
            user_role: b"service",
            api_key_name: b"",
            body_sha256: b"",
        };
        format!("t={t},id={id},v3={}", verifier.v3_hex(&request))
    };
    let signed = v3("replay-1", "/users/7?x=1");
    let send = |target: &'static str, host: String, signature: String| {
        let url = format!("{mock}{target}");
        async move {
            get(
                &url,
                &[
                    identity[0],
                    identity[1],
                    ("host", &host),
                    ("x-gateway-signature", &signature),
                ],
            )
            .await
        }
    };
    // Another query, another host: the MAC does not match (and burns no id).
    let (status, body) = send("/users/7?x=2", host.clone(), signed.clone()).await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );
    let (status, body) = send("/users/7?x=1", "evil.example".into(), signed.clone()).await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );
    // The genuine request passes once; the same request id again is a replay.
    let (status, body) = send("/users/7?x=1", host.clone(), signed.clone()).await?;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send("/users/7?x=1", host.clone(), signed).await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature replayed: request id already seen"
    );
    let (status, body) = send("/users/7?x=1", host.clone(), v3("replay-2", "/users/7?x=1")).await?;
    assert_eq!(status, 200, "{body}");
    // Signed for another upstream (the same secret, another audience): refused.
    let elsewhere = IdentityVerifier::new(SECRET, "orders").context("a valid secret")?;
    let request = SignedRequest {
        t: &t,
        id: "replay-3",
        mirror: false,
        method: "GET",
        host: host.as_bytes(),
        target: "/users/7?x=1",
        user_id: b"svc-signer",
        user_role: b"service",
        api_key_name: b"",
        body_sha256: b"",
    };
    let other = format!("t={t},id=replay-3,v3={}", elsewhere.v3_hex(&request));
    let (status, body) = send("/users/7?x=1", host.clone(), other).await?;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );

    // The secret never reached a log (the mock got it through its environment).
    let (_, leaks) = secrets_in_logs(
        &stack.log_dir(),
        &[("the signing secret".to_owned(), SECRET.to_owned())],
    )?;
    assert!(leaks.is_empty(), "{leaks:?}");
    Ok(())
}

/// The request the mock answered, rebuilt from its echo: the headers a
/// signature covers (as received), method and raw target.
struct Echoed {
    headers: Vec<(String, String)>,
    method: String,
    target: String,
}

impl Echoed {
    fn of(body: &Value) -> Result<Self> {
        let seen = &body["headers"];
        let mut headers = Vec::new();
        for name in [
            "host",
            "x-user-id",
            "x-user-role",
            "x-api-key-name",
            "x-gateway-mirror",
            "x-gateway-signature",
        ] {
            if let Some(v) = seen[name].as_str() {
                headers.push((name.to_owned(), v.to_owned()));
            }
        }
        let path = body["path"].as_str().context("the mock echoes its path")?;
        let target = match body["query"].as_str() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_owned(),
        };
        Ok(Self {
            headers,
            method: body["method"].as_str().unwrap_or("GET").to_owned(),
            target,
        })
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// The same request sent straight to `mock`, with `change` applied to its headers.
    async fn replay(
        &self,
        mock: &str,
        target: &str,
        change: &[(&str, &str)],
    ) -> Result<(u16, Value)> {
        let mut headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .filter(|(n, _)| !change.iter().any(|(c, _)| c == n))
            .collect();
        headers.extend_from_slice(change);
        get(&format!("{mock}{target}"), &headers).await
    }
}

/// Runs the README's Python verifier (the first `python` block of "Route
/// policies: signed identity", verbatim) as the backend of upstream
/// `audience`, once per case (bodiless requests), in order, in one process
/// (so its replay cache carries over); returns its answers.
fn readme_python_verifier(
    secret: &str,
    audience: &str,
    cases: &[(&Echoed, &str)],
) -> Result<Vec<bool>> {
    use std::io::Write as _;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))?;
    let section = readme
        .find("### Route policies: signed identity")
        .context("README: no signed identity section")?;
    let start = readme[section..]
        .find("```python\n")
        .context("README: no python verifier")?
        + section
        + "```python\n".len();
    let end = start
        + readme[start..]
            .find("```")
            .context("README: unterminated block")?;
    let cases: Vec<Value> = cases
        .iter()
        .map(|(e, target)| {
            let headers: serde_json::Map<String, Value> = e
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), Value::String(v.clone())))
                .collect();
            serde_json::json!({"headers": headers, "method": e.method, "target": target})
        })
        .collect();
    let input = serde_json::json!({"secret": secret, "audience": audience, "cases": cases});
    let script = format!(
        "{}\nimport json, sys\nreq = json.load(sys.stdin)\nsecret = req[\"secret\"].encode()\n\
         print(json.dumps([gateway_signed(secret, req[\"audience\"], c[\"headers\"], c[\"method\"], c[\"target\"], b\"\") for c in req[\"cases\"]]))\n",
        &readme[start..end]
    );
    let mut child = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("python3")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn signed_identity_v3_covers_host_query_and_audience_is_unambiguous_and_refuses_replays()
-> Result<()> {
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .env("users-1", "MOCK_IDENTITY_SECRET", SECRET)
        .start()
        .await?;
    let gw = &stack.gateways()[0];
    let mock = format!("http://127.0.0.1:{}", stack.ports().users_1);
    let mut admin = stack.admin_client().await;
    let mut users = admin
        .get_upstream(GetUpstreamRequest {
            name: "users".into(),
        })
        .await?
        .into_inner();
    users.identity_signing_secret = SECRET.into();
    upsert_upstream_synced(&stack, users).await?;
    upsert_route_synced(&stack, keyed_route()).await?;
    // Two callers whose v1 signatures collide: "john.smith" on /users/1 and "smith" on /users/1.john.
    let john = create_api_key_synced(&stack, "john", "john.smith", "service").await?;
    let smith = create_api_key_synced(&stack, "smith", "smith", "service").await?;

    let (status, body) = get(
        &format!("{gw}/keyed/users/1?x=1"),
        &[("x-api-key", &john.key)],
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let johns = Echoed::of(&body)?;
    assert_eq!(johns.target, "/users/1?x=1");
    assert_eq!(johns.header("x-user-id"), "john.smith");
    let (status, body) = get(
        &format!("{gw}/keyed/users/1.john"),
        &[("x-api-key", &smith.key)],
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let smiths = Echoed::of(&body)?;
    // Each request has its own id.
    let id = |e: &Echoed| {
        e.header("x-gateway-signature")
            .split(',')
            .find_map(|p| p.strip_prefix("id="))
            .map(str::to_owned)
    };
    assert!(
        id(&johns).is_some_and(|i| i.len() == 32),
        "{}",
        johns.header("x-gateway-signature")
    );
    assert_ne!(id(&johns), id(&smiths));

    // John's signature presented as Smith's request (what v1 accepted): refused.
    let (status, body) = johns
        .replay(
            &mock,
            "/users/1.john",
            &[("x-user-id", "smith"), ("x-api-key-name", "smith")],
        )
        .await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );
    // The query and Host are covered.
    let (status, body) = johns.replay(&mock, "/users/1?x=2", &[]).await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );
    let (status, body) = johns
        .replay(&mock, "/users/1?x=1", &[("host", "evil.example")])
        .await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );
    // The gateway's request replayed exactly: its id was used.
    let (status, body) = johns.replay(&mock, "/users/1?x=1", &[]).await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature replayed: request id already seen"
    );

    // The README's Python verifier agrees on requests the gateway signed:
    // genuine once, then a replay; another query or the other caller's target refused.
    let (status, body) = get(
        &format!("{gw}/keyed/users/7?q=a%20b&r"),
        &[("x-api-key", &john.key)],
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let fresh = Echoed::of(&body)?;
    let verdicts = readme_python_verifier(
        SECRET,
        "users",
        &[
            (&fresh, "/users/7?q=a%20b&r"),
            (&fresh, "/users/7?q=a%20b&r"),
            (&fresh, "/users/7?q=a%20c&r"),
            (&smiths, "/users/1"),
            (&smiths, "/users/1.john"),
        ],
    )?;
    assert_eq!(verdicts, [true, false, false, false, true]);
    // Verified as another upstream (the audience the gateway signed is `users`): refused.
    assert_eq!(
        readme_python_verifier(SECRET, "orders", &[(&fresh, "/users/7?q=a%20b&r")])?,
        [false]
    );
    // A v2 header of the previous release is refused (it binds no upstream), by the mock and
    // by the README's Python, unless told to accept it while gateways are upgraded.
    let verifier = IdentityVerifier::new(SECRET, "users").context("a valid secret")?;
    let t = unix_now().to_string();
    let v2 = SignedRequest {
        t: &t,
        id: "v2-request",
        mirror: false,
        method: "GET",
        host: b"",
        target: "/users/7?any",
        user_id: b"john.smith",
        user_role: b"service",
        api_key_name: b"",
        body_sha256: b"",
    };
    let old = Echoed {
        headers: vec![
            ("x-user-id".into(), "john.smith".into()),
            ("x-user-role".into(), "service".into()),
            (
                "x-gateway-signature".into(),
                format!("t={t},id=v2-request,v2={}", verifier.v2_hex(&v2)),
            ),
        ],
        method: "GET".into(),
        target: "/users/7?any".into(),
    };
    let (status, body) = old.replay(&mock, "/users/7?any", &[]).await?;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["error"],
        "X-Gateway-Signature v2 is not accepted: expected v3 (v2 only with --identity-accept-v2, while gateways are upgraded)"
    );
    assert_eq!(
        readme_python_verifier(SECRET, "users", &[(&old, "/users/7?any")])?,
        [false]
    );

    // Aggregate parts are signed v3 too, over the part's target with the query.
    upsert_route_synced(
        &stack,
        Route {
            name: "agg".into(),
            path_prefix: "/agg".into(),
            auth: AuthMode::AuthNone as i32,
            aggregate: Some(Aggregate {
                parts: vec![AggregatePart {
                    name: "user".into(),
                    upstream: "users".into(),
                    path: "/users/{rest}".into(),
                    required: true,
                    timeout_ms: 0,
                }],
            }),
            ..Route::default()
        },
    )
    .await?;
    let (status, body) = get(&format!("{gw}/agg/7?x=1"), &[]).await?;
    assert_eq!(status, 200, "{body}");
    let part = Echoed::of(&body["user"])?;
    assert_eq!(part.target, "/users/7?x=1");
    assert!(
        part.header("x-gateway-signature").contains(",v3="),
        "{body}"
    );
    let (status, body) = part.replay(&mock, "/users/7?x=1", &[]).await?;
    assert_eq!(status, 401);
    assert_eq!(
        body["error"],
        "X-Gateway-Signature replayed: request id already seen"
    );
    stack.shutdown().await;
    Ok(())
}

/// The plain SHA-256 of a configuration as the store encodes it, with
/// `secret` put back into every upstream a viewer sees has one.
fn unkeyed_hash(shown: &ConfigSnapshot, secret: &str) -> String {
    let mut upstreams = shown.upstreams.clone();
    for u in &mut upstreams {
        if u.identity_signing_secret_set {
            u.identity_signing_secret = secret.into();
            u.identity_signing_secret_set = false;
        }
    }
    let content = ConfigSnapshot {
        routes: shown.routes.clone(),
        upstreams,
        api_keys: shown.api_keys.clone(),
        ..ConfigSnapshot::default()
    };
    gateway_proto::hash::plain_sha256(&content.encode_to_vec())
}

/// The configuration hash every viewer sees (`GetConfig`, `ListConfigVersions`,
/// a data plane's unauthenticated ops `/config`) must not let anyone check a
/// guessed `identity_signing_secret` offline (issue 25, item 9): it is not the
/// plain SHA-256 of the configuration with the right secret in it. A change of
/// only the secret still gives data planes a new version and hash.
#[tokio::test(flavor = "multi_thread")]
async fn the_config_hash_does_not_confirm_a_guessed_secret() -> Result<()> {
    let stack = Stack::new().data_planes(1).start().await?;
    let ops = stack.gateway_admins()[0].clone();
    let mut admin = stack.admin_client().await;
    // devstack's edge certificate has a private key: a secret too. The
    // control below needs a configuration without any.
    let cleared = admin
        .delete_certificate(gateway_proto::v1::DeleteCertificateRequest {
            name: "default".into(),
            expected_version: None,
        })
        .await?
        .into_inner()
        .version;
    stack.wait_synced(cleared).await?;
    let mut users = admin
        .get_upstream(GetUpstreamRequest {
            name: "users".into(),
        })
        .await?
        .into_inner();
    users.identity_signing_secret = SECRET.into();
    let version = upsert_upstream_synced(&stack, users.clone()).await?;

    let shown = admin
        .get_config(GetConfigRequest { version: None })
        .await?
        .into_inner();
    ensure!(shown.version == version && shown.redacted, "{shown:?}");
    ensure!(
        shown.api_keys.is_empty(),
        "this test rebuilds a configuration without API keys"
    );
    // What an attacker who guessed SECRET right would compute: the viewer's
    // content with the secret put back, hashed as the store encodes it.
    let guess = unkeyed_hash(&shown, SECRET);
    ensure!(
        shown.hash != guess,
        "GetConfig's hash confirms the guessed secret: {guess}"
    );
    // The control: the version before, without a secret, is hashed exactly
    // that way, so the computation above is the one the hash would match.
    let before = admin
        .get_config(GetConfigRequest {
            version: Some(version - 1),
        })
        .await?
        .into_inner();
    ensure!(
        before
            .upstreams
            .iter()
            .all(|u| !u.identity_signing_secret_set),
        "the configuration before already has a secret"
    );
    ensure!(
        before.hash == unkeyed_hash(&before, SECRET),
        "a configuration without secrets is not hashed as its plain encoding"
    );
    // The same (keyed) hash everywhere it is shown.
    let listed = admin
        .list_config_versions(ListConfigVersionsRequest { limit: Some(1) })
        .await?
        .into_inner();
    ensure!(
        listed.versions.first().map(|v| v.hash.as_str()) == Some(shown.hash.as_str()),
        "ListConfigVersions shows another hash: {listed:?}"
    );
    let dp: Value = client()
        .get(format!("{ops}/config"))
        .send()
        .await?
        .json()
        .await?;
    ensure!(
        dp["hash"] == shown.hash.as_str() && dp["version"] == version,
        "ops /config {dp} is not version {version} hash {}",
        shown.hash
    );

    // Rotating only the secret: a new version and hash reach the data plane.
    users.identity_signing_secret = "it-rotated-0123456789abcdef012345678".into();
    let rotated = upsert_upstream_synced(&stack, users).await?;
    ensure!(rotated == version + 1, "no new version for a new secret");
    let dp: Value = client()
        .get(format!("{ops}/config"))
        .send()
        .await?
        .json()
        .await?;
    ensure!(
        dp["version"] == rotated && dp["hash"] != shown.hash.as_str(),
        "the data plane did not see the rotation: {dp}"
    );
    Ok(())
}

/// The shadow upstream's own secret (each upstream has its own: validation refuses a shared one).
const SHADOW_SECRET: &str = "it-shadow-0123456789abcdef0123456789abcdef";

/// A users mock in this process that verifies signatures as the shadow
/// upstream `users-shadow` (and takes mirror copies); stops when dropped.
struct ShadowMock {
    port: u16,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl ShadowMock {
    async fn start() -> Result<Self> {
        use mock_service::config::{IdentityOptions, MockConfig, Service};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let options = IdentityOptions {
            audience: Some("users-shadow".into()),
            shadow: true,
            accept_v2: false,
        };
        let config = MockConfig::new(Service::Users, "shadow-1", 0.0)?
            .with_identity_secret(SHADOW_SECRET, &options)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(mock_service::server::serve(
            listener,
            config,
            gateway_telemetry::Tracer::disabled(),
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self { port, _stop: stop })
    }

    /// The requests it accepted (its `/stats` keeps only those past the signature check).
    async fn accepted(&self) -> Result<Vec<Value>> {
        let stats: Value = client()
            .get(format!("http://127.0.0.1:{}/stats", self.port))
            .send()
            .await?
            .json()
            .await?;
        Ok(stats["recent"].as_array().cloned().unwrap_or_default())
    }
}

/// The headers of a request the shadow accepted, as it received them, minus `Content-Length`.
fn received_headers(kept: &Value) -> Vec<(String, String)> {
    kept["headers"]
        .as_object()
        .map(|h| {
            h.iter()
                .filter(|(n, _)| *n != "content-length")
                .filter_map(|(n, v)| Some((n.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 41, item 5: a mirror copy is signed v3 for the shadow (its name, the
/// mirror flag, the copied body), so what the shadow received does not pass
/// at the primary, and its body cannot be swapped; one secret on two
/// upstreams is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_shadows_signed_copy_is_refused_by_the_primary_and_its_body_is_covered() -> Result<()> {
    let stack = Stack::new()
        .data_planes(1)
        .auth(false)
        .env("users-1", "MOCK_IDENTITY_SECRET", SECRET)
        .start()
        .await?;
    let gw = &stack.gateways()[0];
    let primary = format!("http://127.0.0.1:{}", stack.ports().users_1);
    let shadow = ShadowMock::start().await?;
    let mut admin = stack.admin_client().await;
    let mut users = admin
        .get_upstream(GetUpstreamRequest {
            name: "users".into(),
        })
        .await?
        .into_inner();
    users.identity_signing_secret = SECRET.into();
    upsert_upstream_synced(&stack, users).await?;
    let mut shadow_upstream = gateway_proto::v1::Upstream {
        name: "users-shadow".into(),
        instances: vec![gateway_proto::v1::Instance {
            id: "shadow-1".into(),
            url: format!("http://127.0.0.1:{}", shadow.port),
            ..Default::default()
        }],
        identity_signing_secret: SECRET.into(),
        ..Default::default()
    };
    // The primary's secret on the shadow: refused, naming both upstreams.
    let refused = admin
        .upsert_upstream(gateway_proto::v1::UpsertUpstreamRequest {
            upstream: Some(shadow_upstream.clone()),
            ..Default::default()
        })
        .await
        .expect_err("one secret on two upstreams");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains(
            "upstream \"users-shadow\": identity_signing_secret is the same as upstream \"users\"'s"
        ),
        "{refused:?}"
    );
    assert!(!refused.message().contains(SECRET), "{refused:?}");
    shadow_upstream.identity_signing_secret = SHADOW_SECRET.into();
    upsert_upstream_synced(&stack, shadow_upstream).await?;
    upsert_route_synced(
        &stack,
        Route {
            mirror: Some(gateway_proto::v1::Mirror {
                upstream: "users-shadow".into(),
                percent: 100,
                include_body: true,
                ..Default::default()
            }),
            ..open_route("mirrored", "/mirrored/users", "users", "/users")
        },
    )
    .await?;

    // Both the primary and the shadow verify what the gateway sends them.
    let (status, body) = get(&format!("{gw}/mirrored/users/7"), &[]).await?;
    assert_eq!(status, 200, "{body}");
    let posted = client()
        .post(format!("{gw}/mirrored/users/7/notes"))
        .body("hello")
        .send()
        .await?;
    assert_eq!(posted.status(), 200);
    let copies = gateway_tests::poll(
        std::time::Duration::from_secs(10),
        "the shadow to accept both copies",
        || async {
            let got = shadow.accepted().await.map_err(|e| e.to_string())?;
            if got.len() == 2 {
                Ok(got)
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await?;
    let get_copy = copies
        .iter()
        .find(|c| c["method"] == "GET")
        .context("the GET copy")?;
    let post_copy = copies
        .iter()
        .find(|c| c["method"] == "POST")
        .context("the POST copy")?;
    assert_eq!(post_copy["body_bytes"], 5, "{post_copy}");
    assert_eq!(get_copy["headers"]["x-gateway-mirror"], "1", "{get_copy}");

    // The GET copy replayed to the primary, as the shadow got it: a mirror copy, refused.
    let headers = received_headers(get_copy);
    let send = |url: String, h: Vec<(String, String)>, body: &'static str, method: &str| {
        let mut req = client().request(method.parse().unwrap(), url).body(body);
        for (n, v) in &h {
            req = req.header(n.as_str(), v.as_str());
        }
        async move {
            let resp = req.send().await?;
            let status = resp.status().as_u16();
            let body: Value = resp.json().await?;
            anyhow::Ok((status, body))
        }
    };
    let (status, body) = send(format!("{primary}/users/7"), headers.clone(), "", "GET").await?;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["error"],
        "X-Gateway-Signature is a mirror copy's: this backend is not a shadow"
    );
    // Without the marker: signed for another upstream and as a copy, it does not match.
    let unmarked: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| n != "x-gateway-mirror")
        .cloned()
        .collect();
    let (status, body) = send(format!("{primary}/users/7"), unmarked, "", "GET").await?;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );

    // The POST copy's body is covered: another body under its signature is refused by the shadow.
    let (status, body) = send(
        format!("http://127.0.0.1:{}/users/7/notes", shadow.port),
        received_headers(post_copy),
        "HELLO",
        "POST",
    )
    .await?;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["error"],
        "X-Gateway-Signature does not match the request"
    );
    stack.shutdown().await;
    Ok(())
}
