//! A route's traffic split (`Route.split`, docs/data-plane.md "Traffic
//! splits and canaries"): which upstream a request goes to, before the
//! balancer picks one of its instances.
//!
//! Without stickiness each replica walks the split's [`WeightLine`] one step
//! per request, so every run of `total` requests splits exactly by weight.
//! With `split_hash_on` the request's key is hashed onto the line, so a
//! caller stays on one side while the weights do (a request without the key
//! takes the next step of the walk). When the chosen side has no available
//! instance the request goes to the first other side (in the order listed)
//! that has one, unless the route says `split_fail_closed`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::upstream::UpstreamEntry;
use crate::upstream::balancer::{self, Affinity, HashOn};
use crate::upstream::weights::WeightLine;

/// A compiled split.
#[derive(Debug)]
pub struct Split {
    /// The upstreams, in the order of `split`.
    sides: Box<[Arc<UpstreamEntry>]>,
    line: WeightLine,
    /// Steps of the walk taken on this replica.
    steps: AtomicU64,
    /// What a sticky split hashes (`None`: not sticky).
    sticky: Option<HashOn>,
    /// Fail rather than move to another side.
    fail_closed: bool,
}

/// The side chosen for a request.
#[derive(Debug, Clone, Copy)]
pub struct Choice<'s> {
    /// The upstream the request goes to.
    pub upstream: &'s Arc<UpstreamEntry>,
    /// True when it is not the side the weights chose (that one had no
    /// available instance).
    pub failed_over: bool,
}

impl Split {
    /// A split over `sides` with their weights (validated: at least one
    /// weight above 0). `None` when every weight is 0.
    pub fn new(
        sides: Vec<(Arc<UpstreamEntry>, u32)>,
        sticky: Option<HashOn>,
        fail_closed: bool,
    ) -> Option<Self> {
        let line = WeightLine::new(sides.iter().map(|(_, w)| *w))?;
        Some(Self {
            sides: sides.into_iter().map(|(u, _)| u).collect(),
            line,
            steps: AtomicU64::new(0),
            sticky,
            fail_closed,
        })
    }

    /// What a sticky split hashes, to compute the request's key.
    pub fn sticky(&self) -> Option<&HashOn> {
        self.sticky.as_ref()
    }

    /// The upstreams, in the order of `split`.
    pub fn sides(&self) -> &[Arc<UpstreamEntry>] {
        &self.sides
    }

    /// The side for a request whose key (on a sticky split) is `key`.
    pub fn choose(&self, key: Affinity) -> Choice<'_> {
        let index = match key.value() {
            Some(hash) if self.sticky.is_some() => self.line.sticky(hash),
            _ => self.line.step(self.steps.fetch_add(1, Ordering::Relaxed)),
        };
        let chosen = &self.sides[index];
        if self.fail_closed || balancer::any_available(chosen) {
            return Choice {
                upstream: chosen,
                failed_over: false,
            };
        }
        match self
            .sides
            .iter()
            .enumerate()
            .find(|&(i, u)| i != index && balancer::any_available(u))
        {
            Some((_, other)) => Choice {
                upstream: other,
                failed_over: true,
            },
            // Nothing anywhere: the chosen side answers 503 as a single upstream would.
            None => Choice {
                upstream: chosen,
                failed_over: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::breaker::BreakerSettings;
    use crate::upstream::{InstanceKey, InstanceState};
    use gateway_transport::pool::PoolSettings;
    use std::time::Duration;

    fn upstream(name: &str) -> Arc<UpstreamEntry> {
        let key = InstanceKey {
            upstream: name.into(),
            id: "i".into(),
            url: "http://127.0.0.1:1".into(),
            tls: None,
            protocol: gateway_transport::pool::Protocol::Http1,
        };
        let inst = Arc::new(InstanceState::new(
            key,
            "127.0.0.1:1",
            PoolSettings::default(),
            None,
        ));
        let breaker = BreakerSettings {
            failure_threshold: 1,
            reset_timeout: Duration::from_secs(60),
            half_open_max_requests: 1,
            count_5xx: true,
            max_open_percent: 100,
        };
        Arc::new(UpstreamEntry::new(name, vec![inst], breaker, None))
    }

    fn names(split: &Split, n: usize, key: impl Fn(usize) -> Affinity) -> (usize, usize) {
        let mut stable = 0;
        for i in 0..n {
            if &*split.choose(key(i)).upstream.name == "stable" {
                stable += 1;
            }
        }
        (stable, n - stable)
    }

    #[test]
    fn splits_exactly_by_weight() {
        let s = Split::new(
            vec![(upstream("stable"), 95), (upstream("canary"), 5)],
            None,
            false,
        )
        .unwrap();
        assert_eq!(names(&s, 10_000, |_| Affinity::NONE), (9_500, 500));
        assert!(Split::new(vec![(upstream("a"), 0), (upstream("b"), 0)], None, false).is_none());
    }

    #[test]
    fn sticky_keys_stay_and_keyless_requests_walk() {
        let s = Split::new(
            vec![(upstream("stable"), 50), (upstream("canary"), 50)],
            Some(HashOn::User),
            false,
        )
        .unwrap();
        for user in 0..100 {
            let key = Affinity::of(format!("user-{user}").as_bytes());
            let first = s.choose(key).upstream.name.clone();
            assert!((0..10).all(|_| s.choose(key).upstream.name == first));
        }
        assert_eq!(names(&s, 1000, |_| Affinity::NONE), (500, 500));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_side_hands_its_share_on_unless_fail_closed() {
        let stable = upstream("stable");
        let canary = upstream("canary");
        canary.instances[0].set_healthy(false);
        let open = Split::new(
            vec![(stable.clone(), 50), (canary.clone(), 50)],
            None,
            false,
        )
        .unwrap();
        let choices: Vec<Choice<'_>> = (0..100).map(|_| open.choose(Affinity::NONE)).collect();
        assert!(choices.iter().all(|c| &*c.upstream.name == "stable"));
        assert_eq!(choices.iter().filter(|c| c.failed_over).count(), 50);
        let closed = Split::new(vec![(stable, 50), (canary, 50)], None, true).unwrap();
        assert_eq!(names(&closed, 100, |_| Affinity::NONE), (50, 50));
    }
}
