//! The client address a login is counted against (`--trusted-proxies`): the TCP peer, unless
//! the peer is a trusted proxy (the gateway's data planes, the edge in front of them), in which
//! case the right-most `X-Forwarded-For` entry that is not a trusted proxy. It is the data
//! plane's rule (`data-plane/src/sanitize.rs`), so both count the same client.
//!
//! Every proxy in a trusted chain appends the address it was connected from, so the right-most
//! untrusted entry is the first address no trusted party vouches for; anything left of it was
//! written by the client and is never believed.

use std::net::IpAddr;
use std::sync::Arc;

use gateway_proto::cidr::Cidr;
use http::HeaderMap;

/// Peers whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Arc<[Cidr]>);

impl std::fmt::Display for TrustedProxies {
    /// `10.213.82.128/25, 10.213.80.8/29`, or `none`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, network) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{network}")?;
        }
        Ok(())
    }
}

impl TrustedProxies {
    /// Trusts the given networks (none: every request's client is its peer).
    pub fn new(networks: Vec<Cidr>) -> Self {
        Self(networks.into())
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client address of a request from `peer` carrying `headers`.
    pub fn client_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let mut client = peer;
        let values: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        for entry in values.iter().rev().flat_map(|v| v.rsplit(',')) {
            match entry.trim().parse::<IpAddr>() {
                Ok(ip) => {
                    client = ip;
                    if !self.trusts(ip) {
                        break;
                    }
                }
                // Garbage from beyond the trusted chain: stop at the last good hop.
                Err(_) => break,
            }
        }
        client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let none = TrustedProxies::default();
        assert_eq!(none.to_string(), "none");
        assert_eq!(
            none.client_ip(&headers(&["203.0.113.9"]), ip("10.0.0.5")),
            ip("10.0.0.5")
        );
        let some = TrustedProxies::new(vec!["10.1.0.0/16".parse().unwrap()]);
        assert_eq!(
            some.client_ip(&headers(&["203.0.113.9"]), ip("10.0.0.5")),
            ip("10.0.0.5")
        );
    }

    #[test]
    fn a_trusted_chain_is_walked_from_the_right() {
        let trusted = TrustedProxies::new(vec![
            "10.213.81.0/24".parse().unwrap(),
            "10.213.80.8/29".parse().unwrap(),
        ]);
        assert_eq!(trusted.to_string(), "10.213.81.0/24, 10.213.80.8/29");
        let peer = ip("10.213.81.7");
        // client-written entry, the edge's view of the client, the data plane's view of the edge
        let h = headers(&["6.6.6.6, 198.51.100.4", "10.213.80.10"]);
        assert_eq!(trusted.client_ip(&h, peer), ip("198.51.100.4"));
        // Nothing forwarded: the trusted peer itself.
        assert_eq!(trusted.client_ip(&headers(&[]), peer), peer);
        // Garbage right after the trusted hops: the last good hop.
        let h = headers(&["198.51.100.4, not-an-ip, 10.213.80.10"]);
        assert_eq!(trusted.client_ip(&h, peer), ip("10.213.80.10"));
        // IPv6 and IPv4-mapped peers.
        let v6 = TrustedProxies::new(vec!["fd00::/8".parse().unwrap()]);
        assert_eq!(
            v6.client_ip(&headers(&["2001:db8::1"]), ip("fd00::2")),
            ip("2001:db8::1")
        );
        assert_eq!(
            trusted.client_ip(&headers(&["192.0.2.1"]), ip("::ffff:10.213.81.7")),
            ip("192.0.2.1")
        );
    }
}
