//! IP networks (`10.0.0.0/8`, `fd00::/8`, a bare address for one host), shared
//! by the data plane's `--trusted-proxies` and the routes' `ip_allow` /
//! `ip_deny` lists, so the control plane validates them with the same parser.
//!
//! An IPv4-mapped IPv6 client address (`::ffff:10.1.1.1`, what a dual-stack
//! socket reports for an IPv4 peer) is matched as the IPv4 address it carries.

use std::net::IpAddr;
use std::str::FromStr;

/// An IP network, `addr/prefix` (a bare address means a single host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// A malformed CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IP network like 10.0.0.0/8 or fd00::/8")]
pub struct CidrError(String);

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CidrError(s.to_string());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(err)?,
        };
        Ok(Self { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn mask_v4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask_v6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl Cidr {
    /// Whether `ip` is inside this network (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask_v4(self.prefix);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask_v6(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The network with every host bit cleared (`10.1.2.3/8` → `10.0.0.0/8`).
    pub fn network(&self) -> Self {
        let addr = match self.addr {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & mask_v4(self.prefix)).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) & mask_v6(self.prefix)).into()),
        };
        Self {
            addr,
            prefix: self.prefix,
        }
    }

    /// Whether the address has bits set beyond the prefix (`10.1.2.3/8`),
    /// usually a typo for another network.
    pub fn has_host_bits(&self) -> bool {
        self.network().addr != self.addr
    }

    /// Whether the address is an IPv4-mapped IPv6 one (`::ffff:10.0.0.0/104`).
    /// Client addresses of that form are matched as IPv4, so such a network
    /// would never match anything: write it as IPv4 instead.
    pub fn is_ipv4_mapped(&self) -> bool {
        matches!(self.addr, IpAddr::V6(a) if a.to_ipv4_mapped().is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_networks_and_hosts() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains(ip("10.9.8.7")));
        assert!(!net.contains(ip("11.0.0.1")));
        let host: Cidr = "192.0.2.7".parse().unwrap();
        assert_eq!(host.prefix(), 32);
        assert!(host.contains(ip("192.0.2.7")));
        assert!(!host.contains(ip("192.0.2.8")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        assert!(
            !all.contains(ip("2001:db8::1")),
            "a v4 network never holds v6"
        );
    }

    #[test]
    fn ipv6_networks_and_hosts() {
        let net: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(net.contains(ip("2001:db8:ffff::1")));
        assert!(!net.contains(ip("2001:db9::1")));
        assert!(!net.contains(ip("10.0.0.1")));
        let host: Cidr = "2001:db8::bad".parse().unwrap();
        assert_eq!(host.prefix(), 128);
        assert!(host.contains(ip("2001:db8::bad")));
        assert!(!host.contains(ip("2001:db8::bae")));
        let all: Cidr = "::/0".parse().unwrap();
        assert!(all.contains(ip("fe80::1")));
    }

    #[test]
    fn ipv4_mapped_clients_match_as_ipv4() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains(ip("::ffff:10.1.1.1")));
        let mapped: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert!(mapped.is_ipv4_mapped());
        assert!(!mapped.contains(ip("10.1.1.1")));
        assert!(!"10.0.0.0/8".parse::<Cidr>().unwrap().is_ipv4_mapped());
    }

    #[test]
    fn host_bits_are_detected_and_cleared() {
        let typo: Cidr = "10.1.2.3/8".parse().unwrap();
        assert!(typo.has_host_bits());
        assert_eq!(typo.network().to_string(), "10.0.0.0/8");
        let v6: Cidr = "2001:db8::1/32".parse().unwrap();
        assert!(v6.has_host_bits());
        assert_eq!(v6.network().to_string(), "2001:db8::/32");
        for ok in [
            "10.0.0.0/8",
            "10.1.2.3",
            "0.0.0.0/0",
            "::/0",
            "2001:db8::/32",
        ] {
            assert!(!ok.parse::<Cidr>().unwrap().has_host_bits(), "{ok}");
        }
    }

    #[test]
    fn malformed_networks_are_refused() {
        for bad in [
            "10.0.0.0/33",
            "nope",
            "10.0.0/8",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
