//! Counters of traffic mirroring (`gateway_mirror_requests_total`, by route
//! and outcome; `gateway_mirror_in_flight`, per replica).

use std::sync::atomic::{AtomicU64, Ordering};

/// How one sampled copy of a mirrored route ended (label `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorOutcome {
    /// Sent, and the mirror answered with a status below 500.
    Sent,
    /// Dropped: --mirror-max-in-flight copies were already in flight.
    Shed,
    /// Sent or tried, without an answer below 500 (connect error, timeout,
    /// 5xx, no available instance, or a body that never ended).
    Failed,
    /// Not sent: the request body is larger than the mirror's 65536-byte cap.
    BodyTooLarge,
}

impl MirrorOutcome {
    /// Every outcome, in label order.
    pub const ALL: [Self; 4] = [Self::Sent, Self::Shed, Self::Failed, Self::BodyTooLarge];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Shed => "shed",
            Self::Failed => "failed",
            Self::BodyTooLarge => "body_too_large",
        }
    }
}

/// Mirror outcomes of one route, carried over while the route keeps its name.
#[derive(Debug, Default)]
pub struct MirrorMetrics {
    outcomes: [AtomicU64; 4],
}

impl MirrorMetrics {
    /// Counts one outcome.
    pub fn record(&self, outcome: MirrorOutcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Outcomes counted of one kind.
    pub fn count(&self, outcome: MirrorOutcome) -> u64 {
        self.outcomes[outcome as usize].load(Ordering::Relaxed)
    }
}
