//! One child process: how to start it (again), where it logs, how it is
//! known to be ready.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

use crate::error::StackError;
use crate::sys;

/// How devstack knows a process is ready.
#[derive(Debug, Clone)]
pub(crate) enum Readiness {
    /// `GET url` answers 200.
    Http(String),
    /// Redis answers `PING` (over TLS and with the password, when it has them).
    Redis(gateway_redis::RedisTarget),
    /// `grpc.health.v1.Health/Check("")` at this URL is SERVING.
    GrpcHealth(String),
}

/// Everything needed to (re)start one process.
#[derive(Debug, Clone)]
pub(crate) struct ProcessSpec {
    /// Its name in the stack ("control-plane", "data-plane-1", …).
    pub name: String,
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Environment variables not to inherit.
    pub env_remove: Vec<String>,
    /// Its log file (stdout and stderr, appended across restarts).
    pub log: PathBuf,
    /// How to tell it is ready.
    pub readiness: Readiness,
}

impl ProcessSpec {
    /// Starts the process: its own process group (so a Ctrl-C in devstack's
    /// terminal reaches devstack alone, which then stops children in order),
    /// killed if devstack dies, output appended to its log file.
    pub(crate) fn spawn(&self) -> Result<Child, StackError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(StackError::io(format!("opening {}", self.log.display())))?;
        let _ = writeln!(
            log,
            "---- devstack: starting {} {} ----",
            self.program.display(),
            self.args.join(" ")
        );
        let stderr = log
            .try_clone()
            .map_err(StackError::io(format!("opening {}", self.log.display())))?;

        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true);
        for key in &self.env_remove {
            command.env_remove(key);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        sys::kill_when_parent_dies(&mut command);
        command.spawn().map_err(|source| StackError::Spawn {
            name: self.name.clone(),
            program: self.program.clone(),
            source,
        })
    }
}

/// At most the last `lines` lines of a log file (reads only its tail).
pub fn log_tail(path: &Path, lines: usize) -> String {
    const MAX_TAIL_BYTES: u64 = 64 * 1024;
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::from("(no log)");
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(MAX_TAIL_BYTES);
    let mut buf = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut buf).is_err() {
        return String::from("(unreadable log)");
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        assert_eq!(log_tail(&path, 3), "line 98\nline 99\nline 100");
        assert_eq!(log_tail(&tmp.path().join("missing.log"), 3), "(no log)");
    }

    #[tokio::test]
    async fn spawned_child_logs_to_its_file() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = ProcessSpec {
            name: "echo".into(),
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "echo out; echo err >&2; echo $DEVSTACK_T".into(),
            ],
            env: vec![("DEVSTACK_T".into(), "env-ok".into())],
            env_remove: vec![],
            log: tmp.path().join("echo.log"),
            readiness: Readiness::Http("http://unused".into()),
        };
        let status = spec.spawn().unwrap().wait().await.unwrap();
        assert!(status.success());
        let log = std::fs::read_to_string(&spec.log).unwrap();
        assert!(log.contains("---- devstack: starting /bin/sh"));
        assert!(log.contains("out\n") && log.contains("err\n") && log.contains("env-ok"));
    }
}
