//! The few operating-system calls `std` and tokio do not offer: a parent-death
//! signal for children, a signal to a pid, and the effective uid.
//!
//! This is the only module allowed `unsafe`; each block is one libc call
//! with its contract written next to it.
#![allow(unsafe_code)]

use std::io;

use tokio::process::Command;

/// Makes the kernel SIGKILL the child when the thread that spawned it dies,
/// which covers devstack itself being SIGKILLed (nothing else can run then).
/// If devstack already died between `fork` and this call, the child exits
/// instead of running as an orphan.
pub(crate) fn kill_when_parent_dies(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid), allocating nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                return Err(io::Error::other("devstack exited before the child started"));
            }
            Ok(())
        });
    }
}

/// A signal devstack sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGTERM: stop cleanly.
    Terminate,
    /// SIGSTOP: freeze.
    Stop,
    /// SIGCONT: go on after SIGSTOP.
    Continue,
}

/// Sends SIGTERM to process `pid`. A process that is already gone is not an error.
pub(crate) fn send_sigterm(pid: u32) -> io::Result<()> {
    send_signal(pid, Signal::Terminate)
}

/// Sends `signal` to process `pid`. A process that is already gone is not an error.
pub(crate) fn send_signal(pid: u32, signal: Signal) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let signal = match signal {
        Signal::Terminate => libc::SIGTERM,
        Signal::Stop => libc::SIGSTOP,
        Signal::Continue => libc::SIGCONT,
    };
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// Whether devstack runs as root (and so may install packages).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
