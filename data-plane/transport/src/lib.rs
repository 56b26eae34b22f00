//! The data plane's transport: how bytes become requests and answers on
//! both sides, and nothing of routes, policy or configuration (issue 26).
//! It imports nothing from the data plane; the data plane builds its
//! pipeline on top of it (docs/data-plane.md).
//!
//! * Client side: [`server`] (listeners, protocol sniffing, graceful
//!   shutdown, the hand-over to hyper for h2c and the rare HTTP/1.1 requests
//!   it leaves), [`h1_server`] (the HTTP/1.1 server: heads, request bodies,
//!   answers), [`workers`] (the per-core proxy workers), [`conn_limit`] (the
//!   cap on open connections), [`tls`] (the HTTPS listener's handshake), [`tunnels`] (connections that outlive their
//!   exchange, for shutdown), [`proxy_protocol`] (the client address a
//!   TCP proxy in front names in a PROXY v2 header);
//! * upstream side: [`h1`] (the HTTP/1.1 client), [`pool`] (per-instance
//!   keep-alive pools), [`upstream_io`] (TCP or TLS to an instance), [`in_flight`] (requests in flight per instance);
//! * both: [`framing`] (body framing), [`body`] (request and response body
//!   types), [`response`] (the response and its header fields),
//!   [`response_head`] (upstream fields forwarded as bytes),
//!   [`rewind`] (a socket with bytes already read in front);
//! * time: [`deadline`] (kept timers per worker), [`conn_timer`] (hyper's
//!   header-read timer), [`io_timeout`] (write deadlines of what hyper
//!   serves), [`send_progress`] (HTTP/2 send stalls).

pub mod body;
pub mod conn_limit;
pub mod conn_timer;
pub mod deadline;
pub mod framing;
pub mod h1;
pub mod h1_server;
pub mod h2_client;
pub mod in_flight;
pub mod io_timeout;
pub mod pool;
pub mod proxy_protocol;
pub mod response;
pub mod response_head;
pub mod rewind;
pub mod send_progress;
pub mod server;
pub mod tee;
pub mod tls;
pub mod tunnels;
pub mod upstream_error;
pub mod upstream_io;
pub mod workers;

#[doc(hidden)]
pub mod fuzzing;
