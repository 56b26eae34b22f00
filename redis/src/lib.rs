//! Redis connection settings shared by the data plane (rate-limit budgets)
//! and the auth service (refresh-token families).
//!
//! * [`RedisUrl`]: a checked `redis://` or `rediss://` URL, with or without a
//!   password (`redis://[[user]:password@]host:port[/db]`), or a Sentinel
//!   (`redis+sentinel://[user:password@]host:port[,…]/MASTER_NAME`) or Cluster
//!   (`redis+cluster://[user:password@]host:port[,…]`) one, each also over TLS
//!   (`rediss+…`); its `Display` and `Debug` are redacted, so it can sit in
//!   any logged struct.
//! * [`redact`]: the printable form of any URL string (`redis://:***@host:6379`),
//!   for the places that must show a URL that did not even parse.
//! * [`RedisUrlParser`]: the clap value parser for such a flag; its error
//!   messages quote only the redacted URL.
//! * [`RedisTarget`]: a URL plus, for TLS, the CA file (`--redis-ca`) the
//!   server's certificate must chain to; builds the `redis::Client` (rustls)
//!   of one Redis, and the [`RedisConnection`] of any URL.
//! * [`RedisConnection`]: one lazily connected handle over one Redis, the
//!   master Sentinel names (following failovers), or a Cluster.
//!
//! The password travels only inside the client: no error type or log line of
//! this crate ever holds the URL unredacted.

mod connection;
mod target;
mod url;

pub use connection::{ConnectOptions, RedisConnection};
pub use target::{RedisTarget, RedisTargetError};
pub use url::{
    Credentials, NOT_A_URL, Node, RedisUrl, RedisUrlError, RedisUrlParser, Topology, redact,
};
