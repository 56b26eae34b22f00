//! The gateway control plane: routes, upstreams, API keys and TLS
//! certificates stored as numbered versions in SQLite or in a Postgres
//! database several control planes share, an operator gRPC API
//! (`gateway.v1.AdminService`) and the config stream to data planes
//! (`gateway.v1.ConfigDiscoveryService`).
//!
//! One module per concern:
//! * [`args`] command-line flags, [`logging`] stderr logs, [`auth`] tokens and roles;
//! * [`config`] the content of a configuration and the mutations on it,
//!   [`credentials`] API keys and upstream signing secrets,
//!   [`certificates`] TLS certificates around their shared validation,
//!   [`changes`] the diff between two configurations;
//! * [`secrets`] the `--secrets-key-file` key that seals private keys at rest;
//! * [`database`] the `--database` URL; [`store`] the version history (one
//!   transaction per mutation; with Postgres, commits of other replicas followed by LISTEN);
//! * [`admin`] AdminService, [`discovery`] StreamConfig, [`nodes`] the data-plane registry,
//!   [`upstream_health`] the upstream health the data planes report, [`ack_times`] when each last ACKed;
//! * [`console`] the web console (`--console-listen`), over the same AdminService;
//! * [`metrics`] counters and the Prometheus endpoint; [`seed`] the `--seed` file;
//! * [`server`] assembles and runs everything; [`error`] maps errors to gRPC codes;
//!   [`tls_generate`] the gRPC listener's own certificate (`--tls-generate-dir`).

pub mod ack_times;
pub mod admin;
pub mod args;
pub mod auth;
pub mod certificates;
pub mod changes;
pub mod cli;
pub mod clock;
pub mod config;
/// The `--database` URL (shared with the auth service: `gateway-database`).
pub use gateway_database::url as database;
pub mod console;
pub mod credentials;
pub mod discovery;
pub mod error;
pub mod jwt_issuers;
pub mod logging;
pub mod metrics;
pub mod nodes;
pub mod purge;
/// The `--secrets-key-file` key (shared with the auth service: `gateway-database`).
pub use gateway_database::secrets;
pub mod seed;
pub mod server;
mod shutdown;
pub mod store;
pub mod tls_generate;
pub mod upstream_health;

pub use args::{Args, LogFormat};
pub use database::Database;
pub use error::StoreError;
pub use server::{ControlPlane, Settings, StartError, TlsFiles};
pub use store::Store;
