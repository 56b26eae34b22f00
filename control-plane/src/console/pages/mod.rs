//! One file per page of the console. Each renders from the AdminService
//! ([`crate::console::backend`]) as the signed-in caller; write controls
//! (forms that POST) are rendered only for a caller whose role may make the
//! call, and the call itself is checked again when the form is sent.

pub mod api_keys;
pub mod certificates;
pub mod config;
pub mod health;
pub mod overview;
pub mod signin;
pub mod versions;
