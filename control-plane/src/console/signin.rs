//! Sign-in: a token of the `--auth-tokens-file`, role `admin` or `viewer`
//! (a `data-plane` token signs no one in). Tokens are compared as the gRPC
//! API compares them ([`Tokens::lookup`]: SHA-256 digests, constant time).
//!
//! Every refusal reads the same ([`REFUSED`]): it never says whether the
//! token is unknown, belongs to a data plane, or was empty. A client address
//! (IPv6: its /64, the block one subscriber gets) with [`MAX_FAILURES`]
//! failed sign-ins within [`WINDOW`] is refused (429, [`THROTTLED`]) until the
//! window has passed, whatever it sends; and once [`MAX_GLOBAL_FAILURES`]
//! sign-ins failed within a window from all addresses together, every
//! sign-in is refused until it ends: the bound on guesses from any number of
//! addresses (issue 41).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;
use tokio::time::Instant;

use crate::auth::{Caller, Role, Tokens};

/// The one message of a refused sign-in.
pub const REFUSED: &str = "Sign-in failed.";
/// The message of a throttled sign-in.
pub const THROTTLED: &str = "Too many failed sign-ins from this address; try again in a minute.";
/// Failed sign-ins a client address may make per [`WINDOW`].
pub const MAX_FAILURES: u32 = 5;
/// The throttle's window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Failed sign-ins from all addresses together per [`WINDOW`].
pub const MAX_GLOBAL_FAILURES: u32 = 100;
/// Addresses remembered at most (the oldest windows go first beyond it).
const MAX_ADDRESSES: usize = 10_000;

/// Why a sign-in was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Wrong token (or a data-plane one): [`REFUSED`].
    Refused,
    /// Too many failures from this address: [`THROTTLED`].
    Throttled,
}

/// Failed sign-ins per client address (IPv6: per /64) and in all, in fixed windows.
#[derive(Debug, Default)]
pub struct Throttle {
    failures: Mutex<Failures>,
}

#[derive(Debug, Default)]
struct Failures {
    by_address: HashMap<IpAddr, (Instant, u32)>,
    /// Every address's failures: the window's start and count.
    all: Option<(Instant, u32)>,
}

/// The address a client is counted as: itself (IPv4, or IPv4-mapped IPv6 as
/// IPv4), or its /64.
fn counted(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & (u128::MAX << 64)).into()),
        },
    }
}

impl Throttle {
    fn blocked(&self, ip: IpAddr, now: Instant) -> bool {
        let failures = self.failures.lock();
        let over = |w: &(Instant, u32), max| now.duration_since(w.0) < WINDOW && w.1 >= max;
        failures
            .by_address
            .get(&counted(ip))
            .is_some_and(|w| over(w, MAX_FAILURES))
            || failures
                .all
                .as_ref()
                .is_some_and(|w| over(w, MAX_GLOBAL_FAILURES))
    }

    fn fail(&self, ip: IpAddr, now: Instant) {
        let mut failures = self.failures.lock();
        if failures.by_address.len() >= MAX_ADDRESSES {
            failures
                .by_address
                .retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        }
        let count = |entry: &mut (Instant, u32)| {
            if now.duration_since(entry.0) >= WINDOW {
                *entry = (now, 0);
            }
            entry.1 += 1;
        };
        count(failures.by_address.entry(counted(ip)).or_insert((now, 0)));
        count(failures.all.get_or_insert((now, 0)));
    }

    /// Checks `token` from `ip`: the caller it signs in, or why not.
    pub fn sign_in(&self, tokens: &Tokens, ip: IpAddr, token: &str) -> Result<Caller, Refusal> {
        let now = Instant::now();
        if self.blocked(ip, now) {
            return Err(Refusal::Throttled);
        }
        match tokens.lookup(token.trim()) {
            Some(caller) if caller.role != Role::DataPlane => Ok(caller),
            _ => {
                self.fail(ip, now);
                Err(Refusal::Refused)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tokens() -> Tokens {
        Tokens::parse(
            "alice admin adm-token\nbob viewer view-token\ndp data-plane dp-token\n",
            Path::new("t"),
        )
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn roles_and_the_throttle() {
        let t = Throttle::default();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(
            t.sign_in(&tokens(), ip, "adm-token").unwrap().role,
            Role::Admin
        );
        assert_eq!(
            t.sign_in(&tokens(), ip, " view-token\n").unwrap().name,
            "bob"
        );
        assert_eq!(t.sign_in(&tokens(), ip, "dp-token"), Err(Refusal::Refused));
        for _ in 1..MAX_FAILURES {
            assert_eq!(t.sign_in(&tokens(), ip, "nope"), Err(Refusal::Refused));
        }
        // Five failures: even the right token is refused until the window passes.
        assert_eq!(
            t.sign_in(&tokens(), ip, "adm-token"),
            Err(Refusal::Throttled)
        );
        assert!(t.sign_in(&tokens(), other, "adm-token").is_ok());
        tokio::time::advance(WINDOW).await;
        assert!(t.sign_in(&tokens(), ip, "adm-token").is_ok());
    }

    /// Issue 41, item 16: IPv6 clients count per /64, and all addresses
    /// together are bounded.
    #[tokio::test(start_paused = true)]
    async fn ipv6_counts_per_64_and_all_addresses_share_a_bound() {
        let t = Throttle::default();
        for i in 0..MAX_FAILURES {
            let ip: IpAddr = format!("2001:db8:1:2::{:x}", i + 1).parse().unwrap();
            assert_eq!(t.sign_in(&tokens(), ip, "nope"), Err(Refusal::Refused));
        }
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(
            t.sign_in(&tokens(), same_64, "adm-token"),
            Err(Refusal::Throttled)
        );
        let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(t.sign_in(&tokens(), other_64, "adm-token").is_ok());
        // Spread over many addresses, the failures meet the global bound.
        let t = Throttle::default();
        for i in 0..MAX_GLOBAL_FAILURES {
            let ip: IpAddr = format!("198.51.{}.{}", i / 200, i % 200 + 1)
                .parse()
                .unwrap();
            assert_eq!(t.sign_in(&tokens(), ip, "nope"), Err(Refusal::Refused));
        }
        let fresh: IpAddr = "203.0.113.7".parse().unwrap();
        assert_eq!(
            t.sign_in(&tokens(), fresh, "adm-token"),
            Err(Refusal::Throttled)
        );
        tokio::time::advance(WINDOW).await;
        assert!(t.sign_in(&tokens(), fresh, "adm-token").is_ok());
    }
}
