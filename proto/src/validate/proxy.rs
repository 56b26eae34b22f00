//! Validation of the forwarding settings of a route: `websocket` /
//! `websocket_idle_timeout_ms` and `retry`.

use std::collections::BTreeSet;

use super::{MAX_TIMEOUT_MS, Validator};
use crate::v1::{Retry, RetryOn, Route};

/// Largest accepted `websocket_idle_timeout_ms`: one day.
pub const MAX_WEBSOCKET_IDLE_TIMEOUT_MS: u32 = 86_400_000;
/// Most additional tries a route's `retry.attempts` may ask for.
pub const MAX_RETRY_ATTEMPTS: u32 = 5;

impl Validator {
    /// The forwarding fields of route `r` (`who` names it in messages).
    pub(super) fn forwarding(&mut self, who: &str, r: &Route) {
        if r.websocket {
            if r.aggregate.is_some() {
                self.push(format!(
                    "{who}: websocket is not supported on an aggregate route"
                ));
            }
            if r.coalesce {
                self.push(format!(
                    "{who}: websocket is not supported on a coalesce route"
                ));
            }
        } else if r.websocket_idle_timeout_ms != 0 {
            self.push(format!(
                "{who}: websocket_idle_timeout_ms is set but websocket is false"
            ));
        }
        if r.websocket_idle_timeout_ms > MAX_WEBSOCKET_IDLE_TIMEOUT_MS {
            self.push(format!(
                "{who}: websocket_idle_timeout_ms must be at most {MAX_WEBSOCKET_IDLE_TIMEOUT_MS} (got {})",
                r.websocket_idle_timeout_ms
            ));
        }
        if let Some(retry) = &r.retry {
            if r.aggregate.is_some() {
                self.push(format!(
                    "{who}: retry is not supported on an aggregate route (its parts are single calls)"
                ));
            }
            let route_timeout = match r.timeout_ms {
                // The bound of `retry.per_try_timeout_ms` on such a route.
                0 => crate::defaults::ROUTE_TIMEOUT_MS,
                ms => ms.min(MAX_TIMEOUT_MS),
            };
            self.retry(who, retry, route_timeout);
        }
    }

    fn retry(&mut self, who: &str, retry: &Retry, route_timeout_ms: u32) {
        self.range(who, "retry.attempts", retry.attempts, 1, MAX_RETRY_ATTEMPTS);
        if retry.on.is_empty() {
            self.push(format!(
                "{who}: retry.on must list at least one of CONNECT_FAILURE, STATUS_5XX, TIMEOUT"
            ));
        }
        let mut seen = BTreeSet::new();
        for &on in &retry.on {
            match RetryOn::try_from(on) {
                Ok(RetryOn::Unspecified) => self.push(format!(
                    "{who}: retry.on: RETRY_ON_UNSPECIFIED is not a retry condition"
                )),
                Ok(_) => {}
                Err(_) => self.push(format!("{who}: retry.on: unknown value {on}")),
            }
            if !seen.insert(on) {
                self.push(format!("{who}: retry.on: value {on} is listed twice"));
            }
        }
        if retry.per_try_timeout_ms > route_timeout_ms {
            self.push(format!(
                "{who}: retry.per_try_timeout_ms must be at most the route timeout, {route_timeout_ms} ms (got {})",
                retry.per_try_timeout_ms
            ));
        }
    }
}
