//! Pausing and resuming a whole process tree.
//!
//! Pause is top-down: the root first, so it cannot fork new workers, then its descendants, and the tree
//! is walked again until a walk finds nothing new to stop (a worker forked between walks is caught).
//! Resume is bottom-up: workers first, so the parent finds them running when it wakes. Processes that
//! were already stopped before the pause (a user's Ctrl-Z) are left as they were.

use std::path::Path;

use nix::sys::signal::Signal;

use std::os::fd::OwnedFd;

use super::signal::{SignalError, alive, send, send_pinned};
use crate::proc::{ProcRef, descendants, read_stat};

/// The most walks a pause makes before it settles for what it stopped.
const MAX_WALKS: usize = 8;

/// Stops the tree under `root_ref`. Returns the processes this call stopped, root first. With `pinned`
/// (the pidfd kept since attach) the root is checked and signalled through it.
pub fn stop_tree(
    root: &Path,
    root_ref: ProcRef,
    pinned: Option<&OwnedFd>,
) -> Result<Vec<ProcRef>, SignalError> {
    if let Some(fd) = pinned {
        if !alive(fd, root_ref.pid) {
            return Err(SignalError::Gone(root_ref.pid));
        }
    }
    let signal = |r: ProcRef, sig: Signal| match pinned {
        Some(fd) if r == root_ref => send_pinned(fd, r.pid, sig),
        _ => send(root, r, sig),
    };
    let mut stopped: Vec<ProcRef> = Vec::new();
    // The root first, through its pidfd, before any walk of /proc: a walk costs time in proportion to
    // the processes on the machine, and the root is the one that forks new workers and allocates most.
    if let Some(fd) = pinned {
        send_pinned(fd, root_ref.pid, Signal::SIGSTOP)?;
        stopped.push(root_ref);
    }
    for _ in 0..MAX_WALKS {
        let Some(tree) = descendants(root, root_ref.pid) else {
            return if stopped.is_empty() {
                Err(SignalError::Gone(root_ref.pid))
            } else {
                Ok(stopped)
            };
        };
        if tree.procs.first().map(|p| p.start_time) != Some(root_ref.start_time) {
            return if stopped.is_empty() {
                Err(SignalError::Gone(root_ref.pid))
            } else {
                Ok(stopped)
            };
        }
        let mut new = 0;
        for p in &tree.procs {
            let r = p.proc_ref();
            if stopped.contains(&r) || (p.is_stopped() && r != root_ref) {
                continue;
            }
            match signal(r, Signal::SIGSTOP) {
                Ok(()) => {
                    stopped.push(r);
                    new += 1;
                }
                // A worker that exits mid-walk is no failure; the root is.
                Err(SignalError::Gone(_)) if r != root_ref => {}
                Err(e) => {
                    // Undo: never leave half a tree stopped.
                    resume(root, &stopped, pinned);
                    return Err(e);
                }
            }
        }
        if new == 0 {
            break;
        }
    }
    Ok(stopped)
}

/// Continues the processes `stopped` names, children before parents. Returns those that are gone. The
/// first of `stopped` is the root: with `pinned` it is continued through that pidfd.
pub fn resume(root: &Path, stopped: &[ProcRef], pinned: Option<&OwnedFd>) -> Vec<ProcRef> {
    let mut gone = Vec::new();
    for (i, r) in stopped.iter().enumerate().rev() {
        let result = match pinned {
            Some(fd) if i == 0 => send_pinned(fd, r.pid, Signal::SIGCONT),
            _ => send(root, *r, Signal::SIGCONT),
        };
        if let Err(e) = result {
            tracing::debug!(pid = r.pid, error = %e, "could not continue a paused process");
            gone.push(*r);
        }
    }
    gone
}

/// Whether every process in `refs` that still exists is stopped (the pause has taken effect).
pub fn all_stopped(root: &Path, refs: &[ProcRef]) -> bool {
    refs.iter().all(|r| match read_stat(root, r.pid) {
        Ok(s) if s.start_time == r.start_time => s.is_stopped(),
        _ => true,
    })
}
