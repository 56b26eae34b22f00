//! The web console (`--console-listen`): server-rendered HTML over the same
//! AdminService the gRPC API serves, signed in with the same tokens.
//!
//! * [`server`] accepts connections (TLS with the control plane's own
//!   `--tls-cert`/`--tls-key` when it has them) and serves HTTP/1.1 and h2;
//! * [`router`] maps a request to a page or an action, with the security
//!   headers every answer carries (a strict Content-Security-Policy: no
//!   script at all, styles from `/static/console.css` only);
//! * [`session`] the signed-in sessions (cookie `HttpOnly`, `SameSite=Strict`,
//!   `Secure` over TLS; idle and absolute expiry), [`csrf`] the token every
//!   state-changing form carries, [`signin`] the sign-in with its throttle;
//! * [`backend`] calls the AdminService in process, as the signed-in caller,
//!   with the gRPC API's role table ([`crate::auth::allowed`]): a viewer can
//!   do in the console exactly what it can do with grpcurl;
//! * [`html`] escaping and the page frame, [`pages`] one file per page.

pub mod backend;
pub mod csrf;
pub mod html;
pub mod pages;
pub mod router;
pub mod server;
pub mod session;
pub mod signin;

use std::sync::Arc;

use crate::ack_times::AckTimes;
use crate::auth::Tokens;
use crate::store::Store;
use crate::upstream_health::HealthReports;
use backend::Backend;
use session::Sessions;
use signin::Throttle;

pub use server::serve;

/// Everything the console's handlers share.
#[derive(Debug)]
pub struct Console {
    /// The AdminService, called as the signed-in caller.
    pub backend: Backend,
    /// The configuration store (version snapshots for diffs).
    pub store: Arc<Store>,
    /// The data planes' last upstream health reports.
    pub health: Arc<HealthReports>,
    /// When each data plane last ACKed.
    pub acks: Arc<AckTimes>,
    /// The tokens a sign-in is checked against (`--auth-tokens-file`).
    pub tokens: Arc<Tokens>,
    /// Signed-in sessions.
    pub sessions: Sessions,
    /// Failed sign-ins per client address.
    pub throttle: Throttle,
    /// Served over TLS: cookies get `Secure`, answers `Strict-Transport-Security`.
    pub tls: bool,
}
