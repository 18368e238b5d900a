//! Carrying out decisions: pausing and resuming trees, checkpoint requests, termination, and keeping
//! the state file true so that no job is left frozen by a crash or a stop.

use crate::config::SignalName;

use super::Engine;
use crate::audit::{Action, Reason};
use crate::job::Job;
use crate::policy::Decision;
use crate::record::{self, Persisted, PersistedJob, PersistedPause};
use crate::seam::SignalError;
use crate::seam::SlurmCall;

/// Why a pause did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// The signal could not be sent.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// The write-ahead record could not be written, so nothing was stopped.
    #[error("not paused: the pause could not be recorded ({0})")]
    Unrecorded(record::StateWriteError),
}

impl Engine {
    /// Signals a job's root through its kept pidfd (or, without one, by pid and start time), if its
    /// owner could signal it.
    pub(super) fn signal_root(&self, j: &Job, sig: SignalName) -> Result<(), SignalError> {
        if !self.view.owner_may_signal(j.root.pid, j.owner_uid) {
            return Err(SignalError::Denied(j.root.pid));
        }
        self.host.signal(j.root, j.pidfd.as_deref(), sig)
    }

    pub(super) fn apply(&mut self, d: Decision, now_ms: u64) {
        let dry = self.cfg.policy.dry_run;
        match d {
            Decision::LevelChanged {
                key,
                from,
                to,
                value,
            } => {
                let detail = match value {
                    Some(v) => format!("{key}: {} → {} at {v:.3}", from.as_str(), to.as_str()),
                    None => format!("{key}: {} → {}", from.as_str(), to.as_str()),
                };
                self.record(now_ms, Action::Level, "", (&key).into(), detail, false);
            }
            Decision::Checkpoint { job, cause, reason } => {
                let name = self.cfg.policy.checkpoint_signal.clone();
                let sig = crate::config::SignalName::parse(&name);
                if let (Some(sig), Some(j), false) = (sig, self.jobs.get(&job), dry) {
                    // A Slurm job attached by id: every step's tasks, on every node (its leader
                    // alone when Slurm fails).
                    match j.slurm.clone() {
                        Some(id) => self.emit(super::Effect::Slurm(super::SlurmRequest {
                            job: job.clone(),
                            call: SlurmCall::Signal(name.trim_start_matches("SIG").to_owned()),
                            id,
                            ctl: self.slurm.ctl.clone(),
                            ending: None,
                        })),
                        None => {
                            if let Err(e) = self.signal_root(j, sig) {
                                tracing::warn!(job, error = %e, "checkpoint signal failed");
                            }
                        }
                    }
                }
                self.record(
                    now_ms,
                    Action::Checkpoint,
                    &job,
                    (&cause).into(),
                    reason,
                    dry,
                );
            }
            Decision::Pause {
                job,
                cause,
                reason,
                pause,
            } => {
                if self
                    .jobs
                    .get(&job)
                    .is_some_and(|j| j.terminating_since_ms.is_some())
                {
                    // Being terminated: never paused again (its processes must be free to exit).
                    return;
                }
                // A reflex that fired before this decision is acted on made the stop: the pause
                // holds it, and says so.
                let (mut pause, mut reason) = (pause, reason);
                let taken = self.take_over_for_pause(&job, &mut pause, &mut reason);
                let made = taken.as_ref().map(|(m, _)| m.clone());
                let why = Reason::from(&cause);
                if let Err(e) = self.pause_job_by(&job, pause, &reason, now_ms, made) {
                    if let Some((_, fired)) = &taken {
                        self.undo_fired(fired);
                    }
                    self.record(
                        now_ms,
                        Action::Error,
                        &job,
                        why.clone(),
                        format!("pause failed: {e}"),
                        dry,
                    );
                    if matches!(e, PauseError::Signal(SignalError::Gone(_))) {
                        self.job_gone(&job, now_ms);
                    }
                    return;
                }
                self.record(now_ms, Action::Pause, &job, why, reason, dry);
            }
            Decision::Resume { job, why, reason } => {
                // Room a push to swap is making is the way out's to resume into, once it is made:
                // a job let go halfway would bring back what is still being pushed out.
                if why == crate::policy::Resumed::Recovered && self.pushing(&job) {
                    return;
                }
                // Room the OOM killer made by ending processes of the job is no recovery: the
                // job may have lost a rank or a worker, and says so.
                let killed = self
                    .jobs
                    .get(&job)
                    .and_then(|j| j.pause.as_ref())
                    .map_or(0, |p| p.oom_killed);
                let (why, reason) = match why {
                    crate::policy::Resumed::Recovered if killed > 0 => (
                        Reason::OomKill,
                        format!(
                            "{reason}, after the OOM killer ended {killed} process(es) of the job during the pause: it may have lost a rank or a worker"
                        ),
                    ),
                    _ => (why.into(), reason),
                };
                self.resume_job(&job);
                self.record(now_ms, Action::Resume, &job, why, reason, dry);
            }
            Decision::Terminate { job, reason } => {
                let why = format!("{reason} (on_max_pause = \"terminate\")");
                self.terminate_job(&job, &why, Reason::MaxPause, now_ms);
            }
            Decision::StayPaused { job, reason } => {
                if let Some(p) = self.jobs.get_mut(&job).and_then(|j| j.pause.as_mut()) {
                    p.held.expired = true;
                }
                self.record(
                    now_ms,
                    Action::StayPaused,
                    &job,
                    Reason::MaxPause,
                    reason,
                    dry,
                );
            }
        }
    }

    /// Ends a whole job: SIGTERM to every process of it (its tree, its own cgroup, what was stopped),
    /// then SIGCONT and a thaw so that stopped ones act on it; what is left after `TERMINATE_GRACE_MS`
    /// is killed (`finish_terminations`), with the same `cause`. It is never paused again. A Slurm job
    /// is requeued (or cancelled) through Slurm, on every node, after a resume if memwatch had
    /// suspended it; its `terminate` event is recorded when Slurm answers, and this node's processes
    /// are ended by hand only when Slurm will not (`ended_through_slurm`).
    pub(super) fn terminate_job(&mut self, job: &str, reason: &str, cause: Reason, now_ms: u64) {
        let dry = self.cfg.policy.dry_run;
        let Some(j) = self.jobs.get(job).cloned() else {
            return;
        };
        let slurm_id = j.slurm_job_id().filter(|_| !dry).map(str::to_owned);
        match slurm_id {
            Some(id) => {
                if let Some(s) = j.pause.as_ref().and_then(|p| p.suspended()).cloned() {
                    self.emit(super::Effect::Slurm(super::SlurmRequest {
                        job: job.to_owned(),
                        call: SlurmCall::Resume,
                        id: s.job_id,
                        ctl: s.ctl,
                        ending: None,
                    }));
                }
                let call = if self.cfg.slurm.requeue {
                    SlurmCall::Requeue
                } else {
                    SlurmCall::Cancel
                };
                self.emit(super::Effect::Slurm(super::SlurmRequest {
                    job: job.to_owned(),
                    call,
                    id,
                    ctl: self.slurm.ctl.clone(),
                    ending: Some(super::effect::Ending {
                        reason: reason.to_owned(),
                        cause: cause.clone(),
                        stopped: j
                            .pause
                            .as_ref()
                            .map(|p| p.stopped.clone())
                            .unwrap_or_default(),
                    }),
                }));
                // Its processes stay as they are until Slurm answers; the record no longer holds
                // them (what Slurm suspended, Slurm resumes first).
                self.mark_terminating(job, reason, &cause, now_ms);
            }
            None => {
                if !dry {
                    self.end_by_hand(job);
                }
                self.mark_terminating(job, reason, &cause, now_ms);
                self.record(
                    now_ms,
                    Action::Terminate,
                    job,
                    cause,
                    reason.to_owned(),
                    dry,
                );
            }
        }
    }

    /// What Slurm said to the requeue or cancel that ends a job: the `terminate` event, and this
    /// node's processes ended by hand when Slurm would not.
    pub(super) fn ended_through_slurm(
        &mut self,
        job: &str,
        call: &SlurmCall,
        id: &str,
        result: Result<(), crate::seam::SlurmError>,
        ending: super::effect::Ending,
        now_ms: u64,
    ) {
        let reason = match result {
            Ok(()) => match call {
                SlurmCall::Requeue => {
                    format!(
                        "{}; requeued Slurm job {id} (scontrol requeue)",
                        ending.reason
                    )
                }
                _ => format!("{}; cancelled Slurm job {id} (scancel)", ending.reason),
            },
            Err(e) => {
                tracing::warn!(job, error = %e, "Slurm did not end the job; ending this node's processes");
                self.end_by_hand(job);
                if let Some(j) = self.jobs.get(job) {
                    self.host.continue_tree(&ending.stopped, j.pidfd.as_deref());
                }
                ending.reason
            }
        };
        self.record(now_ms, Action::Terminate, job, ending.cause, reason, false);
    }

    /// The job's record says it is being ended: no pause, why, and since when.
    fn mark_terminating(&mut self, job: &str, reason: &str, cause: &Reason, now_ms: u64) {
        let dry = self.cfg.policy.dry_run;
        self.end_pause(job);
        if let Some(j) = self.jobs.get_mut(job) {
            j.stop_reason = Some(reason.to_owned());
            j.stop_cause = Some(cause.clone());
            if !dry {
                j.terminating_since_ms = Some(now_ms);
            }
        }
        self.dirty = true;
        self.save();
    }

    /// SIGTERM to every process of the job (its tree, its own cgroup, what was stopped, a Slurm
    /// job's other steps on this node), then SIGCONT and a thaw so the stopped ones can act on it.
    fn end_by_hand(&self, job: &str) {
        let Some(j) = self.jobs.get(job) else {
            return;
        };
        let mut members = self.job_members(j);
        members.extend(
            super::slurm::tasks_of(self.view.as_ref(), j)
                .unwrap_or_default()
                .iter()
                .filter(|s| self.view.owner_may_signal(s.pid, j.owner_uid))
                .map(|s| s.proc_ref()),
        );
        for r in &members {
            let _ = self.host.signal(*r, None, SignalName::TERM);
        }
        if let Some(p) = &j.pause {
            self.host.continue_tree(&p.stopped, j.pidfd.as_deref());
            if p.suspended().is_some() {
                // Slurm would not resume what it suspended: continued by hand.
                self.continue_tasks(j);
            }
            if let Some(f) = p.frozen() {
                // A frozen tree acts on the TERM once thawed.
                let _ = self.host.thaw(f);
            }
        }
    }

    fn persisted(&self) -> Persisted {
        Persisted {
            version: record::VERSION,
            jobs: self
                .jobs
                .values()
                .map(|j| PersistedJob {
                    name: j.name.clone(),
                    root: j.root,
                    owner_uid: j.owner_uid,
                    attached_at_ms: j.attached_at_ms,
                    paused: j.pause.as_ref().map(PersistedPause::of).or_else(|| {
                        j.armed
                            .as_ref()
                            .map(|a| super::reflex::record(a, &j.name, super::reflex::line(a, j)))
                    }),
                    config: j.config.clone(),
                    launch: j.launch.clone(),
                    way_out: j.way_out.clone(),
                    slurm: j.slurm.clone(),
                })
                .collect(),
            clock: self.clock_anchor.clone(),
            loans: self.leftover.loans.clone(),
        }
    }

    /// Writes the state file if it changed; the error says why it could not.
    pub(super) fn write_state(&mut self) -> Result<(), record::StateWriteError> {
        let state = self.persisted();
        self.state
            .write(&state)
            .map_err(|e| record::StateWriteError {
                path: self.cfg.runtime_dir.join(record::STATE_FILE),
                reason: e.to_string(),
            })
    }

    /// Writes the state file if it changed; a failure is logged.
    pub(super) fn save(&mut self) {
        if let Err(e) = self.write_state() {
            tracing::error!("{e}");
        }
    }

    /// At start: re-adopt a previous daemon's jobs that still run, go on holding the policy's pauses
    /// that were in effect (a memory pause survives a crash as a pause: the policy resumes it when
    /// its causes recover, the way out goes on where it was, the longest pause still counts from its
    /// start), and undo every other pause it left: one by hand, one still being made, one of a job
    /// that is gone, one whose mechanism this build does not know.
    pub fn recover(&mut self, state: Option<Persisted>, now_ms: u64) {
        let state = state.unwrap_or_default();
        let left = self.left.take();
        let intents = left.as_ref().map(|l| &l.intents);
        self.leftover.loans = state.loans;
        for pj in state.jobs {
            let alive = self
                .view
                .stat(pj.root.pid)
                .is_ok_and(|s| s.start_time == pj.root.start_time && s.state != 'Z');
            let swap_lost = pj.way_out.as_ref().is_some_and(|w| {
                // A swap being made may be lost; a reclaim cut short leaves the job whole,
                // resumed into what was pushed out so far.
                matches!(
                    w.phase,
                    crate::way_out::Phase::MakingSwap | crate::way_out::Phase::Reclaiming
                )
            });
            let kept = pj
                .paused
                .as_ref()
                .filter(|p| {
                    alive
                        && !swap_lost
                        && !self.cfg.policy.dry_run
                        && p.by == crate::policy::By::Policy
                })
                .and_then(|p| p.resumable_hold());
            if kept.is_none() {
                if let Some(done) =
                    crate::seam::undo_pause(self.host.as_ref(), self.view.as_ref(), &pj)
                {
                    self.record(
                        now_ms,
                        Action::Resume,
                        &pj.name,
                        Reason::Restart,
                        done.to_string(),
                        false,
                    );
                }
            }
            if alive {
                let (cg, origin) = self.view.cgroup_of(pj.root.pid);
                let mut job = Job::new(
                    pj.name.clone(),
                    pj.root,
                    pj.owner_uid,
                    pj.attached_at_ms,
                    cg,
                    self.cfg.sampling.growth_window_ms.0,
                );
                job.config = pj.config.clone();
                job.launch = pj.launch.clone();
                job.origin = origin;
                job.cgroup_owner = self.view.cgroup_owner(job.cgroup_dir.as_ref());
                // A pause held on goes on with its way out where it was. One that was undone ends
                // its way out here, and the room it held is given back once the job fits (a new
                // pause starts a new ladder).
                let held_on = kept.is_some();
                job.way_out = pj.way_out.clone().map(|mut w| {
                    use crate::way_out::Phase;
                    if !held_on && !matches!(w.phase, Phase::Done | Phase::Clearing) {
                        w.phase = Phase::Clearing;
                        w.phase_since_ms = now_ms;
                    }
                    w.swap_busy = false;
                    w
                });
                if let Some(c) = job.config.as_mut() {
                    // A rewrite may have landed after the last state save: the journal knows.
                    c.unconfirmed =
                        intents.and_then(|i| i.find(&pj.name, &c.file, c.generation + 1));
                }
                job.pidfd = self.host.pin(pj.root).ok().flatten();
                job.freezer = self.freezer_of(pj.root, pj.owner_uid);
                if let Some(id) = &pj.slurm {
                    // Its Slurm job's cgroup again, never frozen.
                    if let Some(c) = self.view.slurm_job(id, &self.slurm.name) {
                        job.cgroup_dir = Some(c.memory);
                        job.cgroup_owner = self.view.cgroup_owner(job.cgroup_dir.as_ref());
                    }
                    job.slurm = Some(id.clone());
                    job.freezer = None;
                }
                let detail = match &kept {
                    Some(p) => format!(
                        "re-adopted pid {}, still paused ({}, since {} ms ago)",
                        pj.root.pid,
                        p.mechanism.name(),
                        now_ms.saturating_sub(p.since_ms)
                    ),
                    None => format!("re-adopted pid {}", pj.root.pid),
                };
                job.pause = kept;
                self.jobs.insert(pj.name.clone(), job);
                self.record(
                    now_ms,
                    Action::Attach,
                    &pj.name,
                    Reason::Restart,
                    detail,
                    false,
                );
            } else if let Some(loan) = pj.way_out.and_then(|w| w.loan) {
                self.leftover.loans.push(loan);
            }
        }
        // Emergency swap no live job holds: left by a job that ended or by a killed daemon.
        let held: Vec<crate::held::Record> = self
            .jobs
            .values()
            .filter_map(|j| j.way_out.as_ref()?.swap.clone())
            .collect();
        self.leftover.swaps = left
            .map(|l| l.swaps)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !held.contains(r))
            .collect();
        self.state.invalidate();
        self.save();
    }

    /// At stop: continue everything memwatch paused, keep the jobs for the next start. With
    /// `successor` (the service manager is restarting the daemon), a pause the policy made and holds
    /// is kept instead, as after a crash: the next daemon goes on holding it (`recover`), and the
    /// guardian undoes it if none comes within its grace. Returns the jobs kept paused.
    pub fn shutdown(&mut self, now_ms: u64, successor: bool) -> Vec<String> {
        let keep = |j: &crate::job::Job| {
            successor
                && j.pause.as_ref().is_some_and(|p| {
                    p.by == crate::policy::By::Policy
                        && p.phase == crate::job::PausePhase::Held
                        && !p.dry_run
                })
        };
        let kept: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| keep(j))
            .map(|(n, _)| n.clone())
            .collect();
        for name in &kept {
            self.record(
                now_ms,
                Action::StayPaused,
                name,
                Reason::Restart,
                "the daemon is restarting: the pause is kept for its successor".into(),
                false,
            );
        }
        let names: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.pause.is_some() && !keep(j))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            self.resume_job(&name);
            self.record(
                now_ms,
                Action::Resume,
                &name,
                Reason::Shutdown,
                "the daemon is stopping".into(),
                false,
            );
        }
        self.save();
        kept
    }
}
