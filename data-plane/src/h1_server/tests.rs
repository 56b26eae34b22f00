use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use http::header::HeaderValue;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

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

/// Answers with the request's method, path and the number of header fields.
async fn echo(req: Box<Request<ClientBody>>, _peer: SocketAddr) -> Response<ResponseBody> {
    let text = format!("{} {} {}", req.method(), req.uri(), req.headers().len());
    let mut resp = Response::new(ResponseBody::full(text));
    resp.headers_mut()
        .insert("x-host", req.headers()[header::HOST].clone());
    resp
}

/// Serves `server` with `handler` in a task of its own.
fn spawn_serve<H, Fut>(
    server: TcpStream,
    peer: SocketAddr,
    handler: H,
) -> (tokio::task::JoinHandle<Ended>, watch::Sender<()>)
where
    H: Fn(Box<Request<ClientBody>>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let (stop_tx, stop) = watch::channel(());
    let task = tokio::spawn(async move {
        serve(
            server,
            peer,
            Duration::from_secs(30),
            WRITE_TIMEOUT,
            64 * 1024,
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

/// Everything the server sends until it closes the connection.
async fn read_until_closed(client: &mut TcpStream) -> String {
    let mut all = Vec::new();
    tokio::time::timeout(DEADLINE, client.read_to_end(&mut all))
        .await
        .expect("closed within the deadline")
        .unwrap();
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
        resp.headers_mut()
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
    // A body, an upgrade, HTTP/1.0, a malformed head, CONNECT: hyper's.
    for sent in [
        &b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\n\r\nabc"[..],
        b"GET /ws HTTP/1.1\r\nHost: gw\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
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
        assert!(answer.contains("application/problem+json"), "{why}: {answer}");
        assert!(answer.contains("urn:gateway:problem:bad-request"), "{why}: {answer}");
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
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
    resp.headers_mut()
        .insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
    resp.headers_mut().insert(
        header::DATE,
        HeaderValue::from_static("Tue, 01 Dec 2026 00:00:00 GMT"),
    );
    let (parts, ()) = resp.into_parts();
    let get = Exchange {
        head: false,
        close: false,
    };
    let mut out = Vec::new();
    assert!(!encode_head(&mut out, &parts, None, Framing::Chunked, get));
    assert_eq!(
        String::from_utf8(out.clone()).unwrap(),
        "HTTP/1.1 201 Created\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let closing = Exchange { close: true, ..get };
    assert!(encode_head(
        &mut out,
        &parts,
        None,
        Framing::Length(5),
        closing
    ));
    assert_eq!(
        String::from_utf8(out.clone()).unwrap(),
        "HTTP/1.1 201 Created\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\ncontent-length: 5\r\nconnection: close\r\n\r\n"
    );
    // An answer that closes the connection itself says so once.
    let (mut parts, ()) = Response::new(()).into_parts();
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    assert!(encode_head(
        &mut out,
        &parts,
        None,
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
    let (mut parts, ()) = Response::new(()).into_parts();
    parts
        .headers
        .insert("x-request-id", HeaderValue::from_static("gw"));
    let get = Exchange {
        head: false,
        close: false,
    };
    let mut out = Vec::new();
    assert!(!encode_head(
        &mut out,
        &parts,
        Some(&raw),
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
        &parts,
        Some(&raw),
        Framing::None,
        head
    ));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "HTTP/1.1 200 OK\r\nServer: Up\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 2\r\nx-request-id: gw\r\n\r\n"
    );
}
