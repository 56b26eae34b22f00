//! Finding the gateway's binaries and the tools devstack runs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::StackError;

/// How to run one of the gateway's programs: an executable, and the
/// arguments that come before the program's own (`serve <name>` when the
/// executable is devstack's own binary, which holds every program).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The executable.
    pub path: PathBuf,
    /// Arguments before the program's own.
    pub prefix: Vec<String>,
}

impl Program {
    /// A program's own binary.
    pub fn binary(path: PathBuf) -> Self {
        Self {
            path,
            prefix: Vec::new(),
        }
    }

    /// Program `name` run by the multi-call executable `exe` (`exe serve name …`).
    pub fn multi_call(exe: &Path, name: &str) -> Self {
        Self {
            path: exe.to_path_buf(),
            prefix: vec![crate::serve::SUBCOMMAND.to_owned(), name.to_owned()],
        }
    }

    /// The whole argument list for the program's own `args`.
    pub fn args(&self, args: impl IntoIterator<Item = String>) -> Vec<String> {
        self.prefix.iter().cloned().chain(args).collect()
    }
}

/// Environment variable naming the directory that holds the gateway binaries.
pub const BIN_DIR_ENV: &str = "GATEWAY_BIN_DIR";

/// Where to look for the gateway binaries, in order: an explicit directory
/// (builder `.bin_dir`), else `$GATEWAY_BIN_DIR`, else the directory of the
/// running executable and its parent. The parent matters for test binaries,
/// which run from `target/<profile>/deps` while the binaries sit in
/// `target/<profile>`. An explicit choice is the only place searched, so a
/// stale build elsewhere is never picked up by accident.
pub fn search_dirs(explicit: Option<&Path>) -> Vec<PathBuf> {
    if let Some(dir) = explicit {
        return vec![dir.to_path_buf()];
    }
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(dir)];
    }
    let mut dirs = Vec::new();
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        if let Some(parent) = exe_dir.parent() {
            dirs.push(exe_dir.clone());
            dirs.push(parent.to_path_buf());
        } else {
            dirs.push(exe_dir);
        }
    }
    dirs
}

/// The first executable file called `name` in `dirs`.
pub fn find_binary(name: &str, dirs: &[PathBuf]) -> Result<PathBuf, StackError> {
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|path| is_executable(path))
        .ok_or_else(|| StackError::BinaryNotFound {
            name: name.to_owned(),
            searched: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The first executable called `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_call_program_is_the_executable_with_serve_and_its_name() {
        let p = Program::multi_call(Path::new("/x/devstack"), "data-plane");
        assert_eq!(p.path, PathBuf::from("/x/devstack"));
        assert_eq!(
            p.args(["--listen".to_owned(), "a".to_owned()]),
            ["serve", "data-plane", "--listen", "a"]
        );
        assert_eq!(
            Program::binary("/x/data-plane".into()).args(["-v".to_owned()]),
            ["-v"]
        );
    }

    #[test]
    fn explicit_dir_is_the_only_one_searched() {
        let dir = PathBuf::from("/nowhere/bin");
        assert_eq!(search_dirs(Some(&dir)), vec![dir]);
    }

    #[test]
    fn finds_executables_only() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = tmp.path().join("control-plane");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        let plain = tmp.path().join("data-plane");
        std::fs::write(&plain, "not executable").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();

        let dirs = vec![PathBuf::from("/nowhere"), tmp.path().to_path_buf()];
        assert_eq!(find_binary("control-plane", &dirs).unwrap(), exe);
        let err = find_binary("data-plane", &dirs).unwrap_err().to_string();
        assert!(err.contains("`data-plane` not found"), "{err}");
        assert!(err.contains("/nowhere"), "{err}");
    }

    #[test]
    fn which_finds_sh() {
        assert!(which("sh").is_some());
        assert!(which("surely-not-a-real-tool-name").is_none());
    }
}
