//! Pinning a job's processes at each walk of its tree ([`Pinned`], `proc::pinned`): a pidfd per
//! process, opened before the stat read that says it is its parent's child, kept while it lives. A
//! pause by signals stops them through these at once, before it reads anything
//! (`act::pause::stop_tree`). The descriptors are bounded: at most [`MAX_PINNED`] per job, and a
//! quarter of the daemon's descriptor limit over every job ([`pin_limit`]).

use std::collections::HashMap;
use std::path::Path;

use super::signal::{alive, pidfd_open};
pub use crate::proc::pinned::Pinned;
use crate::proc::{pinned, read_stat};

/// The most processes of one job kept pinned ([`pin_members`]).
pub const MAX_PINNED: usize = 4096;

/// Raises this process's soft limit on open descriptors to its hard limit: each pinned process takes
/// one (systemd starts a service at 1 024 soft, 524 288 hard). A failure leaves the limit as it was.
pub fn raise_nofile() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "cannot raise the limit on open descriptors");
        }
    }
}

/// How many processes may be pinned at once, over every job: a quarter of the descriptors this
/// process may open, so that connections, files and the kernel's notifications keep the rest (the
/// unit's `LimitNOFILE=8192`: 2 048).
pub fn pin_limit() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    soft.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX))
}

/// Pins the processes of a tree just walked, `walked` as (pid, parent) pairs below the root (which
/// the job pins itself), at most `limit` of them: those `before` pinned that are still alive keep
/// their descriptor, each other gets one if it is still its parent's child, running or sleeping (one
/// a user stopped by hand is left to the pause's walk, which leaves it as it is), while fewer than
/// [`pin_limit`] descriptors are open for pins over every job. Empty where the kernel has no pidfds.
pub fn pin_members(
    root: &Path,
    walked: &[(u32, u32)],
    before: &[Pinned],
    limit: usize,
) -> Vec<Pinned> {
    let kept: HashMap<u32, &Pinned> = before.iter().map(|p| (p.proc.pid, p)).collect();
    let budget = pin_limit();
    let mut out = Vec::with_capacity(walked.len().min(limit));
    for &(pid, parent) in walked {
        if out.len() >= limit {
            break;
        }
        // A live process keeps its pid: the descriptor still names the process at that pid.
        if let Some(p) = kept.get(&pid).filter(|p| alive(p.fd(), pid)) {
            out.push((*p).clone());
            continue;
        }
        if pinned::open_now() >= budget {
            continue;
        }
        let fd = match pidfd_open(pid) {
            Ok(Some(fd)) => fd,
            Ok(None) => return Vec::new(),
            Err(_) => continue,
        };
        match read_stat(root, pid) {
            Ok(s) if s.ppid == parent && !s.is_stopped() && s.state != 'Z' => {
                out.push(Pinned::new(s.proc_ref(), parent, fd))
            }
            _ => {}
        }
    }
    out
}
