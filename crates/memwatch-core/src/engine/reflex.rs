//! The reflex as the engine decides it (the wake thread's side is `crate::reflex`): for each job
//! whose cgroup has a limit (on v1 one the kernel's thresholds watch; on v2 the wake thread reads
//! the usage itself), what would stop it at its critical line, armed ahead with a write-ahead record
//! (a pause in phase `armed`), and, once it fired, the stop taken over as the policy's own pause, or
//! undone.
//!
//! A reflex is armed only where the policy would pause at the crossing itself: `policy.reflex` on,
//! no dry run, `[policy.job_cgroup]` pausing with no enter hold, no checkpoint signal to send first,
//! the job not paused, not being ended, not a Slurm job (a Slurm pause goes through Slurm), not
//! critical already (critical and running means a person overrode the line), and nobody's override.

use crate::config::SignalName;

use super::Engine;
use crate::audit::{Action, Reason};
use crate::held::Mechanism;
pub use crate::held::{Armed, ReflexHow, ReflexPlan};
use crate::job::Job;
use crate::record::{HoldRecord, LineRecord, PersistedPause, PhaseRecord};

/// Why a reflex was not armed: it stays unarmed, and the engine's probe covers the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArmError {
    /// No such job (detached meanwhile).
    #[error("no job {0}")]
    NoJob(String),
    /// Its write-ahead record could not be written.
    #[error("the armed reflex could not be recorded ({0})")]
    Unrecorded(crate::record::StateWriteError),
}
use crate::held::{Done, Fired, Woken};
use crate::host::Version;
use crate::policy::{By, Cause, Level, PauseState, Resource};

/// The line the reflex `armed` of `j` watches, for its record: the job's memory cgroup and limit as
/// last read.
pub(super) fn line(armed: &Armed, j: &Job) -> Option<LineRecord> {
    let memory = j.cgroup_dir.as_ref()?;
    Some(LineRecord {
        memory: memory.dir.clone(),
        version: memory.version,
        critical_bytes: armed.critical_bytes,
        limit_bytes: j.cgroup().and_then(|c| c.limit_bytes)?,
    })
}

/// The state file's record of the reflex `armed` of `job`: a pause in phase `armed`, undone as one
/// being made, with the `line` it watches (the guardian holds the job there while no daemon runs).
pub(super) fn record(armed: &Armed, job: &str, line: Option<LineRecord>) -> PersistedPause {
    // Ahead of a pause's end, the record covers what that pause still holds: its frozen cgroup
    // (the reflex's own, where both freeze; `Engine::arm_ahead` arms no other) and the processes
    // it stopped.
    let resuming = armed.resuming.as_ref();
    let frozen = match &armed.how {
        ReflexHow::Freeze(f) => Some(f.clone()),
        ReflexHow::Stop(_) => None,
    }
    .or_else(|| resuming.and_then(|r| r.frozen.clone()));
    let hold = HoldRecord::from(&Mechanism::choose(None, frozen));
    let mut stopped = match &armed.how {
        ReflexHow::Stop(root) => vec![*root],
        ReflexHow::Freeze(_) => vec![],
    };
    for p in resuming.map(|r| r.stopped.as_slice()).unwrap_or_default() {
        if !stopped.contains(p) {
            stopped.push(*p);
        }
    }
    PersistedPause {
        since_ms: armed.since_ms,
        by: By::Policy,
        reason: "a reflex armed to stop the job at its cgroup's critical line".into(),
        phase: PhaseRecord::Armed,
        hold,
        stopped,
        causes: vec![Cause::Resource(Resource::JobCgroup(job.to_owned())).to_string()],
        projected: None,
        strict: false,
        expired: false,
        oomd_omit: Vec::new(),
        line,
    }
}

impl Engine {
    /// The reflex to arm for `j` now, if any (see the module's conditions).
    pub(super) fn reflex_plan(&self, j: &Job) -> Option<ReflexPlan> {
        let p = &self.cfg.policy;
        if !p.reflex
            || p.dry_run
            || p.job_cgroup.action != crate::config::OnCritical::Pause
            || p.job_cgroup.enter_hold_ms != 0
            || !p.checkpoint_signal.is_empty()
            || j.pause.is_some()
            || j.terminating_since_ms.is_some()
            || j.slurm_job_id().is_some()
        {
            return None;
        }
        let dir = j.cgroup_dir.as_ref()?;
        let limit = j.cgroup().and_then(|c| c.limit_bytes)?;
        let key = Resource::JobCgroup(j.name.clone());
        if self
            .policy
            .levels
            .get(&key)
            .is_some_and(|l| l.level == Level::Critical)
            || self
                .policy
                .jobs
                .get(&j.name)
                .is_some_and(|s| s.overridden.contains(&key))
        {
            return None;
        }
        // A freezer of the memory cgroup's version whose members the owner could all signal at the
        // last full sample; for a job not root's, one cgroup without children (the reflex checks its
        // members again when it fires).
        let freezer = j.freezer.clone().filter(|f| {
            f.version == dir.version && (j.owner_uid == 0 || !self.view.has_child_cgroups(&f.dir))
        });
        let how = match freezer {
            Some(f) => ReflexHow::Freeze(f),
            None if j.pidfd.is_some() => ReflexHow::Stop(j.root),
            None => return None,
        };
        Some(ReflexPlan {
            critical_bytes: self.critical_bytes(limit),
            how,
            owner: j.owner_uid,
            pidfd: j.pidfd.clone(),
        })
    }

    /// How the kernel watches the job's cgroup (`Probed` for a job not attached).
    pub fn watch(&self, job: &str) -> crate::job::Watch {
        self.jobs.get(job).map(|j| j.watch).unwrap_or_default()
    }

    /// The reflex of `job` as armed now.
    pub fn armed_reflex(&self, job: &str) -> Option<&Armed> {
        self.jobs.get(job).and_then(|j| j.armed.as_ref())
    }

    /// Records `plan` as the job's armed reflex, in the state file before it is handed to the wake
    /// thread: an error means it must not be armed.
    pub fn arm_reflex(&mut self, job: &str, plan: &ReflexPlan) -> Result<(), ArmError> {
        self.record_armed(job, plan, None)
    }

    /// `arm_reflex`, the record covering `resuming` too (a pause being ended).
    fn record_armed(
        &mut self,
        job: &str,
        plan: &ReflexPlan,
        resuming: Option<crate::held::Resuming>,
    ) -> Result<(), ArmError> {
        let Some(j) = self.jobs.get_mut(job) else {
            return Err(ArmError::NoJob(job.to_owned()));
        };
        let before = j.armed.replace(Armed {
            critical_bytes: plan.critical_bytes,
            how: plan.how.clone(),
            since_ms: j.sampled_at_ms.max(j.probed_at_ms),
            resuming,
        });
        if let Err(e) = self.write_state() {
            if let Some(j) = self.jobs.get_mut(job) {
                j.armed = before;
            }
            return Err(ArmError::Unrecorded(e));
        }
        Ok(())
    }

    /// At the end of pause `p` (taken off the job already, not yet undone): the job's reflex, where
    /// the engine would arm one now and the kernel wakes the daemon at its line (its thresholds
    /// whole or still registering, [`crate::job::Watch::wakes_at_the_line`]), recorded as armed, the record
    /// covering what `p` still holds ([`crate::held::Resuming`]); what to hand over once `p` is
    /// undone. `None` (the watches arm it at their next sync) where one record cannot cover both:
    /// `p` froze a cgroup other than the one the reflex would, or suspended a Slurm job.
    pub(super) fn arm_ahead(
        &mut self,
        name: &str,
        p: &crate::job::Pause,
    ) -> Option<(crate::sample::cgroup::CgroupDir, ReflexPlan)> {
        let j = self.jobs.get(name)?;
        if !j.watch.wakes_at_the_line() || j.armed.is_some() || p.suspended().is_some() {
            return None;
        }
        let plan = self.reflex_plan(j)?;
        let memory = j.cgroup_dir.clone()?;
        if let (Some(held), ReflexHow::Freeze(f)) = (p.frozen(), &plan.how) {
            if held != f {
                return None;
            }
        }
        let resuming = crate::held::Resuming {
            frozen: p.frozen().cloned(),
            stopped: p.stopped.clone(),
        };
        if let Err(e) = self.record_armed(name, &plan, Some(resuming)) {
            tracing::warn!(job = name, error = %e, "the reflex is not armed ahead of the resume: it could not be recorded");
            return None;
        }
        Some((memory, plan))
    }

    /// Hands the reflex [`Engine::arm_ahead`] recorded to the host, now that the pause is undone;
    /// its record no longer needs to cover that pause.
    pub(super) fn hand_over_ahead(
        &mut self,
        name: &str,
        memory: &crate::sample::cgroup::CgroupDir,
        plan: &ReflexPlan,
    ) {
        let taken = self.host.arm_reflex(name, memory, plan);
        if let Some(j) = self.jobs.get_mut(name) {
            match j.armed.as_mut() {
                Some(a) if taken => a.resuming = None,
                _ => j.armed = None,
            }
        }
        if taken {
            tracing::debug!(job = name, critical_bytes = plan.critical_bytes, how = ?plan.how, "reflex armed as the job resumes");
        }
    }

    /// The wake thread no longer holds the job's reflex (it was disarmed before it could fire).
    pub fn disarm_reflex(&mut self, job: &str) {
        if let Some(j) = self.jobs.get_mut(job) {
            if j.armed.take().is_some() {
                self.save();
            }
        }
    }

    /// A reflex fired: its stop becomes the policy's pause of the job (recorded, the rest of the
    /// tree stopped, held by the mechanism that made it), or is undone where the job is gone, is
    /// being ended, or was paused by something else first.
    pub fn handle_reflex(&mut self, fired: Fired, now_ms: u64) {
        let name = fired.job.clone();
        // What the reflex read is the job's cgroup now: the cache of the last sample may have been
        // dropped since, as the job grew.
        if let Some(j) = self.jobs.get_mut(&name) {
            if let Some(cg) = j.cgroup().map(|c| c.read_again(fired.usage, fired.cache)) {
                j.note_probe(cg, now_ms);
            }
        }
        let mechanism = self.fired_mechanism(&fired);
        let free = self
            .jobs
            .get(&name)
            .is_some_and(|j| j.pause.is_none() && j.terminating_since_ms.is_none());
        if let Some(j) = self.jobs.get_mut(&name) {
            j.armed = None;
        }
        let Some(mechanism) = mechanism.filter(|_| free) else {
            self.undo_fired(&fired);
            self.save();
            return;
        };
        let limit = self
            .jobs
            .get(&name)
            .and_then(|j| j.cgroup())
            .and_then(|c| c.limit_bytes)
            .unwrap_or(0);
        let percent = if limit > 0 {
            fired.unreclaimable() as f64 * 100.0 / limit as f64
        } else {
            0.0
        };
        let cause = Cause::Resource(Resource::JobCgroup(name.clone()));
        let reason = format!(
            "job cgroup at {percent:.1} % (stopped by the reflex {} µs after {})",
            fired.took_us,
            self.woken_by(&fired)
        );
        tracing::info!(job = name, took_us = fired.took_us, done = ?fired.done, "the reflex stopped the job at its critical line");
        let state = PauseState {
            since_ms: now_ms,
            by: By::Policy,
            reasons: vec![cause.clone()],
            projected: None,
            expired: false,
            strict: false,
        };
        match self.pause_job_by(&name, state, &reason, now_ms, Some(mechanism)) {
            Ok(()) if self.jobs.get(&name).is_some_and(|j| j.pause.is_some()) => {
                self.record(
                    now_ms,
                    Action::Pause,
                    &name,
                    Reason::from(&cause),
                    reason,
                    false,
                );
            }
            Ok(()) => self.undo_fired(&fired),
            Err(e) => {
                self.undo_fired(&fired);
                self.record(
                    now_ms,
                    Action::Error,
                    &name,
                    Reason::from(&cause),
                    format!("pause failed: {e}"),
                    false,
                );
            }
        }
    }

    /// The mechanism that holds what `fired` did, where it acted on the job as it is now (a stopped
    /// root that is still the job's).
    fn fired_mechanism(&self, fired: &Fired) -> Option<Mechanism> {
        match &fired.done {
            Done::Froze(f) => Some(Mechanism::choose(None, Some(f.clone()))),
            Done::Stopped(root) => self
                .jobs
                .get(&fired.job)
                .is_some_and(|j| j.root == *root)
                .then_some(Mechanism::Signals),
        }
    }

    /// For a pause the policy decided on a reading of its own: a reflex of the job that fired
    /// before and is not yet taken over made the stop, so the pause holds it by the reflex's
    /// mechanism, counts the job cgroup among its causes and says the reflex stopped it; the
    /// mechanism and what fired (to undo should the pause fail). A stop the pause cannot hold (a
    /// root no longer the job's) is undone. A reflex still armed stays armed until the watches follow
    /// the pause: one that fires on a job already stopped is undone at no cost, and no stop waits
    /// for a disarm.
    pub(super) fn take_over_for_pause(
        &mut self,
        name: &str,
        state: &mut PauseState,
        reason: &mut String,
    ) -> Option<(Mechanism, Fired)> {
        let fired = self.host.fired_reflex(name)?;
        if let Some(j) = self.jobs.get_mut(name) {
            j.armed = None;
        }
        let Some(mechanism) = self.fired_mechanism(&fired) else {
            self.undo_fired(&fired);
            return None;
        };
        let cause = Cause::Resource(Resource::JobCgroup(name.to_owned()));
        if !state.reasons.contains(&cause) {
            state.reasons.push(cause);
        }
        reason.push_str(&format!(
            " (stopped by the reflex {} µs after {})",
            fired.took_us,
            self.woken_by(&fired)
        ));
        Some((mechanism, fired))
    }

    /// What woke the job's reflex, in words: the kernel's threshold (v1) or the wake thread's own
    /// read of the usage file (v2's, or v1's while its thresholds register or while it is over its
    /// line by its page cache).
    fn woken_by(&self, fired: &Fired) -> &'static str {
        let version = self
            .jobs
            .get(&fired.job)
            .and_then(|j| j.cgroup_dir.as_ref())
            .map(|d| d.version);
        match (fired.woken, version) {
            (Woken::Threshold, _) => "the kernel's notification",
            (Woken::Read, Some(Version::V2)) => "its read of memory.current",
            (Woken::Read, _) => "its read of memory.usage_in_bytes",
        }
    }

    /// Undoes what a fired reflex did, unless the job's pause now holds it the same way.
    pub(super) fn undo_fired(&self, fired: &Fired) {
        let pause = self.jobs.get(&fired.job).and_then(|j| j.pause.as_ref());
        match &fired.done {
            Done::Froze(f) => {
                if pause.and_then(|p| p.frozen()) != Some(f) {
                    if let Err(e) = self.host.thaw(f) {
                        tracing::warn!(cgroup = %f.dir.display(), error = %e, "cannot thaw what the reflex froze");
                    }
                }
            }
            Done::Stopped(root) => {
                if !pause.is_some_and(|p| p.stopped.contains(root)) {
                    let pidfd = self
                        .jobs
                        .get(&fired.job)
                        .filter(|j| j.root == *root)
                        .and_then(|j| j.pidfd.clone());
                    if let Err(e) = self.host.signal(*root, pidfd.as_deref(), SignalName::CONT) {
                        tracing::warn!(pid = root.pid, error = %e, "cannot continue what the reflex stopped");
                    }
                }
            }
        }
        tracing::info!(
            job = fired.job,
            "undid the reflex's stop: the job was not the policy's to pause"
        );
    }
}
