//! The SQLite file's permissions (issue 41, item 10): it holds the
//! configuration's history (sealed private keys, signing secrets, API key
//! digests) or the users' password hashes, so only its owner may read it.
//!
//! A new file is created with mode 0600 before SQLite opens it (SQLite gives
//! its `-wal` and `-shm` files the database file's mode); an existing file,
//! and its `-wal` and `-shm`, are tightened to 0600.

use std::io;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// The mode of every database file.
pub const MODE: u32 = 0o600;

/// Creates the SQLite file at `path` with mode 0600 when it does not exist,
/// and sets 0600 on it and on its `-wal` and `-shm` files when they do.
/// `:memory:` and an empty path are left alone.
pub fn prepare(path: &Path) -> io::Result<()> {
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
        return Ok(());
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(MODE)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for file in [
        path.to_path_buf(),
        with_suffix(path, "-wal"),
        with_suffix(path, "-shm"),
    ] {
        match std::fs::metadata(&file) {
            Ok(m) if m.permissions().mode() & 0o777 != MODE => {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(MODE))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn new_files_are_0600_and_existing_ones_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.db");
        prepare(&new).unwrap();
        assert_eq!(mode(&new), 0o600);
        let old = dir.path().join("old.db");
        for f in [&old, &with_suffix(&old, "-wal"), &with_suffix(&old, "-shm")] {
            std::fs::write(f, b"").unwrap();
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        prepare(&old).unwrap();
        for f in [&old, &with_suffix(&old, "-wal"), &with_suffix(&old, "-shm")] {
            assert_eq!(mode(f), 0o600, "{}", f.display());
        }
        prepare(Path::new(":memory:")).unwrap();
    }
}
