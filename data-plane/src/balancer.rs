//! Round-robin instance selection (DESIGN §4, "Balance").
//!
//! The cursor advances once per request; from there the first instance that is
//! healthy *and* whose breaker admits the request is chosen. The breaker is
//! asked last, only for a healthy candidate, so a half-open probe slot is taken
//! only by the instance that really gets the request.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::breaker::Permit;
use crate::config::{InstanceState, UpstreamEntry};

/// The chosen instance and its breaker admission.
#[derive(Debug)]
pub struct Pick<'a> {
    /// Position in the upstream's instance list.
    pub index: usize,
    /// The instance.
    pub instance: &'a Arc<InstanceState>,
    /// Breaker admission; report the outcome through it.
    pub permit: Permit<'a>,
}

/// Picks the next available instance of `upstream`, skipping `exclude` (the
/// instance a retry moves away from). `None`: every instance is unhealthy,
/// breaker-open or excluded.
pub fn pick(upstream: &UpstreamEntry, exclude: Option<usize>) -> Option<Pick<'_>> {
    let n = upstream.instances.len();
    if n == 0 {
        return None;
    }
    let start = upstream.cursor.fetch_add(1, Ordering::Relaxed);
    (0..n).find_map(|k| {
        let index = (start + k) % n;
        if Some(index) == exclude {
            return None;
        }
        let instance = &upstream.instances[index];
        if !instance.is_healthy() {
            return None;
        }
        let permit = instance.breaker.try_acquire(&upstream.breaker)?;
        Some(Pick {
            index,
            instance,
            permit,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::BreakerSettings;
    use crate::config::InstanceKey;
    use crate::pool::PoolSettings;
    use std::time::Duration;

    fn upstream(n: usize) -> UpstreamEntry {
        let instances = (0..n)
            .map(|i| {
                let key = InstanceKey {
                    upstream: "u".into(),
                    id: format!("i{i}").into(),
                    url: format!("http://127.0.0.1:{}", 1000 + i).into(),
                };
                Arc::new(InstanceState::new(
                    key,
                    "127.0.0.1:1",
                    PoolSettings::default(),
                ))
            })
            .collect();
        let breaker = BreakerSettings {
            failure_threshold: 1,
            reset_timeout: Duration::from_secs(60),
            half_open_max_requests: 1,
        };
        UpstreamEntry::new("u", instances, breaker, None)
    }

    fn ids(u: &UpstreamEntry, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| pick(u, None).map_or("-".into(), |p| p.instance.id.to_string()))
            .collect()
    }

    #[test]
    fn round_robin_over_all_when_all_are_available() {
        let u = upstream(3);
        assert_eq!(ids(&u, 6), ["i0", "i1", "i2", "i0", "i1", "i2"]);
    }

    #[test]
    fn skips_unhealthy_instances() {
        let u = upstream(3);
        u.instances[1].set_healthy(false);
        let got = ids(&u, 6);
        assert!(!got.contains(&"i1".to_string()), "{got:?}");
        assert!(got.contains(&"i0".to_string()) && got.contains(&"i2".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn skips_breaker_open_instances() {
        let u = upstream(2);
        // failure_threshold 1: one failure opens i0's breaker.
        let first = pick(&u, None).unwrap();
        assert_eq!(&*first.instance.id, "i0");
        let _ = first.permit.failure();
        assert_eq!(ids(&u, 4), ["i1", "i1", "i1", "i1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn none_when_nothing_is_available() {
        let u = upstream(2);
        u.instances[0].set_healthy(false);
        let p = pick(&u, None).unwrap();
        let _ = p.permit.failure();
        assert!(pick(&u, None).is_none());
    }

    #[test]
    fn exclude_moves_a_retry_elsewhere() {
        let u = upstream(2);
        for _ in 0..4 {
            assert_eq!(&*pick(&u, Some(0)).unwrap().instance.id, "i1");
        }
        let single = upstream(1);
        assert!(pick(&single, Some(0)).is_none());
    }
}
