//! Hearing of the daemon's death before its descriptors close. A killed daemon keeps its
//! descriptors, the pipe's write end and the state lock among them, until its last thread has
//! exited, and a thread inside an uninterruptible call finishes it first: registering a v1 memory
//! threshold waits out an RCU grace period (about 11 ms here, longer on a busy machine), and the
//! daemon registers 20 of them after each resume, just when a job runs toward its line. So the
//! guardian also asks the kernel for a signal when the thread that started it exits
//! (`PR_SET_PDEATHSIG`): the daemon starts its guardians from a thread of their own that does
//! nothing else ([`spawner`]), asleep in an interruptible wait, so it dies as soon as the daemon is
//! killed. The guardian takes the signal for the daemon's death once the daemon's main thread is
//! dying (a SIGKILL pending for it, `PF_EXITING` in its flags, a zombie, or gone): a thread of a
//! live daemon ending is no death.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};

/// The signal the kernel sends the guardian when the thread that started it exits.
const SIGNAL: Signal = Signal::SIGUSR1;

/// `PF_EXITING` in a task's flags: set as it begins to exit.
const PF_EXITING: u64 = 0x4;

/// Set by the signal's handler.
static HEARD: AtomicBool = AtomicBool::new(false);

extern "C" fn heard(_: nix::libc::c_int) {
    HEARD.store(true, Ordering::SeqCst);
}

/// Asks for the signal, with a handler that interrupts the guardian's blocked read (no
/// `SA_RESTART`). Returns whether the daemon `daemon` had already gone when it was asked for.
pub fn listen(daemon: nix::unistd::Pid) -> bool {
    let action = SigAction::new(
        SigHandler::Handler(heard),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    let installed = unsafe { nix::sys::signal::sigaction(SIGNAL, &action) }.is_ok();
    if installed && let Err(e) = nix::sys::prctl::set_pdeathsig(SIGNAL) {
        tracing::debug!(error = %e, "no signal at the daemon's death: the guardian hears of it when its descriptors close");
    }
    nix::unistd::getppid() != daemon
}

/// Whether the signal came since the last call, and the daemon is dying or gone (looked at three
/// times, a millisecond apart: its main thread may be between taking its SIGKILL and exiting).
pub fn heard_of(daemon: u32) -> bool {
    if !HEARD.swap(false, Ordering::SeqCst) {
        return false;
    }
    for _ in 0..3 {
        if dying(daemon) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    tracing::debug!("a thread of the daemon ended, not the daemon");
    false
}

/// Whether the process `pid` (its main thread) is dying: killed, exiting, a zombie, or gone.
pub fn dying(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    exiting(&stat) || killed(&status)
}

/// Whether a `/proc/PID/status` shows a SIGKILL pending (every thread of a process being killed,
/// or exiting as a group, has one until it takes it).
fn killed(status: &str) -> bool {
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    status.lines().any(|l| {
        l.strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & SIGKILL_BIT != 0)
    })
}

/// Runs `start` (which starts a guardian) on the spawner: a thread that only starts guardians and
/// otherwise sleeps, started at the first call, at real-time `priority` where the kernel lets it
/// (as the reflexes' threads; 0: the daemon's policy). The guardian's death signal is tied to it,
/// and the guardian inherits its policy: both run the moment the daemon dies, ahead of a job that
/// keeps the CPUs busy. Where it cannot be started, `start` runs on the caller's thread. `None` if
/// the spawner died running it.
pub fn spawner<T: Send + 'static>(
    priority: u8,
    start: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    type Job = Box<dyn FnOnce() + Send>;
    static SPAWNER: std::sync::Mutex<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::Mutex::new(None);
    let (tx, rx) = std::sync::mpsc::sync_channel::<T>(1);
    let job: Job = Box::new(move || {
        let _ = tx.send(start());
    });
    let mut spawner = match SPAWNER.lock() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    };
    if spawner.is_none() {
        let (jobs, inbox) = std::sync::mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("guardian-parent".into())
            .spawn(move || {
                if let Err(e) = crate::wake::realtime(priority) {
                    tracing::debug!(error = %e, "the guardian runs at the daemon's priority");
                }
                while let Ok(job) = inbox.recv() {
                    job();
                }
            });
        if started.is_ok() {
            *spawner = Some(jobs);
        }
    }
    let job = match spawner.as_ref() {
        Some(jobs) => match jobs.send(job) {
            Ok(()) => None,
            Err(e) => Some(e.0),
        },
        None => Some(job),
    };
    drop(spawner);
    if let Some(job) = job {
        job();
    }
    rx.recv().ok()
}

/// Whether a `/proc/PID/stat` line is of a task that is exiting: a zombie, or `PF_EXITING` in its
/// flags (the sixth field after the state).
fn exiting(stat: &str) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("");
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

/// Waits until the pipe `input` has something to read or has ended (`true`: a read will not
/// block), or the signal came (`false`: [`heard_of`] says whether it is the daemon's death).
pub fn wait(input: &std::io::StdinLock<'_>) -> bool {
    use nix::poll::{PollFd, PollFlags};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(input.as_fd(), PollFlags::POLLIN)];
    // The signal is let in only for the wait, atomically.
    match nix::poll::ppoll(&mut fds, None, Some(SigSet::empty())) {
        Ok(n) if n > 0 => true,
        Ok(_) | Err(nix::errno::Errno::EINTR) => false,
        // A wait that cannot be made: a blocking read still hears the pipe's end.
        Err(_) => true,
    }
}

/// What is left in the pipe (`input`), read without waiting: whether it has ended, and the bytes.
pub fn drain(input: &mut std::io::StdinLock<'_>) -> (bool, Vec<u8>) {
    // The same open pipe as `input`, to set its flags while `input` reads.
    let Ok(fd) = std::os::fd::AsFd::as_fd(&std::io::stdin()).try_clone_to_owned() else {
        return (false, Vec::new());
    };
    let Ok(flags) = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL) else {
        return (false, Vec::new());
    };
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags);
    let set = |f| nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(f)).is_ok();
    if !set(flags | nix::fcntl::OFlag::O_NONBLOCK) {
        return (false, Vec::new());
    }
    let (mut ended, mut out, mut buf) = (false, Vec::new(), [0u8; 64]);
    loop {
        match input.read(&mut buf) {
            Ok(0) => {
                ended = true;
                break;
            }
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    set(flags);
    (ended, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A running daemon's main thread is no death; one exiting (`PF_EXITING`) or a zombie is.
    #[test]
    fn a_task_is_exiting_by_its_state_or_its_flags() {
        let running = "123 (memwatch) S 1 123 123 0 -1 4194560 100 0 0 0";
        let exiting_ = "123 (memwatch) R 1 123 123 0 -1 4194564 100 0 0 0";
        let zombie = "123 (mem watch)) Z 1 123 123 0 -1 4194560 100 0 0 0";
        assert!(!exiting(running));
        assert!(exiting(exiting_));
        assert!(exiting(zombie));
        assert!(!exiting("garbage"));
        assert!(killed(
            "Name:\tmemwatch\nSigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n"
        ));
        assert!(!killed(
            "SigPnd:\t0000000000000000\nShdPnd:\t0000000000004000\n"
        ));
        let me = std::process::id();
        assert!(!dying(me), "this test's own process is alive");
        assert!(dying(u32::MAX), "no such process");
    }
}
