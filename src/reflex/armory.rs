//! The armory: the reflexes armed and those fired, shared by the owner task, the engine's host
//! driver and the wake thread and its firers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::*;
/// The reflexes armed and those fired, shared by the owner task (arms, disarms, takes what fired),
/// the engine's host driver (takes what fired before a stop of the engine's own) and the wake
/// thread (fires).
#[derive(Default)]
pub struct Armory {
    armed: Mutex<HashMap<String, Reflex>>,
    fired: Mutex<Vec<Fired>>,
    /// Where the v1 freezer is kept active from (`Armory::new`; none: never, as in tests on fixture
    /// cgroups).
    process_root: Option<PathBuf>,
    /// While a v1 freezer reflex is armed: an empty freezer cgroup held frozen ([`active`]). Taken
    /// and let go on the owner task only, never on the wake thread.
    active: Mutex<Option<active::Held>>,
    /// When a reflex last fired ([`Armory::let_it_stop`]).
    last_fired: Mutex<Option<Instant>>,
}

impl crate::act::driver::Reflexes for Armory {
    fn take(&self, job: &str) -> Option<Fired> {
        Armory::take(self, job)
    }

    fn arm(
        &self,
        job: &str,
        memory: &CgroupDir,
        plan: &ReflexPlan,
        process_root: &Path,
    ) -> Result<(), crate::reflex::PrepareError> {
        Armory::arm(self, Reflex::prepare(job, memory, plan, process_root)?);
        Ok(())
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
    /// The daemon's reflexes, on the host under `process_root`, which keep the v1 freezer active
    /// while one of them would freeze a v1 cgroup. What daemons that are gone held is let go here.
    pub fn new(process_root: &Path) -> Armory {
        active::let_go_of_the_dead(process_root);
        Armory {
            process_root: Some(process_root.to_owned()),
            ..Armory::default()
        }
    }

    /// Arms `reflex`, replacing the job's earlier one.
    pub fn arm(&self, reflex: Reflex) {
        if let Ok(mut armed) = self.armed.lock() {
            armed.insert(reflex.job.clone(), reflex);
        }
        self.keep_active();
    }

    /// Disarms the job's reflex. `true`: it was armed and can no longer fire; `false`: there was none,
    /// or it fired (what it did is among [`Armory::take_fired`]).
    pub fn disarm(&self, job: &str) -> bool {
        let disarmed = self
            .armed
            .lock()
            .is_ok_and(|mut armed| armed.remove(job).is_some());
        self.keep_active();
        disarmed
    }

    /// What the job's reflex did, if it fired and is not taken yet (taken here, so it is handled
    /// once).
    pub fn take(&self, job: &str) -> Option<Fired> {
        let taken = {
            let mut fired = self.fired.lock().ok()?;
            let at = fired.iter().position(|f| f.job == job)?;
            fired.remove(at)
        };
        self.keep_active();
        Some(taken)
    }

    /// Holds the v1 freezer active while an armed reflex would freeze a v1 cgroup, and lets it go
    /// when none would (on the owner task, at each change it makes to the armed set; one that fired
    /// is let go of when its act is taken).
    fn keep_active(&self) {
        let Some(root) = &self.process_root else {
            return;
        };
        let wanted = self.armed.lock().is_ok_and(|armed| {
            armed.values().any(
                |r| matches!(&r.act, Act::Freeze { frozen, .. } if frozen.version == Version::V1),
            )
        });
        let Ok(mut active) = self.active.lock() else {
            return;
        };
        match (wanted, active.is_some()) {
            (true, false) => match active::Held::hold(root) {
                Ok(held) => {
                    tracing::debug!(cgroup = %held.dir().display(), "the v1 freezer kept active for the reflex");
                    *active = Some(held);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the v1 freezer not kept active: a reflex's freeze may be the kernel's first");
                }
            },
            (false, true) => *active = None,
            _ => {}
        }
    }

    /// The cgroup held frozen to keep the v1 freezer active, if one is.
    pub fn held_active(&self) -> Option<PathBuf> {
        self.active
            .lock()
            .ok()
            .and_then(|a| a.as_ref().map(|h| h.dir().to_owned()))
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
        let fired = self
            .fired
            .lock()
            .map(|mut f| std::mem::take(&mut *f))
            .unwrap_or_default();
        if !fired.is_empty() {
            self.keep_active();
        }
        fired
    }

    /// A crossing of `job`'s line, read at `woke` (a v1 threshold's eventfd, or a v2 read of its
    /// usage at or over the line): fires its reflex at critical (once: a fired reflex is disarmed).
    pub fn crossing(&self, job: &str, woke: Instant) -> Crossing {
        self.crossing_at(job, woke, None)
    }

    /// The same with the job's usage just read by the caller (a v2 read), which the reflex then
    /// does not read again.
    pub fn crossing_at(&self, job: &str, woke: Instant, usage: Option<u64>) -> Crossing {
        let woken = if usage.is_some() {
            Woken::Read
        } else {
            Woken::Threshold
        };
        self.look_at(job, woke, usage, woken)
    }

    /// A v1 threshold's crossing, with the job's usage the caller read after the kernel's
    /// notification woke it (a firer's: `wake::firers`), which the reflex then does not read again.
    pub fn threshold_crossing(&self, job: &str, woke: Instant, usage: u64) -> Crossing {
        self.look_at(job, woke, Some(usage), Woken::Threshold)
    }

    fn look_at(&self, job: &str, woke: Instant, usage: Option<u64>, woken: Woken) -> Crossing {
        let Ok(mut armed) = self.armed.lock() else {
            return Crossing::Unread;
        };
        let Some(look) = armed.get_mut(job).map(|r| r.look(woke, usage, woken)) else {
            return Crossing::None;
        };
        let fired = match look {
            Look::Fired(fired) => fired,
            Look::Below(room) => return Crossing::Below(room),
            Look::Cached(room) => return Crossing::Cached(room),
            Look::Nothing => return Crossing::Unread,
        };
        armed.remove(job);
        // Recorded before the lock on the armed set is let go: a disarm that finds the reflex gone
        // finds what it did here.
        if let Ok(mut f) = self.fired.lock() {
            f.push(fired);
        }
        if let Ok(mut at) = self.last_fired.lock() {
            *at = Some(Instant::now());
        }
        Crossing::Fired
    }

    /// Called by the daemon's real-time threads before they wake the owner task: within
    /// [`LET_IT_STOP`] of a reflex's fire, sleeps out the rest of it, so that the job its reflex
    /// just signalled or froze has its CPU to stop on before the engine's work is woken there. The
    /// engine learns of the stop that much later, and the sleeping thread's next notification waits
    /// as long (another job's crossing is still looked at by the other firers). Returns the time
    /// it slept.
    pub fn let_it_stop(&self) -> Duration {
        let Some(at) = self.last_fired.lock().ok().and_then(|at| *at) else {
            return Duration::ZERO;
        };
        let left = (at + LET_IT_STOP).saturating_duration_since(Instant::now());
        if !left.is_zero() {
            std::thread::sleep(left);
        }
        left
    }
}
