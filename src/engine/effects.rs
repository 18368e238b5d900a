//! Carrying out decisions: pausing and resuming trees, checkpoint requests, termination, and keeping
//! the state file true so that no job is left frozen by a crash or a stop.

use nix::sys::signal::Signal;

use super::Engine;
use crate::act::audit::{Action, Reason};
use crate::act::persist::{self, Persisted, PersistedJob, PersistedPause};
use crate::act::{pause, signal};
use crate::job::{Job, Pause};
use crate::policy::Decision;

/// Why a pause did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// The signal could not be sent.
    #[error(transparent)]
    Signal(#[from] signal::SignalError),
    /// The write-ahead record could not be written, so nothing was stopped.
    #[error("not paused: the pause could not be recorded ({0})")]
    Unrecorded(String),
}

impl Engine {
    /// Signals a job's root through its kept pidfd (or, without one, by pid and start time), if its
    /// owner could signal it.
    pub(super) fn signal_root(&self, j: &Job, sig: Signal) -> Result<(), signal::SignalError> {
        if !signal::owner_may_signal(&self.process_root, j.root.pid, j.owner_uid) {
            return Err(signal::SignalError::Denied(j.root.pid));
        }
        match &j.pidfd {
            Some(fd) => signal::send_pinned(fd, j.root.pid, sig),
            None => signal::send(&self.process_root, j.root, sig),
        }
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
                let name = &self.cfg.policy.checkpoint_signal;
                let sig = crate::config::signal_by_name(name);
                if let (Some(sig), Some(j), false) = (sig, self.jobs.get(&job), dry) {
                    // A Slurm job attached by id: every step's tasks, on every node.
                    let through_slurm = j.slurm.as_ref().map(|id| {
                        crate::act::slurm::Slurmctl::new(&self.cfg.slurm)
                            .signal(id, name.trim_start_matches("SIG"))
                    });
                    let sent = match through_slurm {
                        Some(Ok(())) => Ok(()),
                        Some(Err(e)) => {
                            tracing::warn!(job, error = %e, "cannot signal the Slurm job; signalling its leader");
                            self.signal_root(j, sig)
                        }
                        None => self.signal_root(j, sig),
                    };
                    if let Err(e) = sent {
                        tracing::warn!(job, error = %e, "checkpoint signal failed");
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
                let why = Reason::from(&cause);
                if let Err(e) = self.pause_job(&job, pause, &reason, now_ms) {
                    self.record(
                        now_ms,
                        Action::Error,
                        &job,
                        why.clone(),
                        format!("pause failed: {e}"),
                        dry,
                    );
                    if matches!(e, PauseError::Signal(signal::SignalError::Gone(_))) {
                        self.job_gone(&job, now_ms);
                    }
                    return;
                }
                self.record(now_ms, Action::Pause, &job, why, reason, dry);
            }
            Decision::Resume { job, why, reason } => {
                self.resume_job(&job);
                self.record(now_ms, Action::Resume, &job, why.into(), reason, dry);
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
    /// is killed (`finish_terminations`), with the same `cause`. It is never paused again.
    pub(super) fn terminate_job(&mut self, job: &str, reason: &str, cause: Reason, now_ms: u64) {
        let dry = self.cfg.policy.dry_run;
        // A Slurm job is requeued (or cancelled) through Slurm, on every node; this node's
        // processes are ended by hand only when Slurm will not.
        let through_slurm = if dry
            || self
                .jobs
                .get(job)
                .is_none_or(|j| j.slurm_job_id().is_none())
        {
            None
        } else {
            Some(self.end_through_slurm(job))
        };
        let reason = match &through_slurm {
            Some(Ok(how)) => format!("{reason}; {how}"),
            Some(Err(e)) => {
                tracing::warn!(job, error = %e, "Slurm did not end the job; ending this node's processes");
                reason.to_owned()
            }
            None => reason.to_owned(),
        };
        let reason = reason.as_str();
        {
            {
                if let Some(j) = self.jobs.get(job) {
                    if !dry && !matches!(through_slurm, Some(Ok(_))) {
                        // TERM every process of the job (its tree, its own cgroup, what was stopped),
                        // then CONT and thaw so the stopped ones can act on it. What is left after
                        // TERMINATE_GRACE_MS is killed (`finish_terminations`).
                        let mut members = self.job_members(j);
                        // A Slurm job's other steps on this node.
                        members.extend(
                            super::slurm::tasks_of(&self.process_root, j)
                                .unwrap_or_default()
                                .iter()
                                .filter(|s| {
                                    signal::owner_may_signal(&self.process_root, s.pid, j.owner_uid)
                                })
                                .map(|s| s.proc_ref()),
                        );
                        for r in &members {
                            let _ = signal::send(&self.process_root, *r, Signal::SIGTERM);
                        }
                        let stopped = j
                            .pause
                            .as_ref()
                            .map(|p| p.stopped.clone())
                            .unwrap_or_default();
                        pause::resume(&self.process_root, &stopped, j.pidfd.as_deref());
                        if j.pause.as_ref().is_some_and(|p| p.slurm.is_some()) {
                            // Slurm would not resume what it suspended: continued by hand.
                            super::slurm::continue_tasks(&self.process_root, j);
                        }
                        if let Some(f) = j.pause.as_ref().and_then(|p| p.frozen.as_ref()) {
                            // A frozen tree acts on the TERM once thawed.
                            let _ = f.thaw();
                        }
                    }
                }
                if let Some(j) = self.jobs.get_mut(job) {
                    j.pause = None;
                    j.stop_reason = Some(reason.to_owned());
                    j.stop_cause = Some(cause.clone());
                    if !dry {
                        j.terminating_since_ms = Some(now_ms);
                    }
                }
                self.save();
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

    /// Stops a job's tree (unless dry-run) and records the pause. Write-ahead: the pause, with the
    /// cgroup it is about to freeze, is in the state file before the first signal or freeze, so a
    /// daemon killed at any instant leaves a record of all it may have stopped (see `act::recover`).
    /// A pause that cannot be recorded is refused: an unrecorded pause is one a crash could leave
    /// frozen for good. `state` is what the pause holds for the policy; the job's record is the only
    /// place the pause lives, so a pause that fails leaves no trace for the policy to believe in.
    pub(super) fn pause_job(
        &mut self,
        name: &str,
        state: crate::policy::PauseState,
        reason: &str,
        now_ms: u64,
    ) -> Result<(), PauseError> {
        let dry = self.cfg.policy.dry_run;
        let Some(j) = self.jobs.get(name) else {
            return Ok(());
        };
        if j.pause.is_some() {
            return Ok(());
        }
        // A Slurm job is suspended through Slurm, whole, on every node.
        let suspend = if dry { None } else { self.slurm_suspend_of(j) };
        let j = match self.jobs.get_mut(name) {
            Some(j) => j,
            None => return Ok(()),
        };
        // Decided on the last full sample, so the pause itself walks nothing but the cgroup's member
        // list: a process that became another user's since then keeps the freezer out.
        let candidate = if dry || suspend.is_some() {
            None
        } else {
            j.freezer
                .clone()
                .filter(|f| f.within_reach(&self.process_root, j.owner_uid))
        };
        j.pause = Some(Pause {
            since_ms: now_ms,
            by: state.by,
            reason: reason.to_owned(),
            stopped: Vec::new(),
            frozen: candidate.clone(),
            slurm: suspend.clone(),
            dry_run: dry,
            growth_at_start: crate::job::GrowthAtPause {
                cgroup: j.cgroup_growth.rate_per_second(),
                host: self.host_used.rate_per_second(),
            },
            held: state.into(),
        });
        if !dry {
            if let Err(e) = self.write_state() {
                if let Some(j) = self.jobs.get_mut(name) {
                    j.pause = None;
                }
                return Err(PauseError::Unrecorded(e));
            }
        }
        if let Some(s) = &suspend {
            match s.ctl.suspend(&s.job_id) {
                Ok(()) => {
                    tracing::info!(job = name, slurm_job_id = %s.job_id, "suspended the whole Slurm job (scontrol suspend)");
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(job = name, error = %e, "cannot suspend the Slurm job; stopping this node's tasks with signals");
                    if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
                        p.slurm = None;
                    }
                }
            }
        }
        let Some(j) = self.jobs.get(name) else {
            return Ok(());
        };
        let (stopped, frozen) = if dry {
            (Vec::new(), None)
        } else {
            match candidate.map(|f| (f.freeze(), f)) {
                Some((Ok(true), f)) => (Vec::new(), Some(f)),
                Some((Ok(false), f)) => {
                    // Still freezing: the daemon finishes the wait off this task and reports back
                    // (`freeze_settled`); until then the pause holds the freeze.
                    self.unsettled.push((name.to_owned(), f.clone()));
                    (Vec::new(), Some(f))
                }
                other => {
                    if let Some((Err(e), f)) = other {
                        tracing::warn!(cgroup = %f.dir.display(), error = %e, "cannot freeze the job's cgroup; stopping it with signals");
                    }
                    match self.stop_tasks(j) {
                        Ok(s) => (s, None),
                        Err(e) => {
                            if let Some(j) = self.jobs.get_mut(name) {
                                j.pause = None;
                            }
                            self.save();
                            return Err(PauseError::Signal(e));
                        }
                    }
                }
            }
        };
        if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
            p.stopped = stopped;
            p.frozen = frozen;
        }
        self.save();
        Ok(())
    }

    /// The cgroup a job rooted at `root` owns, if any (a walk of its tree; full samples refresh it).
    pub(super) fn freezer_of(
        &self,
        root: crate::proc::ProcRef,
        owner: u32,
    ) -> Option<crate::act::freeze::Frozen> {
        let tree = crate::proc::descendants(&self.process_root, root.pid)?;
        if tree.procs.first()?.start_time != root.start_time {
            return None;
        }
        let pids: Vec<u32> = tree.procs.iter().map(|p| p.pid).collect();
        crate::act::freeze::owned(&self.process_root, &pids, owner)
    }

    /// Freezes that did not settle at once, for the daemon to wait on elsewhere.
    pub fn take_unsettled(&mut self) -> Vec<(String, crate::act::freeze::Frozen)> {
        std::mem::take(&mut self.unsettled)
    }

    /// A freeze handed off by `take_unsettled` settled, or did not within `freeze::SETTLE`: then the
    /// cgroup is thawed and the job stopped with signals instead.
    pub fn freeze_settled(
        &mut self,
        name: &str,
        frozen: &crate::act::freeze::Frozen,
        settled: bool,
        now_ms: u64,
    ) {
        let Some(j) = self.jobs.get(name) else {
            return;
        };
        if settled || j.pause.as_ref().and_then(|p| p.frozen.as_ref()) != Some(frozen) {
            return;
        }
        tracing::warn!(cgroup = %frozen.dir.display(), "the job's cgroup did not freeze; stopping it with signals");
        let stopped = pause::stop_tree(&self.process_root, j.root, j.pidfd.as_deref(), j.owner_uid);
        let _ = frozen.thaw();
        match stopped {
            Ok(s) => {
                if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
                    p.stopped = s;
                    p.frozen = None;
                }
                self.save();
            }
            Err(e) => {
                self.record(
                    now_ms,
                    Action::Error,
                    name,
                    Reason::Freeze,
                    format!("the cgroup did not freeze and signals failed: {e}"),
                    false,
                );
                if let Some(j) = self.jobs.get_mut(name) {
                    j.pause = None;
                }
                self.save();
            }
        }
    }

    /// Continues whatever memwatch stopped of a job and records that it runs.
    pub(super) fn resume_job(&mut self, name: &str) {
        let Some(j) = self.jobs.get_mut(name) else {
            return;
        };
        if let Some(p) = j.pause.take() {
            if let Some(s) = &p.slurm {
                if let Err(e) = s.ctl.resume(&s.job_id) {
                    // Never left stopped: this node's tasks are continued by hand.
                    tracing::error!(job = name, error = %e, "cannot resume the Slurm job memwatch suspended; continuing this node's tasks with signals");
                    super::slurm::continue_tasks(&self.process_root, j);
                }
            }
            if let Some(f) = &p.frozen {
                if let Err(e) = f.thaw() {
                    tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw a job's cgroup");
                }
            }
            pause::resume(&self.process_root, &p.stopped, j.pidfd.as_deref());
        }
        self.save();
    }

    fn persisted(&self) -> Persisted {
        Persisted {
            version: 1,
            jobs: self
                .jobs
                .values()
                .map(|j| PersistedJob {
                    name: j.name.clone(),
                    root: j.root,
                    owner_uid: j.owner_uid,
                    attached_at_ms: j.attached_at_ms,
                    paused: j.pause.as_ref().map(|p| PersistedPause {
                        since_ms: p.since_ms,
                        by: p.by,
                        reason: p.reason.clone(),
                        stopped: p.stopped.clone(),
                        frozen: p.frozen.clone(),
                        slurm: p.slurm.clone(),
                    }),
                    config: j.config.clone(),
                    launch: j.launch.clone(),
                    way_out: j.way_out.clone(),
                    slurm: j.slurm.clone(),
                })
                .collect(),
            clock: self.clock_anchor.clone(),
            loans: self.leftover_loans.clone(),
        }
    }

    /// Writes the state file if it changed; the error says why it could not.
    pub(super) fn write_state(&mut self) -> Result<(), String> {
        let state = self.persisted();
        self.state.write(&state).map_err(|e| {
            format!(
                "cannot write {}: {e}",
                self.cfg
                    .control
                    .state_dir
                    .join(persist::STATE_FILE)
                    .display()
            )
        })
    }

    /// Writes the state file if it changed; a failure is logged.
    pub(super) fn save(&mut self) {
        if let Err(e) = self.write_state() {
            tracing::error!("{e}");
        }
    }

    /// At start: continue whatever a previous daemon left stopped, and re-adopt its jobs that still run.
    pub fn recover(&mut self, state: Option<Persisted>, now_ms: u64) {
        let state = state.unwrap_or_default();
        // The journal, read once and only when a job has a config.
        let mut intents = None;
        self.leftover_loans = state.loans;
        for pj in state.jobs {
            if let Some(done) = crate::act::recover::undo_pause(&self.process_root, &pj) {
                self.record(
                    now_ms,
                    Action::Resume,
                    &pj.name,
                    Reason::Restart,
                    done.to_string(),
                    false,
                );
            }
            let alive = crate::proc::read_stat(&self.process_root, pj.root.pid)
                .is_ok_and(|s| s.start_time == pj.root.start_time && s.state != 'Z');
            if alive {
                let (cg, origin) = crate::job::measure::cgroup_of(&self.process_root, pj.root.pid);
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
                // Its pause was just undone: a way out in progress ends here, and the room it held
                // is given back once the job fits (a new pause starts a new ladder).
                job.way_out = pj.way_out.clone().map(|mut w| {
                    use crate::job::way_out::Phase;
                    if !matches!(w.phase, Phase::Done | Phase::Clearing) {
                        w.phase = Phase::Clearing;
                        w.phase_since_ms = now_ms;
                    }
                    w.swap_busy = false;
                    w
                });
                if let Some(c) = job.config.as_mut() {
                    // A rewrite may have landed after the last state save: the journal knows.
                    let intents = intents.get_or_insert_with(|| {
                        super::adapt::Intents::read(
                            &self.cfg.control.state_dir.join(super::adapt::JOURNAL),
                        )
                    });
                    c.unconfirmed = intents.find(&pj.name, &c.file, c.generation + 1);
                }
                job.pidfd = signal::open(&self.process_root, pj.root).ok().flatten();
                job.freezer = self.freezer_of(pj.root, pj.owner_uid);
                if let Some(id) = &pj.slurm {
                    // Its Slurm job's cgroup again, never frozen.
                    if let Some(c) = crate::slurm::find_job(&self.process_root, id) {
                        job.cgroup_dir = Some(c.memory);
                    }
                    job.slurm = Some(id.clone());
                    job.freezer = None;
                }
                self.jobs.insert(pj.name.clone(), job);
                self.record(
                    now_ms,
                    Action::Attach,
                    &pj.name,
                    Reason::Restart,
                    format!("re-adopted pid {}", pj.root.pid),
                    false,
                );
            } else if let Some(loan) = pj.way_out.and_then(|w| w.loan) {
                self.leftover_loans.push(loan);
            }
        }
        // Emergency swap no live job holds: left by a job that ended or by a killed daemon.
        let held: Vec<crate::act::swap::Record> = self
            .jobs
            .values()
            .filter_map(|j| j.way_out.as_ref()?.swap.clone())
            .collect();
        self.leftover_swaps = crate::act::swap::recorded(&self.cfg.control.state_dir)
            .into_iter()
            .filter(|r| !held.contains(r))
            .collect();
        self.state.invalidate();
        self.save();
    }

    /// At stop: continue everything memwatch paused, keep the jobs for the next start.
    pub fn shutdown(&mut self, now_ms: u64) {
        let names: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.pause.is_some())
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
    }
}
