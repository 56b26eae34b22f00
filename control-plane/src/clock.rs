//! The control plane's reading of the workspace's injectable wall clock
//! ([`gateway_clock`]), so tests can pin the timestamps it records.

use chrono::{DateTime, SecondsFormat, Utc};
use gateway_clock::Clock;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// The real clock.
pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(gateway_clock::SystemClock)
}

/// What `clock` reads, as a UTC date.
pub fn now_utc(clock: &dyn Clock) -> DateTime<Utc> {
    DateTime::from(UNIX_EPOCH + clock.now())
}

/// RFC 3339 with millisecond precision and a `Z` suffix, e.g. `2025-01-31T12:00:00.000Z`.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use gateway_clock::ManualClock;
    use std::time::Duration;

    #[test]
    fn formats_rfc3339_utc() {
        let t = Utc.with_ymd_and_hms(2025, 1, 31, 12, 0, 5).unwrap();
        assert_eq!(rfc3339(t), "2025-01-31T12:00:05.000Z");
    }

    #[test]
    fn reads_a_clock_as_utc_to_the_millisecond() {
        let clock = ManualClock::new(Duration::from_millis(1_738_324_805_123));
        assert_eq!(rfc3339(now_utc(&clock)), "2025-01-31T12:00:05.123Z");
    }
}
