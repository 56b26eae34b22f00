//! Rate limiting for the data plane: budgets shared by every replica through
//! atomic Redis Lua scripts, with a fast replica-local fallback.
//!
//! * [`Policy`]: a compiled `gateway.v1.RateLimit` (name, algorithm, limit, window).
//! * [`RateLimiter::check`]: one decision for `(policy, subject)`; the subject is
//!   whatever the caller counts per (a user, an address, an API key name, a
//!   route, a header value).
//! * [`RateLimiter::check_all`]: one decision under up to [`MAX_STACKED`]
//!   stacked limits, all or nothing ([`stacked`]).
//! * [`write_headers`]: `X-RateLimit-*`, `RateLimit-Policy`, `RateLimit`, and `Retry-After` on denial.
//! * [`StatsSnapshot::write_prometheus`]: the counters for `/metrics`.
//!
//! # Shared limiting
//! Each decision is one `EVALSHA` of `token_bucket.lua` or `fixed_window.lua`
//! on the key `rl:{<subject>}:<policy>` (a sliding window, or stacked limits:
//! `stacked.lua` over every key at once), timed by Redis's own clock (`TIME`), so
//! every replica spends the same budget exactly: N replicas together admit
//! `limit` per window, not N × `limit`. Keys expire once their budget is whole again.
//!
//! # Leases: busy keys decided in-process
//! A key this replica decides many times a second asks Redis, in the same
//! atomic run, for a few tokens more than its requests need, and spends them
//! on its next requests without a round trip (`lease.rs`). Leased tokens are
//! spent from the shared budget when they are taken, so leasing never admits
//! more than the limit; what a replica leased and did not spend is lost to
//! every replica until the budget refills (a token bucket) or the window ends
//! (a fixed window). A lease holds at most the key's demand on this replica
//! over `lease_period` (100 ms), at most 1/64 of the budget Redis last
//! reported left (so a nearly spent budget, and any limit below 64, is decided
//! one request at a time), and at most `lease_max_tokens` (1,000; 0 turns
//! leasing off). A fixed window's lease ends with its window; sliding windows
//! and stacked limits are never leased.
//!
//! # Stacked limits
//! A route may stack up to [`MAX_STACKED`] limits ([`RateLimiter::check_all`]).
//! A request is admitted only when every limit admits it and only then spends
//! from each, in one `stacked.lua` run over every key. On Redis Cluster the
//! limits of one subject share a slot and keep that rule; limits of different
//! subjects are decided slot by slot, never admitting more than the tightest
//! limit (`redis.rs`, "Keys and slots"). Concurrent requests of one key set merge like single ones, and
//! the local fallback applies the same all-or-nothing rule ([`stacked`]). A
//! limit found in the "denied until" cache refuses the whole request without
//! a round trip.
//!
//! # When Redis is slow or down (fallback semantics)
//! A decision waits at most `decision_timeout` (default 5 ms) for Redis. On a
//! timeout or error that decision is made by the replica's local limiter,
//! which applies the same policy to budgets kept in that process, and
//! `gateway_ratelimit_fallbacks_total` counts it. After
//! `breaker_failure_threshold` consecutive failures (default 3) spanning at
//! least `breaker_min_failure_span` (default 50 ms, so one CPU stall that makes
//! every in-flight decision late at once does not count as an outage) the
//! breaker opens: requests stop waiting on Redis at all, and a background probe
//! pings it every `breaker_open_for` (default 1 s). When it answers, shared
//! limiting resumes on its own, without a restart. Until the first probe
//! connects (at startup), decisions are local too: building the limiter never
//! waits on Redis.
//!
//! What a client can get away with during an outage: each replica enforces
//! the limit on its own, so a client whose requests reach N replicas can get
//! up to N × `limit` per window (at most `limit` per replica), plus whatever
//! was left of its shared budget when Redis went away, since local budgets
//! start full. A client pinned to one replica (keep-alive) still gets only
//! `limit`. Nothing is ever unlimited, no request fails because of Redis,
//! and no request waits more than `decision_timeout` on it. When Redis comes
//! back, its stored budgets resume where they were (they did not see the
//! outage's traffic); if Redis restarted empty, every budget starts full.
//!
//! A single decision that misses its deadline while Redis is otherwise fine
//! is decided locally too; if Redis then still applies the late script, that
//! request was counted in both places, so the shared budget errs towards
//! refusing, and the local decision towards admitting: at most one extra
//! admission per missed deadline, each one counted in the metrics.
//!
//! # Never over-admitting shortcuts
//! A key Redis has just denied is answered from a local "denied until" cache
//! until its `Retry-After` passes: budgets only refill with time, so this can
//! never admit what Redis would refuse, and abusive clients cost no Redis traffic.

pub mod algorithm;
mod breaker;
mod deadline;
mod deny_cache;
pub mod headers;
mod lease;
mod limiter;
pub mod local;
mod merge;
pub mod policy;
mod redis;
mod shard;
pub mod stacked;
pub mod stats;

pub use headers::{Decision, Source, write_headers};
pub use limiter::{RateLimitError, RateLimiter, RateLimiterOptions};
pub use local::LocalLimiter;
pub use policy::{Algorithm, MAX_TOKEN_MILLIS, Policy, PolicyError};
pub use redis::{FIXED_WINDOW_LUA, REFUND_LUA, STACKED_LUA, TOKEN_BUCKET_LUA};
pub use stacked::MAX_STACKED;
pub use stats::{Stats, StatsSnapshot};
