//! The PROXY protocol, version 2 (binary), on the client listeners
//! (`--proxy-protocol`, issue 41): a TCP proxy in front (the compose edge,
//! HAProxy with `send-proxy-v2`) opens each connection with a header that
//! names the client's address, since its own address is all the socket shows.
//!
//! * Only peers the application trusts ([`ProxyProtocol::trusts`], the data
//!   plane's `--trusted-proxies`) are read for a header, and each of their
//!   connections must start with one (within the first-bytes deadline, the
//!   header read timeout): a connection without it is closed. From any other
//!   peer nothing is read here; its bytes go to HTTP or TLS as they came, so a
//!   header it sends is not a request (400 and a close on the cleartext
//!   listener) nor a ClientHello (the handshake fails and the connection
//!   closes).
//! * `PROXY` over TCP/IPv4 or TCP/IPv6: the header's source address is the
//!   connection's peer from then on, for everything (the client address, the
//!   trusted-proxy rule, the access log). Being a client's, it is normally
//!   not trusted, so the client's own `X-Forwarded-*`, `Forwarded` and
//!   `X-Real-IP` are dropped or replaced like those of any direct client.
//!   Any other family (UNSPEC, UNIX, UDP) with `PROXY` is refused: the
//!   client would otherwise take the trusted proxy's own address.
//! * `LOCAL` (the proxy's own connection, e.g. a health check): the real peer.
//! * TLVs are skipped. Version 1 (the text form) is not accepted: a trusted
//!   peer that sends it is closed like one that sends no header.
//! * Whether the client used TLS is not read from the header: it is which
//!   listener the proxy connected to (HTTPS traffic to `--tls-listen`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _};

/// The 12 bytes every version 2 header starts with.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The fixed part of a header: the signature, version and command, family
/// and transport, and the length of what follows.
pub const FIXED_LEN: usize = 16;

/// Longest header: the fixed part and the most its 16-bit length can announce.
pub const MAX_LEN: usize = FIXED_LEN + u16::MAX as usize;

/// Address bytes of TCP over IPv4: source, destination, their ports.
const INET_LEN: usize = 4 + 4 + 2 + 2;
/// Address bytes of TCP over IPv6.
const INET6_LEN: usize = 16 + 16 + 2 + 2;

/// Which peers' connections start with a header, shared by a replica's listeners.
#[derive(Clone)]
pub struct ProxyProtocol {
    trusted: Arc<dyn Fn(IpAddr) -> bool + Send + Sync>,
}

impl fmt::Debug for ProxyProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyProtocol").finish_non_exhaustive()
    }
}

impl ProxyProtocol {
    /// Expects a header on every connection from a peer `trusted` says yes to.
    pub fn new(trusted: impl Fn(IpAddr) -> bool + Send + Sync + 'static) -> Self {
        Self {
            trusted: Arc::new(trusted),
        }
    }

    /// Whether connections from `peer` must start with a header.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        (self.trusted)(peer)
    }
}

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The proxy's own connection (a health check): use the real peer.
    Local,
    /// A relayed connection from `source` to `destination`.
    Proxy {
        /// The client.
        source: SocketAddr,
        /// The address the client connected to, at the proxy.
        destination: SocketAddr,
    },
}

impl Header {
    /// The peer the connection stands for: the client of a relayed one, else `peer`.
    pub fn client(self, peer: SocketAddr) -> SocketAddr {
        match self {
            Self::Local => peer,
            Self::Proxy { source, .. } => source,
        }
    }
}

/// Why a trusted peer's connection was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The first 12 bytes are not the version 2 signature.
    #[error("the connection does not start with a PROXY protocol v2 header")]
    Missing,
    /// A version other than 2.
    #[error("PROXY protocol version {0} (only 2 is accepted)")]
    Version(u8),
    /// A command other than LOCAL (0) or PROXY (1).
    #[error("PROXY protocol command {0} (only LOCAL and PROXY exist)")]
    Command(u8),
    /// `PROXY` with something other than TCP over IPv4 or IPv6.
    #[error(
        "PROXY protocol family/transport byte {0:#04x}: only TCP over IPv4 (0x11) or IPv6 (0x21) names a client"
    )]
    Family(u8),
    /// The length is shorter than the family's addresses.
    #[error(
        "PROXY protocol header of {len} bytes after the fixed part, short of the {needed} its addresses take"
    )]
    Short {
        /// The announced length.
        len: usize,
        /// What the addresses need.
        needed: usize,
    },
    /// Not all of the header came within the deadline.
    #[error("no complete PROXY protocol header within {0:?}")]
    Timeout(Duration),
    /// The socket failed or closed first.
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

/// Checks the fixed part of a header; returns how many bytes follow it.
pub fn parse_fixed(fixed: &[u8; FIXED_LEN]) -> Result<usize, Error> {
    if fixed[..12] != SIGNATURE {
        return Err(Error::Missing);
    }
    let version = fixed[12] >> 4;
    if version != 2 {
        return Err(Error::Version(version));
    }
    Ok(usize::from(u16::from_be_bytes([fixed[14], fixed[15]])))
}

/// Reads a header's addresses: `fixed` is its first 16 bytes (checked by
/// [`parse_fixed`]), `rest` the bytes they announced (TLVs, if any, are
/// skipped).
pub fn parse_rest(fixed: &[u8; FIXED_LEN], rest: &[u8]) -> Result<Header, Error> {
    let command = fixed[12] & 0x0f;
    let family = fixed[13];
    match command {
        0 => return Ok(Header::Local),
        1 => {}
        c => return Err(Error::Command(c)),
    }
    let needed = match family {
        0x11 => INET_LEN,
        0x21 => INET6_LEN,
        f => return Err(Error::Family(f)),
    };
    let Some(a) = rest.get(..needed) else {
        return Err(Error::Short {
            len: rest.len(),
            needed,
        });
    };
    let port = |at: usize| u16::from_be_bytes([a[at], a[at + 1]]);
    let (source, destination) = if family == 0x11 {
        let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]));
        (
            SocketAddr::new(ip(0), port(8)),
            SocketAddr::new(ip(4), port(10)),
        )
    } else {
        let ip = |at: usize| {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&a[at..at + 16]);
            IpAddr::V6(Ipv6Addr::from(octets))
        };
        (
            SocketAddr::new(ip(0), port(32)),
            SocketAddr::new(ip(16), port(34)),
        )
    };
    Ok(Header::Proxy {
        source,
        destination,
    })
}

/// Parses a whole header at the start of `bytes`; returns it and its length
/// (for tests and fuzzing; connections use [`read`]).
pub fn parse(bytes: &[u8]) -> Result<(Header, usize), Error> {
    let eof = || Error::Io(std::io::ErrorKind::UnexpectedEof.into());
    let fixed: &[u8; FIXED_LEN] = bytes
        .get(..FIXED_LEN)
        .and_then(|f| f.try_into().ok())
        .ok_or_else(eof)?;
    let len = parse_fixed(fixed)?;
    let rest = bytes.get(FIXED_LEN..FIXED_LEN + len).ok_or_else(eof)?;
    Ok((parse_rest(fixed, rest)?, FIXED_LEN + len))
}

/// Reads exactly one header from `io` within `timeout`, and nothing after
/// it: the next byte read is the client's first (HTTP or a ClientHello).
pub async fn read<IO: AsyncRead + Unpin>(io: &mut IO, timeout: Duration) -> Result<Header, Error> {
    let read = async {
        let mut fixed = [0u8; FIXED_LEN];
        io.read_exact(&mut fixed).await?;
        let len = parse_fixed(&fixed)?;
        let mut rest = vec![0u8; len];
        io.read_exact(&mut rest).await?;
        parse_rest(&fixed, &rest)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Err(Error::Timeout(timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header with `ver_cmd`, `family` and `rest`.
    fn header(ver_cmd: u8, family: u8, rest: &[u8]) -> Vec<u8> {
        let mut h = SIGNATURE.to_vec();
        h.push(ver_cmd);
        h.push(family);
        h.extend_from_slice(&u16::try_from(rest.len()).unwrap().to_be_bytes());
        h.extend_from_slice(rest);
        h
    }

    #[test]
    fn tcp4_names_the_client() {
        let rest = [203, 0, 113, 7, 10, 0, 0, 5, 0xc3, 0x50, 0x20, 0xfb];
        let (h, len) = parse(&header(0x21, 0x11, &rest)).unwrap();
        assert_eq!(len, 28);
        assert_eq!(
            h,
            Header::Proxy {
                source: "203.0.113.7:50000".parse().unwrap(),
                destination: "10.0.0.5:8443".parse().unwrap(),
            }
        );
        let peer = "10.213.80.10:4000".parse().unwrap();
        assert_eq!(h.client(peer), "203.0.113.7:50000".parse().unwrap());
    }

    #[test]
    fn tcp6_names_the_client_and_tlvs_are_skipped() {
        let mut rest = Vec::new();
        rest.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        rest.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        rest.extend_from_slice(&443u16.to_be_bytes());
        rest.extend_from_slice(&8443u16.to_be_bytes());
        // A PP2_TYPE_ALPN TLV ("h2") and a NOOP one.
        rest.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2', 0x04, 0x00, 0x00]);
        let bytes = header(0x21, 0x21, &rest);
        let (h, len) = parse(&bytes).unwrap();
        assert_eq!(len, bytes.len());
        assert_eq!(
            h,
            Header::Proxy {
                source: "[2001:db8::1]:443".parse().unwrap(),
                destination: "[2001:db8::2]:8443".parse().unwrap(),
            }
        );
    }

    #[test]
    fn local_keeps_the_real_peer() {
        // LOCAL with addresses anyway (the receiver ignores them).
        let (h, _) = parse(&header(0x20, 0x11, &[1; 12])).unwrap();
        assert_eq!(h, Header::Local);
        let peer = "10.213.80.10:4000".parse().unwrap();
        assert_eq!(h.client(peer), peer);
        assert_eq!(parse(&header(0x20, 0x00, &[])).unwrap().0, Header::Local);
    }

    #[test]
    fn what_names_no_client_is_refused() {
        // PROXY over UNSPEC, UNIX, UDP: no client address to take.
        for family in [0x00, 0x31, 0x12, 0x22, 0x10] {
            let err = parse(&header(0x21, family, &[0; 216])).unwrap_err();
            assert!(matches!(err, Error::Family(f) if f == family), "{err}");
        }
        assert!(matches!(
            parse(&header(0x11, 0x11, &[0; 12])).unwrap_err(),
            Error::Version(1)
        ));
        assert!(matches!(
            parse(&header(0x22, 0x11, &[0; 12])).unwrap_err(),
            Error::Command(2)
        ));
        assert!(matches!(
            parse(&header(0x21, 0x11, &[0; 11])).unwrap_err(),
            Error::Short {
                len: 11,
                needed: 12
            }
        ));
        assert!(matches!(
            parse(&header(0x21, 0x21, &[0; 12])).unwrap_err(),
            Error::Short {
                len: 12,
                needed: 36
            }
        ));
    }

    #[test]
    fn http_and_version_1_are_not_a_header() {
        for bytes in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"PROXY TCP4 203.0.113.7 10.0.0.5 50000 8443\r\nGET / HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x00\x00\x00\x00\x00",
        ] {
            assert!(matches!(parse(bytes).unwrap_err(), Error::Missing));
        }
        // Cut short: the fixed part, or the announced rest.
        let whole = header(0x21, 0x11, &[0; 12]);
        for cut in [0, 5, 15, 16, 27] {
            assert!(matches!(parse(&whole[..cut]).unwrap_err(), Error::Io(_)));
        }
    }

    #[tokio::test]
    async fn read_takes_the_header_and_nothing_more() {
        let rest = [127, 0, 0, 9, 127, 0, 0, 1, 0x04, 0xd2, 0x1f, 0x90];
        let mut bytes = header(0x21, 0x11, &rest);
        bytes.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let mut io = &bytes[..];
        let h = read(&mut io, Duration::from_secs(1)).await.unwrap();
        assert_eq!(
            h.client("127.0.0.1:1".parse().unwrap()),
            "127.0.0.9:1234".parse().unwrap()
        );
        assert_eq!(io, b"GET / HTTP/1.1\r\n");
    }

    #[tokio::test(start_paused = true)]
    async fn read_has_a_deadline() {
        let (mut client, mut server) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut client, &SIGNATURE)
            .await
            .unwrap();
        let err = read(&mut server, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err}");
        drop(client);
    }
}
