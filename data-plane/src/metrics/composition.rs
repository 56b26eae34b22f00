//! Counters of the composition stages: aggregation part outcomes and request
//! coalescing (`gateway_aggregate_parts_total`, `gateway_coalesced_requests_total`,
//! `gateway_coalesce_alone_total`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{esc, header};
use crate::config::{Compiled, Target};

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
    pub(super) const ALL: [Self; 2] = [Self::WaitersFull, Self::BodyTooLarge];

    fn as_str(self) -> &'static str {
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
    pub(super) const ALL: [Self; 7] = [
        Self::Ok,
        Self::Status,
        Self::Timeout,
        Self::Unreachable,
        Self::Unavailable,
        Self::InvalidJson,
        Self::TooLarge,
    ];

    fn as_str(self) -> &'static str {
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

/// Appends the counters of `coalesce` and aggregation routes.
pub(super) fn render_composition(out: &mut String, cfg: &Compiled) {
    let routes = cfg.router.routes();
    header(
        out,
        "gateway_coalesced_requests_total",
        "counter",
        "Requests of coalesce routes answered with an identical in-flight request's upstream response.",
    );
    for r in routes.iter().filter(|r| r.coalesce.is_some()) {
        let _ = writeln!(
            out,
            "gateway_coalesced_requests_total{{route=\"{}\"}} {}",
            esc(&r.name),
            r.metrics.coalesced.load(Ordering::Relaxed)
        );
    }
    header(
        out,
        "gateway_coalesce_alone_total",
        "counter",
        "Requests of coalesce routes that made their own upstream call although an identical one was in flight, by reason.",
    );
    for r in routes.iter().filter(|r| r.coalesce.is_some()) {
        for reason in CoalesceAlone::ALL {
            let _ = writeln!(
                out,
                "gateway_coalesce_alone_total{{route=\"{}\",reason=\"{}\"}} {}",
                esc(&r.name),
                reason.as_str(),
                r.metrics.coalesce_alone[reason as usize].load(Ordering::Relaxed)
            );
        }
    }
    header(
        out,
        "gateway_aggregate_parts_total",
        "counter",
        "Parts of aggregation requests by route, part and outcome (ok, status, timeout, unreachable, unavailable, invalid_json, too_large).",
    );
    for r in routes {
        let Target::Aggregate(agg) = &r.target else {
            continue;
        };
        for part in agg.parts() {
            for outcome in PartOutcome::ALL {
                let _ = writeln!(
                    out,
                    "gateway_aggregate_parts_total{{route=\"{}\",part=\"{}\",outcome=\"{}\"}} {}",
                    esc(&r.name),
                    esc(part.name()),
                    outcome.as_str(),
                    part.metrics().count(outcome)
                );
            }
        }
    }
}
