//! Injectable wall clock, so tests can pin the timestamps the control plane records.

use chrono::{DateTime, SecondsFormat, Utc};
use std::sync::Arc;

/// A source of the current wall-clock time.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// The real clock.
pub fn system_clock() -> Clock {
    Arc::new(Utc::now)
}

/// RFC 3339 with millisecond precision and a `Z` suffix, e.g. `2025-01-31T12:00:00.000Z`.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn formats_rfc3339_utc() {
        let t = Utc.with_ymd_and_hms(2025, 1, 31, 12, 0, 5).unwrap();
        assert_eq!(rfc3339(t), "2025-01-31T12:00:05.000Z");
    }
}
