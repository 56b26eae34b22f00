//! Sign-in: a token of the `--auth-tokens-file`, role `admin` or `viewer`
//! (a `data-plane` token signs no one in). Tokens are compared as the gRPC
//! API compares them ([`Tokens::lookup`]: SHA-256 digests, constant time).
//!
//! Every refusal reads the same ([`REFUSED`]): it never says whether the
//! token is unknown, belongs to a data plane, or was empty. A client address
//! with [`MAX_FAILURES`] failed sign-ins within [`WINDOW`] is refused
//! (429, [`THROTTLED`]) until the window has passed, whatever it sends.

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

/// Failed sign-ins per client address, in fixed windows.
#[derive(Debug, Default)]
pub struct Throttle {
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Throttle {
    fn blocked(&self, ip: IpAddr, now: Instant) -> bool {
        self.failures
            .lock()
            .get(&ip)
            .is_some_and(|(start, n)| now.duration_since(*start) < WINDOW && *n >= MAX_FAILURES)
    }

    fn fail(&self, ip: IpAddr, now: Instant) {
        let mut failures = self.failures.lock();
        if failures.len() >= MAX_ADDRESSES {
            failures.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        }
        let entry = failures.entry(ip).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
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
}
