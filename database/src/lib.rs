//! Storage plumbing the control plane and the auth service share:
//!
//! * [`url`]: the `--database` value, a SQLite file or a `postgres://` URL
//!   that several replicas share, shown with its password masked;
//! * [`postgres`]: Postgres pools that fail fast while Postgres is down, and
//!   the test that tells "unreachable" from "refused";
//! * [`postgres_tls`]: `sslmode` and `sslrootcert`, checked before connecting
//!   (`verify-full` verifies the server; a remote host needs an explicit mode);
//! * [`secrets`]: the key from a key file that seals private keys at rest
//!   (AES-256-GCM), so a database never holds one in the clear;
//! * [`sqlite_file`]: a SQLite file and its `-wal`/`-shm` are mode 0600.

pub mod postgres;
pub mod postgres_tls;
pub mod secrets;
pub mod sqlite_file;
pub mod url;

pub use url::{Database, DatabaseUrlError, PostgresUrl};
