//! Signals that cannot hit the wrong process: `pidfd_open`, a check through /proc that the process is
//! still the one attached (its start time), then `pidfd_send_signal` on that descriptor.

use std::os::fd::OwnedFd;
use std::path::Path;

use nix::sys::signal::Signal;

use crate::proc::{ProcRef, read_stat};
use memwatch_core::seam::may_signal;

pub use memwatch_core::seam::SignalError;

/// The signal a configuration names ("SIGUSR1", "usr1", "10"), as nix's [`Signal`]: memwatch-core's
/// table ([`SignalName`](crate::config::SignalName)) gives the number, nix the signal.
pub fn signal_by_name(name: &str) -> Option<Signal> {
    let s = crate::config::SignalName::parse(name)?;
    Signal::try_from(s.number()).ok()
}

/// Whether a process of user `owner` could signal process `pid` itself, by kill(2)'s rule for an
/// unprivileged sender: its uid is the target's real or saved uid. Root (`owner` 0) may signal any
/// process; a process that became root (sudo, su, a set-uid program that called setresuid) is out of
/// its user's reach, so memwatch never signals or freezes it on that user's behalf. A process whose
/// uids cannot be read is out of reach too.
pub fn owner_may_signal(root: &Path, pid: u32, owner: u32) -> bool {
    owner == 0 || crate::proc::read_status(root, pid).is_ok_and(|s| may_signal(&s, owner))
}

/// Whether a freeze of a cgroup holding `pid` is within `owner`'s reach for that process: root,
/// its own process ([`owner_may_signal`]), or one that exited since the cgroup's members were read
/// (nothing is left of it to freeze).
pub fn owner_may_freeze(root: &Path, pid: u32, owner: u32) -> bool {
    owner == 0
        || match crate::proc::read_status(root, pid) {
            Ok(s) => may_signal(&s, owner),
            Err(e) => e.is_gone(),
        }
}

/// Whether a freeze of a cgroup holding `pids` is within `owner`'s reach for every one of them
/// ([`owner_may_freeze`]): asked of the kernel with the owner's uids
/// ([`all_within_reach`](super::as_owner::all_within_reach)) where the processes are this machine's
/// (`root` is "/"), else read from each one's status.
pub fn all_may_freeze(root: &Path, pids: &[u32], owner: u32) -> bool {
    let kernel = (owner != 0 && root == Path::new("/"))
        .then(|| super::as_owner::all_within_reach(owner, pids))
        .flatten();
    kernel.unwrap_or_else(|| pids.iter().all(|&p| owner_may_freeze(root, p, owner)))
}

/// nix's signal for the core's name (every standard signal has one).
pub fn nix_signal(sig: crate::config::SignalName, pid: u32) -> Result<Signal, SignalError> {
    Signal::try_from(sig.number()).map_err(|e| SignalError::Other {
        pid,
        reason: format!("{sig}: {e}"),
    })
}

/// rustix's pid for ours (`None` for 0 or one beyond `i32`).
fn rustix_pid(pid: u32) -> Option<rustix::process::Pid> {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
}

/// rustix's signal for nix's.
fn rustix_signal(sig: Signal) -> Option<rustix::process::Signal> {
    rustix::process::Signal::from_named_raw(sig as i32)
}

/// The error for a failed signal call's errno.
fn error_of(e: rustix::io::Errno, pid: u32) -> SignalError {
    match e {
        rustix::io::Errno::SRCH => SignalError::Gone(pid),
        rustix::io::Errno::PERM => SignalError::Denied(pid),
        e => SignalError::Other {
            pid,
            reason: e.to_string(),
        },
    }
}

/// Opens a pidfd for `pid`; `None` where the kernel has no pidfd_open (before 5.3).
pub(crate) fn pidfd_open(pid: u32) -> Result<Option<OwnedFd>, SignalError> {
    let Some(p) = rustix_pid(pid) else {
        return Err(SignalError::Gone(pid));
    };
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOSYS) => Ok(None),
        Err(e) => Err(error_of(e, pid)),
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

fn pidfd_signal(fd: &OwnedFd, pid: u32, sig: Signal) -> Result<(), SignalError> {
    let sig = rustix_signal(sig).ok_or_else(|| SignalError::Other {
        pid,
        reason: format!("{sig} has no number here"),
    })?;
    rustix::process::pidfd_send_signal(fd, sig).map_err(|e| error_of(e, pid))
}

/// Sends `sig` through a pidfd kept since attach: to that very process, or to nobody.
pub fn send_pinned(fd: &OwnedFd, pid: u32, sig: Signal) -> Result<(), SignalError> {
    pidfd_signal(fd, pid, sig)
}

/// Whether the process a kept pidfd refers to has not exited: a pidfd turns readable when its process
/// exits (a zombie has exited). `pid` names it in logs only.
pub fn alive(fd: &OwnedFd, pid: u32) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&now)) {
        Ok(n) => n == 0,
        Err(e) => {
            tracing::debug!(pid, error = %e, "cannot poll a pidfd; taking the process as alive");
            true
        }
    }
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
        Some(fd) => pidfd_signal(fd, pid, sig),
        // Kernels before 5.3: the start-time check above narrows the race to microseconds.
        None => match (rustix_pid(pid), rustix_signal(sig)) {
            (Some(p), Some(s)) => rustix::process::kill_process(p, s).map_err(|e| error_of(e, pid)),
            _ => Err(SignalError::Gone(pid)),
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
        // Exited but not reaped yet: a zombie is not alive.
        let exited = (0..2000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            read_stat(Path::new("/"), pid).is_ok_and(|s| s.state == 'Z')
        });
        assert!(exited, "the child never became a zombie");
        assert!(!alive(&fd, pid), "a zombie has exited");
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

    /// memwatch-core's table of names and numbers is nix's (the C library's) on this architecture:
    /// every signal nix knows has the same number under its name in the table, and back.
    #[test]
    fn the_cores_signal_table_is_nixs() {
        use crate::config::SignalName;
        let mut seen = 0;
        for sig in Signal::iterator() {
            let core = SignalName::parse(sig.as_str())
                .unwrap_or_else(|| panic!("{sig} is not in memwatch-core's table"));
            assert_eq!(core.number(), sig as i32, "{sig}");
            assert_eq!(core.name(), sig.as_str());
            seen += 1;
        }
        assert_eq!(seen, SignalName::all().count());
        for s in SignalName::all() {
            assert_eq!(signal_by_name(s.name()).map(|x| x as i32), Some(s.number()));
        }
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
