//! The reflex: a job's stop at its critical line, decided ahead and made in the thread that reads
//! the kernel's threshold notification, with no hop to the owner task (channel, policy, state file).
//!
//! The engine decides, whenever a job's limit, line or reach changes, what would stop the job at
//! critical (`engine::reflex`), and records it in the state file as a pause in phase `armed` before
//! it is handed over: a daemon killed after the reflex fired leaves a record of what it may have
//! stopped, and recovery and the guardian undo it as a pause being made. The wake thread then holds
//! a [`Reflex`]: the job's usage and memory.stat kept open, and what to act on, open too (the v1
//! freezer's `freezer.state`, or the pidfd pinned on the job's root since attach). On each crossing
//! of the job's thresholds it reads the working set (usage less inactive file cache, as the engine
//! counts it); at critical it fires once: freezes the cgroup, or stops the root through its pidfd
//! after the uid check on the pinned process. It then wakes the owner task, which takes the stop
//! over as the policy's own pause (write-ahead record, the rest of the tree, the way out), or undoes
//! it where the job is gone or someone else paused it first.
//!
//! A freezer reflex of a job not owned by root checks every member of the cgroup at firing (its
//! user could signal each), so a cgroup that came to hold another user's process is left to the
//! engine, which stops the job with signals instead.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::sys::signal::Signal;

use crate::proc::ProcRef;

pub use crate::job::held::{Done, Fired};
use crate::sample::kept::KeptFile;

/// What a reflex acts on.
pub enum Act {
    /// A cgroup v1 freezer directory, its `freezer.state` open for writing, its members' list kept
    /// open to check them at firing.
    Freeze {
        /// The freezer cgroup's directory.
        dir: PathBuf,
        /// `freezer.state`, open for writing.
        state: std::fs::File,
        /// `cgroup.procs` of the freezer cgroup.
        procs: KeptFile,
    },
    /// The job's root, through the pidfd kept since attach.
    Stop {
        /// The root process.
        root: ProcRef,
        /// Its pidfd.
        pidfd: Arc<OwnedFd>,
    },
}

/// A stop at critical, ready in the wake thread.
pub struct Reflex {
    job: String,
    /// The working set at which it fires (bytes).
    critical_bytes: u64,
    /// The job's owner: the reflex acts only where that user could.
    owner: u32,
    /// Where `/proc` lies (`/` but in tests).
    process_root: PathBuf,
    usage: KeptFile,
    stat: KeptFile,
    act: Act,
}

impl Reflex {
    /// Opens what the reflex reads and acts on: the v1 memory cgroup `memory_dir`'s usage and
    /// memory.stat, and `act`'s target.
    pub fn open(
        job: &str,
        memory_dir: &Path,
        critical_bytes: u64,
        owner: u32,
        process_root: &Path,
        act: Act,
    ) -> Reflex {
        Reflex {
            job: job.to_owned(),
            critical_bytes,
            owner,
            process_root: process_root.to_owned(),
            usage: KeptFile::new(memory_dir.join("memory.usage_in_bytes")),
            stat: KeptFile::new(memory_dir.join("memory.stat")),
            act,
        }
    }

    /// The freezer act on the v1 freezer directory `dir`, if its state file opens for writing.
    pub fn freezer(dir: &Path) -> std::io::Result<Act> {
        let state = crate::delegated::open_write(&dir.join("freezer.state"), false, 0)?;
        Ok(Act::Freeze {
            dir: dir.to_owned(),
            state,
            procs: KeptFile::new(dir.join("cgroup.procs")),
        })
    }

    /// The job's working set now (usage less inactive file cache), if both read.
    fn working_set(&mut self) -> Option<u64> {
        let usage: u64 = self.usage.read().ok()?.1.trim().parse().ok()?;
        if usage < self.critical_bytes {
            return Some(usage);
        }
        let (path, stat) = self.stat.read().ok()?;
        let [inactive] = crate::sample::keyed::stat_values(path, stat, ["total_inactive_file"]);
        let inactive = inactive.unwrap_or(0);
        Some(usage.saturating_sub(inactive))
    }

    /// Whether every member of the freezer cgroup could be signalled by the owner.
    fn members_within_reach(&mut self) -> bool {
        if self.owner == 0 {
            return true;
        }
        let Act::Freeze { procs, .. } = &mut self.act else {
            return true;
        };
        let Ok((_, text)) = procs.read() else {
            return false;
        };
        text.lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .all(|pid| crate::act::signal::owner_may_signal(&self.process_root, pid, self.owner))
    }

    /// Reads the job's working set and, at critical, acts: what it did, or `None` (below the line,
    /// or the act was refused or failed: the engine's probe decides then).
    fn try_fire(&mut self, woke: Instant) -> Option<Fired> {
        let working_set = self.working_set()?;
        if working_set < self.critical_bytes || !self.members_within_reach() {
            tracing::debug!(
                job = self.job,
                working_set,
                critical = self.critical_bytes,
                "a crossing below the reflex's line"
            );
            return None;
        }
        let done = match &mut self.act {
            Act::Freeze { dir, state, .. } => {
                state.write_all(b"FROZEN").ok()?;
                Done::Froze(dir.clone())
            }
            Act::Stop { root, pidfd } => {
                if !crate::act::signal::alive(pidfd, root.pid)
                    || !crate::act::signal::owner_may_signal(
                        &self.process_root,
                        root.pid,
                        self.owner,
                    )
                {
                    return None;
                }
                crate::act::signal::send_pinned(pidfd, root.pid, Signal::SIGSTOP).ok()?;
                Done::Stopped(*root)
            }
        };
        Some(Fired {
            job: self.job.clone(),
            done,
            working_set,
            took_us: u64::try_from(woke.elapsed().as_micros()).unwrap_or(u64::MAX),
        })
    }
}

/// The reflexes armed and those fired, shared by the owner task (arms, disarms, takes what fired),
/// the engine's host driver (takes what fired before a stop of the engine's own) and the wake
/// thread (fires).
#[derive(Default)]
pub struct Armory {
    armed: Mutex<HashMap<String, Reflex>>,
    fired: Mutex<Vec<Fired>>,
}

impl crate::act::driver::FiredReflexes for Armory {
    fn take(&self, job: &str) -> Option<Fired> {
        Armory::take(self, job)
    }
}

impl std::fmt::Debug for Armory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armory")
            .field("armed", &self.armed_jobs())
            .finish_non_exhaustive()
    }
}

impl Armory {
    /// Arms `reflex`, replacing the job's earlier one.
    pub fn arm(&self, reflex: Reflex) {
        if let Ok(mut armed) = self.armed.lock() {
            armed.insert(reflex.job.clone(), reflex);
        }
    }

    /// Disarms the job's reflex. `true`: it was armed and can no longer fire; `false`: there was none,
    /// or it fired (what it did is among [`Armory::take_fired`]).
    pub fn disarm(&self, job: &str) -> bool {
        self.armed
            .lock()
            .is_ok_and(|mut armed| armed.remove(job).is_some())
    }

    /// What the job's reflex did, if it fired and is not taken yet (taken here, so it is handled
    /// once).
    pub fn take(&self, job: &str) -> Option<Fired> {
        let mut fired = self.fired.lock().ok()?;
        let at = fired.iter().position(|f| f.job == job)?;
        Some(fired.remove(at))
    }

    /// The jobs whose reflexes are armed.
    pub fn armed_jobs(&self) -> Vec<String> {
        self.armed
            .lock()
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What fired since the last call.
    pub fn take_fired(&self) -> Vec<Fired> {
        self.fired
            .lock()
            .map(|mut f| std::mem::take(&mut *f))
            .unwrap_or_default()
    }

    /// A crossing of `job`'s thresholds, read at `woke`: fires its reflex at critical (once: a
    /// fired reflex is disarmed). `true` when it fired.
    pub fn crossing(&self, job: &str, woke: Instant) -> bool {
        let Ok(mut armed) = self.armed.lock() else {
            return false;
        };
        let Some(fired) = armed.get_mut(job).and_then(|r| r.try_fire(woke)) else {
            return false;
        };
        armed.remove(job);
        // Recorded before the lock on the armed set is let go: a disarm that finds the reflex gone
        // finds what it did here.
        if let Ok(mut f) = self.fired.lock() {
            f.push(fired);
        }
        true
    }
}
