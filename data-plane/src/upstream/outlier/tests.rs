//! The window and ejection arithmetic, with time given by hand (ms).

use std::sync::Arc;
use std::time::Duration;

use gateway_transport::pool::PoolSettings;

use super::*;
use crate::upstream::InstanceKey;
use crate::upstream::breaker::BreakerSettings;

fn settings() -> OutlierSettings {
    OutlierSettings::from_proto(&OutlierDetection {
        failure_rate_percent: 50,
        min_requests: 10,
        window_ms: 10_000,
        ejection_ms: 1_000,
        max_ejection_percent: 50,
    })
}

fn instance(id: &str) -> Arc<InstanceState> {
    let key = InstanceKey {
        upstream: "u".into(),
        id: id.into(),
        url: "http://127.0.0.1:1".into(),
        tls: None,
        protocol: gateway_transport::pool::Protocol::Http1,
    };
    Arc::new(InstanceState::new(
        key,
        "127.0.0.1:1",
        PoolSettings::default(),
        None,
    ))
}

fn upstream(n: usize, s: OutlierSettings) -> UpstreamEntry {
    let breaker = BreakerSettings {
        failure_threshold: 1000,
        reset_timeout: Duration::from_secs(60),
        half_open_max_requests: 1,
        count_5xx: true,
        max_open_percent: 100,
    };
    let instances = (0..n).map(|i| instance(&format!("i{i}"))).collect();
    UpstreamEntry::new("u", instances, breaker, None).with_outlier(Some(Outlier::new(s)))
}

/// Counts `n` attempts of instance `i` at `now`, every other one failed
/// (ending with a failure); true when any crossed the threshold.
fn half_failing(state: &OutlierState, s: &OutlierSettings, now: u64, n: u64) -> bool {
    let mut hit = false;
    for k in 0..n {
        hit |= state.count(s, now, k % 2 == 1);
    }
    hit
}

#[test]
fn the_rate_is_judged_only_after_min_requests() {
    let s = settings();
    let st = OutlierState::default();
    // Nine failures in a row: under min_requests (10), never judged.
    for _ in 0..9 {
        assert!(!st.count(&s, 5_000, true));
    }
    assert_eq!(st.window(&s, 5_000), (9, 9));
    // The tenth attempt is a failure: 10 of 10 failed.
    assert!(st.count(&s, 5_000, true));
}

#[test]
fn the_threshold_is_inclusive_and_successes_never_trigger() {
    let s = settings();
    let st = OutlierState::default();
    for _ in 0..5 {
        assert!(!st.count(&s, 0, false));
    }
    for k in 0..4 {
        assert!(!st.count(&s, 0, true), "failure {k}: 4 of 9 is under 50 %");
    }
    // 5 failures of 10: exactly 50 %.
    assert!(st.count(&s, 0, true));
    // A success never asks for an ejection, whatever the rate.
    assert!(!st.count(&s, 0, false));
}

#[test]
fn the_window_slides_by_buckets() {
    let s = settings();
    assert_eq!(s.bucket_ms, 1_000);
    let st = OutlierState::default();
    for _ in 0..8 {
        st.count(&s, 500, true);
    }
    assert_eq!(st.window(&s, 9_999), (8, 8), "still in the window");
    // Ten buckets later the first one has left the window.
    assert_eq!(st.window(&s, 10_000), (0, 0));
    st.count(&s, 10_500, false);
    assert_eq!(
        st.window(&s, 10_500),
        (1, 0),
        "its slot was reused, not added to"
    );
    // Failures spread over the window add up.
    let st = OutlierState::default();
    for t in 0..10 {
        st.count(&s, t * 1_000, true);
    }
    assert_eq!(st.window(&s, 9_000), (10, 10));
    assert_eq!(st.window(&s, 10_000), (9, 9));
}

#[test]
fn at_most_max_ejection_percent_rounded_down_at_least_one_never_all() {
    assert_eq!(max_ejected(1, 100), 0, "a lone instance is never ejected");
    assert_eq!(max_ejected(2, 10), 1);
    assert_eq!(max_ejected(2, 100), 1);
    assert_eq!(max_ejected(3, 50), 1, "1.5 rounds down");
    assert_eq!(
        max_ejected(3, 10),
        1,
        "0.3 rounds down to 0, but at least one"
    );
    assert_eq!(max_ejected(4, 50), 2);
    assert_eq!(max_ejected(10, 100), 9);
    assert_eq!(max_ejected(10, 35), 3);
}

#[test]
fn ejection_grows_with_repeats_is_capped_and_decays() {
    let s = settings();
    assert_eq!(s.ejection_for(1), 1_000);
    assert_eq!(s.ejection_for(3), 3_000);
    assert_eq!(s.ejection_for(1_000), MAX_EJECTION_MS, "capped at 300 s");
    let long = OutlierSettings {
        ejection_ms: 600_000,
        ..s
    };
    assert_eq!(
        long.ejection_for(5),
        600_000,
        "the cap is never below ejection_ms"
    );

    let st = OutlierState::default();
    assert_eq!(st.eject(&s, 0), 1_000);
    assert!(st.ejected_now(999));
    assert!(!st.ejected_now(1_000), "back at the end of the ejection");
    // Ejected again at once: twice as long.
    assert_eq!(st.eject(&s, 1_000), 2_000);
    assert!(st.ejected_now(2_999));
    assert!(!st.ejected_now(3_000));
    // Again 0.5 s after its return: three times.
    assert_eq!(st.eject(&s, 3_500), 3_000);
    // Back at 6.5 s, then 2 s in service (two ejection_ms): the streak drops from 3 to 1, this is the 2nd.
    assert_eq!(st.eject(&s, 8_500), 2_000);
    assert_eq!(st.ejections(), 4);
}

#[test]
fn ejection_clears_the_window() {
    let s = settings();
    let st = OutlierState::default();
    assert!(half_failing(&st, &s, 0, 10));
    st.eject(&s, 0);
    assert_eq!(st.window(&s, 0), (0, 0));
    assert_eq!(st.ejected_for(400), Some(600));
    assert_eq!(st.ejected_for(1_000), None);
}

#[test]
fn the_cap_keeps_the_others_in_service() {
    let s = settings();
    let u = upstream(3, s);
    let o = u.outlier.as_ref().unwrap();
    let (a, b) = (&u.instances[0], &u.instances[1]);
    assert!(half_failing(&a.outlier, &s, 0, 10));
    assert_eq!(try_eject(o, &u, a, 0), Some(1_000));
    assert_eq!(try_eject(o, &u, a, 10), None, "already out");
    assert!(half_failing(&b.outlier, &s, 10, 10));
    assert_eq!(try_eject(o, &u, b, 10), None, "1 of 3 at 50 % is the cap");
    assert!(!b.outlier.ejected_now(10));
    // Once the first is back, the second can go.
    assert_eq!(try_eject(o, &u, b, 1_000), Some(1_000));
    assert!(!a.outlier.ejected_now(1_000));
}

#[tokio::test(start_paused = true)]
async fn record_ejects_on_the_tokio_clock_and_the_instance_comes_back() {
    let s = settings();
    let u = upstream(2, s);
    let a = &u.instances[0];
    for k in 0..10 {
        record(&u, a, k % 2 == 1);
    }
    assert!(a.outlier.is_ejected());
    assert_eq!(a.outlier.ejections(), 1);
    assert!(!u.instances[1].outlier.is_ejected());
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(a.outlier.is_ejected());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!a.outlier.is_ejected(), "back after ejection_ms");
    // Failing again at once: ejected for twice as long.
    for k in 0..10 {
        record(&u, a, k % 2 == 1);
    }
    assert_eq!(a.outlier.ejected_for(now_ms()), Some(2_000));
}

#[test]
fn an_upstream_without_outlier_detection_counts_nothing() {
    let u = UpstreamEntry::new(
        "u",
        vec![instance("a")],
        BreakerSettings {
            failure_threshold: 5,
            reset_timeout: Duration::from_secs(1),
            half_open_max_requests: 1,
            count_5xx: true,
            max_open_percent: 100,
        },
        None,
    );
    for _ in 0..100 {
        record(&u, &u.instances[0], true);
    }
    assert_eq!(u.instances[0].outlier.window(&settings(), now_ms()), (0, 0));
    assert!(!u.instances[0].outlier.is_ejected());
}

/// Issue 41, item 6: one cap for instances out of rotation, whether by an
/// ejection or by an open breaker.
#[test]
fn open_breakers_and_ejections_share_one_cap() {
    let u = upstream(3, settings());
    let o = u.outlier.as_ref().unwrap();
    let (a, b) = (&u.instances[0], &u.instances[1]);
    // a's breaker opens (uncapped at 100 %): 1 of 3 is out.
    let _ = a.breaker.try_acquire(&u.breaker).unwrap().failure();
    let open = BreakerSettings {
        failure_threshold: 1,
        ..u.breaker
    };
    let _ = a.breaker.try_acquire(&open).unwrap().failure();
    assert!(!a.breaker.is_closed());
    assert_eq!(u.instances_out(), 1);
    // The outlier cap (50 % of 3 = 1) is reached: b is not ejected.
    assert_eq!(try_eject(o, &u, b, 0), None);
    // a itself may be ejected: it adds nothing to what is out.
    assert_eq!(try_eject(o, &u, a, 0), Some(1_000));
    assert_eq!(u.instances_out(), 1);
}

#[test]
fn breakers_may_take_out_max_open_percent_at_least_one_never_all() {
    use crate::upstream::max_out;
    assert_eq!(max_out(1, 50), 1, "one instance may always be out");
    assert_eq!(max_out(2, 50), 1);
    assert_eq!(max_out(2, 100), 1, "never all of two or more");
    assert_eq!(max_out(3, 50), 1);
    assert_eq!(max_out(4, 50), 2);
    assert_eq!(max_out(10, 1), 1, "at least one");
    assert_eq!(max_out(10, 100), 9);
    let mut u = upstream(2, settings());
    u.breaker.max_open_percent = 50;
    u.breaker.failure_threshold = 1;
    let (a, b) = (&u.instances[0], &u.instances[1]);
    let cap = || u.may_take_out_one();
    assert!(
        a.breaker
            .try_acquire(&u.breaker)
            .unwrap()
            .failure_capped(cap)
            .is_some()
    );
    assert!(!a.breaker.is_closed());
    // b reaches its threshold, but one of two is the cap: it stays closed.
    assert!(
        b.breaker
            .try_acquire(&u.breaker)
            .unwrap()
            .failure_capped(cap)
            .is_none()
    );
    assert!(b.breaker.is_closed());
    assert!(
        b.breaker
            .try_acquire(&u.breaker)
            .unwrap()
            .failure_capped(cap)
            .is_none()
    );
    assert!(b.breaker.is_closed());
}
