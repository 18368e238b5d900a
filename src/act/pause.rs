//! Pausing and resuming a whole process tree.
//!
//! Pause is top-down: the root first (through its pidfd, before any walk), so it cannot fork new
//! workers, then its descendants, and the tree is walked again until a walk finds nothing new to stop
//! (a worker forked between walks is caught).
//! Resume is bottom-up: workers first, so the parent finds them running when it wakes. Processes that
//! were already stopped before the pause (a user's Ctrl-Z) are left as they were.

use std::path::Path;

use nix::sys::signal::Signal;

use std::os::fd::OwnedFd;

use std::collections::{HashMap, HashSet};

use super::signal::{SignalError, alive, owner_may_signal, pidfd_open, send, send_pinned};
use crate::proc::{ProcRef, children_files, parent_map, read_stat};

/// The most walks a pause makes before it settles for what it stopped.
const MAX_WALKS: usize = 8;

/// Stops the tree under `root_ref` on behalf of user `owner`. Returns the processes this call stopped,
/// root first. With `pinned` (the pidfd kept since attach) the root is checked and signalled through
/// it. Only processes the owner could signal themselves are stopped ([`owner_may_signal`], checked on
/// the pinned process just before its signal): a root that is out of reach refuses the pause, a
/// descendant out of reach (a `sudo` child) is left running and its own children are still walked.
///
/// The root is stopped first, before any walk. Each child found in the walk gets a pidfd *before* its
/// stat is read, so one read of /proc/PID/stat both identifies it (its parent is the process whose
/// children list named it) and pins it: a pid recycled after the pidfd was opened makes the signal
/// fail with "gone", never hit the newcomer. Then the tree is walked again, reading only children
/// lists, until a walk finds nothing new (a worker forked between walks is caught).
pub fn stop_tree(
    root: &Path,
    root_ref: ProcRef,
    pinned: Option<&OwnedFd>,
    owner: u32,
) -> Result<Vec<ProcRef>, SignalError> {
    if !owner_may_signal(root, root_ref.pid, owner) {
        return Err(SignalError::Denied(root_ref.pid));
    }
    match pinned {
        Some(fd) => {
            if !alive(fd, root_ref.pid) {
                return Err(SignalError::Gone(root_ref.pid));
            }
            send_pinned(fd, root_ref.pid, Signal::SIGSTOP)?;
        }
        None => send(root, root_ref, Signal::SIGSTOP)?,
    }
    let mut stopped: Vec<ProcRef> = vec![root_ref];
    let mut known: HashSet<u32> = HashSet::from([root_ref.pid]);
    let mut fallback: Option<HashMap<u32, Vec<u32>>> = None;
    for _ in 0..MAX_WALKS {
        let mut new = 0;
        let mut queue = vec![root_ref.pid];
        let mut visited: HashSet<u32> = HashSet::from([root_ref.pid]);
        let mut i = 0;
        while i < queue.len() {
            let parent = queue[i];
            i += 1;
            let kids = match children_files(root, parent) {
                Some(k) => k,
                None => fallback
                    .get_or_insert_with(|| parent_map(root))
                    .get(&parent)
                    .cloned()
                    .unwrap_or_default(),
            };
            for kid in kids {
                if !visited.insert(kid) {
                    continue;
                }
                queue.push(kid);
                if known.contains(&kid) {
                    continue;
                }
                match stop_child(root, kid, parent, owner) {
                    Ok(Some(r)) => {
                        stopped.push(r);
                        known.insert(kid);
                        new += 1;
                    }
                    Ok(None) => {
                        known.insert(kid);
                    }
                    Err(e) => {
                        // Undo: never leave half a tree stopped.
                        resume(root, &stopped, pinned);
                        return Err(e);
                    }
                }
            }
        }
        if new == 0 {
            break;
        }
    }
    Ok(stopped)
}

/// Stops `pid` if it is a running child of `parent` that `owner` could signal. `Ok(None)`: gone, no
/// longer that parent's child, already stopped by someone else (a user's Ctrl-Z stays theirs to
/// undo), or out of the owner's reach.
fn stop_child(
    root: &Path,
    pid: u32,
    parent: u32,
    owner: u32,
) -> Result<Option<ProcRef>, SignalError> {
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(SignalError::Gone(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Ok(s) = read_stat(root, pid) else {
        return Ok(None);
    };
    if s.ppid != parent || s.state == 'Z' || s.is_stopped() {
        return Ok(None);
    }
    // Read after the pidfd pinned the process: these are its uids, not a newcomer's.
    if !owner_may_signal(root, pid, owner) {
        tracing::warn!(
            pid,
            owner,
            "left a process of the job running: its user could not signal it (it runs as another user)"
        );
        return Ok(None);
    }
    let r = s.proc_ref();
    let sent = match &fd {
        Some(fd) => send_pinned(fd, pid, Signal::SIGSTOP),
        None => send(root, r, Signal::SIGSTOP),
    };
    match sent {
        Ok(()) => Ok(Some(r)),
        Err(SignalError::Gone(_)) => Ok(None),
        Err(e) => Err(e),
    }
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
