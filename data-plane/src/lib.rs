//! The gateway data plane: a stateless reverse proxy that takes its routes and
//! upstreams from the control plane's config stream (docs/grpc-api.md, docs/data-plane.md).
//!
//! The folders are the layers, each importing only those listed after it
//! (`scripts/check-layers` fails the tests on an import that runs back up):
//! * [`app`]: the application — [`DataPlane`], the request [`pipeline`](app::pipeline)
//!   (sanitise → route → IP rules → WebSocket admission → CORS preflight →
//!   authenticate → rate-limit → request headers → aggregate | coalesce |
//!   proxy), the config runtime, the xDS client, the ops listener, flags;
//! * [`fuzzing`]: entry points for the fuzz targets;
//! * [`config`]: the compiled snapshot every request reads, and the compiler
//!   that builds it from the control plane's configuration;
//! * [`composition`]: aggregation, coalescing and WebSocket tunnels, built
//!   on the upstream layer;
//! * [`upstream`]: where a request goes and how it gets there — upstreams and
//!   their instances, balancing, breakers, health checks, DNS discovery, retry
//!   policies and budgets, and forwarding;
//! * [`error`]: every refusal and failure, and the one place a status and its
//!   problem document are chosen;
//! * [`policy`]: the request stages that decide on a request before it is
//!   forwarded — sanitising, routing, IP rules, CORS, API keys, JWTs, rate
//!   limits, header transforms, identity signing — and the [`hooks`](policy::hooks)
//!   where token verification and rate limiting plug in;
//! * [`metrics`]: the counters every layer updates;
//! * `gateway-transport` (`data-plane/transport`, its own crate): listeners and
//!   workers, the HTTP/1.1 server and upstream client, pools, bodies, response
//!   heads, deadlines; it knows nothing of routes.
//!
//! `main.rs` only calls [`app::cli::main`].

pub mod app;
pub mod composition;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
pub mod policy;
pub mod upstream;

pub use app::{DataPlane, Running, StartError, args, cli, run};
