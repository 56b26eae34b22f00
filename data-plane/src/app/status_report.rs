//! The status report a data plane sends on its config stream every
//! [`REPORT_INTERVAL`] (`ConfigRequest.upstream_health`, docs/grpc-api.md):
//! each upstream instance of the snapshot it serves, as the balancer sees it
//! (health-check verdict, breaker state, requests in flight) and its error
//! rate since the previous report. It only reads the instances' state.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gateway_proto::v1::{InstanceHealth, UpstreamHealthReport};

use crate::config::Compiled;
use crate::upstream::{InstanceKey, InstanceState};

/// How often a report is sent (the first one right after the stream opens).
pub const REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// Attempts and errors of one instance at the previous report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    attempts: u64,
    errors: u64,
}

fn totals(instance: &InstanceState) -> Totals {
    Totals {
        attempts: instance.metrics.attempts.load(Ordering::Relaxed),
        errors: instance.metrics.errors().iter().map(|(_, n)| n).sum(),
    }
}

/// Builds successive reports; remembers each instance's counters so the next
/// report's error rate covers only the time since this one.
#[derive(Debug, Default)]
pub struct Reporter {
    previous: HashMap<InstanceKey, Totals>,
}

impl Reporter {
    /// The report for `config`, covering `window` since the previous one.
    pub fn report(&mut self, config: &Compiled, window: Duration) -> UpstreamHealthReport {
        let mut next = HashMap::with_capacity(self.previous.len());
        let mut instances = Vec::new();
        for upstream in &config.upstreams {
            for instance in &upstream.instances {
                let now = totals(instance);
                let before = self
                    .previous
                    .get(&instance.key)
                    .copied()
                    .unwrap_or_default();
                // A counter never goes back; an instance state made anew starts from zero.
                let attempts = now.attempts.saturating_sub(before.attempts);
                let errors = now.errors.saturating_sub(before.errors);
                next.insert(instance.key.clone(), now);
                instances.push(InstanceHealth {
                    upstream: upstream.name.to_string(),
                    instance: instance.id.to_string(),
                    url: instance.key.url.to_string(),
                    healthy: instance.is_healthy(),
                    breaker: instance.breaker.state().as_str().to_owned(),
                    in_flight: instance.in_flight(),
                    attempts,
                    errors,
                    error_rate: if attempts == 0 {
                        0.0
                    } else {
                        errors as f64 / attempts as f64
                    },
                });
            }
        }
        self.previous = next;
        UpstreamHealthReport {
            instances,
            window_seconds: u32::try_from(window.as_secs()).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::UpstreamEntry;
    use crate::upstream::breaker::BreakerSettings;
    use gateway_transport::pool::PoolSettings;
    use std::sync::Arc;

    fn instance(id: &str) -> Arc<InstanceState> {
        let key = InstanceKey {
            upstream: "orders".into(),
            id: id.into(),
            url: format!("http://{id}:80").into(),
            tls: None,
            protocol: gateway_transport::pool::Protocol::Http1,
        };
        Arc::new(InstanceState::new(
            key,
            &format!("{id}:80"),
            PoolSettings::default(),
            None,
        ))
    }

    #[test]
    fn reports_state_and_the_error_rate_since_the_previous_report() {
        let a = instance("a");
        let b = instance("b");
        let entry = UpstreamEntry::new(
            "orders",
            vec![a.clone(), b.clone()],
            BreakerSettings::default(),
            None,
        );
        let config = Compiled {
            upstreams: vec![Arc::new(entry)],
            ..Compiled::default()
        };
        a.metrics.attempts.store(10, Ordering::Relaxed);
        a.metrics.status_5xx();
        a.metrics.status_5xx();
        b.set_healthy(false);
        let _busy = b.start_request();
        let mut reporter = Reporter::default();
        let first = reporter.report(&config, REPORT_INTERVAL);
        assert_eq!(first.window_seconds, 5);
        let [ra, rb] = &first.instances[..] else {
            panic!("{first:?}")
        };
        assert_eq!(
            (ra.upstream.as_str(), ra.instance.as_str()),
            ("orders", "a")
        );
        assert_eq!((ra.attempts, ra.errors, ra.error_rate), (10, 2, 0.2));
        assert!(ra.healthy);
        assert_eq!(ra.breaker, "closed");
        assert_eq!(ra.url, "http://a:80");
        assert!(!rb.healthy);
        assert_eq!(rb.in_flight, 1);
        assert_eq!(rb.error_rate, 0.0);

        // Only what happened since the first report counts.
        a.metrics.attempts.store(14, Ordering::Relaxed);
        let second = reporter.report(&config, REPORT_INTERVAL);
        let ra = &second.instances[0];
        assert_eq!((ra.attempts, ra.errors, ra.error_rate), (4, 0, 0.0));
    }
}
