use super::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

async fn listener(limits: Limits) -> (Listener, SocketAddr) {
    let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = inner.local_addr().unwrap();
    (Listener::new(inner, limits, "test"), addr)
}

/// Reads from `conn` until it ends, within `within`: true when the server closed it.
async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await,
        Ok(())
    )
}

/// Serves every accepted connection: echoes what it reads until the read fails.
fn serve(l: Listener) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n @ 1..) = conn.read(&mut buf).await {
                    if conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    })
}

#[tokio::test]
async fn past_the_cap_connections_are_closed_at_once_and_counted() {
    let (l, addr) = listener(Limits {
        max_connections: 2,
        ..Limits::default()
    })
    .await;
    let counters = l.counters();
    let server = serve(l);
    let mut kept = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        c.read_exact(&mut one).await.unwrap();
        kept.push(c);
    }
    assert_eq!(counters.open(), 2);
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut third, Duration::from_secs(5)).await);
    assert_eq!(counters.refused(), 1);
    // A slot given back is a slot free.
    drop(kept.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    while counters.open() != 1 {
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut again = TcpStream::connect(addr).await.unwrap();
    again.write_all(b"y").await.unwrap();
    let mut one = [0u8; 1];
    again.read_exact(&mut one).await.unwrap();
    assert_eq!(&one, b"y");
    server.abort();
}

#[tokio::test]
async fn a_connection_that_sends_too_little_or_goes_idle_is_closed() {
    let (l, addr) = listener(Limits {
        max_connections: 8,
        first_bytes_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(600),
    })
    .await;
    let counters = l.counters();
    let server = serve(l);
    // Silent: closed by the first-bytes deadline.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
    // A few bytes, then nothing: still the first-bytes deadline.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"PRI * ").await.unwrap();
    assert!(closed_within(&mut slow, Duration::from_secs(5)).await);
    // A full start, then traffic keeps it; silence past the idle limit ends it.
    let mut busy = TcpStream::connect(addr).await.unwrap();
    busy.write_all(&[b'a'; FIRST_BYTES as usize]).await.unwrap();
    let mut echoed = [0u8; FIRST_BYTES as usize];
    busy.read_exact(&mut echoed).await.unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        busy.write_all(b"z").await.unwrap();
        let mut one = [0u8; 1];
        busy.read_exact(&mut one).await.unwrap();
    }
    assert!(closed_within(&mut busy, Duration::from_secs(5)).await);
    assert_eq!(counters.timed_out(), 3);
    server.abort();
}
