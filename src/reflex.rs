//! The reflex: a job's stop at its critical line, decided ahead and made in the wake thread, with no
//! hop to the owner task (channel, policy, state file).
//!
//! The engine decides, whenever a job's limit, line or reach changes, what would stop the job at
//! critical (`engine::reflex`), and records it in the state file as a pause in phase `armed` before
//! it is handed over: a daemon killed after the reflex fired leaves a record of what it may have
//! stopped, and recovery and the guardian undo it as a pause being made. The wake thread then holds
//! a [`Reflex`]: the job's usage and memory.stat kept open, and what to act on, open too (the job's
//! own freezer cgroup's `freezer.state` (v1) or `cgroup.freeze` (v2), or the pidfd pinned on the
//! job's root since attach). It reads the cgroup's unreclaimable memory (usage less clean page cache,
//! as the engine counts it) when woken (a freezer reflex freezes first where usage less the cache it last read is
//! over the line, and thaws at once where the cache it reads then holds the job under: see
//! `Reflex::look`); at critical it fires once: freezes the cgroup, or stops the root through
//! its pidfd, where the owner could (the kernel's check, with the owner's uids on the thread
//! (`act::as_owner`), or a read of the pinned process's uids). It then wakes the owner task, which takes the
//! stop over as the policy's own pause (write-ahead record, the rest of the tree, the way out), or
//! undoes it where the job is gone or someone else paused it first.
//!
//! What wakes it differs by cgroup version:
//! - v1: each crossing of the job's memory thresholds (the kernel's eventfd).
//! - v2, which has no usage thresholds: the wake thread's own reads of the job's `memory.current`
//!   (`crate::wake::reads`), which stand in for v1's thresholds and look at the reflex whenever
//!   usage is at or over its line. They come after the time the fastest growth memwatch plans for
//!   ([`FASTEST_GROWTH`], 4 GiB/s) would take to cover the room left to the line and half the margin
//!   from the line to the limit, between [`POLL_MIN`] and [`POLL_MAX`] ([`poll_after`]): rarely
//!   while the job is far from its line, every few milliseconds next to it (a 512 MiB limit: 3 ms).
//!   Growth at 4 GiB/s is caught before it is halfway from the line to the limit; slower growth
//!   nearer the line. Each read costs a wake-up of the thread (BENCHMARKS.md: its cost by fill).
//!   Nothing is written to the job's cgroup to arm it.
//!
//! A freezer reflex of a job not owned by root checks every member of the cgroup at firing (its
//! user could signal each), so a cgroup that came to hold another user's process is left to the
//! engine, which stops the job with signals instead.

use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::job::held::{Frozen, ReflexHow, ReflexPlan};
use crate::proc::ProcRef;
use crate::sample::cgroup::{CgroupDir, PageCache, Version};

pub use crate::act::driver::PrepareError;
pub use crate::job::held::{Done, Fired, Woken};
use crate::sample::kept::KeptFile;

/// What a reflex acts on.
pub enum Act {
    /// The job's own freezer cgroup, its state file open for writing, its members' list kept open to
    /// check them at firing.
    Freeze {
        /// The cgroup and its version.
        frozen: Frozen,
        /// `freezer.state` (v1) or `cgroup.freeze` (v2), open for writing.
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
    /// The unreclaimable memory at which it fires (bytes).
    critical_bytes: u64,
    /// The job's owner: the reflex acts only where that user could.
    owner: u32,
    /// Where `/proc` lies (`/` but in tests).
    process_root: PathBuf,
    usage: KeptFile,
    stat: KeptFile,
    /// memory.stat's keys for the clean page cache (`sample::cgroup::cache_keys`).
    cache_keys: [&'static str; 4],
    /// The page cache at the last read of memory.stat (a freezer reflex's when armed and at
    /// each look under the line; any reflex's at each look over it): whether the job is over the
    /// line before memory.stat is read again.
    cache_seen: PageCache,
    /// When a freeze made ahead of the read of memory.stat was last taken back: within
    /// [`THAWED_READ_FIRST`] of it every look reads first.
    thawed_at: Option<Instant>,
    act: Act,
}

/// How long a freezer reflex that froze ahead of its read of the cache sleeps first: the least the
/// kernel's timer gives, so that a job it preempted on its own CPU runs into its freeze then.
const LET_IT_FREEZE: Duration = Duration::from_micros(1);

/// How long after a reflex fired the daemon's own threads tell the owner task nothing
/// ([`Armory::let_it_stop`]): a stop takes effect only when the job next runs, and the owner task,
/// woken on the job's CPU, ran ahead of it (traced here, scripts/trace-reflex.sh: 0.3 to 2.6 ms of
/// the engine's work on the job's CPU before it stopped, in each of the 5 stops of 158 that took
/// over 0.5 ms from the act). The job needs tens of microseconds of its CPU to take its signal or
/// its freeze.
pub const LET_IT_STOP: Duration = Duration::from_micros(300);

/// After a freeze made ahead of its read was taken back (the job's cache grew and holds it under its
/// line), its reflex reads first for this long: a job whose cache hovers at its line is frozen and
/// thawed at most once a second.
pub const THAWED_READ_FIRST: Duration = Duration::from_secs(1);

pub use memwatch_core::held::FASTEST_GROWTH;
/// The shortest time between two reads of a v2 job's usage: 4 MiB of growth at 4 GiB/s.
pub const POLL_MIN: Duration = Duration::from_millis(1);
/// The longest: the room of 4 GiB to the line, or more.
pub const POLL_MAX: Duration = Duration::from_secs(1);
/// After a read that failed or an act that was refused, the next read (the engine's probe decides
/// meanwhile).
pub const POLL_AFTER_ERROR: Duration = Duration::from_millis(100);

/// What one look at the job found.
enum Look {
    /// At critical: the act made.
    Fired(Fired),
    /// Below the line by this many bytes.
    Below(u64),
    /// Usage at or over the line, its clean page cache holding the job this many bytes under it.
    Cached(u64),
    /// Not read, or at critical but the act was refused or failed: the engine's probe decides.
    Nothing,
}

/// What a crossing did with the job's reflex ([`Armory::crossing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crossing {
    /// It fired (and is disarmed): what it did is among [`Armory::take_fired`].
    Fired,
    /// The unreclaimable memory lies this many bytes below the line, and so does usage.
    Below(u64),
    /// Usage is at or over the line, the job's clean page cache holding its unreclaimable memory
    /// this many bytes under it: usage thresholds tell little of such a job (as its own memory
    /// grows, the cache goes, or usage crosses the next threshold only after more of its growth),
    /// so the wake thread reads it on its own timer while this lasts (`crate::wake::reads`).
    Cached(u64),
    /// Not read, or at critical but the act was refused or failed: the engine's probe decides.
    Unread,
    /// No reflex is armed for the job.
    None,
}

/// The time until a v2 reflex reads again, with `room` bytes left below its line and `margin` bytes
/// from the line to the limit: the time growth at [`FASTEST_GROWTH`] takes to cover the room and
/// half the margin.
pub fn poll_after(room: u64, margin: u64) -> Duration {
    Duration::from_secs_f64((room + margin / 2) as f64 / FASTEST_GROWTH).clamp(POLL_MIN, POLL_MAX)
}

impl Reflex {
    /// Opens what the reflex reads and acts on: the memory cgroup `memory_dir`'s usage and
    /// memory.stat (of cgroup `version`), and `act`'s target.
    pub fn open(
        job: &str,
        memory_dir: &Path,
        version: Version,
        critical_bytes: u64,
        owner: u32,
        process_root: &Path,
        act: Act,
    ) -> Reflex {
        let mut reflex = Reflex {
            job: job.to_owned(),
            critical_bytes,
            owner,
            process_root: process_root.to_owned(),
            usage: KeptFile::new(memory_dir.join(crate::sample::cgroup::usage_file(version))),
            stat: KeptFile::new(memory_dir.join("memory.stat")),
            cache_keys: crate::sample::cgroup::cache_keys(version),
            cache_seen: PageCache::default(),
            thawed_at: None,
            act,
        };
        // A freezer reflex's only (a stop by signals always reads first). Unread, it counts as no
        // cache: the first look over the line by usage then freezes first and reads after.
        if matches!(reflex.act, Act::Freeze { .. }) {
            reflex.cache_seen = reflex.cache().unwrap_or_default();
        }
        reflex
    }

    /// The reflex `plan` describes for `job`, whose memory cgroup is `memory`: its act opened (the
    /// freezer's state file, or the root's pidfd the plan carries).
    pub fn prepare(
        job: &str,
        memory: &CgroupDir,
        plan: &ReflexPlan,
        process_root: &Path,
    ) -> Result<Reflex, PrepareError> {
        let act = match &plan.how {
            ReflexHow::Freeze(f) => Reflex::freezer(f)?,
            ReflexHow::Stop(root) => match &plan.pidfd {
                Some(pidfd) => Act::Stop {
                    root: *root,
                    pidfd: pidfd.clone(),
                },
                None => return Err(PrepareError::NoPidfd(root.pid)),
            },
        };
        Ok(Reflex::open(
            job,
            &memory.dir,
            memory.version,
            plan.critical_bytes,
            plan.owner,
            process_root,
            act,
        ))
    }

    /// The freezer act on the job's own cgroup `f`, if its state file opens for writing.
    pub fn freezer(f: &Frozen) -> Result<Act, crate::act::cgroup_error::CgroupError> {
        let (file, _) = crate::act::freeze::state_file(f.version, true);
        let path = f.dir.join(file);
        let state = crate::delegated::open_write(&path, false, 0)
            .map_err(|e| crate::act::cgroup_error::CgroupError::write(path, &e))?;
        Ok(Act::Freeze {
            frozen: f.clone(),
            state,
            procs: KeptFile::new(f.dir.join("cgroup.procs")),
        })
    }

    /// The job's usage: `usage` when the caller has just read it, else read now.
    fn usage(&mut self, usage: Option<u64>) -> Option<u64> {
        match usage {
            Some(u) => Some(u),
            None => self.usage.read().ok()?.1.trim().parse().ok(),
        }
    }

    /// The page cache now, kept as [`Reflex::cache_seen`].
    fn cache(&mut self) -> Option<PageCache> {
        let (path, stat) = self.stat.read().ok()?;
        let cache = PageCache::from_stat(crate::sample::keyed::stat_values(
            path,
            stat,
            self.cache_keys,
        ));
        self.cache_seen = cache;
        Some(cache)
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
        let pids: Vec<u32> = text
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .collect();
        crate::act::signal::all_may_freeze(&self.process_root, &pids, self.owner)
    }

    /// Reads the job's unreclaimable memory and, at critical, acts.
    ///
    /// That is usage less clean page cache, and memory.stat, where the cache is
    /// read, takes about 50 µs to read (the kernel sums the cgroup's counters first). So a freezer
    /// reflex whose job is over the line by its usage less the cache last seen (when armed, and at
    /// each look, under the line too) freezes first and reads after: where the cache grew
    /// meanwhile and holds the job under the line, it thaws the cgroup at once (frozen for
    /// one read of memory.stat, unseen by the job's parent), and the cache it read makes its next
    /// look read first, as does every look within [`THAWED_READ_FIRST`] of that thaw. A stop by
    /// signals always reads first: a SIGSTOP taken back is seen (a shell reports its foreground
    /// job stopped).
    fn look(&mut self, woke: Instant, usage: Option<u64>, woken: Woken) -> Look {
        let Some(usage) = self.usage(usage) else {
            return Look::Nothing;
        };
        if usage < self.critical_bytes {
            // The cache now, off the stop's path: a v1 job's crossings of half its limit and of
            // warn come before its critical line, so the cache it goes by there is the latest.
            if matches!(self.act, Act::Freeze { .. }) {
                let _ = self.cache();
            }
            return self.under(usage, false);
        }
        let freeze_first = matches!(self.act, Act::Freeze { .. })
            && usage.saturating_sub(self.cache_seen.clean()) >= self.critical_bytes
            && self
                .thawed_at
                .is_none_or(|at| woke.saturating_duration_since(at) >= THAWED_READ_FIRST);
        if freeze_first {
            if !self.members_within_reach() || !self.freeze(true) {
                return Look::Nothing;
            }
            let took = woke.elapsed();
            // Fired from the job's own CPU (`wake::firers`), this thread took it from the job,
            // which freezes only once it runs again: a moment's sleep lets it, ahead of the read.
            std::thread::sleep(LET_IT_FREEZE);
            // Unread: the cache last seen; the freeze holds, and the engine, which takes it over,
            // decides.
            let cache = self.cache().unwrap_or(self.cache_seen);
            let unreclaimable = usage.saturating_sub(cache.clean());
            // A thaw that fails leaves the freeze to the engine, as one that stands.
            if unreclaimable < self.critical_bytes && self.freeze(false) {
                self.thawed_at = Some(woke);
                tracing::debug!(
                    job = self.job,
                    unreclaimable,
                    "frozen ahead of the read of its cache, which holds it under the line: thawed"
                );
                return self.under(unreclaimable, true);
            }
            let frozen = match &self.act {
                Act::Freeze { frozen, .. } => frozen.clone(),
                Act::Stop { .. } => return Look::Nothing,
            };
            return self.fired(Done::Froze(frozen), usage, cache, took, woken);
        }
        let Some(cache) = self.cache() else {
            return Look::Nothing;
        };
        let unreclaimable = usage.saturating_sub(cache.clean());
        if unreclaimable < self.critical_bytes {
            return self.under(unreclaimable, true);
        }
        if !self.members_within_reach() {
            return Look::Nothing;
        }
        let done = match &mut self.act {
            Act::Freeze { frozen, .. } => {
                let frozen = frozen.clone();
                if !self.freeze(true) {
                    return Look::Nothing;
                }
                Done::Froze(frozen)
            }
            Act::Stop { root, pidfd } => {
                if !crate::act::signal::alive(pidfd, root.pid) {
                    return Look::Nothing;
                }
                // With the owner's uids the kernel checks at the signal; else the uids are read.
                let as_owner = crate::act::as_owner::AsOwner::take(self.owner);
                if (as_owner.is_none()
                    && !crate::act::signal::owner_may_signal(
                        &self.process_root,
                        root.pid,
                        self.owner,
                    ))
                    || crate::act::signal::send_pinned(pidfd, root.pid, Signal::SIGSTOP).is_err()
                {
                    return Look::Nothing;
                }
                Done::Stopped(*root)
            }
        };
        let took = woke.elapsed();
        self.fired(done, usage, cache, took, woken)
    }

    /// Under the line at `unreclaimable`: by usage too, or (`by_cache`) only by the clean page
    /// cache just read.
    fn under(&self, unreclaimable: u64, by_cache: bool) -> Look {
        let room = self.critical_bytes - unreclaimable;
        tracing::trace!(
            job = self.job,
            unreclaimable,
            critical = self.critical_bytes,
            by_cache,
            "under the reflex's line"
        );
        if by_cache {
            Look::Cached(room)
        } else {
            Look::Below(room)
        }
    }

    /// Writes the freezer's state (`freeze`: frozen, else thawed); `false` where it failed or this
    /// reflex stops by signals.
    fn freeze(&mut self, freeze: bool) -> bool {
        let Act::Freeze { frozen, state, .. } = &mut self.act else {
            return false;
        };
        let (_, word) = crate::act::freeze::state_file(frozen.version, freeze);
        state.write_all(word.as_bytes()).is_ok()
    }

    /// What it did, made `took` after the wake-up by `woken`, at `usage` and `cache`.
    fn fired(
        &self,
        done: Done,
        usage: u64,
        cache: PageCache,
        took: Duration,
        woken: Woken,
    ) -> Look {
        Look::Fired(Fired {
            job: self.job.clone(),
            done,
            usage,
            cache,
            took_us: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            woken,
        })
    }
}

pub mod armory;
pub use armory::Armory;

pub mod active;
pub use active::let_go_of_the_dead;

#[cfg(test)]
pub(crate) mod tests;
