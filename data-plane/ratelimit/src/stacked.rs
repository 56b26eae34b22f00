//! Stacked limits and the sliding window, as pure functions of `(states, now)`.
//!
//! A request of a route with several limits is admitted only when **every**
//! limit admits it, and only then does it spend from each: a request refused
//! by one limit burns nothing anywhere. [`decide`] decides `requests` such
//! requests at one instant (merged concurrent requests of one key set, see
//! `merge.rs`): it admits `min` over the limits of what each could admit
//! on its own, and every limit spends exactly that many — what that many
//! single requests, one after another, would have done.
//!
//! `stacked.lua` is a line-by-line translation (same units, same rounding);
//! the local fallback runs these functions directly, so both apply the same
//! all-or-nothing rule.
//!
//! # Sliding window (counter approximation)
//! Two fixed windows of `window_ms` (aligned like [`crate::algorithm::fixed_window`]'s)
//! are kept per key: the current one's count `curr` and the previous one's,
//! `prev`. At `e` ms into the current window the estimate is
//! `prev × (window − e) / window + curr`, i.e. it assumes the previous window's
//! requests were spread evenly. A request is admitted when the estimate plus
//! one stays within `limit`, in exact integers:
//! `prev × (window − e) + (curr + 1) × window ≤ limit × window`.
//!
//! **Error bound.** Under that assumption no window of length `window`, wherever
//! it starts, holds more than `limit` admitted requests. Without it, a real
//! window that starts `a` ms into counting window `k − 1` holds at most
//! `limit + ⌊P × (a − 1) / window⌋` admitted requests, `P ≤ limit` being window
//! `k − 1`'s count; so at most `2 × limit − 1` in the worst case (every one of the
//! previous window's requests in its last milliseconds, then the current
//! window filled as fast as the estimate allows). A fixed window allows
//! `2 × limit` across an edge; a token bucket `limit` plus its refill. The
//! unit tests below check the bound at every offset and that it is reached.
//!
//! Proof sketch: let `x` be the admitted requests of window `k − 1` in
//! `[a, window)` (so `x ≤ P`) and `y` those of window `k` in `[0, a)`. The last
//! of the `y`, admitted at `e ≤ a − 1`, needed `P × (window − e) + y × window ≤
//! limit × window`, so `y ≤ limit − P × (window − a + 1) / window`, and
//! `x + y ≤ limit + P × (a − 1) / window`.

use crate::algorithm::{FixedWindowState, TokenBucketState};
use crate::policy::Algorithm;

/// Most limits one decision may stack (validation allows up to this many per route).
pub const MAX_STACKED: usize = 8;

/// Sliding-window state of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Window index of `count`: `now_ms / window_ms`.
    pub window: u64,
    /// Requests admitted in that window (never more than a `u32` limit).
    pub count: u32,
    /// Requests admitted in the window before it.
    pub prev: u32,
}

/// The stored state of one budget, whatever its algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// A token bucket's level.
    TokenBucket(TokenBucketState),
    /// A fixed window's count.
    FixedWindow(FixedWindowState),
    /// A sliding window's two counts.
    SlidingWindow(SlidingWindowState),
}

/// The settings of one limit that the arithmetic needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// How the budget is spent and refilled.
    pub algorithm: Algorithm,
    /// Bucket capacity, or requests per window.
    pub limit: u32,
    /// Window (or whole-bucket refill time) in milliseconds.
    pub window_ms: u64,
}

/// One limit's figures after a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitOutcome {
    /// Requests this limit would still admit right now.
    pub remaining: u64,
    /// Milliseconds until its whole budget is back.
    pub reset_after_ms: u64,
    /// When `remaining` is 0: milliseconds until it admits one request again; else 0.
    pub retry_after_ms: u64,
}

/// One limit read at `now`: how many requests it admits, and what spending needs.
#[derive(Debug, Clone, Copy)]
struct Reading {
    cap: u64,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    TokenBucket { level: u64, at: u64, ahead: u64 },
    FixedWindow { window: u64, count: u64 },
    SlidingWindow(Sliding),
}

/// A sliding window normalised to `now`'s window (or a later one if the clock went back).
#[derive(Debug, Clone, Copy)]
struct Sliding {
    window: u64,
    curr: u64,
    prev: u64,
    /// Milliseconds into `window` (0 if `window` starts after now).
    elapsed: u64,
    /// How far `window`'s start lies ahead of now (clock went backwards), else 0.
    ahead: u64,
}

fn read(shape: Shape, state: Option<State>, now_ms: u64) -> Reading {
    let limit = u64::from(shape.limit);
    let w = shape.window_ms;
    match shape.algorithm {
        Algorithm::TokenBucket => {
            let capacity = limit * w;
            let (mut level, mut at) = match state {
                Some(State::TokenBucket(s)) => (s.level.min(capacity), s.updated_ms),
                _ => (capacity, now_ms),
            };
            if now_ms > at {
                let elapsed = now_ms - at;
                level = if elapsed >= w {
                    capacity
                } else {
                    (level + elapsed * limit).min(capacity)
                };
                at = now_ms;
            }
            Reading {
                cap: level / w,
                kind: Kind::TokenBucket {
                    level,
                    at,
                    ahead: at - now_ms,
                },
            }
        }
        Algorithm::FixedWindow => {
            let current = now_ms / w;
            let (window, count) = match state {
                Some(State::FixedWindow(s)) if s.window >= current => (s.window, s.count),
                _ => (current, 0),
            };
            Reading {
                cap: limit.saturating_sub(count),
                kind: Kind::FixedWindow { window, count },
            }
        }
        Algorithm::SlidingWindow => {
            let s = sliding(w, state, now_ms);
            Reading {
                cap: sliding_cap(limit, w, &s),
                kind: Kind::SlidingWindow(s),
            }
        }
    }
}

fn sliding(w: u64, state: Option<State>, now_ms: u64) -> Sliding {
    let current = now_ms / w;
    let (window, curr, prev) = match state {
        Some(State::SlidingWindow(s)) if s.window >= current => {
            (s.window, u64::from(s.count), u64::from(s.prev))
        }
        Some(State::SlidingWindow(s)) if s.window + 1 == current => {
            (current, 0, u64::from(s.count))
        }
        _ => (current, 0, 0),
    };
    let start = window * w;
    Sliding {
        window,
        curr,
        prev,
        elapsed: now_ms.saturating_sub(start),
        ahead: start.saturating_sub(now_ms),
    }
}

/// `⌊(limit × w − prev × (w − elapsed)) / w⌋ − curr`, at least 0.
fn sliding_cap(limit: u64, w: u64, s: &Sliding) -> u64 {
    let weighted = s.prev * (w - s.elapsed);
    (limit * w)
        .checked_sub(weighted)
        .map_or(0, |room| (room / w).saturating_sub(s.curr))
}

/// Spends `k` (at most `reading.cap`) from one limit: its figures after, and
/// the state to store (`None`: unchanged, when `k` is 0).
fn spend(shape: Shape, reading: Reading, k: u64, now_ms: u64) -> (LimitOutcome, Option<State>) {
    let limit = u64::from(shape.limit);
    let w = shape.window_ms;
    let remaining = reading.cap - k;
    match reading.kind {
        Kind::TokenBucket { level, at, ahead } => {
            let level = level - k * w;
            let capacity = limit * w;
            let outcome = LimitOutcome {
                remaining,
                reset_after_ms: ahead + (capacity - level).div_ceil(limit),
                retry_after_ms: if remaining == 0 {
                    ahead + (w - level).div_ceil(limit)
                } else {
                    0
                },
            };
            let state = (k > 0).then_some(State::TokenBucket(TokenBucketState {
                level,
                updated_ms: at,
            }));
            (outcome, state)
        }
        Kind::FixedWindow { window, count } => {
            let reset = (window + 1) * w - now_ms;
            let outcome = LimitOutcome {
                remaining,
                reset_after_ms: reset,
                retry_after_ms: if remaining == 0 { reset } else { 0 },
            };
            let state = (k > 0).then_some(State::FixedWindow(FixedWindowState {
                window,
                count: count + k,
            }));
            (outcome, state)
        }
        Kind::SlidingWindow(s) => {
            let curr = s.curr + k;
            let to_end = s.ahead + (w - s.elapsed);
            let reset_after_ms = if curr > 0 {
                to_end + w
            } else if s.prev > 0 {
                to_end
            } else {
                0
            };
            let retry_after_ms = if remaining == 0 {
                sliding_retry(limit, w, &s, curr)
            } else {
                0
            };
            // Both counts stay within the limit, a u32 (k is at most what fits).
            let state = (k > 0).then_some(State::SlidingWindow(SlidingWindowState {
                window: s.window,
                count: u32::try_from(curr).unwrap_or(u32::MAX),
                prev: u32::try_from(s.prev).unwrap_or(u32::MAX),
            }));
            (
                LimitOutcome {
                    remaining,
                    reset_after_ms,
                    retry_after_ms,
                },
                state,
            )
        }
    }
}

/// Milliseconds until a sliding window with `curr` admitted admits one more.
fn sliding_retry(limit: u64, w: u64, s: &Sliding, curr: u64) -> u64 {
    // In this window: the first e with prev × (w − e) ≤ (limit − curr − 1) × w.
    if let Some(room) = limit.checked_sub(curr + 1)
        && s.prev > 0
    {
        let e = w - (room * w / s.prev).min(w);
        if e < w {
            return s.ahead + e.saturating_sub(s.elapsed).max(1);
        }
    }
    // In the next one, where `curr` becomes the previous count: the first e
    // with curr × (w − e) ≤ (limit − 1) × w.
    let e = ((limit - 1) * w)
        .checked_div(curr)
        .map_or(0, |room| w - room.min(w));
    s.ahead + (w - s.elapsed) + e
}

/// Decides `requests` requests (at least 1) at `now_ms` under every limit of
/// `shapes` at once, all or nothing; see the module documentation.
///
/// `states[i]` is limit `i`'s stored state (`None`: a fresh budget; a state of
/// another algorithm counts as fresh); the limits that spent get their new
/// state written back. `out[i]` receives limit `i`'s figures. Returns how many
/// of the requests, first to last, are admitted.
///
/// # Panics
/// If the three slices differ in length or hold more than [`MAX_STACKED`] limits.
pub fn decide(
    shapes: &[Shape],
    states: &mut [Option<State>],
    now_ms: u64,
    requests: u64,
    out: &mut [LimitOutcome],
) -> u64 {
    assert!(shapes.len() <= MAX_STACKED);
    assert!(shapes.len() == states.len() && shapes.len() == out.len());
    let mut readings = [None; MAX_STACKED];
    let mut admitted = requests;
    for (i, (shape, state)) in shapes.iter().zip(states.iter()).enumerate() {
        let reading = read(*shape, *state, now_ms);
        admitted = admitted.min(reading.cap);
        readings[i] = Some(reading);
    }
    for (i, shape) in shapes.iter().enumerate() {
        let reading = readings[i].expect("read above");
        let (outcome, state) = spend(*shape, reading, admitted, now_ms);
        out[i] = outcome;
        if let Some(state) = state {
            states[i] = Some(state);
        }
    }
    admitted
}

/// Which limit describes an admitted request, and which one a refused one,
/// given every limit's figures after a decision that admitted `admitted` of
/// `requests`.
///
/// Admitted: the most restrictive limit — the fewest `remaining`, then the
/// longest `reset_after_ms`, then the first listed. Refused (only when
/// `admitted < requests`): of the limits that refused (those left with
/// nothing), the one with the longest `retry_after_ms`, then the first listed.
pub fn shaping(outcomes: &[LimitOutcome]) -> (usize, usize) {
    let mut allow = 0;
    let mut deny: Option<usize> = None;
    for (i, o) in outcomes.iter().enumerate() {
        let best = &outcomes[allow];
        if (o.remaining, std::cmp::Reverse(o.reset_after_ms))
            < (best.remaining, std::cmp::Reverse(best.reset_after_ms))
        {
            allow = i;
        }
        if o.remaining == 0 && deny.is_none_or(|d| o.retry_after_ms > outcomes[d].retry_after_ms) {
            deny = Some(i);
        }
    }
    (allow, deny.unwrap_or(allow))
}

/// True when forgetting a stored sliding window changes nothing at `now_ms`.
pub fn sliding_window_is_idle(window_ms: u64, state: SlidingWindowState, now_ms: u64) -> bool {
    now_ms / window_ms > state.window + 1 || (state.count == 0 && state.prev == 0)
}

#[cfg(test)]
mod tests;
