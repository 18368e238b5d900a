//! Undoing a predecessor's pauses: what a restarted daemon does first, and what the guardian does when
//! the daemon died and nobody restarted it. Idempotent: continuing a running process or thawing a
//! thawed cgroup changes nothing, so running it twice (guardian, then a new daemon) is safe.
//!
//! A pause is recorded before its first signal (write-ahead), with the cgroup it is about to freeze, so
//! a kill at any instant leaves a record of everything it may have stopped. The record's list of
//! stopped processes can be short of the truth (the kill landed mid-walk), so recovery also continues
//! every stopped member of the job's current tree. A member a user had stopped by hand inside a job
//! memwatch paused is continued too; that is the price of never leaving a job frozen.

use std::path::Path;

use nix::sys::signal::Signal;

use super::persist::PersistedJob;
use super::signal::send;
use crate::proc::{descendants, read_stat};

/// What recovery did for one job.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub continued: usize,
    pub thawed: Option<std::path::PathBuf>,
}

impl std::fmt::Display for Recovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.thawed {
            Some(dir) => write!(
                f,
                "thawed {} and continued {} process(es) a previous daemon had paused",
                dir.display(),
                self.continued
            ),
            None => write!(
                f,
                "continued {} process(es) a previous daemon had paused",
                self.continued
            ),
        }
    }
}

/// Thaws and continues whatever the paused job `job` may have had stopped. `None` when the record
/// holds no pause.
pub fn undo_pause(process_root: &Path, job: &PersistedJob) -> Option<Recovered> {
    let p = job.paused.as_ref()?;
    let mut out = Recovered::default();
    if let Some(f) = &p.frozen {
        match f.thaw() {
            Ok(()) => out.thawed = Some(f.dir.clone()),
            Err(e) => {
                tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw a cgroup a previous daemon froze")
            }
        }
    }
    // Children before parents, as a resume does.
    for r in p.stopped.iter().rev() {
        if send(process_root, *r, Signal::SIGCONT).is_ok() {
            out.continued += 1;
        }
    }
    // Whatever of the tree is still stopped: members the record missed.
    let root_is_ours = read_stat(process_root, job.root.pid)
        .is_ok_and(|s| s.start_time == job.root.start_time && s.state != 'Z');
    if root_is_ours {
        if let Some(tree) = descendants(process_root, job.root.pid) {
            for proc in tree.procs.iter().rev() {
                let r = proc.proc_ref();
                if proc.is_stopped()
                    && !p.stopped.contains(&r)
                    && send(process_root, r, Signal::SIGCONT).is_ok()
                {
                    out.continued += 1;
                }
            }
        }
    }
    Some(out)
}
