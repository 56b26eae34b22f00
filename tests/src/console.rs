//! A client of the control plane's web console for the suites: keeps the
//! cookies the console sets (as a browser would, by name), never follows
//! redirects (a test asserts them), and fills in the CSRF fields of forms.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;

/// One answer of the console.
#[derive(Debug, Clone)]
pub struct Page {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: reqwest::header::HeaderMap,
    /// The `Set-Cookie` values, as sent.
    pub set_cookies: Vec<String>,
    /// The body.
    pub body: String,
}

impl Page {
    /// Header `name`'s first value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `Set-Cookie` value that sets cookie `name`.
    pub fn set_cookie(&self, name: &str) -> Option<&str> {
        self.set_cookies
            .iter()
            .find(|c| c.starts_with(&format!("{name}=")))
            .map(String::as_str)
    }

    /// The value of the first hidden field `name` of the page's forms.
    pub fn hidden(&self, name: &str) -> Option<String> {
        let marker = format!("name=\"{name}\" value=\"");
        let start = self.body.find(&marker)? + marker.len();
        let end = self.body[start..].find('"')? + start;
        Some(self.body[start..end].to_owned())
    }
}

/// `value` for an `application/x-www-form-urlencoded` body.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A browser-like session with the console at `base`.
#[derive(Debug)]
pub struct ConsoleClient {
    base: String,
    http: reqwest::Client,
    cookies: BTreeMap<String, String>,
}

impl ConsoleClient {
    /// A client of the console at `base` (`http://127.0.0.1:P`), with no cookie yet.
    pub fn new(base: &str) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a plain HTTP client always builds");
        ConsoleClient {
            base: base.trim_end_matches('/').to_owned(),
            http,
            cookies: BTreeMap::new(),
        }
    }

    /// The cookie `name` as the client holds it.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.cookies.get(name).map(String::as_str)
    }

    /// Holds cookie `name` with `value`, as if the console had set it (a
    /// replayed or stolen cookie).
    pub fn insert_cookie(&mut self, name: &str, value: &str) {
        self.cookies.insert(name.to_owned(), value.to_owned());
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn send(&mut self, request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<Page> {
        let request = if self.cookies.is_empty() {
            request
        } else {
            request.header(reqwest::header::COOKIE, self.cookie_header())
        };
        let response = request.send().await.with_context(|| what.to_owned())?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let set_cookies: Vec<String> = headers
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect();
        for c in &set_cookies {
            let pair = c.split(';').next().unwrap_or_default();
            if let Some((name, value)) = pair.split_once('=') {
                if value.is_empty() || c.contains("Max-Age=0") {
                    self.cookies.remove(name);
                } else {
                    self.cookies.insert(name.to_owned(), value.to_owned());
                }
            }
        }
        let body = response
            .text()
            .await
            .with_context(|| format!("body of {what}"))?;
        Ok(Page {
            status,
            headers,
            set_cookies,
            body,
        })
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> anyhow::Result<Page> {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(request, &format!("GET {path}")).await
    }

    /// `POST path` with `fields` as a form, exactly as given (no CSRF field added).
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> anyhow::Result<Page> {
        let body = fields
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body);
        self.send(request, &format!("POST {path}")).await
    }

    /// Shows the sign-in form and sends `token` with the form's CSRF field.
    pub async fn sign_in(&mut self, token: &str) -> anyhow::Result<Page> {
        let form = self.get("/signin").await?;
        let csrf = form
            .hidden("csrf")
            .with_context(|| format!("no csrf field in the sign-in form: {}", form.body))?;
        self.post("/signin", &[("csrf", &csrf), ("token", token)])
            .await
    }
}
