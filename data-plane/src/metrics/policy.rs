//! Counters of the route policy stages: requests refused by a policy
//! (`gateway_policy_refusals_total{route,reason}`), one `reason` per policy
//! (and per refusal class of the API-key stage: `api_key_missing`, `api_key_invalid`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Which policy refused a request (label `reason` of `gateway_policy_refusals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyRefusal {
    /// The client address is refused by `ip_allow` / `ip_deny` (403).
    Ip,
    /// A CORS preflight from an origin, or for a method or header, not allowed (403).
    Cors,
    /// A WebSocket upgrade on a route without `websocket`, or a malformed handshake (400).
    Upgrade,
    /// An `AUTH_API_KEY` request without `X-API-Key` (401).
    ApiKeyMissing,
    /// An `AUTH_API_KEY` request whose key is unknown or revoked (401).
    ApiKeyInvalid,
}

impl PolicyRefusal {
    /// Every reason, in label order.
    pub const ALL: [Self; 5] = [
        Self::Ip,
        Self::Cors,
        Self::Upgrade,
        Self::ApiKeyMissing,
        Self::ApiKeyInvalid,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ip => "ip",
            Self::Cors => "cors",
            Self::Upgrade => "upgrade",
            Self::ApiKeyMissing => "api_key_missing",
            Self::ApiKeyInvalid => "api_key_invalid",
        }
    }
}

/// Refusal counters of one route, one slot per [`PolicyRefusal`].
#[derive(Debug, Default)]
pub struct PolicyMetrics {
    refusals: [AtomicU64; PolicyRefusal::ALL.len()],
}

impl PolicyMetrics {
    /// Counts one refused request.
    pub fn refused(&self, reason: PolicyRefusal) {
        self.refusals[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals counted for one reason.
    pub fn count(&self, reason: PolicyRefusal) -> u64 {
        self.refusals[reason as usize].load(Ordering::Relaxed)
    }
}
