//! The policy stages: what decides on a request before it is forwarded, one
//! concern a file, in the order the pipeline applies them. They import nothing
//! of the layers above (upstreams, composition, configuration, application).
//!
//! * [`sanitize`]: hop-by-hop and spoofable headers, `Forwarded`, request ids,
//!   the client address; [`normalize`]: the path;
//! * [`router`]: routes by host, prefix and method; [`https`]: `https_only` routes;
//! * [`grpc`]: gRPC calls (recognised by `content-type`) and their `grpc-timeout`;
//! * [`ip_rules`], [`cors`], [`api_key`], [`mtls`] (client certificates), [`jwt`] (behind the
//!   [`hooks::Authenticator`] hook), [`ratelimit`] (behind
//!   [`hooks::RateLimiter`]);
//! * [`transform`]: request and response header changes; [`signature`]:
//!   `X-Gateway-Signature` for upstreams with an `identity_signing_secret`.

pub mod api_key;
pub mod cors;
pub mod grpc;
pub mod hooks;
pub mod https;
pub mod ip_rules;
pub mod jwt;
pub mod matching;
pub mod mtls;
pub mod normalize;
pub mod ratelimit;
pub mod router;
pub mod sanitize;
pub mod signature;
pub mod transform;
