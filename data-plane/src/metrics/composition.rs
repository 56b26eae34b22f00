//! Counters of the composition stages: aggregation part outcomes and request
//! coalescing (`gateway_aggregate_parts_total`, `gateway_coalesced_requests_total`,
//! `gateway_coalesce_alone_total`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a request of a `coalesce` route made its own upstream call although an
/// identical one was in flight (label `reason` of `gateway_coalesce_alone_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoalesceAlone {
    /// The in-flight call already had the maximum number of waiters.
    WaitersFull,
    /// The shared response's body was over the size limit for sharing.
    BodyTooLarge,
}

impl CoalesceAlone {
    /// Every reason, in label order.
    pub const ALL: [Self; 2] = [Self::WaitersFull, Self::BodyTooLarge];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WaitersFull => "waiters_full",
            Self::BodyTooLarge => "body_too_large",
        }
    }
}

/// How one part of an aggregation request ended (label `outcome` of
/// `gateway_aggregate_parts_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartOutcome {
    /// 2xx with a JSON body.
    Ok,
    /// A non-2xx answer.
    Status,
    /// No complete answer within the part's timeout.
    Timeout,
    /// Connect error or broken exchange.
    Unreachable,
    /// No healthy instance whose breaker admits (failed without a network call).
    Unavailable,
    /// A body that is not JSON.
    InvalidJson,
    /// A body over the part size limit.
    TooLarge,
}

impl PartOutcome {
    /// Every outcome, in label order.
    pub const ALL: [Self; 7] = [
        Self::Ok,
        Self::Status,
        Self::Timeout,
        Self::Unreachable,
        Self::Unavailable,
        Self::InvalidJson,
        Self::TooLarge,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Status => "status",
            Self::Timeout => "timeout",
            Self::Unreachable => "unreachable",
            Self::Unavailable => "unavailable",
            Self::InvalidJson => "invalid_json",
            Self::TooLarge => "too_large",
        }
    }
}

/// Outcome counters of one part of an aggregation route, carried over while
/// the route and the part keep their names.
#[derive(Debug, Default)]
pub struct PartMetrics {
    outcomes: [AtomicU64; 7],
}

impl PartMetrics {
    /// Counts one outcome.
    pub fn record(&self, outcome: PartOutcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Outcomes counted of one kind.
    pub fn count(&self, outcome: PartOutcome) -> u64 {
        self.outcomes[outcome as usize].load(Ordering::Relaxed)
    }
}
