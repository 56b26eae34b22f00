//! Small helpers shared by the black-box suites in `tests/tests/*.rs`.
//! Stacks themselves come from the `devstack` library
//! (`devstack::Stack::new().data_planes(3).start().await?`); this crate only
//! adds what several suites need to talk to one:
//!
//! * [`client`]: a `reqwest` client for loopback targets (no proxy, timeouts);
//! * [`login`]: an access token from the auth service (or a gateway's `/auth/login`);
//! * [`poll`]: retry a check until it passes or a deadline expires (never sleep-and-hope);
//! * [`raw_request`]: send bytes exactly as written, for requests `reqwest`
//!   would normalise (`%2e%2e` paths, hop-by-hop headers);
//! * [`open_route`]: an `AUTH_NONE` route for tests that are not about auth;
//! * [`rss_kib`]: a process's resident memory, from `/proc`;
//! * [`cpu_seconds`]: a process's CPU time (user + system), from `/proc`;
//! * [`cdp`]: a headless Chromium driven over the DevTools protocol;
//! * [`console`]: a browser-like client of the control plane's web console (cookies, CSRF fields);
//! * [`flags_reference`]: the generator of `docs/flags.md` (from the binaries' clap definitions);
//! * [`layers`]: the data plane's import layering, checked from its source;
//! * [`h2_frames`]: raw HTTP/2 frames (an h2c client that writes what it is told);
//! * [`metric_sum`]: one metric from a data plane's `/metrics`;
//! * [`secrets_in_logs`]: the log-hygiene scan (no secret in any log line).

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use gateway_proto::v1::{AuthMode, Route};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod cdp;
pub mod console;
pub mod flags_reference;
pub mod h2_frames;
pub mod layers;
pub mod oidc;

/// A client for the stack's loopback addresses: never uses a proxy from the
/// environment, 30 s overall timeout per request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("a plain HTTP client always builds")
}

/// Logs in at `base` (the auth service URL, or a gateway URL: both serve
/// `POST /auth/login`) and returns the access token.
pub async fn login(base: &str, username: &str, password: &str) -> anyhow::Result<String> {
    let response = client()
        .post(format!("{base}/auth/login"))
        .json(&serde_json::json!({"username": username, "password": password}))
        .send()
        .await
        .with_context(|| format!("POST {base}/auth/login"))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.context("login answer is not JSON")?;
    if !status.is_success() {
        bail!("login as {username} answered {status}: {body}");
    }
    body["access_token"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("login answer has no access_token: {body}"))
}

/// Runs `check` every 50 ms until it returns `Ok`, and returns that value;
/// fails with the last error once `timeout` has passed.
pub async fn poll<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(last) if tokio::time::Instant::now() >= deadline => {
                bail!("timed out after {timeout:?} waiting for {what}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A response read by [`raw_request`].
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked when it was chunked.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("body is not JSON: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends `head` (request line and headers, each line ending in `\r\n`,
/// WITHOUT the final empty line) to `base_url` ("http://127.0.0.1:P") on a
/// new connection, adds `Connection: close` and the empty line, and reads
/// the whole response. Nothing is normalised: the bytes go out as written.
pub async fn raw_request(base_url: &str, head: &str) -> anyhow::Result<RawResponse> {
    let addr = base_url
        .strip_prefix("http://")
        .with_context(|| format!("{base_url} is not an http:// URL"))?;
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream
        .write_all(format!("{head}Connection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .context("response not complete within 30 s")??;
    parse_response(&raw)
}

impl RawResponse {
    /// Parses one response as it came off the wire (a chunked body is de-chunked).
    pub fn parse(raw: &[u8]) -> anyhow::Result<Self> {
        parse_response(raw)
    }
}

fn parse_response(raw: &[u8]) -> anyhow::Result<RawResponse> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("no header end in {:?}", String::from_utf8_lossy(raw)))?;
    let head = std::str::from_utf8(&raw[..split]).context("response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(RawResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunk size")?;
        let size_text = std::str::from_utf8(&data[..line_end])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// A stack with one data plane started with `data_plane_args`, and no auth
/// service; panics (failing the test) when it does not start.
pub async fn one_data_plane(data_plane_args: &[&str]) -> devstack::Stack {
    start_without_auth(
        data_plane_args
            .iter()
            .fold(devstack::Stack::new().data_planes(1), |b, a| {
                b.data_plane_arg(*a)
            }),
    )
    .await
}

/// A stack of `data_planes` data planes and no auth service, for scenarios on
/// `AUTH_NONE` routes: seeding its users hashes passwords with Argon2, which
/// takes about five seconds per stack in a debug build and tests nothing
/// there. Panics (failing the test) when it does not start.
pub async fn data_planes_without_auth(data_planes: usize) -> devstack::Stack {
    start_without_auth(devstack::Stack::new().data_planes(data_planes)).await
}

/// Starts `builder` without the auth service; panics when the stack does not start.
async fn start_without_auth(builder: devstack::StackBuilder) -> devstack::Stack {
    builder
        .auth(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("stack did not start: {e}"))
}

/// A route without authentication or rate limit, for tests that are not
/// about auth: `prefix` → `upstream`, the prefix replaced by `rewrite`
/// (empty for none).
pub fn open_route(name: &str, prefix: &str, upstream: &str, rewrite: &str) -> Route {
    Route {
        name: name.to_owned(),
        path_prefix: prefix.to_owned(),
        upstream: upstream.to_owned(),
        rewrite_prefix: rewrite.to_owned(),
        auth: AuthMode::AuthNone as i32,
        ..Route::default()
    }
}

/// Creates or replaces `route` through the stack's admin API and waits until
/// every data plane serves the resulting version, which it returns.
pub async fn upsert_route_synced(stack: &devstack::Stack, route: Route) -> anyhow::Result<u64> {
    let name = route.name.clone();
    let version = stack
        .admin_client()
        .await
        .upsert_route(gateway_proto::v1::UpsertRouteRequest {
            route: Some(route),
            expected_version: None,
        })
        .await
        .with_context(|| format!("upserting route {name}"))?
        .into_inner()
        .version;
    stack
        .wait_synced(version)
        .await
        .with_context(|| format!("data planes syncing version {version}"))?;
    Ok(version)
}

/// Creates or replaces `upstream` and waits until every data plane serves the
/// new version. Returns the version.
pub async fn upsert_upstream_synced(
    stack: &devstack::Stack,
    upstream: gateway_proto::v1::Upstream,
) -> anyhow::Result<u64> {
    let name = upstream.name.clone();
    let version = stack
        .admin_client()
        .await
        .upsert_upstream(gateway_proto::v1::UpsertUpstreamRequest {
            upstream: Some(upstream),
            expected_version: None,
        })
        .await
        .with_context(|| format!("upserting upstream {name}"))?
        .into_inner()
        .version;
    stack
        .wait_synced(version)
        .await
        .with_context(|| format!("data planes syncing version {version}"))?;
    Ok(version)
}

/// Creates API key `name` for `subject` with `role` and waits until every data
/// plane has the version that holds it. Returns the answer (the key itself, once).
pub async fn create_api_key_synced(
    stack: &devstack::Stack,
    name: &str,
    subject: &str,
    role: &str,
) -> anyhow::Result<gateway_proto::v1::CreateApiKeyResponse> {
    let created = stack
        .admin_client()
        .await
        .create_api_key(gateway_proto::v1::CreateApiKeyRequest {
            name: name.into(),
            subject: subject.into(),
            role: role.into(),
            expected_version: None,
        })
        .await
        .with_context(|| format!("creating API key {name}"))?
        .into_inner();
    stack
        .wait_synced(created.version)
        .await
        .with_context(|| format!("data planes syncing version {}", created.version))?;
    Ok(created)
}

/// Requests a mock has served so far (its `GET /stats`), by the mock's port.
pub async fn mock_requests(port: u16) -> anyhow::Result<u64> {
    let stats: serde_json::Value = client()
        .get(format!("http://127.0.0.1:{port}/stats"))
        .send()
        .await?
        .json()
        .await?;
    stats["requests"].as_u64().context("no request count")
}

/// A response header as text, if present and visible ASCII.
pub fn header<'r>(response: &'r reqwest::Response, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The value of one sample at `{ops}/metrics`, found by its full series text
/// (name and labels exactly as exposed, e.g. `m_total{route="r"}`).
pub async fn metric_sample(ops: &str, series: &str) -> anyhow::Result<f64> {
    let text = client()
        .get(format!("{ops}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("no sample {series} in /metrics"))
}

/// Resident memory of process `pid` in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// CPU time process `pid` has used so far, user and system, in seconds
/// (fields 14 and 15 of `/proc/PID/stat`, in ticks of 1/100 s: Linux reports
/// them in `USER_HZ`, which is 100 on every architecture's user ABI).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("no command name in /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state), so field N is fields[N - 3].
    let ticks = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("no field {n} in /proc/{pid}/stat"))
    };
    Ok((ticks(14)? + ticks(15)?) as f64 / 100.0)
}

/// Sum of every sample of metric `name` (any labels) in the Prometheus text
/// at `{ops}/metrics` (a data plane's ops URL).
pub async fn metric_sum(ops: &str, name: &str) -> anyhow::Result<f64> {
    let text = client()
        .get(format!("{ops}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let mut found = false;
    let mut sum = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..name_end] == name {
            found = true;
            let value = line.rsplit(' ').next().unwrap_or_default();
            sum += value
                .parse::<f64>()
                .with_context(|| format!("metric line {line:?}"))?;
        }
    }
    if !found {
        bail!("{ops}/metrics has no metric {name}");
    }
    Ok(sum)
}

/// The log-hygiene scan: reads every file in `dir` (a stack's log directory)
/// and returns how many it read, and one "WHAT in FILE: LINE" for each file
/// and secret where a line contains that secret. `secrets` are (what, secret).
pub fn secrets_in_logs(
    dir: &Path,
    secrets: &[(String, String)],
) -> anyhow::Result<(usize, Vec<String>)> {
    let mut scanned = 0;
    let mut leaks = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        scanned += 1;
        for (what, secret) in secrets {
            if let Some(line) = text.lines().find(|l| l.contains(secret.as_str())) {
                leaks.push(format!("{what} in {}: {line}", path.display()));
            }
        }
    }
    Ok((scanned, leaks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chunked_responses() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let r = parse_response(raw).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-a"), Some("b"));
        assert_eq!(r.body, b"abcde");
    }

    #[test]
    fn parses_plain_responses() {
        let r = parse_response(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\nno").unwrap();
        assert_eq!(r.status, 400);
        assert_eq!(r.body, b"no");
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn the_log_scan_finds_secrets_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        std::fs::write(dir.join("a.log"), "fine\nthe token is s3cr3t-x here\n").unwrap();
        std::fs::write(dir.join("b.log"), "nothing to see\n").unwrap();
        let secrets = [("a token".to_owned(), "s3cr3t-x".to_owned())];
        let (scanned, leaks) = secrets_in_logs(dir, &secrets).unwrap();
        assert_eq!(scanned, 2);
        assert_eq!(leaks.len(), 1, "{leaks:?}");
        assert!(leaks[0].starts_with("a token in ") && leaks[0].contains("a.log"));
    }

    #[test]
    fn reads_own_cpu_time_as_it_grows() {
        // Spin until the reading has grown by 0.2 s: a reader stuck at one value
        // (or reading the wrong fields) fails at the deadline.
        let pid = std::process::id();
        let before = cpu_seconds(pid).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut x = 0u64;
        while cpu_seconds(pid).unwrap() < before + 0.2 {
            assert!(
                std::time::Instant::now() < deadline,
                "CPU time stuck at {before}"
            );
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
    }

    #[test]
    fn reads_own_rss() {
        assert!(rss_kib(std::process::id()).unwrap() > 0);
    }
}
