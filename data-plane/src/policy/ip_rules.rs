//! Per-route client IP rules (`Route.ip_allow` / `Route.ip_deny`), compiled
//! once per snapshot into parsed networks and checked right after routing.
//!
//! Deny wins over allow; a non-empty allow list admits only its networks. The
//! address checked is the real client (see [`crate::policy::sanitize::client_ip`]: the
//! TCP peer, or `X-Forwarded-For` when the peer is a trusted proxy).
//! IPv4-mapped IPv6 clients are matched as IPv4 ([`Cidr::contains`]).

use std::net::IpAddr;

use crate::policy::sanitize::Cidr;

/// A route's parsed allow and deny lists. A linear scan: lists are short
/// (at most 1000 entries, validated) and usually a handful.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRules {
    allow: Box<[Cidr]>,
    deny: Box<[Cidr]>,
}

impl IpRules {
    /// The rules of a route's parsed lists (`gateway_proto::spec::RouteSpec`);
    /// `None` when both are empty (the route admits everyone without looking
    /// up the client address).
    pub fn new(allow: &[Cidr], deny: &[Cidr]) -> Option<Self> {
        if allow.is_empty() && deny.is_empty() {
            return None;
        }
        Some(Self {
            allow: allow.into(),
            deny: deny.into(),
        })
    }

    /// Whether `client` may use the route.
    pub fn admits(&self, client: IpAddr) -> bool {
        if self.deny.iter().any(|net| net.contains(client)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|net| net.contains(client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> IpRules {
        let parse = |v: &[&str]| v.iter().map(|s| s.parse().unwrap()).collect::<Vec<Cidr>>();
        IpRules::new(&parse(allow), &parse(deny)).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn empty_lists_compile_to_nothing() {
        assert_eq!(IpRules::new(&[], &[]), None);
    }

    #[test]
    fn allow_list_admits_only_its_networks() {
        let r = rules(&["203.0.113.0/24", "2001:db8::/32"], &[]);
        assert!(r.admits(ip("203.0.113.5")));
        assert!(r.admits(ip("2001:db8::1")));
        assert!(!r.admits(ip("198.51.100.1")));
        assert!(!r.admits(ip("2001:db9::1")));
    }

    #[test]
    fn deny_wins_over_allow() {
        let r = rules(
            &["203.0.113.0/24", "2001:db8::/32"],
            &["203.0.113.7", "2001:db8::bad"],
        );
        assert!(!r.admits(ip("203.0.113.7")));
        assert!(r.admits(ip("203.0.113.8")));
        assert!(!r.admits(ip("2001:db8::bad")));
        assert!(r.admits(ip("2001:db8::bae")));
    }

    #[test]
    fn deny_only_admits_everyone_else() {
        let r = rules(&[], &["10.0.0.0/8", "fd00::/8"]);
        assert!(!r.admits(ip("10.1.2.3")));
        assert!(!r.admits(ip("fd12::1")));
        assert!(r.admits(ip("192.0.2.1")));
        assert!(r.admits(ip("2001:db8::1")));
    }

    #[test]
    fn ipv4_mapped_clients_are_matched_as_ipv4() {
        let r = rules(&["203.0.113.0/24"], &["203.0.113.7"]);
        assert!(r.admits(ip("::ffff:203.0.113.5")));
        assert!(!r.admits(ip("::ffff:203.0.113.7")));
        assert!(!r.admits(ip("::ffff:198.51.100.1")));
    }
}
