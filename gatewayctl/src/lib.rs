//! `gatewayctl`: the gateway's configuration as files kept in git. `dump`
//! writes the current configuration as YAML or JSON (the proto's JSON
//! mapping), `diff` shows per field what `apply` would change (the control
//! plane's own dry run), `apply` commits a file as one version (with
//! compare-and-swap), `validate` checks a file offline with the control
//! plane's validation and names the line of each problem, `rollback` and
//! `status` do what they say. It is a client of the AdminService, like
//! grpcurl, which keeps working as documented.

pub mod args;
pub mod cli;
pub mod commands;
pub mod connect;
/// `diff`'s per-field view, shared with the control plane's web console.
pub use gateway_proto::field_diff as diff;
pub mod emit;
pub mod error;
pub mod file;
pub mod yaml;

pub use args::Args;
pub use error::CtlError;
