//! Validation of the traffic-management settings of issue 29 kept here:
//! a route's `mirror` and an upstream's `outlier_detection`.

use std::collections::HashSet;

use super::Validator;
use crate::v1::{OutlierDetection, Route};

/// Largest request body a mirror copies (bytes); larger bodies are not mirrored.
pub const MAX_MIRROR_BODY_BYTES: u64 = 65_536;
/// Most `mirror.deny_headers`.
pub const MAX_MIRROR_DENY_HEADERS: usize = 32;
/// Most attempts `outlier_detection.min_requests` may ask for.
pub const MAX_OUTLIER_MIN_REQUESTS: u32 = 100_000;
/// Shortest `outlier_detection.window_ms` (ten buckets of at least 100 ms).
pub const MIN_OUTLIER_WINDOW_MS: u32 = 1_000;
/// Longest `outlier_detection.window_ms` and `ejection_ms`: one hour.
pub const MAX_OUTLIER_MS: u32 = 3_600_000;
/// Shortest `outlier_detection.ejection_ms`.
pub const MIN_OUTLIER_EJECTION_MS: u32 = 100;

impl Validator {
    /// Route `r`'s `mirror` (that its upstream exists is checked against
    /// `upstreams`, the names of the whole configuration).
    pub(super) fn mirror(&mut self, r: &Route, upstreams: &HashSet<&str>) {
        let Some(m) = &r.mirror else {
            return;
        };
        let who = format!("route \"{}\": mirror", r.name);
        if r.aggregate.is_some() {
            self.push(format!(
                "{who}: not supported on an aggregate route (its parts are calls of their own)"
            ));
        }
        if r.websocket {
            self.push(format!(
                "{who}: not supported on a websocket route (a tunnel cannot be copied)"
            ));
        }
        if m.upstream.is_empty() {
            self.push(format!("{who}.upstream is required"));
        } else if !upstreams.contains(m.upstream.as_str()) {
            self.push(format!("{who}.upstream \"{}\" does not exist", m.upstream));
        } else if m.upstream == r.upstream {
            self.push(format!(
                "{who}.upstream must differ from the route's upstream \"{}\" (a copy would double its load and touch its breakers)",
                r.upstream
            ));
        }
        if !(1..=100).contains(&m.percent) {
            self.push(format!(
                "{who}.percent must be 1 to 100 (got {}; remove mirror to stop mirroring)",
                m.percent
            ));
        }
        self.header_names(
            &format!("{who}.deny_headers"),
            &m.deny_headers,
            MAX_MIRROR_DENY_HEADERS,
        );
    }

    /// An upstream's `outlier_detection` (`who` names the upstream).
    pub(super) fn outlier_detection(&mut self, who: &str, o: &OutlierDetection) {
        self.range(
            who,
            "outlier_detection.failure_rate_percent",
            o.failure_rate_percent,
            1,
            100,
        );
        self.range(
            who,
            "outlier_detection.min_requests",
            o.min_requests,
            1,
            MAX_OUTLIER_MIN_REQUESTS,
        );
        self.range(
            who,
            "outlier_detection.window_ms",
            o.window_ms,
            MIN_OUTLIER_WINDOW_MS,
            MAX_OUTLIER_MS,
        );
        self.range(
            who,
            "outlier_detection.ejection_ms",
            o.ejection_ms,
            MIN_OUTLIER_EJECTION_MS,
            MAX_OUTLIER_MS,
        );
        self.range(
            who,
            "outlier_detection.max_ejection_percent",
            o.max_ejection_percent,
            1,
            100,
        );
    }
}
