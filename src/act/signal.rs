//! Signals that cannot hit the wrong process: `pidfd_open`, a check through /proc that the process is
//! still the one attached (its start time), then `pidfd_send_signal` on that descriptor.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::sys::signal::Signal;

use crate::proc::{ProcRef, read_stat};

/// Why a signal was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    #[error("process {0} is gone (exited, or its pid now belongs to another process)")]
    Gone(u32),
    #[error("not permitted to signal process {0}")]
    Denied(u32),
    #[error("signalling process {pid} failed: {reason}")]
    Other { pid: u32, reason: String },
}

/// Whether a process of user `owner` could signal process `pid` itself, by kill(2)'s rule for an
/// unprivileged sender: its uid is the target's real or saved uid. Root (`owner` 0) may signal any
/// process; a process that became root (sudo, su, a set-uid program that called setresuid) is out of
/// its user's reach, so memwatch never signals or freezes it on that user's behalf. A process whose
/// uids cannot be read is out of reach too.
pub fn owner_may_signal(root: &Path, pid: u32, owner: u32) -> bool {
    owner == 0
        || crate::proc::read_status(root, pid)
            .is_ok_and(|s| s.uids[0] == owner || s.uids[2] == owner)
}

/// Parses "SIGUSR1", "USR1" or a number.
pub fn signal_by_name(name: &str) -> Option<Signal> {
    if let Ok(n) = name.parse::<i32>() {
        return Signal::try_from(n).ok();
    }
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse::<Signal>().ok()
}

fn errno() -> nix::errno::Errno {
    nix::errno::Errno::last()
}

/// Opens a pidfd for `pid`; `None` where the kernel has no pidfd_open (before 5.3).
pub(crate) fn pidfd_open(pid: u32) -> Result<Option<OwnedFd>, SignalError> {
    // SAFETY: plain syscall with integer arguments; a non-negative return is a new fd we own.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as nix::libc::pid_t, 0) };
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor to us.
        return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }));
    }
    match errno() {
        nix::errno::Errno::ENOSYS => Ok(None),
        nix::errno::Errno::ESRCH => Err(SignalError::Gone(pid)),
        e => Err(SignalError::Other {
            pid,
            reason: e.to_string(),
        }),
    }
}

/// Opens a pidfd on `target` and checks it is that process (its start time): the handle a job keeps
/// from attach on, so that its root can never be confused with a later process with the same pid — not
/// even one started within the same clock tick, which start times cannot tell apart.
pub fn open(root: &Path, target: ProcRef) -> Result<Option<std::sync::Arc<OwnedFd>>, SignalError> {
    let fd = pidfd_open(target.pid)?;
    match read_stat(root, target.pid) {
        Ok(s) if s.start_time == target.start_time && s.state != 'Z' => {
            Ok(fd.map(std::sync::Arc::new))
        }
        _ => Err(SignalError::Gone(target.pid)),
    }
}

fn pidfd_signal(fd: &OwnedFd, pid: u32, sig: Option<Signal>) -> Result<(), SignalError> {
    // SAFETY: a valid pidfd, a valid signal number (0 probes), no siginfo.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig.map_or(0, |s| s as i32),
            std::ptr::null::<nix::libc::siginfo_t>(),
            0u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(errno_error(pid))
    }
}

/// Sends `sig` through a pidfd kept since attach: to that very process, or to nobody.
pub fn send_pinned(fd: &OwnedFd, pid: u32, sig: Signal) -> Result<(), SignalError> {
    pidfd_signal(fd, pid, Some(sig))
}

/// Whether the process a kept pidfd refers to still exists (it may be a zombie).
pub fn alive(fd: &OwnedFd, pid: u32) -> bool {
    pidfd_signal(fd, pid, None).is_ok()
}

/// Sends `sig` to exactly the process `target` names, or to nobody.
pub fn send(root: &Path, target: ProcRef, sig: Signal) -> Result<(), SignalError> {
    let pid = target.pid;
    let fd = pidfd_open(pid)?;
    // The descriptor now pins whichever process had the pid when it was opened; that process is ours
    // only if the pid still shows our start time (ours started before the descriptor was opened).
    match read_stat(root, pid) {
        Ok(s) if s.start_time == target.start_time && s.state != 'Z' => {}
        _ => return Err(SignalError::Gone(pid)),
    }
    match &fd {
        Some(fd) => pidfd_signal(fd, pid, Some(sig)),
        // Kernels before 5.3: the start-time check above narrows the race to microseconds.
        None => {
            // SAFETY: plain kill(2) with a checked pid and a valid signal.
            if unsafe { nix::libc::kill(pid as nix::libc::pid_t, sig as i32) } == 0 {
                Ok(())
            } else {
                Err(errno_error(pid))
            }
        }
    }
}

/// The error for the errno a failed signal call left.
fn errno_error(pid: u32) -> SignalError {
    match errno() {
        nix::errno::Errno::ESRCH => SignalError::Gone(pid),
        nix::errno::Errno::EPERM => SignalError::Denied(pid),
        e => SignalError::Other {
            pid,
            reason: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_kept_pidfd_outlives_its_pid() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let r = read_stat(Path::new("/"), pid).unwrap().proc_ref();
        let fd = open(Path::new("/"), r)
            .unwrap()
            .expect("pidfd_open (Linux 5.3+)");
        assert!(alive(&fd, pid));
        child.kill().unwrap();
        child.wait().unwrap();
        // Whatever process gets this pid next, the descriptor still names the dead one.
        assert!(!alive(&fd, pid));
        assert_eq!(
            send_pinned(&fd, pid, Signal::SIGSTOP),
            Err(SignalError::Gone(pid))
        );
    }

    #[test]
    fn names() {
        assert_eq!(signal_by_name("SIGUSR1"), Some(Signal::SIGUSR1));
        assert_eq!(signal_by_name("usr2"), Some(Signal::SIGUSR2));
        assert_eq!(signal_by_name("10"), Some(Signal::SIGUSR1));
        assert_eq!(signal_by_name("SIGNOPE"), None);
    }

    #[test]
    fn a_wrong_start_time_is_never_signalled() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let real = read_stat(Path::new("/"), pid).unwrap().proc_ref();
        let impostor = ProcRef {
            pid,
            start_time: real.start_time + 1,
        };
        assert_eq!(
            send(Path::new("/"), impostor, Signal::SIGKILL),
            Err(SignalError::Gone(pid))
        );
        assert_eq!(child.try_wait().unwrap(), None, "the process was signalled");
        send(Path::new("/"), real, Signal::SIGKILL).unwrap();
        child.wait().unwrap();
        assert_eq!(
            send(Path::new("/"), real, Signal::SIGKILL),
            Err(SignalError::Gone(pid))
        );
    }
}
