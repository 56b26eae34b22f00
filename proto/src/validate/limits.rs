//! Validation of a route's rate limits: `rate_limit` and the stacked
//! `rate_limits` (that routes sharing a policy agree is checked with the
//! whole configuration, in `validate_config`).

use std::collections::HashSet;

use super::{
    HOP_BY_HOP, MAX_HEADER_NAME_LEN, MAX_WINDOW_SECONDS, Validator, is_valid_header_name,
    is_valid_name,
};
use crate::v1::{AuthMode, RateLimit, RateLimitAlgorithm, RateLimitKey, Route};

/// Most rate limits one route may stack (`rate_limit` and `rate_limits` together).
pub const MAX_RATE_LIMITS: usize = 8;

/// The largest budget a rate limit may count, `limit × window_seconds` in
/// milliseconds of tokens: 2^53, the integers a Lua number (a double) holds
/// exactly. The data plane's limiter refuses larger policies with the same bound.
pub const MAX_BUDGET_MILLIS: u64 = 1 << 53;

/// Every rate limit of `r` with the field that holds it: `rate_limit` first,
/// then `rate_limits[i]`. The order the data plane checks them in.
pub fn route_limits(r: &Route) -> impl Iterator<Item = (String, &RateLimit)> {
    r.rate_limit
        .iter()
        .map(|rl| ("rate_limit".to_owned(), rl))
        .chain(
            r.rate_limits
                .iter()
                .enumerate()
                .map(|(i, rl)| (format!("rate_limits[{i}]"), rl)),
        )
}

impl Validator {
    /// Every rate limit of route `r` (`who` names it in messages).
    pub(super) fn rate_limits(&mut self, who: &str, r: &Route, auth: Option<AuthMode>) {
        let count = usize::from(r.rate_limit.is_some()) + r.rate_limits.len();
        if count > MAX_RATE_LIMITS {
            self.push(format!(
                "{who}: rate_limits: at most {MAX_RATE_LIMITS} rate limits per route, rate_limit included (got {count})"
            ));
        }
        let mut names = HashSet::new();
        for (field, rl) in route_limits(r) {
            self.rate_limit(who, &field, rl, auth);
            if is_valid_name(&rl.policy) && !names.insert(rl.policy.as_str()) {
                self.push(format!(
                    "{who}: {field}.policy \"{}\" is used twice on this route (each stacked limit needs its own policy)",
                    rl.policy
                ));
            }
        }
    }

    fn rate_limit(&mut self, who: &str, field: &str, rl: &RateLimit, auth: Option<AuthMode>) {
        if !is_valid_name(&rl.policy) {
            self.push(format!(
                "{who}: {field}.policy must match [a-z0-9][a-z0-9-]*"
            ));
        }
        if RateLimitAlgorithm::try_from(rl.algorithm).is_err() {
            self.push(format!(
                "{who}: {field}.algorithm: unknown value {}",
                rl.algorithm
            ));
        }
        let key = RateLimitKey::try_from(rl.key);
        match key {
            Err(_) => self.push(format!("{who}: {field}.key: unknown value {}", rl.key)),
            // An API key and a client certificate set a subject too, so per-user budgets work with each.
            Ok(RateLimitKey::KeyUser)
                if !matches!(
                    auth,
                    Some(AuthMode::AuthJwt | AuthMode::AuthApiKey | AuthMode::AuthMtls)
                ) =>
            {
                self.push(format!(
                    "{who}: {field}.key KEY_USER needs auth AUTH_JWT, AUTH_API_KEY or AUTH_MTLS (there is no user otherwise)"
                ))
            }
            Ok(RateLimitKey::KeyApiKey) if auth != Some(AuthMode::AuthApiKey) => {
                self.push(format!(
                    "{who}: {field}.key KEY_API_KEY needs auth AUTH_API_KEY (there is no API key otherwise)"
                ))
            }
            Ok(_) => {}
        }
        let header = rl.key_header.as_str();
        match key {
            Ok(RateLimitKey::KeyHeader) if header.is_empty() => self.push(format!(
                "{who}: {field}.key_header is required with key KEY_HEADER"
            )),
            Ok(RateLimitKey::KeyHeader) if !is_valid_header_name(header) => self.push(format!(
                "{who}: {field}.key_header \"{header}\" is not a valid header name (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_HEADER_NAME_LEN})"
            )),
            Ok(RateLimitKey::KeyHeader)
                if HOP_BY_HOP.contains(&header.to_ascii_lowercase().as_str()) =>
            {
                self.push(format!(
                    "{who}: {field}.key_header \"{header}\" is a hop-by-hop header, removed before rate limiting"
                ))
            }
            Ok(RateLimitKey::KeyHeader) => {}
            _ if !header.is_empty() => self.push(format!(
                "{who}: {field}.key_header is only used with key KEY_HEADER"
            )),
            _ => {}
        }
        if rl.limit == 0 {
            self.push(format!("{who}: {field}.limit must be greater than 0"));
        }
        if rl.window_seconds == 0 || rl.window_seconds > MAX_WINDOW_SECONDS {
            self.push(format!(
                "{who}: {field}.window_seconds must be 1 to {MAX_WINDOW_SECONDS}"
            ));
        } else if u128::from(rl.limit) * u128::from(rl.window_seconds) * 1000
            > u128::from(MAX_BUDGET_MILLIS)
        {
            self.push(format!(
                "{who}: {field}: limit {} per {} s is too large to count exactly (limit × window_seconds × 1000 must not exceed 2^53)",
                rl.limit, rl.window_seconds
            ));
        }
    }
}
