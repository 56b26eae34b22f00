//! `devstack`: the whole gateway system as local processes, for people
//! (the `devstack` binary) and for the black-box test suites (this library).
//!
//! ```no_run
//! # async fn demo() -> Result<(), devstack::StackError> {
//! // Redis, control plane, auth service, mocks and 3 data planes on free
//! // 127.0.0.1 ports, demo configuration seeded, every data plane SYNCED.
//! let stack = devstack::Stack::new().data_planes(3).start().await?;
//! println!("gateway at {}", stack.gateways()[0]);
//! stack.kill("orders-1").await?;          // crash one instance
//! stack.start_process("orders-1").await?; // and bring it back
//! # Ok(()) }
//! ```
//!
//! Process names (also the keys of the `--json` `pids` object):
//! `redis`, `control-plane`, `users-1`, `orders-1`, `orders-2`,
//! `auth-service`, `data-plane-1` … `data-plane-N`.
//!
//! Children never outlive devstack: each gets `PR_SET_PDEATHSIG(SIGKILL)`
//! and `kill_on_drop`, and dropping the [`Stack`] kills them all.

pub mod args;
pub mod binaries;
mod boot;
pub mod builder;
pub mod demo;
pub mod error;
pub mod pki;
pub mod ports;
pub mod prereq;
mod process;
mod readiness;
pub mod redis;
pub mod secrets;
pub mod serve;
pub mod stack;
pub mod summary;
mod sys;

pub use boot::DEMO_USERS;
pub use builder::StackBuilder;
pub use error::StackError;
pub use ports::Ports;
pub use process::log_tail;
pub use redis::{RedisBuilder, RedisServer};
pub use stack::{Exited, Stack};
pub use summary::StackInfo;
pub use sys::is_root;
