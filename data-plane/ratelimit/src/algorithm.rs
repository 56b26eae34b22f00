//! The arithmetic of both algorithms, as pure functions of `(state, now)`.
//!
//! The local fallback limiter runs these directly; `token_bucket.lua` and
//! `fixed_window.lua` are line-by-line translations (same units, same
//! rounding), so the unit tests here pin the semantics of both.
//!
//! All times are whole milliseconds on some clock that only the caller knows
//! (Redis's `TIME` for the scripts, a monotonic clock for the local limiter).
//! Rounding always errs towards the client waiting longer: a reported
//! `retry_after` is never shorter than the real time until a request would be
//! admitted, and `reset_after` never shorter than the time until the budget is full.

/// The result of spending (or failing to spend) one unit of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Requests still admissible right now, after this one.
    pub remaining: u64,
    /// Milliseconds until the whole budget is available again.
    pub reset_after_ms: u64,
    /// On denial: milliseconds until one request would be admitted. 0 when allowed.
    pub retry_after_ms: u64,
}

/// Token-bucket state of one key.
///
/// `level` is in token-milliseconds: one token is worth `window_ms`, the
/// bucket holds `limit × window_ms`, and every elapsed millisecond adds
/// `limit`. That keeps the refill exact in integers (no fractional tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Bucket level in token-milliseconds.
    pub level: u64,
    /// When `level` was computed (ms).
    pub updated_ms: u64,
}

/// Fixed-window state of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Window index: `now_ms / window_ms`.
    pub window: u64,
    /// Requests admitted in that window.
    pub count: u64,
}

/// `ceil(a / b)` for `b > 0`.
fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// One token-bucket decision at `now_ms`.
///
/// Returns the outcome and the state to store, or `None` when nothing changed
/// (denials do not spend, so they write nothing). A missing state is a full bucket.
/// If the clock went backwards (`now_ms` before `updated_ms`) the bucket is
/// read as of `updated_ms` and the wait times are extended by the difference.
pub fn token_bucket(
    limit: u32,
    window_ms: u64,
    state: Option<TokenBucketState>,
    now_ms: u64,
) -> (Outcome, Option<TokenBucketState>) {
    let limit = u64::from(limit);
    let capacity = limit * window_ms;
    let (mut level, mut at) = match state {
        Some(s) => (s.level.min(capacity), s.updated_ms),
        None => (capacity, now_ms),
    };
    if now_ms > at {
        let elapsed = now_ms - at;
        level = if elapsed >= window_ms {
            capacity
        } else {
            (level + elapsed * limit).min(capacity)
        };
        at = now_ms;
    }
    // Only non-zero when the clock went backwards: every wait starts at `at`.
    let ahead = at - now_ms;
    if level >= window_ms {
        level -= window_ms;
        let outcome = Outcome {
            allowed: true,
            remaining: level / window_ms,
            reset_after_ms: ahead + ceil_div(capacity - level, limit),
            retry_after_ms: 0,
        };
        (
            outcome,
            Some(TokenBucketState {
                level,
                updated_ms: at,
            }),
        )
    } else {
        let outcome = Outcome {
            allowed: false,
            remaining: 0,
            reset_after_ms: ahead + ceil_div(capacity - level, limit),
            retry_after_ms: ahead + ceil_div(window_ms - level, limit),
        };
        (outcome, None)
    }
}

/// True when a stored token bucket is indistinguishable from a missing one at `now_ms`.
pub fn token_bucket_is_full(
    limit: u32,
    window_ms: u64,
    state: TokenBucketState,
    now_ms: u64,
) -> bool {
    let limit = u64::from(limit);
    let deficit = (limit * window_ms).saturating_sub(state.level);
    now_ms >= state.updated_ms && (now_ms - state.updated_ms) * limit >= deficit
}

/// One fixed-window decision at `now_ms`.
///
/// Windows are `[k × window_ms, (k + 1) × window_ms)`. Returns the outcome and
/// the state to store (`None` on denial: nothing changes). A missing or older
/// state is an empty window; a newer one (clock went backwards) is kept.
pub fn fixed_window(
    limit: u32,
    window_ms: u64,
    state: Option<FixedWindowState>,
    now_ms: u64,
) -> (Outcome, Option<FixedWindowState>) {
    let limit = u64::from(limit);
    let current = now_ms / window_ms;
    let (window, count) = match state {
        Some(s) if s.window >= current => (s.window, s.count),
        _ => (current, 0),
    };
    let reset_after_ms = (window + 1) * window_ms - now_ms;
    if count < limit {
        let count = count + 1;
        (
            Outcome {
                allowed: true,
                remaining: limit - count,
                reset_after_ms,
                retry_after_ms: 0,
            },
            Some(FixedWindowState { window, count }),
        )
    } else {
        (
            Outcome {
                allowed: false,
                remaining: 0,
                reset_after_ms,
                retry_after_ms: reset_after_ms,
            },
            None,
        )
    }
}

/// True when a stored window is over at `now_ms` (so the entry can be forgotten).
pub fn fixed_window_is_over(window_ms: u64, state: FixedWindowState, now_ms: u64) -> bool {
    now_ms / window_ms > state.window
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    /// Runs `n` token-bucket decisions at `now`, threading the state through.
    fn spend_tb(
        limit: u32,
        window_ms: u64,
        state: &mut Option<TokenBucketState>,
        now: u64,
        n: usize,
    ) -> Vec<Outcome> {
        (0..n)
            .map(|_| {
                let (o, s) = token_bucket(limit, window_ms, *state, now);
                if let Some(s) = s {
                    *state = Some(s);
                }
                o
            })
            .collect()
    }

    #[test]
    fn token_bucket_allows_a_full_burst_then_denies() {
        let mut st = None;
        let t0 = 1_000_000;
        let out = spend_tb(20, MIN, &mut st, t0, 21);
        for (i, o) in out[..20].iter().enumerate() {
            assert!(o.allowed, "request {i} of the burst");
            assert_eq!(o.remaining, 19 - i as u64);
            assert_eq!(o.retry_after_ms, 0);
            // One token refills every 3 s; the deficit after i+1 tokens is (i+1)×3 s.
            assert_eq!(o.reset_after_ms, (i as u64 + 1) * 3_000);
        }
        let denied = out[20];
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 0);
        assert_eq!(denied.retry_after_ms, 3_000, "one token takes window/limit");
        assert_eq!(denied.reset_after_ms, MIN);
    }

    #[test]
    fn token_bucket_refills_continuously_and_caps_at_capacity() {
        let mut st = None;
        let t0 = 5_000;
        spend_tb(20, MIN, &mut st, t0, 20);
        // 2999 ms later: still no whole token; the wait shrinks to 1 ms.
        let (o, _) = token_bucket(20, MIN, st, t0 + 2_999);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ms, 1);
        // At exactly 3000 ms one token is back, and only one.
        let out = spend_tb(20, MIN, &mut st, t0 + 3_000, 2);
        assert!(out[0].allowed);
        assert_eq!(out[0].remaining, 0);
        assert!(!out[1].allowed);
        assert_eq!(out[1].retry_after_ms, 3_000);
        // Half a window later 10 tokens are back.
        let out = spend_tb(20, MIN, &mut st, t0 + 3_000 + 30_000, 11);
        assert_eq!(out.iter().filter(|o| o.allowed).count(), 10);
        // Idle for ten windows: the bucket is full, never fuller.
        let out = spend_tb(20, MIN, &mut st, t0 + 10 * MIN, 21);
        assert_eq!(out.iter().filter(|o| o.allowed).count(), 20);
    }

    #[test]
    fn token_bucket_retry_after_is_never_early_with_uneven_rates() {
        // 7 per 10 s: one token every 1428.57… ms, which is not a whole number.
        let limit = 7;
        let window = 10_000;
        let mut st = None;
        spend_tb(limit, window, &mut st, 0, 7);
        let (o, _) = token_bucket(limit, window, st, 0);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ms, 1_429, "ceil(10000/7)");
        // One millisecond before the reported time: still denied.
        assert!(!token_bucket(limit, window, st, 1_428).0.allowed);
        // At the reported time: admitted.
        assert!(token_bucket(limit, window, st, 1_429).0.allowed);
        // The 8th token after the empty start accrues at 80000/7 ≈ 11428.6 ms:
        // until then exactly 7 more are admitted, whatever the spacing.
        let mut admitted = 0;
        for now in (1..=11_428).step_by(7) {
            let (o, s) = token_bucket(limit, window, st, now);
            if let Some(s) = s {
                st = Some(s);
            }
            admitted += usize::from(o.allowed);
        }
        assert_eq!(admitted, 7);
    }

    #[test]
    fn token_bucket_survives_a_clock_going_backwards() {
        let mut st = None;
        spend_tb(2, 1_000, &mut st, 10_000, 2);
        // The clock jumps 300 ms back: no refill, and waits count from the stored time.
        let (o, s) = token_bucket(2, 1_000, st, 9_700);
        assert!(!o.allowed);
        assert!(s.is_none());
        assert_eq!(o.retry_after_ms, 300 + 500);
        assert_eq!(o.reset_after_ms, 300 + 1_000);
    }

    #[test]
    fn token_bucket_full_detection() {
        let mut st = None;
        spend_tb(4, 1_000, &mut st, 0, 1);
        let s = st.unwrap();
        assert!(!token_bucket_is_full(4, 1_000, s, 249));
        assert!(token_bucket_is_full(4, 1_000, s, 250));
    }

    #[test]
    fn fixed_window_counts_up_to_the_limit_per_window() {
        let mut st = None;
        let w = 60_000;
        let start = 7 * w; // an aligned window start
        for i in 0..5u64 {
            let (o, s) = fixed_window(5, w, st, start + i * 1_000);
            assert!(o.allowed);
            assert_eq!(o.remaining, 4 - i);
            assert_eq!(o.reset_after_ms, w - i * 1_000);
            st = s;
        }
        let (o, s) = fixed_window(5, w, st, start + 10_000);
        assert!(!o.allowed);
        assert!(s.is_none());
        assert_eq!(o.remaining, 0);
        assert_eq!(o.retry_after_ms, 50_000);
        assert_eq!(o.reset_after_ms, 50_000);
    }

    #[test]
    fn fixed_window_edges_are_exact() {
        let w = 1_000;
        let mut st = None;
        // Spend the whole budget in the last millisecond of window 3.
        for _ in 0..3 {
            let (o, s) = fixed_window(3, w, st, 3_999);
            assert!(o.allowed);
            st = s;
        }
        let (o, _) = fixed_window(3, w, st, 3_999);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ms, 1, "the window ends in 1 ms");
        assert!(!fixed_window_is_over(w, st.unwrap(), 3_999));
        assert!(fixed_window_is_over(w, st.unwrap(), 4_000));
        // The first millisecond of window 4 has a fresh budget: the well-known
        // 2 × limit burst across a window edge.
        let (o, s) = fixed_window(3, w, st, 4_000);
        assert!(o.allowed);
        assert_eq!(o.remaining, 2);
        assert_eq!(o.reset_after_ms, 1_000);
        assert_eq!(
            s,
            Some(FixedWindowState {
                window: 4,
                count: 1
            })
        );
    }

    #[test]
    fn fixed_window_keeps_a_newer_window_when_the_clock_goes_back() {
        let st = Some(FixedWindowState {
            window: 5,
            count: 2,
        });
        let (o, s) = fixed_window(2, 1_000, st, 4_900);
        assert!(!o.allowed);
        assert!(s.is_none());
        assert_eq!(o.retry_after_ms, 1_100);
    }
}
