//! The stack's control-channel credentials: a random admin token and a random
//! data-plane token, written to a tokens file (mode 0600) that the control
//! plane reads with `--auth-tokens-file`; and the control plane's
//! `--secrets-key-file`, beside its database. Data planes get their token through
//! the environment (`DP_CONTROL_PLANE_TOKEN`), never on a command line, so it
//! shows up neither in `ps` nor in the "starting …" line of their log.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::StackError;

/// Name of the admin token in the tokens file (the author of devstack's changes).
pub const ADMIN_NAME: &str = "devstack-admin";
/// Name of the viewer token in the tokens file (read-only: the console's viewer sign-in).
pub const VIEWER_NAME: &str = "devstack-viewer";
/// Name of the data planes' token in the tokens file.
pub const DATA_PLANE_NAME: &str = "devstack-data-plane";

/// The stack's three tokens.
#[derive(Clone)]
pub struct Tokens {
    /// Role `admin`: every AdminService RPC.
    pub admin: String,
    /// Role `viewer`: the read-only AdminService RPCs.
    pub viewer: String,
    /// Role `data-plane`: StreamConfig only.
    pub data_plane: String,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens { <redacted> }")
    }
}

/// 32 random bytes from the kernel, hex-encoded (tokens, the Redis password).
pub(crate) fn random_token() -> Result<String, StackError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(StackError::io(
            "reading /dev/urandom for the stack's tokens",
        ))?;
    Ok(gateway_hex::encode(bytes))
}

impl Tokens {
    /// Three fresh random tokens.
    pub fn generate() -> Result<Tokens, StackError> {
        Ok(Tokens {
            admin: random_token()?,
            viewer: random_token()?,
            data_plane: random_token()?,
        })
    }

    /// Writes the control plane's tokens file (owner read/write only).
    pub fn write_file(&self, path: &Path) -> Result<(), StackError> {
        let text = format!(
            "# devstack: generated for this stack only\n\
             {ADMIN_NAME} admin {}\n{VIEWER_NAME} viewer {}\n{DATA_PLANE_NAME} data-plane {}\n",
            self.admin, self.viewer, self.data_plane
        );
        write_private(path, &text)
    }
}

/// The control plane's `--secrets-key-file` for `database`: `<database>.secrets-key`
/// beside it, made (64 random hex digits, mode 0600) when missing and kept
/// otherwise, so a persistent `--database` reopens with the key its
/// certificates' private keys were encrypted with.
pub(crate) fn secrets_key_file(database: &Path) -> Result<PathBuf, StackError> {
    let mut name = database.as_os_str().to_owned();
    name.push(".secrets-key");
    let path = PathBuf::from(name);
    if !path.exists() {
        write_private(&path, &format!("{}\n", random_token()?))?;
    }
    Ok(path)
}

/// Writes `text` to a file only its owner can read (mode 0600).
pub(crate) fn write_private(path: &Path, text: &str) -> Result<(), StackError> {
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(StackError::io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex_and_the_file_is_private() {
        let a = Tokens::generate().unwrap();
        let b = Tokens::generate().unwrap();
        assert_eq!(a.admin.len(), 64);
        assert!(a.admin.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.admin, a.data_plane);
        assert_ne!(a.admin, b.admin);
        assert!(!format!("{a:?}").contains(&a.admin));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        a.write_file(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&format!("devstack-admin admin {}", a.admin)));
        assert!(text.contains(&format!("devstack-data-plane data-plane {}", a.data_plane)));
        assert!(text.contains(&format!("devstack-viewer viewer {}", a.viewer)));
        assert_ne!(a.viewer, a.admin);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn the_secrets_key_lives_beside_the_database_and_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("cp.db");
        let path = secrets_key_file(&db).unwrap();
        assert_eq!(path, dir.path().join("cp.db.secrets-key"));
        let key = std::fs::read_to_string(&path).unwrap();
        assert_eq!(key.trim().len(), 64);
        assert!(key.trim().chars().all(|c| c.is_ascii_hexdigit()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // The next stack on the same database gets the same key.
        assert_eq!(secrets_key_file(&db).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), key);
    }
}
