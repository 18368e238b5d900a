//! The gap: from a daemon's death until a successor takes the state lock (under systemd 1.5–3.5 s,
//! longer with `RestartSec=` or a start limit), nothing else watches a job's memory. A job the dead
//! daemon had just resumed near its line would run into its cgroup's limit, where the kernel's only
//! answer is the OOM killer. So the guardian holds the line meanwhile: each reflex the dead daemon
//! had armed (a pause record in phase `armed`, which names its line since state file version 5) is
//! armed here too, while the daemon lives (after each write of the state file) and again at its
//! death if the file changed since, the same [`Reflex`] the wake thread would hold (the job's freezer cgroup, or a
//! SIGSTOP to its root through a pidfd the guardian pins itself), and looked at on a timer: the time
//! growth at [`GAP_GROWTH`] takes to cover the room left to the line, from [`LOOK_MIN`] to
//! [`LOOK_MAX`] (the guardian also looks for a successor that often). That is four times the growth
//! the wake thread's reads plan for: a job resumed after a pause may catch up at the speed of its
//! memory (the test's hog: about 3 GiB/s), and on v1 the guardian has no thresholds (registering one
//! waits out the removal of the dead daemon's, hundreds of ms), so it reads every millisecond within
//! 16 MiB of the line. The gap lasts seconds; a read costs microseconds.
//!
//! A reflex fires only while no successor can hold the state lock (the guardian holds it, or the
//! dying daemon still does), and its pause is recorded (phase `held`, by the policy, for the job's
//! cgroup) at once: a successor that takes the lock finds the job held and goes on holding it, as
//! after any crash, its way out included. One that read the record as `armed` undoes the stop (an
//! armed reflex may have fired) and arms its own, which stops the job again at the line. A job the guardian holds when no successor comes is resumed with every
//! other pause when the grace is over: a job is never left frozen.
//!
//! What it costs: nothing while a daemon runs (the record's line is a few more bytes); in the gap, a
//! read of `memory.current` (or v1's usage) per job and look, and a job is stopped only at its line.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::act::persist::{self, HoldRecord, PersistedJob, PersistedPause, PhaseRecord};
use crate::job::held::Frozen;
use crate::reflex::{Act, Armory, Crossing, Reflex};
use crate::sample::cgroup::Version;

/// The longest time between two looks at a line (and at the state lock).
pub const LOOK_MAX: Duration = Duration::from_millis(50);
/// The shortest.
pub const LOOK_MIN: Duration = Duration::from_millis(1);
/// The growth the guardian's looks keep up with (bytes/s): 16 GiB/s.
pub const GAP_GROWTH: f64 = 16.0 * (1u64 << 30) as f64;

/// When to look again with `room` bytes left below the line.
pub fn look_after(room: u64) -> Duration {
    Duration::from_secs_f64(room as f64 / GAP_GROWTH).clamp(LOOK_MIN, LOOK_MAX)
}

/// What the guardian's reflexes watch.
pub struct Gap {
    runtime_dir: PathBuf,
    process_root: PathBuf,
    armory: Armory,
    /// Each armed job's line and when to look at it next.
    lines: Vec<Line>,
    /// The state file these lines were armed from, as it was then.
    armed_from: Option<Stamp>,
}

/// A state file's identity and version: it is replaced by a rename at every write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(runtime_dir: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(runtime_dir.join(persist::STATE_FILE)).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(Stamp {
            ino: m.ino(),
            len: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

struct Line {
    job: String,
    critical: u64,
    next: Instant,
}

impl Gap {
    /// Arms the line of every reflex recorded in the state file of `runtime_dir`: none when the file
    /// cannot be read (said in the log) or records none.
    pub fn arm(runtime_dir: &Path, process_root: &Path) -> Gap {
        let mut gap = Gap::idle(runtime_dir, process_root);
        gap.armed_from = Stamp::of(runtime_dir);
        let state = match persist::load(runtime_dir) {
            Ok(Some(state)) => state,
            Ok(None) => return gap,
            Err(e) => {
                tracing::error!(error = %e, "the guardian cannot read the state file: no line is held while no daemon runs");
                return gap;
            }
        };
        let now = Instant::now();
        for job in &state.jobs {
            match reflex_of(job, process_root) {
                Ok(Some((reflex, critical))) => {
                    gap.armory.arm(reflex);
                    gap.lines.push(Line {
                        job: job.name.clone(),
                        critical,
                        next: now,
                    });
                    tracing::debug!(job = %job.name, "the guardian armed the job's line");
                }
                Ok(None) => {}
                Err(why) => {
                    tracing::warn!(job = %job.name, "the guardian cannot hold the job's line: {why}")
                }
            }
        }
        gap
    }

    /// Watching no line (a daemon that stood down resumed everything).
    pub fn idle(runtime_dir: &Path, process_root: &Path) -> Gap {
        Gap {
            runtime_dir: runtime_dir.to_owned(),
            process_root: process_root.to_owned(),
            armory: Armory::default(),
            lines: Vec::new(),
            armed_from: None,
        }
    }

    /// Whether the state file is no longer the one these lines were armed from.
    pub fn stale(&self) -> bool {
        Stamp::of(&self.runtime_dir) != self.armed_from
    }

    /// Says in the log which lines it holds now that no daemon runs (since `ended`), and how long
    /// after the daemon's end it could first look at them.
    pub fn announce(&self, ended: Instant) {
        let after_us = u64::try_from(ended.elapsed().as_micros()).unwrap_or(u64::MAX);
        for line in &self.lines {
            tracing::info!(job = %line.job, critical = line.critical, after_us, "the guardian holds the job's line until a daemon takes over");
        }
    }

    /// When the next look is due, at most [`LOOK_MAX`] from `now`.
    pub fn next_look(&self, now: Instant) -> Duration {
        self.lines
            .iter()
            .map(|l| l.next.saturating_duration_since(now))
            .min()
            .unwrap_or(LOOK_MAX)
            .min(LOOK_MAX)
    }

    /// Looks at every line due at `now`: a job at its line is stopped there, and its pause recorded
    /// as held before this returns (the log says how far past its line it was). To be called while
    /// no successor can take the state lock: the guardian holds it, or the dying daemon still does.
    pub fn look(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.lines.len() {
            let line = &mut self.lines[i];
            if line.next > now {
                i += 1;
                continue;
            }
            match self.armory.crossing(&line.job, now) {
                Crossing::Below(room) | Crossing::Cached(room) => {
                    line.next = now + look_after(room);
                    i += 1;
                }
                Crossing::Unread => {
                    line.next = now + crate::reflex::POLL_AFTER_ERROR;
                    i += 1;
                }
                Crossing::Fired => {
                    let line = self.lines.remove(i);
                    for fired in self.armory.take_fired() {
                        let unreclaimable = fired.unreclaimable();
                        match self.record(&fired.job) {
                            Ok(()) => tracing::warn!(
                                job = %fired.job,
                                unreclaimable,
                                past_line = unreclaimable.saturating_sub(line.critical),
                                took_us = fired.took_us,
                                "no daemon runs: the guardian held the job at its critical line"
                            ),
                            Err(e) => {
                                tracing::error!(job = %fired.job, error = %e, "the guardian held the job at its line but could not record it: the next daemon will resume it")
                            }
                        }
                    }
                }
                Crossing::None => {
                    self.lines.remove(i);
                }
            }
        }
    }

    /// Records the pause of `job` the guardian just made: held, by the policy, for its cgroup.
    fn record(&self, job: &str) -> Result<(), RecordError> {
        let mut state = persist::load(&self.runtime_dir)?.ok_or(RecordError::Gone)?;
        // The engine clock now, as the dead daemon kept it.
        let since_ms = crate::clock::Clock::system(
            crate::clock::anchor(&self.process_root, state.clock.as_ref()).anchor_ms,
        )
        .now_ms();
        let j = state
            .jobs
            .iter_mut()
            .find(|j| j.name == job)
            .ok_or(RecordError::Gone)?;
        let armed = j.paused.take().ok_or(RecordError::Gone)?;
        j.paused = Some(held_at_line(armed, since_ms));
        state.version = persist::VERSION;
        persist::save(&self.runtime_dir, &state).map_err(RecordError::Write)
    }
}

/// The pause the guardian's reflex made, from the record of the reflex `armed`.
pub fn held_at_line(armed: PersistedPause, since_ms: u64) -> PersistedPause {
    PersistedPause {
        since_ms,
        phase: PhaseRecord::Held,
        reason: "held at its cgroup's critical line by the guardian while no daemon ran".into(),
        line: None,
        ..armed
    }
}

/// Why the guardian's pause could not be recorded.
#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error(transparent)]
    Read(#[from] persist::StateReadError),
    #[error("the job's record is gone from the state file")]
    Gone,
    #[error("cannot write the state file: {0}")]
    Write(std::io::Error),
}

/// The reflex the record of `job` describes, and its line (bytes): `None` where the job has no
/// reflex armed with a line.
fn reflex_of(job: &PersistedJob, process_root: &Path) -> Result<Option<(Reflex, u64)>, String> {
    let Some(p) = job
        .paused
        .as_ref()
        .filter(|p| p.phase == PhaseRecord::Armed)
    else {
        return Ok(None);
    };
    let Some(line) = &p.line else {
        return Ok(None);
    };
    let frozen = |version, dir: &PathBuf| Frozen {
        version,
        dir: dir.clone(),
    };
    let act = match &p.hold {
        HoldRecord::CgroupV1Freezer { dir } => {
            Reflex::freezer(&frozen(Version::V1, dir)).map_err(|e| e.to_string())?
        }
        HoldRecord::CgroupV2Freeze { dir } => {
            Reflex::freezer(&frozen(Version::V2, dir)).map_err(|e| e.to_string())?
        }
        HoldRecord::Signals => match crate::act::signal::open(process_root, job.root) {
            Ok(Some(pidfd)) => Act::Stop {
                root: job.root,
                pidfd: Arc::clone(&pidfd),
            },
            Ok(None) => return Err(format!("its root {} is gone", job.root.pid)),
            Err(e) => return Err(e.to_string()),
        },
        HoldRecord::SlurmSuspend { .. } | HoldRecord::Unknown => return Ok(None),
    };
    let reflex = Reflex::open(
        &job.name,
        &line.memory,
        line.version,
        line.critical_bytes,
        job.owner_uid,
        process_root,
        act,
    );
    Ok(Some((reflex, line.critical_bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every millisecond within 16 MiB of the line, every 50 ms a GiB away.
    #[test]
    fn looks_come_as_often_as_the_room_left_needs() {
        assert_eq!(look_after(0), LOOK_MIN);
        assert_eq!(look_after(16 << 20), LOOK_MIN);
        let at_64 = look_after(64 << 20);
        assert!(at_64 > Duration::from_micros(3800) && at_64 < Duration::from_micros(4000));
        assert_eq!(look_after(1 << 30), LOOK_MAX);
        assert_eq!(look_after(u64::MAX), LOOK_MAX);
    }
}
