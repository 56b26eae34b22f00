//! Tools devstack needs from the machine, and how to get them (docs/devstack.md:
//! install on Debian/Ubuntu as root, otherwise print the exact command).

use std::process::{Command, Stdio};

use crate::binaries::which;
use crate::error::StackError;
use crate::sys;

/// The Linux distribution family, from `/etc/os-release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distro {
    /// Debian, Ubuntu and derivatives (apt).
    Debian,
    /// Fedora, RHEL, CentOS, Rocky, Alma (dnf).
    Fedora,
    /// Arch (pacman).
    Arch,
    /// Alpine (apk).
    Alpine,
    /// Anything else.
    Other,
}

impl Distro {
    /// Reads `/etc/os-release`.
    pub fn detect() -> Self {
        std::fs::read_to_string("/etc/os-release")
            .map(|text| Self::from_os_release(&text))
            .unwrap_or(Distro::Other)
    }

    /// Classifies an os-release document by its `ID` and `ID_LIKE`.
    pub fn from_os_release(text: &str) -> Self {
        let ids: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("ID=").or_else(|| l.strip_prefix("ID_LIKE=")))
            .flat_map(|v| {
                v.trim_matches('"')
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        let has = |name: &str| ids.iter().any(|id| id == name);
        if has("debian") || has("ubuntu") {
            Distro::Debian
        } else if has("fedora") || has("rhel") || has("centos") {
            Distro::Fedora
        } else if has("arch") {
            Distro::Arch
        } else if has("alpine") {
            Distro::Alpine
        } else {
            Distro::Other
        }
    }
}

/// The exact command that installs `redis-server` here.
pub fn redis_install_hint() -> String {
    redis_install_command(Distro::detect(), sys::is_root())
}

/// The install command for a distribution, with `sudo` unless root.
pub fn redis_install_command(distro: Distro, root: bool) -> String {
    let sudo = if root { "" } else { "sudo " };
    match distro {
        Distro::Debian => format!("{sudo}apt-get update && {sudo}apt-get install -y redis-server"),
        Distro::Fedora => format!("{sudo}dnf install -y redis"),
        Distro::Arch => format!("{sudo}pacman -S --noconfirm redis"),
        Distro::Alpine => format!("{sudo}apk add redis"),
        Distro::Other => "install Redis 6 or newer so that `redis-server` is on PATH".to_owned(),
    }
}

/// Makes sure `redis-server` is on PATH: installs it with apt when running
/// as root on Debian or Ubuntu (saying so on stderr), otherwise fails with
/// the exact command to run.
pub fn ensure_redis() -> Result<(), StackError> {
    if which("redis-server").is_some() {
        return Ok(());
    }
    let distro = Distro::detect();
    if distro != Distro::Debian || !sys::is_root() {
        return Err(StackError::ToolMissing {
            tool: "redis-server".into(),
            install: redis_install_command(distro, sys::is_root()),
        });
    }
    eprintln!(
        "devstack: redis-server is not installed; running `apt-get update && apt-get install -y redis-server`"
    );
    for args in [&["update"][..], &["install", "-y", "redis-server"][..]] {
        let shown = format!("apt-get {}", args.join(" "));
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            // apt's progress goes to stderr so a --json stdout stays one line.
            .stdout(std::io::stderr())
            .status()
            .map_err(StackError::io(format!("running `{shown}`")))?;
        if !status.success() {
            return Err(StackError::Command {
                command: shown,
                status: status.to_string(),
                output: "see the apt output above".into(),
            });
        }
    }
    if which("redis-server").is_none() {
        return Err(StackError::ToolMissing {
            tool: "redis-server".into(),
            install: redis_install_command(distro, true),
        });
    }
    eprintln!("devstack: redis-server installed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_distributions() {
        assert_eq!(
            Distro::from_os_release("NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\n"),
            Distro::Debian
        );
        assert_eq!(Distro::from_os_release("ID=debian\n"), Distro::Debian);
        assert_eq!(
            Distro::from_os_release("ID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\n"),
            Distro::Fedora
        );
        assert_eq!(Distro::from_os_release("ID=alpine\n"), Distro::Alpine);
        assert_eq!(Distro::from_os_release("ID=nixos\n"), Distro::Other);
    }

    #[test]
    fn install_commands_are_exact() {
        assert_eq!(
            redis_install_command(Distro::Debian, false),
            "sudo apt-get update && sudo apt-get install -y redis-server"
        );
        assert_eq!(
            redis_install_command(Distro::Debian, true),
            "apt-get update && apt-get install -y redis-server"
        );
        assert_eq!(
            redis_install_command(Distro::Fedora, false),
            "sudo dnf install -y redis"
        );
    }
}
