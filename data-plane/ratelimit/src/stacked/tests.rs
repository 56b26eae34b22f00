//! The stacked model and the sliding window's arithmetic.

use super::*;
use crate::algorithm::{fixed_window, token_bucket};

fn shape(algorithm: Algorithm, limit: u32, window_ms: u64) -> Shape {
    Shape {
        algorithm,
        limit,
        window_ms,
    }
}

/// One request under one limit: (allowed, figures).
fn one(s: Shape, state: &mut Option<State>, now: u64) -> (bool, LimitOutcome) {
    let mut states = [*state];
    let mut out = [LimitOutcome::default()];
    let admitted = decide(&[s], &mut states, now, 1, &mut out);
    *state = states[0];
    (admitted == 1, out[0])
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

#[test]
fn sliding_window_weights_the_previous_window() {
    let s = shape(Algorithm::SlidingWindow, 4, 1_000);
    let mut st = None;
    for i in 0..4u64 {
        let (ok, o) = one(s, &mut st, 1_000);
        assert!(ok);
        assert_eq!(o.remaining, 3 - i);
        // Counted in window 1: the whole budget is back when window 2 ends.
        assert_eq!(o.reset_after_ms, 2_000);
    }
    let (ok, o) = one(s, &mut st, 1_000);
    assert!(!ok);
    // In window 2 the 4 count as 4 × (1000 − e) / 1000: one fits from e = 250.
    assert_eq!(o.retry_after_ms, 1_250);
    assert!(
        !one(s, &mut st, 2_000).0,
        "a window edge does not reset the count"
    );
    assert!(!one(s, &mut st, 2_249).0);
    let (ok, o) = one(s, &mut st, 2_250);
    assert!(ok);
    assert_eq!(o.remaining, 0);
    // Next: 4 × (1000 − e) + 2 × 1000 ≤ 4000 from e = 500.
    assert_eq!(o.retry_after_ms, 250);
    assert!(!one(s, &mut st, 2_499).0);
    assert!(one(s, &mut st, 2_500).0);
    // Half-way through window 2: estimate 4 × 0.5 + 2 = 4.
    assert_eq!(one(s, &mut st, 2_500).1.retry_after_ms, 250);
    // Window 4: window 3 saw nothing, window 2's requests no longer count.
    let (ok, o) = one(s, &mut st, 4_000);
    assert!(ok);
    assert_eq!(o.remaining, 3);
    assert_eq!(
        st,
        Some(State::SlidingWindow(SlidingWindowState {
            window: 4,
            count: 1,
            prev: 0
        }))
    );
}

#[test]
fn sliding_window_edges_and_limit_one() {
    let s = shape(Algorithm::SlidingWindow, 1, 1_000);
    let mut st = None;
    assert!(one(s, &mut st, 999).0, "last millisecond of window 0");
    let (ok, o) = one(s, &mut st, 999);
    assert!(!ok);
    // In window 1 the one request weighs (1000 − e) / 1000 > 0 until its end:
    // the next fits when window 2 starts.
    assert_eq!(o.retry_after_ms, 1_001);
    assert!(!one(s, &mut st, 1_000).0);
    assert!(!one(s, &mut st, 1_999).0);
    assert!(one(s, &mut st, 2_000).0);
    // The clock going back keeps the newer window and lengthens the waits.
    let (ok, o) = one(s, &mut st, 1_500);
    assert!(!ok);
    assert_eq!(o.retry_after_ms, 500 + 2_000);
    assert!(sliding_window_is_idle(
        1_000,
        SlidingWindowState {
            window: 2,
            count: 1,
            prev: 0
        },
        4_000
    ));
    assert!(!sliding_window_is_idle(
        1_000,
        SlidingWindowState {
            window: 2,
            count: 1,
            prev: 0
        },
        3_999
    ));
}

/// Every window of length `w` holds at most `limit + ⌊P × (a − 1) / w⌋`
/// admitted requests (`a`: its offset into the counting window it starts in,
/// `P`: that window's count), so never more than `2 × limit − 1`; and the
/// burst-at-the-edge schedule reaches that.
#[test]
fn sliding_window_stays_within_its_documented_bound() {
    let (limit, w) = (5u32, 20u64);
    let s = shape(Algorithm::SlidingWindow, limit, w);
    let check = |admitted: &[u64], counts: &dyn Fn(u64) -> u64| -> u64 {
        let end = admitted.last().copied().unwrap_or(0) + w;
        let mut worst = 0;
        for t in 0..end {
            let n = admitted.iter().filter(|&&x| x >= t && x < t + w).count() as u64;
            let a = t % w;
            let bound = if a == 0 {
                u64::from(limit)
            } else {
                u64::from(limit) + counts(t / w) * (a - 1) / w
            };
            assert!(
                n <= bound,
                "{n} admitted in [{t}, {}), bound {bound}",
                t + w
            );
            assert!(n < 2 * u64::from(limit));
            worst = worst.max(n);
        }
        worst
    };
    // The worst case: the whole budget in the last millisecond of window 0,
    // then a request every millisecond.
    let mut st = None;
    let mut admitted = Vec::new();
    for _ in 0..limit {
        assert!(one(s, &mut st, w - 1).0);
        admitted.push(w - 1);
    }
    for now in w..5 * w {
        if one(s, &mut st, now).0 {
            admitted.push(now);
        }
    }
    let per_window = |k: u64| admitted.iter().filter(|&&x| x / w == k).count() as u64;
    assert_eq!(check(&admitted, &per_window), 2 * u64::from(limit) - 1);
    // Random schedules, several requests per millisecond at times.
    let mut rng = Lcg(7);
    for _ in 0..50 {
        let mut st = None;
        let mut admitted = Vec::new();
        let mut now = rng.next(w);
        while now < 20 * w {
            for _ in 0..=rng.next(3) {
                if one(s, &mut st, now).0 {
                    admitted.push(now);
                }
            }
            now += rng.next(6);
        }
        let per_window = |k: u64| admitted.iter().filter(|&&x| x / w == k).count() as u64;
        check(&admitted, &per_window);
    }
}

#[test]
fn a_refusal_by_one_limit_burns_no_other_budget() {
    let shapes = [
        shape(Algorithm::TokenBucket, 10, 60_000),
        shape(Algorithm::FixedWindow, 2, 60_000),
        shape(Algorithm::SlidingWindow, 5, 60_000),
    ];
    let mut states = [None; 3];
    let mut out = [LimitOutcome::default(); 3];
    for expected in [1, 1, 0, 0, 0] {
        assert_eq!(decide(&shapes, &mut states, 1_000, 1, &mut out), expected);
    }
    // Two admitted: the bucket and the sliding window spent exactly two each.
    assert_eq!(out[0].remaining, 8);
    assert_eq!(out[2].remaining, 3);
    assert_eq!(out[1].remaining, 0);
    assert_eq!(out[1].retry_after_ms, 59_000);
    assert_eq!((out[0].retry_after_ms, out[2].retry_after_ms), (0, 0));
    assert_eq!(shaping(&out), (1, 1));
    // A batch of 4 on fresh budgets: the fixed window admits 2, so all spend 2.
    let mut fresh = [None; 3];
    assert_eq!(decide(&shapes, &mut fresh, 1_000, 4, &mut out), 2);
    assert_eq!(fresh, states);
}

#[test]
fn shaping_picks_the_most_restrictive_limit() {
    let o = |remaining, reset_after_ms, retry_after_ms| LimitOutcome {
        remaining,
        reset_after_ms,
        retry_after_ms,
    };
    assert_eq!(shaping(&[o(5, 10, 0), o(2, 10, 0), o(2, 30, 0)]), (2, 2));
    assert_eq!(shaping(&[o(3, 10, 0)]), (0, 0));
    // Refused: of the limits left with nothing, the longest retry.
    assert_eq!(
        shaping(&[o(0, 10, 4), o(7, 10, 0), o(0, 90, 9), o(0, 5, 9)]),
        (2, 2)
    );
}

/// A batch of n equals n single requests at that instant, in every limit,
/// over long random timelines of mixed algorithms (clock steps back included).
#[test]
fn a_batch_equals_that_many_single_requests() {
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ];
    let mut rng = Lcg(42);
    for round in 0..60 {
        let n = 1 + (round % 3);
        let shapes: Vec<Shape> = (0..n)
            .map(|_| {
                shape(
                    algorithms[rng.next(3) as usize],
                    1 + rng.next(6) as u32,
                    1_000 * (1 + rng.next(3)),
                )
            })
            .collect();
        let mut batched = vec![None; n];
        let mut single = vec![None; n];
        let mut now: u64 = 10_000 + rng.next(5_000);
        for _ in 0..200 {
            now = match rng.next(20) {
                0 => now.saturating_sub(rng.next(800)),
                1..=8 => now,
                _ => now + rng.next(700),
            };
            let requests = 1 + rng.next(5);
            let mut out_b = vec![LimitOutcome::default(); n];
            let admitted = decide(&shapes, &mut batched, now, requests, &mut out_b);
            let mut out_s = vec![LimitOutcome::default(); n];
            let mut singles = 0;
            for _ in 0..requests {
                singles += decide(&shapes, &mut single, now, 1, &mut out_s);
            }
            assert_eq!(admitted, singles, "{shapes:?} at {now}");
            assert_eq!(batched, single, "{shapes:?} at {now}");
            assert_eq!(out_b, out_s, "{shapes:?} at {now}");
        }
    }
}

/// With one limit, the model is `algorithm.rs`'s single decision.
#[test]
fn one_limit_agrees_with_the_single_algorithms() {
    let mut rng = Lcg(3);
    for (algorithm, limit, w) in [
        (Algorithm::TokenBucket, 7, 10_000),
        (Algorithm::FixedWindow, 3, 2_000),
    ] {
        let s = shape(algorithm, limit, w);
        let mut model = None;
        let (mut tb, mut fw) = (None, None);
        let mut now: u64 = 50_000;
        for _ in 0..2_000 {
            now = match rng.next(20) {
                0 => now.saturating_sub(rng.next(900)),
                _ => now + rng.next(w / 4),
            };
            let (ok, o) = one(s, &mut model, now);
            let single = match algorithm {
                Algorithm::TokenBucket => {
                    let (o, st) = token_bucket(limit, w, tb, now);
                    tb = st.or(tb);
                    o
                }
                _ => {
                    let (o, st) = fixed_window(limit, w, fw, now);
                    fw = st.or(fw);
                    o
                }
            };
            assert_eq!(ok, single.allowed);
            assert_eq!(o.remaining, single.remaining);
            assert_eq!(o.reset_after_ms, single.reset_after_ms);
            if !ok {
                assert_eq!(o.retry_after_ms, single.retry_after_ms);
            }
        }
    }
}
