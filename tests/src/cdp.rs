//! A headless Chromium driven over the DevTools protocol (a WebSocket of
//! JSON commands and events), for the console's browser test and its
//! screenshots: a real browser that applies the Content-Security-Policy,
//! keeps cookies and submits forms as a user would.
//!
//! The browser is `chromium` on PATH (or `$CHROMIUM`), started with
//! `--headless --no-sandbox` (the tests may run as root, where Chromium's
//! sandbox refuses to start), a throwaway profile, and
//! `--remote-debugging-port=0`; the port it picked is read from its
//! "DevTools listening on ws://…" line on stderr.

use std::time::Duration;

use anyhow::{Context, bail};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

/// How long a command or an awaited event may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A running headless Chromium and its DevTools connection.
pub struct Browser {
    child: Child,
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Events received while waiting for something else, oldest first.
    events: Vec<Value>,
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

/// The browser program: `$CHROMIUM`, else `chromium`.
pub fn program() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".to_owned())
}

impl Browser {
    /// Starts the browser and connects to it.
    pub async fn launch() -> anyhow::Result<Browser> {
        let profile = tempfile::tempdir().context("a profile directory")?;
        let mut child = Command::new(program())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (install it: apt-get install -y chromium; scripts/test does)",
                    program()
                )
            })?;
        let stderr = child.stderr.take().context("the browser's stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let url = tokio::time::timeout(TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(at) = line.find("ws://") {
                    return Ok(line[at..].trim().to_owned());
                }
            }
            bail!("the browser exited before listening for DevTools")
        })
        .await
        .context("the browser's DevTools line")??;
        // Keep draining stderr, so the browser never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (ws, _) = connect_async(url.as_str())
            .await
            .with_context(|| format!("connecting to {url}"))?;
        Ok(Browser {
            child,
            ws,
            next_id: 1,
            events: Vec::new(),
            _profile: profile,
        })
    }

    async fn receive(&mut self, deadline: Instant) -> anyhow::Result<Value> {
        loop {
            let message = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .context("timed out waiting for the browser")?
                .context("the DevTools connection closed")??;
            if let Message::Text(text) = message {
                return serde_json::from_str(text.as_str()).context("a DevTools message");
            }
        }
    }

    /// Sends `method` with `params` (to the page of `session`, or the browser)
    /// and returns its result; events that arrive meanwhile are kept.
    pub async fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            command["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::text(command.to_string()))
            .await
            .with_context(|| format!("sending {method}"))?;
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let message = self.receive(deadline).await?;
            if message["id"] == json!(id) {
                if let Some(error) = message.get("error") {
                    bail!("{method} failed: {error}");
                }
                return Ok(message["result"].clone());
            }
            self.events.push(message);
        }
    }

    /// Waits for event `method` of `session` (one already received counts) and returns its params.
    pub async fn event(&mut self, session: &str, method: &str) -> anyhow::Result<Value> {
        let matches = |e: &Value| e["method"] == json!(method) && e["sessionId"] == json!(session);
        if let Some(at) = self.events.iter().position(matches) {
            return Ok(self.events.remove(at)["params"].clone());
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let message = self
                .receive(deadline)
                .await
                .with_context(|| format!("waiting for {method}"))?;
            if matches(&message) {
                return Ok(message["params"].clone());
            }
            self.events.push(message);
        }
    }

    /// Every event received and not yet taken, oldest first.
    pub fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    /// A new page (tab) of `width`×`height` CSS pixels, with the console, log
    /// and runtime events on; returns its session id.
    pub async fn new_page(&mut self, width: u32, height: u32) -> anyhow::Result<String> {
        let target = self
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await?;
        let attached = self
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await?;
        let session = attached["sessionId"]
            .as_str()
            .context("attachToTarget gave no sessionId")?
            .to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable", "DOM.enable"] {
            self.call(Some(&session), domain, json!({})).await?;
        }
        self.call(
            Some(&session),
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await?;
        Ok(session)
    }

    /// Navigates the page to `url` and waits until it has loaded.
    pub async fn navigate(&mut self, session: &str, url: &str) -> anyhow::Result<()> {
        self.events
            .retain(|e| !(e["method"] == "Page.loadEventFired" && e["sessionId"] == session));
        let result = self
            .call(Some(session), "Page.navigate", json!({"url": url}))
            .await?;
        if let Some(error) = result.get("errorText") {
            bail!("navigating to {url}: {error}");
        }
        self.event(session, "Page.loadEventFired").await?;
        Ok(())
    }

    /// Focuses the element `selector` and types `text` into it, as a user
    /// would (no script runs in the page).
    pub async fn type_into(
        &mut self,
        session: &str,
        selector: &str,
        text: &str,
    ) -> anyhow::Result<()> {
        let node = self.query(session, selector).await?;
        self.call(Some(session), "DOM.focus", json!({"nodeId": node}))
            .await?;
        self.call(Some(session), "Input.insertText", json!({"text": text}))
            .await?;
        Ok(())
    }

    /// Presses Enter (submits the focused form) and waits for the next page to load.
    pub async fn press_enter_and_wait(&mut self, session: &str) -> anyhow::Result<()> {
        self.events
            .retain(|e| !(e["method"] == "Page.loadEventFired" && e["sessionId"] == session));
        for kind in ["keyDown", "keyUp"] {
            let mut key = json!({"type": kind, "key": "Enter", "code": "Enter",
                "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13});
            if kind == "keyDown" {
                key["text"] = json!("\r");
            }
            self.call(Some(session), "Input.dispatchKeyEvent", key)
                .await?;
        }
        self.event(session, "Page.loadEventFired").await?;
        Ok(())
    }

    /// The DOM node id of the first element matching `selector`.
    pub async fn query(&mut self, session: &str, selector: &str) -> anyhow::Result<u64> {
        let document = self
            .call(Some(session), "DOM.getDocument", json!({"depth": 0}))
            .await?;
        let found = self
            .call(
                Some(session),
                "DOM.querySelector",
                json!({"nodeId": document["root"]["nodeId"], "selector": selector}),
            )
            .await?;
        match found["nodeId"].as_u64() {
            Some(n) if n != 0 => Ok(n),
            _ => bail!("no element matches {selector}"),
        }
    }

    /// The page's document as HTML, as the browser parsed it.
    pub async fn html(&mut self, session: &str) -> anyhow::Result<String> {
        let document = self
            .call(Some(session), "DOM.getDocument", json!({"depth": 0}))
            .await?;
        let html = self
            .call(
                Some(session),
                "DOM.getOuterHTML",
                json!({"nodeId": document["root"]["nodeId"]}),
            )
            .await?;
        html["outerHTML"]
            .as_str()
            .map(str::to_owned)
            .context("getOuterHTML gave no outerHTML")
    }

    /// The page's URL.
    pub async fn url(&mut self, session: &str) -> anyhow::Result<String> {
        let tree = self
            .call(Some(session), "Page.getFrameTree", json!({}))
            .await?;
        tree["frameTree"]["frame"]["url"]
            .as_str()
            .map(str::to_owned)
            .context("getFrameTree gave no url")
    }

    /// A PNG of the whole page (`full_page`) or of the viewport.
    pub async fn screenshot(&mut self, session: &str, full_page: bool) -> anyhow::Result<Vec<u8>> {
        use base64::Engine as _;
        let shot = self
            .call(
                Some(session),
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": full_page}),
            )
            .await?;
        let data = shot["data"]
            .as_str()
            .context("captureScreenshot gave no data")?;
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .context("the screenshot's base64")
    }

    /// Console messages, exceptions and browser log entries of level error or
    /// warning (a Content-Security-Policy violation is one) among the events
    /// received so far, as text; they are taken.
    pub fn problems(&mut self) -> Vec<String> {
        self.take_events()
            .into_iter()
            .filter_map(|e| {
                let p = &e["params"];
                match e["method"].as_str()? {
                    "Runtime.exceptionThrown" => {
                        Some(format!("exception: {}", p["exceptionDetails"]))
                    }
                    "Runtime.consoleAPICalled"
                        if matches!(p["type"].as_str(), Some("error" | "warning" | "assert")) =>
                    {
                        Some(format!("console.{}: {}", p["type"], p["args"]))
                    }
                    "Log.entryAdded"
                        if matches!(p["entry"]["level"].as_str(), Some("error" | "warning")) =>
                    {
                        Some(format!(
                            "log {} ({}): {}",
                            p["entry"]["level"], p["entry"]["source"], p["entry"]["text"]
                        ))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// Closes the browser.
    pub async fn close(mut self) {
        let _ = self.call(None, "Browser.close", json!({})).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        let _ = self.child.kill().await;
    }
}
