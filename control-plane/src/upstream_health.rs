//! The upstream health the data planes report on their config streams
//! (`ConfigRequest.upstream_health`, every few seconds): the last report of
//! each node, kept in memory for the web console's "Upstream health" page.
//! Like the data-plane registry it starts empty after a restart.

use chrono::{DateTime, Utc};
use gateway_clock::Clock;
use gateway_proto::v1::UpstreamHealthReport;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::now_utc;

/// One node's last report.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeReport {
    /// The data plane's node id.
    pub node_id: String,
    /// When it arrived.
    pub received: DateTime<Utc>,
    /// What it said.
    pub report: UpstreamHealthReport,
}

/// The last report of every node that sent one.
pub struct HealthReports {
    reports: Mutex<BTreeMap<String, NodeReport>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for HealthReports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthReports")
            .field("nodes", &self.reports.lock().len())
            .finish_non_exhaustive()
    }
}

impl HealthReports {
    /// No report yet; arrival times from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        HealthReports {
            reports: Mutex::new(BTreeMap::new()),
            clock,
        }
    }

    /// `node_id` reported `report`: it replaces the node's previous one.
    pub fn record(&self, node_id: &str, report: UpstreamHealthReport) {
        let received = now_utc(&*self.clock);
        self.reports.lock().insert(
            node_id.to_owned(),
            NodeReport {
                node_id: node_id.to_owned(),
                received,
                report,
            },
        );
    }

    /// Every node's last report, by node id.
    pub fn list(&self) -> Vec<NodeReport> {
        self.reports.lock().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_proto::v1::InstanceHealth;
    use std::time::Duration;

    #[test]
    fn keeps_the_last_report_of_each_node() {
        let clock = Arc::new(gateway_clock::ManualClock::new(Duration::from_secs(
            1_700_000_000,
        )));
        let reports = HealthReports::new(clock.clone());
        let report = |instance: &str| UpstreamHealthReport {
            instances: vec![InstanceHealth {
                upstream: "orders".into(),
                instance: instance.into(),
                ..Default::default()
            }],
            window_seconds: 5,
        };
        reports.record("dp-b", report("1"));
        reports.record("dp-a", report("1"));
        clock.advance(Duration::from_secs(5));
        reports.record("dp-b", report("2"));
        let list = reports.list();
        let ids: Vec<_> = list.iter().map(|r| r.node_id.as_str()).collect();
        assert_eq!(ids, ["dp-a", "dp-b"]);
        assert_eq!(list[1].report.instances[0].instance, "2");
        assert_eq!(list[1].received.timestamp(), 1_700_000_005);
    }
}
