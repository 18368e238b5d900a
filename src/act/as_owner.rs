//! Signals sent with the job owner's uids, so that the kernel's own kill(2) check decides whether
//! the owner could send them: no read of the target's status first, and no window between a check
//! and the signal in which the target could change its uids.
//!
//! Only the calling thread changes: on Linux uids are per thread, and the raw `setresuid` call
//! (rustix's `set_thread_res_uid`, not the C library's, which changes every thread of the process)
//! leaves the daemon's other threads as they are. The thread keeps root as its saved uid, so it can
//! come back, and gets back its capabilities exactly as they were.

use rustix::process::Uid;
use rustix::thread::{CapabilitySet, CapabilitySets, capabilities, set_capabilities};

/// While alive, this thread's real and effective uids are the owner's: a signal it sends reaches
/// exactly the processes that owner could signal itself (their real or saved uid is the owner's).
/// Dropping it makes the thread root again, with the capabilities it had.
#[must_use]
pub struct AsOwner {
    caps: CapabilitySets,
}

impl AsOwner {
    /// Takes user `owner`'s uids on this thread; `None` when the check stays memwatch's own: for
    /// root's jobs (nothing to check), a daemon not running as root, a thread that may not change
    /// its uids (no `CAP_SETUID`), or one that would keep `CAP_KILL` (which skips the kernel's check)
    /// after the change.
    pub fn take(owner: u32) -> Option<AsOwner> {
        if owner == 0 || !rustix::process::geteuid().is_root() {
            return None;
        }
        let caps = capabilities(None).ok()?;
        let owner = Uid::from_raw(owner);
        rustix::thread::set_thread_res_uid(owner, owner, None).ok()?;
        let taken = AsOwner { caps };
        // Leaving uid 0 clears the effective capabilities, unless the process set
        // SECBIT_NO_SETUID_FIXUP: then CAP_KILL would let any signal through.
        match capabilities(None) {
            Ok(now) if !now.effective.contains(CapabilitySet::KILL) => Some(taken),
            _ => None,
        }
    }
}

/// Whether user `owner` could signal every one of `pids` now, asked of the kernel (kill(2) with
/// signal 0, which checks and sends nothing) with the owner's uids on this thread; one that is gone
/// counts as within reach (nothing is left of it to freeze). `None` where the uids cannot be taken:
/// the caller reads each one's uids instead. For the machine's own processes only, not a fixture
/// root's.
pub fn all_within_reach(owner: u32, pids: &[u32]) -> Option<bool> {
    let _as = AsOwner::take(owner)?;
    Some(pids.iter().all(|&pid| {
        let Some(p) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        else {
            return false;
        };
        match rustix::process::test_kill_process(p) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => true,
            Err(_) => false,
        }
    }))
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        let root = Uid::ROOT;
        // Root is the saved uid, so taking it back is always allowed; a thread that could not would
        // carry on with a user's rights where the daemon counts on root's. Better the guardian and a
        // restart than that.
        if let Err(e) = rustix::thread::set_thread_res_uid(root, root, root) {
            eprintln!(
                "memwatch: cannot take back root's uid on a thread that signalled as a user: {e}"
            );
            std::process::abort();
        }
        if let Err(e) = set_capabilities(None, self.caps) {
            tracing::warn!(error = %e, "could not restore a thread's capabilities after signalling as a user");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn state(pid: u32) -> char {
        crate::proc::read_stat(std::path::Path::new("/"), pid)
            .unwrap()
            .state
    }

    /// A signal sent while the owner's uids are taken reaches the owner's process and is refused
    /// for root's, by the kernel; after the drop the thread is root again, with its capabilities.
    #[test]
    fn the_kernel_decides_what_the_owner_may_signal_and_root_comes_back() {
        if !rustix::process::geteuid().is_root() {
            crate::test_skip::cannot_run(
                "the_kernel_decides_what_the_owner_may_signal",
                "needs root",
            );
            return;
        }
        let uid = 65534;
        let mut users = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sleep",
                "60",
            ])
            .spawn()
            .unwrap();
        let mut roots = Command::new("sleep").arg("60").spawn().unwrap();
        // Wait for setpriv's exec: until then the child is still root's.
        let dropped = (0..5000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            crate::proc::read_status(std::path::Path::new("/"), users.id())
                .is_ok_and(|s| s.uids[0] == uid)
        });
        assert!(dropped, "setpriv never took the user's uid");
        let (u, r) = (users.id(), roots.id());
        // Root's sleep asleep before any signal: a fresh child runs ('R') until it reaches its
        // sleep, and only a sleeper's state says afterwards that no signal stopped it.
        let asleep = (0..5000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            state(r) == 'S'
        });
        assert!(asleep, "root's sleep never went to sleep");
        std::thread::spawn(move || {
            let before = capabilities(None).unwrap();
            {
                let _as = AsOwner::take(uid).expect("root may take a user's uids");
                assert_eq!(
                    rustix::thread::capabilities(None).unwrap().effective,
                    CapabilitySet::empty()
                );
                let kill = |pid: u32| {
                    rustix::process::kill_process(
                        rustix::process::Pid::from_raw(pid as i32).unwrap(),
                        rustix::process::Signal::STOP,
                    )
                };
                assert_eq!(kill(u), Ok(()));
                assert_eq!(kill(r), Err(rustix::io::Errno::PERM));
            }
            assert!(rustix::process::geteuid().is_root());
            assert_eq!(all_within_reach(uid, &[u]), Some(true));
            assert_eq!(all_within_reach(uid, &[u, r]), Some(false));
            // A pid no process has (beyond pid_max) is gone: nothing of it to freeze.
            assert_eq!(all_within_reach(uid, &[u, 1 << 30]), Some(true));
            assert!(rustix::process::geteuid().is_root());
            assert_eq!(capabilities(None).unwrap(), before);
        })
        .join()
        .unwrap();
        let stopped = (0..5000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            state(u) == 'T'
        });
        assert!(stopped, "the owner's process was not stopped");
        assert_eq!(state(r), 'S', "root's process was stopped");
        // This thread never changed.
        assert!(rustix::process::geteuid().is_root());
        users.kill().unwrap();
        roots.kill().unwrap();
        users.wait().unwrap();
        roots.wait().unwrap();
        assert_eq!(
            AsOwner::take(0).map(|_| ()),
            None,
            "root's job needs no switch"
        );
    }
}
