//! The defaults of the configuration: what a field left at 0 (or a message
//! left out) means. Both planes take them from here: the control plane's
//! validation bounds what depends on them, the data plane compiles them in.

/// Route timeout of a route with `timeout_ms` 0: 15 s.
pub const ROUTE_TIMEOUT_MS: u32 = 15_000;
/// Idle timeout of a WebSocket tunnel whose route sets
/// `websocket_idle_timeout_ms` 0: five minutes.
pub const WEBSOCKET_IDLE_TIMEOUT_MS: u32 = 300_000;
/// DNS refresh interval of a `discovery` with `refresh_ms` 0: 5 s.
pub const DNS_REFRESH_MS: u32 = 5_000;
/// Consecutive failures that open the breaker of an upstream without
/// `circuit_breaker`.
pub const BREAKER_FAILURE_THRESHOLD: u32 = 5;
/// How long that breaker stays open before admitting probes: 10 s.
pub const BREAKER_RESET_TIMEOUT_MS: u32 = 10_000;
/// Probes that breaker admits at once while half-open.
pub const BREAKER_HALF_OPEN_MAX_REQUESTS: u32 = 1;
/// Most of an upstream's instances out of rotation at once (breaker not
/// closed, or ejected), in percent, for `max_open_percent` 0 (and an upstream
/// without `circuit_breaker`).
pub const BREAKER_MAX_OPEN_PERCENT: u32 = 50;
