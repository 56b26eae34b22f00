//! `GET /ws`: a WebSocket echo endpoint on every mock, for the gateway's
//! WebSocket tunnels.
//!
//! After the handshake (101 with `Sec-WebSocket-Accept`) the mock first sends
//! one text frame describing the upgrade request —
//! `{"service", "instance", "path", "headers"}`, `headers` as in
//! [`header_echo`] — so a test can see what the gateway forwarded (identity
//! headers included), then echoes every text and binary frame as it came,
//! answers pings, and answers a close with a close.
//!
//! A request to `/ws` that is not a WebSocket handshake gets 400.
//!
//! Fault hook: `?bad_101=accept` answers the handshake with a wrong
//! `Sec-WebSocket-Accept`, `?bad_101=upgrade` with `Upgrade: h2c` instead of
//! `websocket` (a gateway must not open a tunnel on either).

use futures::{SinkExt as _, StreamExt as _};
use http::header::{CONNECTION, HeaderValue, SEC_WEBSOCKET_ACCEPT, UPGRADE};
use http::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::body::MockBody;
use crate::config::MockConfig;
use crate::handler::header_echo;

/// The path of the echo endpoint.
pub const PATH: &str = "/ws";

/// Whether `value` lists `token` (comma-separated, any case).
fn lists(value: Option<&HeaderValue>, token: &str) -> bool {
    value
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// Answers a request to [`PATH`]: the 101 of a valid handshake (the echo then
/// runs in a task of its own on the upgraded connection), else 400.
pub fn answer<B>(config: &MockConfig, mut req: Request<B>) -> Response<MockBody> {
    let h = req.headers();
    let key = h.get("sec-websocket-key").filter(|k| !k.is_empty());
    let handshake = req.method() == Method::GET
        && lists(h.get(CONNECTION), "upgrade")
        && lists(h.get(UPGRADE), "websocket")
        && h.get("sec-websocket-version").is_some_and(|v| v == "13");
    let Some(key) = key.filter(|_| handshake) else {
        return bad_request();
    };
    let mut accept = derive_accept_key(key.as_bytes());
    let mut upgrade_to = "websocket";
    let fault = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("bad_101=")));
    match fault {
        Some("accept") => accept = derive_accept_key(b"not the key that was sent"),
        Some("upgrade") => upgrade_to = "h2c",
        _ => {}
    }
    let hello = json!({
        "service": config.service.name(),
        "instance": config.instance_id,
        "path": req.uri().path(),
        "headers": header_echo(req.headers()),
    })
    .to_string();
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await;
                echo(ws, hello).await;
            }
            Err(e) => tracing::debug!(error = %e, "websocket upgrade did not complete"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, upgrade_to)
        .header(SEC_WEBSOCKET_ACCEPT, accept)
        .body(MockBody::Full(None))
        .expect("static response parts are valid")
}

/// Sends `hello`, then echoes data frames until the peer closes (tungstenite
/// answers pings and the close itself).
async fn echo<S>(mut ws: WebSocketStream<S>, hello: String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if ws.send(Message::text(hello)).await.is_err() {
        return;
    }
    while let Some(msg) = ws.next().await {
        let echoed = match msg {
            Ok(m @ (Message::Text(_) | Message::Binary(_))) => ws.send(m).await,
            Ok(_) => Ok(()),
            Err(_) => break,
        };
        if echoed.is_err() {
            break;
        }
    }
}

fn bad_request() -> Response<MockBody> {
    let doc = json!({"error": "not a WebSocket handshake", "status": 400});
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(MockBody::full(doc.to_string()))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Service;

    fn config() -> MockConfig {
        MockConfig::new(Service::Orders, "orders-1", 0.0).unwrap()
    }

    #[test]
    fn a_handshake_is_answered_with_101_and_the_accept_key() {
        let req = Request::get(PATH)
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("sec-websocket-version", "13")
            .body(())
            .unwrap();
        // Outside a hyper server the upgrade never completes; the answer is what is checked.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let resp = rt.block_on(async { answer(&config(), req) });
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        // The example of RFC 6455 §1.3.
        assert_eq!(
            resp.headers()[SEC_WEBSOCKET_ACCEPT],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn anything_else_is_400() {
        for req in [
            Request::get(PATH).body(()).unwrap(),
            Request::post(PATH)
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-key", "a2V5")
                .header("sec-websocket-version", "13")
                .body(())
                .unwrap(),
            Request::get(PATH)
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-key", "a2V5")
                .header("sec-websocket-version", "8")
                .body(())
                .unwrap(),
        ] {
            assert_eq!(answer(&config(), req).status(), StatusCode::BAD_REQUEST);
        }
    }
}
