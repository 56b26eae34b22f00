use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use http::header::HeaderValue;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const DEADLINE: Duration = Duration::from_secs(10);
/// The write timeout of the connections served here.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// A connected pair: the client's socket and the server's.
async fn pair() -> (TcpStream, TcpStream, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).await.unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    (client, server, peer)
}

/// The refusal answer of the connections served here: its status, saying why.
fn refusal(refused: Refusal) -> Response<ResponseBody> {
    let status = match refused {
        Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
        Refusal::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        Refusal::HeadTimeout(_) => StatusCode::REQUEST_TIMEOUT,
    };
    let mut resp = Response::new(ResponseBody::full(format!("refused: {refused:?}")));
    *resp.status_mut() = status;
    resp
}

/// Answers with the request's method, path and the number of header fields.
async fn echo(req: Box<Request<ClientBody>>, _peer: SocketAddr) -> Response<ResponseBody> {
    let text = format!("{} {} {}", req.method(), req.uri(), req.headers().len());
    let mut resp = Response::new(ResponseBody::full(text));
    resp.fields_mut()
        .map_mut()
        .insert("x-host", req.headers()[header::HOST].clone());
    resp
}

/// Serves `server` with `handler` in a task of its own.
fn spawn_serve<H, Fut>(
    server: TcpStream,
    peer: SocketAddr,
    handler: H,
) -> (tokio::task::JoinHandle<Ended<TcpStream>>, watch::Sender<()>)
where
    H: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let (stop_tx, stop) = watch::channel(());
    let task = tokio::spawn(async move {
        serve(
            server,
            BytesMut::new(),
            peer,
            Duration::from_secs(30),
            WRITE_TIMEOUT,
            64 * 1024,
            refusal,
            &handler,
            &stop,
        )
        .await
    });
    (task, stop_tx)
}

/// What [`gated`]'s handler returns.
type Answer = Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>>;

/// A handler that holds requests for `held` until [`Gate::release`], and says
/// when one has arrived; other requests are [`echo`]ed at once.
fn gated(
    held: &'static str,
) -> (
    impl Fn(Box<Request<ClientBody>>, SocketAddr) -> Answer + Send + Sync + 'static,
    Gate,
) {
    let (arrived_tx, arrived) = tokio::sync::mpsc::unbounded_channel::<()>();
    let release = Arc::new(tokio::sync::Notify::new());
    let go = release.clone();
    let handler = move |req: Box<Request<ClientBody>>, peer: SocketAddr| {
        let arrived_tx = arrived_tx.clone();
        let go = go.clone();
        Box::pin(async move {
            if req.uri() == held {
                let _ = arrived_tx.send(());
                go.notified().await;
            }
            echo(req, peer).await
        }) as Answer
    };
    (handler, Gate { arrived, release })
}

struct Gate {
    arrived: tokio::sync::mpsc::UnboundedReceiver<()>,
    release: Arc<tokio::sync::Notify>,
}

impl Gate {
    /// Waits (within the deadline) until a held request is in the handler.
    async fn arrived(&mut self) {
        tokio::time::timeout(DEADLINE, self.arrived.recv())
            .await
            .expect("the request reached the handler");
    }

    fn release(&self) {
        self.release.notify_one();
    }
}

/// Reads until `want` complete responses (by their `content-length`) are in.
async fn read_responses(client: &mut TcpStream, want: usize) -> String {
    let mut got = Vec::new();
    let read = async {
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if complete_responses(&text) >= want {
                return text;
            }
            let mut chunk = [0u8; 4096];
            let n = client.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed after {text:?}");
            got.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("responses within the deadline")
}

/// Everything the server sends until it closes the connection; then the
/// client closes its side too (a server lingering after its close stops).
async fn read_until_closed(client: &mut TcpStream) -> String {
    let mut all = Vec::new();
    tokio::time::timeout(DEADLINE, client.read_to_end(&mut all))
        .await
        .expect("closed within the deadline")
        .unwrap();
    let _ = client.shutdown().await;
    String::from_utf8_lossy(&all).into_owned()
}

fn complete_responses(mut text: &str) -> usize {
    let mut n = 0;
    while let Some(end) = text.find("\r\n\r\n") {
        let head = &text[..end];
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.parse().unwrap());
        if head.starts_with("HTTP/1.1 ") && text.len() >= end + 4 + len {
            n += 1;
            text = &text[end + 4 + len..];
        } else {
            break;
        }
    }
    n
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_with_framing_and_date() {
    let (mut client, server, peer) = pair().await;
    let (task, _stop) = spawn_serve(server, peer, echo);
    client
        .write_all(
            b"GET /a?x=1 HTTP/1.1\r\nHost: gw\r\n\r\nGET /b HTTP/1.1\r\nHost: gw\r\nX-One: 1\r\n\r\n",
        )
        .await
        .unwrap();
    let text = read_responses(&mut client, 2).await;
    let (first, second) = text.split_at(text.rfind("HTTP/1.1 200 OK\r\n").unwrap());
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(first.contains("\r\nx-host: gw\r\n"), "{text}");
    assert!(first.contains("\r\ncontent-length: 12\r\n"), "{text}");
    assert!(first.contains("\r\ndate: "), "{text}");
    assert!(text.contains("\r\n\r\nGET /a?x=1 1"), "{text}");
    assert!(second.ends_with("\r\n\r\nGET /b 2"), "{text}");
    // The connection stays open for more.
    client
        .write_all(b"GET /c HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    assert!(read_responses(&mut client, 1).await.ends_with("GET /c 1"));
    drop(client);
    let ended = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
    assert!(matches!(ended, Ended::Closed));
}

#[tokio::test]
async fn connection_close_is_answered_and_the_connection_closed() {
    let (mut client, server, peer) = pair().await;
    let (task, _stop) = spawn_serve(server, peer, echo);
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let text = read_until_closed(&mut client).await;
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(text.ends_with("GET / 2"), "{text}");
    assert!(matches!(task.await.unwrap(), Ended::Closed));
}

#[tokio::test]
async fn head_answers_keep_their_length_and_send_no_body() {
    let (mut client, server, peer) = pair().await;
    let handler = |_req: Box<Request<ClientBody>>, _peer: SocketAddr| async {
        let mut resp = Response::new(ResponseBody::empty());
        resp.fields_mut()
            .map_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1234"));
        resp
    };
    let (_task, _stop) = spawn_serve(server, peer, handler);
    client
        .write_all(b"HEAD / HTTP/1.1\r\nHost: gw\r\n\r\nHEAD / HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let text = read_until_closed(&mut client).await;
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
    assert_eq!(
        text.matches("\r\ncontent-length: 1234\r\n").count(),
        2,
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\n"), "{text}");
}

#[tokio::test]
async fn requests_for_hyper_come_back_whole() {
    // An upgrade, another transfer coding or expectation, HTTP/1.0,
    // CONNECT: hyper's.
    for sent in [
        &b"GET /ws HTTP/1.1\r\nHost: gw\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"[..],
        b"PUT /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 0\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"CONNECT gw:443 HTTP/1.1\r\nHost: gw:443\r\n\r\n",
    ] {
        let (mut client, server, peer) = pair().await;
        let called = Arc::new(AtomicUsize::new(0));
        let seen = called.clone();
        let handler = move |req: Box<Request<ClientBody>>, peer: SocketAddr| {
            seen.fetch_add(1, Ordering::SeqCst);
            echo(req, peer)
        };
        let (task, _stop) = spawn_serve(server, peer, handler);
        client.write_all(sent).await.unwrap();
        let ended = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
        let Ended::Handover(mut rewind) = ended else {
            panic!("{:?} was not handed over", String::from_utf8_lossy(sent));
        };
        let mut back = vec![0u8; sent.len()];
        rewind.read_exact(&mut back).await.unwrap();
        assert_eq!(back, sent);
        assert_eq!(called.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn ambiguous_framing_is_refused_with_400_and_the_connection_closed() {
    for (sent, why) in [
        (
            &b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
            "CL then TE",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
            "TE then CL",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            "two CL",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3, 3\r\n\r\nabc",
            "a CL list",
        ),
        (
            b"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "two Host",
        ),
        (
            b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            "two CL on a bodiless request",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: +3\r\n\r\nabc",
            "a signed CL",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 0x3\r\n\r\nabc",
            "a hex CL",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
            "CL with another coding",
        ),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", "a malformed field name"),
        (
            b"POST /x HTTP/1.0\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "CL and TE on HTTP/1.0",
        ),
        (b"GET /a b/c HTTP/1.1\r\nHost: gw\r\n\r\n", "a malformed request line"),
        (b"GET / HTTP/1.1\r\nHost: gw\r\nX: \x01\r\n\r\n", "a control byte in a value"),
    ] {
        let (mut client, server, peer) = pair().await;
        let called = Arc::new(AtomicUsize::new(0));
        let seen = called.clone();
        let handler = move |req: Box<Request<ClientBody>>, peer: SocketAddr| {
            seen.fetch_add(1, Ordering::SeqCst);
            echo(req, peer)
        };
        let (task, _stop) = spawn_serve(server, peer, handler);
        client.write_all(sent).await.unwrap();
        let answer = read_until_closed(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{why}: {answer}");
        assert!(answer.contains("refused: BadRequest"), "the refusal answer: {why}: {answer}");
        assert!(matches!(task.await.unwrap(), Ended::Closed), "{why}");
        assert_eq!(called.load(Ordering::SeqCst), 0, "{why}");
    }
}

#[tokio::test]
async fn a_client_that_never_reads_is_disconnected_after_the_write_timeout() {
    let (client, server, peer) = pair().await;
    // Shrink the receive window so the answer cannot all sit in socket buffers.
    let client = {
        let std = client.into_std().unwrap();
        socket2::SockRef::from(&std)
            .set_recv_buffer_size(4096)
            .unwrap();
        TcpStream::from_std(std).unwrap()
    };
    let big = Bytes::from(vec![b'x'; 32 << 20]);
    let handler = move |_req: Box<Request<ClientBody>>, _peer: SocketAddr| {
        let big = big.clone();
        async move { Response::new(ResponseBody::full(big)) }
    };
    let (task, _stop) = spawn_serve(server, peer, handler);
    let mut client = client;
    client
        .write_all(b"GET /big HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    // The client reads nothing; the connection must end on its own.
    let ended = tokio::time::timeout(WRITE_TIMEOUT + DEADLINE, task)
        .await
        .expect("the server gave up on the client")
        .unwrap();
    assert!(matches!(ended, Ended::Closed));
}

#[tokio::test]
async fn a_head_split_across_segments_is_put_together() {
    let (mut client, server, peer) = pair().await;
    client.set_nodelay(true).unwrap();
    let (_task, _stop) = spawn_serve(server, peer, echo);
    client
        .write_all(b"GET /split HTTP/1.1\r\nHo")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.write_all(b"st: gw\r\n\r\n").await.unwrap();
    assert!(
        read_responses(&mut client, 1)
            .await
            .ends_with("GET /split 1")
    );
}

#[tokio::test]
async fn a_client_that_pipelines_and_then_closes_still_gets_the_answer_in_flight() {
    let (mut client, server, peer) = pair().await;
    let (handler, mut gate) = gated("/first");
    let (_task, _stop) = spawn_serve(server, peer, handler);
    client
        .write_all(b"GET /first HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    gate.arrived().await;
    // The second arrives while the first is in flight, then the client half-closes:
    // as with hyper, the buffered request stops the watch for a close, so the
    // first is answered (the second, read after the close, is not).
    client
        .write_all(b"GET /second HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    client.shutdown().await.unwrap();
    gate.release();
    let text = read_responses(&mut client, 1).await;
    assert!(text.ends_with("GET /first 1"), "{text}");
}

#[tokio::test]
async fn a_client_that_leaves_cancels_its_request() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (mut client, server, peer) = pair().await;
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let handler = move |_req: Box<Request<ClientBody>>, _peer: SocketAddr| {
        let flag = Flag(flag.clone());
        async move {
            let _flag = flag;
            std::future::pending::<Response<ResponseBody>>().await
        }
    };
    let (task, _stop) = spawn_serve(server, peer, handler);
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    client.shutdown().await.unwrap();
    let ended = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
    assert!(matches!(ended, Ended::Closed));
    assert!(dropped.load(Ordering::SeqCst));
}

#[tokio::test]
async fn shutdown_closes_an_idle_connection_and_lets_a_request_finish() {
    // Idle: closed at once.
    let (_client, server, peer) = pair().await;
    let (task, stop) = spawn_serve(server, peer, echo);
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
    assert!(matches!(ended, Ended::Closed));

    // In flight: answered, then closed.
    let (mut client, server, peer) = pair().await;
    let (handler, mut gate) = gated("/late");
    let (task, stop) = spawn_serve(server, peer, handler);
    client
        .write_all(b"GET /late HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    gate.arrived().await;
    stop.send(()).unwrap();
    gate.release();
    assert!(
        read_until_closed(&mut client)
            .await
            .ends_with("GET /late 1")
    );
    assert!(matches!(task.await.unwrap(), Ended::Closed));
}

#[test]
fn chunk_lines_are_lower_case_hex() {
    for (len, line) in [
        (0, "0\r\n"),
        (1, "1\r\n"),
        (15, "f\r\n"),
        (16, "10\r\n"),
        (255, "ff\r\n"),
        (4096, "1000\r\n"),
    ] {
        let mut out = Vec::new();
        chunk_line(&mut out, len);
        assert_eq!(String::from_utf8(out).unwrap(), line);
    }
    let mut out = Vec::new();
    frame_into(&mut out, b"hello", Framing::Chunked);
    assert_eq!(out, b"5\r\nhello\r\n");
}

#[test]
fn heads_carry_our_framing_not_the_handlers() {
    let mut resp = Response::new(());
    *resp.status_mut() = StatusCode::CREATED;
    resp.fields_mut()
        .map_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
    resp.fields_mut()
        .map_mut()
        .insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
    resp.fields_mut().map_mut().insert(
        header::DATE,
        HeaderValue::from_static("Tue, 01 Dec 2026 00:00:00 GMT"),
    );
    let (status, fields, ()) = resp.into_parts();
    let get = Exchange {
        body: None,
        expect_continue: false,
        head: false,
        close: false,
    };
    let mut out = Vec::new();
    assert!(!encode_head(
        &mut out,
        status,
        &fields,
        Framing::Chunked,
        get
    ));
    assert_eq!(
        String::from_utf8(out.clone()).unwrap(),
        "HTTP/1.1 201 Created\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let closing = Exchange { close: true, ..get };
    assert!(encode_head(
        &mut out,
        status,
        &fields,
        Framing::Length(5),
        closing
    ));
    assert_eq!(
        String::from_utf8(out.clone()).unwrap(),
        "HTTP/1.1 201 Created\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\ncontent-length: 5\r\nconnection: close\r\n\r\n"
    );
    // An answer that closes the connection itself says so once.
    let mut fields = Fields::default();
    fields.insert(header::CONNECTION, HeaderValue::from_static("close"));
    assert!(encode_head(
        &mut out,
        StatusCode::OK,
        &fields,
        Framing::Length(0),
        closing
    ));
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches("connection").count(), 1, "{text}");
}

#[test]
fn an_upstreams_fields_are_written_as_they_came_under_the_gateways() {
    let raw = crate::response_head::from_head(
        b"HTTP/1.1 200 OK\r\nServer: Up\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 2\r\n\
X-Request-Id: up\r\nConnection: keep-alive\r\nx-request-id: up-again\r\n\r\n",
    );
    let mut fields = Fields::upstream(http::HeaderMap::new(), Some(raw));
    fields.insert(
        header::HeaderName::from_static("x-request-id"),
        HeaderValue::from_static("gw"),
    );
    let get = Exchange {
        body: None,
        expect_continue: false,
        head: false,
        close: false,
    };
    let mut out = Vec::new();
    assert!(!encode_head(
        &mut out,
        StatusCode::OK,
        &fields,
        Framing::Length(2),
        get
    ));
    // The upstream's date stands; its length gives way to the framing; the gateway's id replaces both of its.
    assert_eq!(
        String::from_utf8(out.clone()).unwrap(),
        "HTTP/1.1 200 OK\r\nServer: Up\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nx-request-id: gw\r\ncontent-length: 2\r\n\r\n"
    );
    // A HEAD answer keeps the length of what GET would send.
    let head = Exchange { head: true, ..get };
    assert!(!encode_head(
        &mut out,
        StatusCode::OK,
        &fields,
        Framing::None,
        head
    ));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "HTTP/1.1 200 OK\r\nServer: Up\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 2\r\nx-request-id: gw\r\n\r\n"
    );
}

/// Answers with the request's method, target and whole body; a body that
/// cannot be read is answered 400 with the reason.
async fn echo_body(req: Box<Request<ClientBody>>, _peer: SocketAddr) -> Response<ResponseBody> {
    use http_body_util::BodyExt as _;
    let (parts, body) = (*req).into_parts();
    match body.collect().await {
        Ok(b) => Response::new(ResponseBody::full(format!(
            "{} {} {}",
            parts.method,
            parts.uri,
            String::from_utf8_lossy(&b.to_bytes())
        ))),
        Err(e) => {
            let mut resp = Response::new(ResponseBody::full(format!("unreadable: {e}")));
            *resp.status_mut() = StatusCode::BAD_REQUEST;
            resp
        }
    }
}

/// Answers 401 without reading the body.
async fn refuse(_req: Box<Request<ClientBody>>, _peer: SocketAddr) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full("no"));
    *resp.status_mut() = StatusCode::UNAUTHORIZED;
    resp
}

/// The bodies of the answers in `text`, in order.
fn bodies(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(end) = rest.find("\r\n\r\n") {
        let head = &rest[..end];
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.parse().unwrap());
        let start = end + 4;
        out.push(rest[start..(start + len).min(rest.len())].to_string());
        rest = &rest[(start + len).min(rest.len())..];
    }
    out
}

#[tokio::test]
async fn bodies_are_read_here_and_the_connection_carries_the_next_request() {
    let (mut client, server, peer) = pair().await;
    let (task, _stop) = spawn_serve(server, peer, echo_body);
    // A length body with its head, a chunked one (extensions, trailers), a
    // bodiless request, all pipelined on one connection.
    client
        .write_all(
            b"POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nhello\
              PUT /b HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n\
              3;x=y\r\nwor\r\n2\r\nld\r\n0\r\nx-sum: 1\r\n\r\n\
              GET /c HTTP/1.1\r\nHost: gw\r\n\r\n",
        )
        .await
        .unwrap();
    let text = read_responses(&mut client, 3).await;
    assert_eq!(
        bodies(&text),
        ["POST /a hello", "PUT /b world", "GET /c "],
        "{text}"
    );
    // A body that arrives a byte at a time after its head streams through.
    client
        .write_all(b"POST /d HTTP/1.1\r\nHost: gw\r\nContent-Length: 4\r\n\r\n")
        .await
        .unwrap();
    for b in b"slow" {
        client.write_all(&[*b]).await.unwrap();
        tokio::task::yield_now().await;
    }
    let text = read_responses(&mut client, 1).await;
    assert_eq!(bodies(&text), ["POST /d slow"], "{text}");
    drop(client);
    assert!(matches!(task.await.unwrap(), Ended::Closed));
}

#[tokio::test]
async fn expect_100_continue_is_answered_when_the_body_is_first_read() {
    let (mut client, server, peer) = pair().await;
    let (_task, _stop) = spawn_serve(server, peer, echo_body);
    client
        .write_all(
            b"POST /e HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
        )
        .await
        .unwrap();
    let mut interim = vec![0u8; b"HTTP/1.1 100 Continue\r\n\r\n".len()];
    tokio::time::timeout(DEADLINE, client.read_exact(&mut interim))
        .await
        .expect("the interim answer within the deadline")
        .unwrap();
    assert_eq!(interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    client.write_all(b"abc").await.unwrap();
    let text = read_responses(&mut client, 1).await;
    assert_eq!(bodies(&text), ["POST /e abc"], "{text}");
    // A handler that answers without reading never asks for the body: no 100,
    // and the connection closes after the answer (the body would follow).
    let (mut client, server, peer) = pair().await;
    let (task, _stop) = spawn_serve(server, peer, refuse);
    client
        .write_all(
            b"POST /e HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
        )
        .await
        .unwrap();
    let text = read_until_closed(&mut client).await;
    assert!(text.starts_with("HTTP/1.1 401 "), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    assert!(matches!(task.await.unwrap(), Ended::Closed));
}

#[tokio::test]
async fn an_unread_body_is_skipped_when_buffered_and_closes_the_connection_otherwise() {
    // All of it came with the head: skipped, and the connection goes on.
    let (mut client, server, peer) = pair().await;
    let (_task, _stop) = spawn_serve(server, peer, refuse);
    client
        .write_all(b"POST /f HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\nPOST /g HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nhi")
        .await
        .unwrap();
    let text = read_responses(&mut client, 2).await;
    assert_eq!(text.matches("HTTP/1.1 401 ").count(), 2, "{text}");
    assert!(!text.contains("connection: close"), "{text}");
    // Most of it still to come: the answer closes the connection.
    let (mut client, server, peer) = pair().await;
    let (task, _stop) = spawn_serve(server, peer, refuse);
    client
        .write_all(b"POST /h HTTP/1.1\r\nHost: gw\r\nContent-Length: 100000\r\n\r\npartial")
        .await
        .unwrap();
    let text = read_until_closed(&mut client).await;
    assert!(text.starts_with("HTTP/1.1 401 "), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    assert!(matches!(task.await.unwrap(), Ended::Closed));
}

#[tokio::test]
async fn a_malformed_chunked_body_fails_the_request_and_closes_the_connection() {
    for sent in [
        &b"POST /i HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n"
            [..],
        b"POST /i HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiX\r\n0\r\n\r\n",
        b"POST /i HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n2\nhi\r\n0\r\n\r\n",
    ] {
        let (mut client, server, peer) = pair().await;
        let (task, _stop) = spawn_serve(server, peer, echo_body);
        client.write_all(sent).await.unwrap();
        // A request that follows on the connection is never read.
        client
            .write_all(b"GET /never HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await
            .unwrap();
        let text = read_until_closed(&mut client).await;
        let why = String::from_utf8_lossy(sent);
        assert!(text.starts_with("HTTP/1.1 400 "), "{why}: {text}");
        assert!(text.contains("malformed request body"), "{why}: {text}");
        assert!(!text.contains("/never"), "{why}: {text}");
        assert!(matches!(task.await.unwrap(), Ended::Closed), "{why}");
    }
}

#[tokio::test]
async fn ambiguous_framing_after_a_body_on_the_same_connection_is_refused() {
    for second in [
        &b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
        b"POST /x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    ] {
        for first in [
            &b"POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nhi"[..],
            b"POST /a HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
            b"POST /a HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
        ] {
            let (mut client, server, peer) = pair().await;
            let (task, _stop) = spawn_serve(server, peer, echo_body);
            client.write_all(first).await.unwrap();
            client.write_all(second).await.unwrap();
            let text = read_until_closed(&mut client).await;
            let why = format!(
                "{} then {}",
                String::from_utf8_lossy(first),
                String::from_utf8_lossy(second)
            );
            let statuses: Vec<&str> = text
                .match_indices("HTTP/1.1 ")
                .map(|(i, _)| &text[i + 9..i + 12])
                .filter(|s| *s != "100")
                .collect();
            assert_eq!(statuses, ["200", "400"], "{why}: {text}");
            assert!(matches!(task.await.unwrap(), Ended::Closed), "{why}");
        }
    }
}

#[tokio::test]
async fn a_client_gone_before_its_body_ends_cancels_the_request() {
    let (mut client, server, peer) = pair().await;
    let cancelled = Arc::new(AtomicBool::new(false));
    let flag = cancelled.clone();
    let handler = move |req: Box<Request<ClientBody>>, peer: SocketAddr| {
        let flag = flag.clone();
        async move {
            struct OnDrop(Arc<AtomicBool>);
            impl Drop for OnDrop {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let guard = OnDrop(flag);
            let resp = echo_body(req, peer).await;
            std::mem::forget(guard);
            resp
        }
    };
    let (task, _stop) = spawn_serve(server, peer, handler);
    client
        .write_all(b"POST /j HTTP/1.1\r\nHost: gw\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    client.shutdown().await.unwrap();
    let ended = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
    assert!(matches!(ended, Ended::Closed));
    assert!(
        cancelled.load(Ordering::SeqCst),
        "the request's future was dropped"
    );
}

#[tokio::test]
async fn a_head_too_large_is_refused_431_and_a_stalled_one_408() {
    // Larger than the server reads (64 KiB here): 431, whole or still partial.
    for complete in [true, false] {
        let (mut client, server, peer) = pair().await;
        let (task, _stop) = spawn_serve(server, peer, echo);
        let mut head = format!(
            "GET / HTTP/1.1\r\nHost: gw\r\nX-Big: {}\r\n",
            "a".repeat(70 * 1024)
        );
        if complete {
            head.push_str("\r\n");
        }
        client.write_all(head.as_bytes()).await.unwrap();
        let answer = read_until_closed(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        assert!(answer.contains("refused: HeadTooLarge(65536)"), "{answer}");
        assert!(matches!(task.await.unwrap(), Ended::Closed));
    }
    // Too many fields: 431 as well.
    let (mut client, server, peer) = pair().await;
    let (_task, _stop) = spawn_serve(server, peer, echo);
    let mut head = String::from("GET / HTTP/1.1\r\nHost: gw\r\n");
    for i in 0..MAX_HEADERS {
        head.push_str(&format!("X-{i}: 1\r\n"));
    }
    head.push_str("\r\n");
    client.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
}

#[tokio::test(start_paused = true)]
async fn part_of_a_head_and_then_nothing_is_answered_408() {
    let (mut client, server, peer) = pair().await;
    let (task, _stop) = spawn_serve(server, peer, echo);
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: g")
        .await
        .unwrap();
    // The header read timeout here is 30 s (paused time: no real wait).
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), client.read_to_end(&mut all))
        .await
        .expect("closed after the header read timeout")
        .unwrap();
    let answer = String::from_utf8_lossy(&all);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("refused: HeadTimeout(30s)"), "{answer}");
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    assert!(matches!(task.await.unwrap(), Ended::Closed));
}

/// What an idle connection costs is mostly the size of this future (plus the
/// handler's own, inline in it): a large local held across an await, such as
/// a buffer on the stack of a function it awaits, sits in every connection's
/// memory. 10,000 idle connections are measured by `scripts/bench`; this
/// keeps the transport's own share from growing unnoticed.
#[tokio::test]
async fn the_connection_future_stays_small() {
    let (_client, server, peer) = pair().await;
    let (_stop_tx, stop) = watch::channel(());
    let handler = |_req: Box<Request<ClientBody>>, _peer: SocketAddr| async {
        Response::new(ResponseBody::empty())
    };
    let serving = serve(
        server,
        BytesMut::new(),
        peer,
        Duration::from_secs(30),
        WRITE_TIMEOUT,
        64 * 1024,
        refusal,
        &handler,
        &stop,
    );
    // 1,912 bytes in a debug build when written (a 4 KiB buffer held in it
    // by mistake made it over 6 KiB).
    let size = std::mem::size_of_val(&serving);
    assert!(
        size <= 3 * 1024,
        "h1_server::serve's future is {size} bytes"
    );
}
