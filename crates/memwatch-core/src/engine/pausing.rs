//! A pause, step by step: recorded, then made by the job's mechanism (`Mechanism::choose`), held,
//! and undone. The pause record (`Job::pause`) is the only place a pause lives, keyed by the job as
//! systemd-oomd keys its kill mark by cgroup: while a record exists, a second pause of the job does
//! nothing. A pause that goes through Slurm, or a freeze that does not settle at once, stays
//! `Pausing` until its outcome comes back (`handle_outcome`); one that fails falls back to signals. A
//! pause through Slurm stops this node's tasks first, with signals, and keeps them stopped until the
//! job is resumed.

use crate::config::SignalName;

use super::effect::Effect;
use super::{Engine, PauseError};
use crate::audit::{Action, Reason};
use crate::held::Frozen;
use crate::held::Mechanism;
use crate::job::{Pause, PausePhase};
use crate::seam::{CgroupError, SlurmAnswer, SlurmCall};

impl Engine {
    /// Records a pause of `name` and makes it (unless dry-run). Write-ahead: the pause, with the
    /// mechanism about to hold it, is in the state file before the first signal, freeze or Slurm
    /// call, so a daemon killed at any instant leaves a record of all it may have stopped (see
    /// `seam::undo_pause`). A pause that cannot be recorded is refused: an unrecorded pause is one a
    /// crash could leave frozen for good. `state` is what the pause holds for the policy.
    pub(super) fn pause_job(
        &mut self,
        name: &str,
        state: crate::policy::PauseState,
        reason: &str,
        now_ms: u64,
    ) -> Result<(), PauseError> {
        self.pause_job_by(name, state, reason, now_ms, None)
    }

    /// [`Engine::pause_job`], held by `made` where a reflex already made the stop (its freezer, or
    /// its root stopped) instead of the mechanism the job would choose.
    pub(super) fn pause_job_by(
        &mut self,
        name: &str,
        state: crate::policy::PauseState,
        reason: &str,
        now_ms: u64,
        made: Option<Mechanism>,
    ) -> Result<(), PauseError> {
        let dry = self.cfg.policy.dry_run;
        let Some(j) = self.jobs.get(name) else {
            return Ok(());
        };
        if j.pause.is_some() {
            return Ok(());
        }
        // A Slurm job is suspended through Slurm, whole, on every node. Otherwise the job's own
        // cgroup, decided on the last full sample, so the pause itself walks nothing but the
        // cgroup's member list: a process that became another user's since then keeps the freezer
        // out.
        let made_by_reflex = made.is_some();
        let mechanism = match made {
            Some(m) => m,
            None => {
                let suspend = if dry { None } else { self.slurm_suspend_of(j) };
                let candidate = if dry || suspend.is_some() {
                    None
                } else {
                    j.freezer
                        .clone()
                        .filter(|f| self.view.within_reach(f, j.owner_uid))
                };
                Mechanism::choose(suspend, candidate)
            }
        };
        // systemd-oomd is kept off a job the policy holds; a pause by hand is the user's to keep,
        // and oomd's to end.
        let oomd_omit = if dry || state.by != crate::policy::By::Policy {
            Vec::new()
        } else {
            self.oomd_candidates_of(j)
        };
        // A Slurm job's other task trees on this node are not the root's descendants: they are
        // recorded before they are stopped, so that whoever undoes the pause after a crash
        // (`seam::undo_pause`) continues them from the record, as it does the root's tree.
        let ahead = if dry {
            Vec::new()
        } else {
            super::slurm::tops_of(self.view.as_ref(), j)
        };
        let growth_at_start = crate::job::GrowthAtPause {
            cgroup: j.cgroup_growth.rate_per_second(),
            host: self.readings.host_used.rate_per_second(),
        };
        if let Some(j) = self.jobs.get_mut(name) {
            j.pause = Some(Pause {
                since_ms: now_ms,
                by: state.by,
                reason: reason.to_owned(),
                phase: if dry {
                    PausePhase::Held
                } else {
                    PausePhase::Pausing
                },
                mechanism: mechanism.clone(),
                stopped: ahead,
                dry_run: dry,
                oomd_omit,
                growth_at_start,
                held: state.into(),
                oom_killed: 0,
            });
        }
        if dry {
            return Ok(());
        }
        if let Err(e) = self.write_state() {
            if let Some(j) = self.jobs.get_mut(name) {
                j.pause = None;
            }
            return Err(PauseError::Unrecorded(e));
        }
        self.mark_for_oomd(name);
        match mechanism {
            Mechanism::Slurm(s) => {
                // Stop here first: this node's tasks at once, as fast as a pause outside Slurm,
                // while the suspension makes its way through Slurm (scontrol, slurmctld, every
                // node's slurmstepd), which a rank growing fast outruns. The local stop is kept
                // until the job is resumed: a job resumed behind this node's back (another node's
                // memwatch, a person) finds this rank still held.
                if self.jobs.contains_key(name) {
                    match self.stop_tasks(name) {
                        Ok(stopped) => {
                            if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut())
                            {
                                p.stopped = stopped;
                            }
                            self.save();
                        }
                        Err(e) => {
                            tracing::warn!(job = name, error = %e, "cannot stop this node's tasks first; leaving the pause to Slurm")
                        }
                    }
                }
                tracing::info!(job = name, slurm_job_id = %s.job_id, "suspending the whole Slurm job (scontrol suspend)");
                self.emit(Effect::Slurm(super::SlurmRequest {
                    job: name.to_owned(),
                    call: SlurmCall::Suspend,
                    id: s.job_id,
                    ctl: s.ctl,
                    ending: None,
                }));
                Ok(())
            }
            Mechanism::FreezeV1(f) | Mechanism::FreezeV2(f) if made_by_reflex => {
                // The reflex wrote the freeze already. Not written again: a second write holds the
                // freezer's lock while the job freezes, and its wait would be on this task. The
                // executor waits for it to settle, as for a freeze that did not settle at once.
                self.emit(Effect::Settle {
                    job: name.to_owned(),
                    frozen: f,
                });
                Ok(())
            }
            Mechanism::FreezeV1(f) | Mechanism::FreezeV2(f) => match self.host.freeze(&f) {
                Ok(true) => {
                    self.set_held(name);
                    Ok(())
                }
                Ok(false) => {
                    // Still freezing: the executor finishes the wait off this task and reports back
                    // (`Outcome::Settled`); until then the pause is being made.
                    self.emit(Effect::Settle {
                        job: name.to_owned(),
                        frozen: f,
                    });
                    Ok(())
                }
                Err(e @ CgroupError::FrozenByAnother { .. }) => {
                    // Another's freeze is theirs to undo: no thaw here, ever.
                    tracing::warn!(error = %e, "the job's cgroup is frozen by another; stopping it with signals");
                    self.pause_by_signals(name)
                }
                Err(e) => {
                    tracing::warn!(cgroup = %f.dir.display(), error = %e, "cannot freeze the job's cgroup; stopping it with signals");
                    let _ = self.host.thaw(&f);
                    self.pause_by_signals(name)
                }
            },
            Mechanism::Signals => self.pause_by_signals(name),
        }
    }

    /// The processes in the frozen cgroup and below it, as the host shows them now.
    pub(super) fn members_of(&self, f: &Frozen) -> Vec<u32> {
        let mut pids = Vec::new();
        self.view.pids_below(&f.dir, &mut pids);
        pids
    }

    /// The cgroup a job rooted at `root` owns, if any (a walk of its tree; full samples refresh it).
    pub(super) fn freezer_of(&self, root: crate::host::ProcRef, owner: u32) -> Option<Frozen> {
        let tree = self.view.tree(root.pid)?;
        if tree.first()?.start_time != root.start_time {
            return None;
        }
        let pids: Vec<u32> = tree.iter().map(|p| p.pid).collect();
        self.view.freezer_of(&pids, owner)
    }

    /// The freeze holding `name` was found undone by someone else (on cgroup v2 `docker unpause`
    /// writes the same `cgroup.freeze`): made again, said in an event; a freeze that fails now
    /// falls back to signals, as a first one would.
    pub(super) fn freeze_again(&mut self, name: &str, now_ms: u64) {
        let Some(f) = self
            .jobs
            .get(name)
            .and_then(|j| j.pause.as_ref())
            .and_then(|p| p.held_freezer())
            .cloned()
        else {
            return;
        };
        self.record(
            now_ms,
            Action::Pause,
            name,
            Reason::Freeze,
            format!(
                "the freeze memwatch holds the job by was undone by another ({} thawed; a container \
                 engine's unpause?): frozen again",
                f.dir.display()
            ),
            false,
        );
        match self.host.freeze(&f) {
            Ok(true) => {}
            Ok(false) => self.emit(Effect::Settle {
                job: name.to_owned(),
                frozen: f,
            }),
            Err(e) => {
                tracing::warn!(cgroup = %f.dir.display(), error = %e, "cannot freeze the job's cgroup again; stopping it with signals");
                if !matches!(e, CgroupError::FrozenByAnother { .. }) {
                    let _ = self.host.thaw(&f);
                }
                let _ = self.pause_by_signals(name);
            }
        }
    }

    /// The pause of `name` now holds.
    fn set_held(&mut self, name: &str) {
        if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
            p.phase = PausePhase::Held;
        }
        self.dirty = true;
        self.save();
    }

    /// Makes the pause of `name` hold with signals: the whole pause, or the fallback when a freeze
    /// or Slurm failed. A failure drops the pause record (nothing is left stopped).
    fn pause_by_signals(&mut self, name: &str) -> Result<(), PauseError> {
        if !self.jobs.contains_key(name) {
            return Ok(());
        }
        match self.stop_tasks(name) {
            Ok(stopped) => {
                if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
                    p.mechanism = Mechanism::Signals;
                    p.stopped = stopped;
                }
                self.set_held(name);
                Ok(())
            }
            Err(e) => {
                self.end_pause(name);
                self.dirty = true;
                self.save();
                Err(PauseError::Signal(e))
            }
        }
    }

    /// A freeze handed off as `Effect::Settle` settled, or did not within `freeze::SETTLE`: then
    /// the cgroup is thawed and the job stopped with signals instead.
    pub(super) fn freeze_settled(
        &mut self,
        name: &str,
        frozen: &Frozen,
        settled: bool,
        now_ms: u64,
    ) {
        let Some(p) = self.jobs.get(name).and_then(|j| j.pause.as_ref()) else {
            return;
        };
        if p.frozen() != Some(frozen) || p.phase != PausePhase::Pausing {
            return;
        }
        if settled {
            self.set_held(name);
            return;
        }
        tracing::warn!(cgroup = %frozen.dir.display(), "the job's cgroup did not freeze; stopping it with signals");
        let by_signals = self.pause_by_signals(name);
        let _ = self.host.thaw(frozen);
        if let Err(e) = by_signals {
            self.record(
                now_ms,
                Action::Error,
                name,
                Reason::Freeze,
                format!("the cgroup did not freeze and signals failed: {e}"),
                false,
            );
        }
    }

    /// Continues whatever memwatch stopped of a job and records that it runs. A Slurm job is resumed
    /// through Slurm, after any suspend still under way (the calls run in order).
    pub(super) fn resume_job(&mut self, name: &str) {
        if let Some(p) = self.end_pause(name) {
            // The job's stop at critical is recorded before the thaw and handed over right after
            // it, with no write between: a slow disk that holds the owner task after the thaw
            // (a page-cache write throttled while a checkpoint is flushed) never leaves a resumed
            // job growing with nothing armed to stop it.
            let ahead = self.arm_ahead(name, &p);
            if let Some(s) = p.suspended() {
                self.effects.push_back(Effect::Slurm(super::SlurmRequest {
                    job: name.to_owned(),
                    call: SlurmCall::Resume,
                    id: s.job_id.clone(),
                    ctl: s.ctl.clone(),
                    ending: None,
                }));
            }
            if let Some(f) = p.frozen() {
                if let Err(e) = self.host.thaw(f) {
                    tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw a job's cgroup");
                }
            }
            let pinned = self.jobs.get(name).and_then(|j| j.pidfd.clone());
            self.host.continue_tree(&p.stopped, pinned.as_deref());
            if let Some((memory, plan)) = ahead {
                self.hand_over_ahead(name, &memory, &plan);
            }
        }
        self.dirty = true;
        self.save();
    }

    /// The cgroups to mark for systemd-oomd while the policy holds `j`: its cgroup v2 one's
    /// candidates (`HostDriver::oomd_candidates`); none on cgroup v1, which oomd does not watch.
    fn oomd_candidates_of(&self, j: &crate::job::Job) -> Vec<crate::held::OomdMark> {
        j.cgroup_dir
            .as_ref()
            .filter(|d| d.version == crate::host::Version::V2)
            .map(|d| self.host.oomd_candidates(d, j.owner_uid))
            .unwrap_or_default()
    }

    /// Sets the marks the pause of `name` recorded. A mark that cannot be set is logged and left
    /// out of the record; it never stops the pause.
    fn mark_for_oomd(&mut self, name: &str) {
        let Some(marks) = self
            .jobs
            .get(name)
            .and_then(|j| j.pause.as_ref())
            .map(|p| p.oomd_omit.clone())
            .filter(|m| !m.is_empty())
        else {
            return;
        };
        let n = marks.len();
        let set: Vec<_> = marks
            .into_iter()
            .filter(|m| match self.host.oomd_mark(m) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(job = name, cgroup = %m.dir.display(), error = %e, "cannot mark the job's cgroup for systemd-oomd to leave alone; pausing it all the same");
                    false
                }
            })
            .collect();
        tracing::info!(
            job = name,
            cgroups = ?set.iter().map(|m| m.dir.display().to_string()).collect::<Vec<_>>(),
            "marked user.oomd_omit=1 while the job is held"
        );
        if set.len() != n {
            if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
                p.oomd_omit = set;
            }
            self.dirty = true;
        }
    }

    /// Sets again, once a full sample, the marks of every pause that holds some: systemd removes a
    /// `user.oomd_omit` it did not set whenever it re-applies a unit's cgroup settings (a
    /// `daemon-reload`, a `set-property`). Setting a mark that is there changes nothing.
    pub(super) fn renew_oomd_marks(&self) {
        for j in self.jobs.values() {
            for m in j.pause.iter().flat_map(|p| &p.oomd_omit) {
                if let Err(e) = self.host.oomd_mark(m) {
                    tracing::debug!(job = j.name, cgroup = %m.dir.display(), error = %e, "cannot renew the systemd-oomd mark");
                }
            }
        }
    }

    /// Ends the pause record of `name`, taking off the marks it set for systemd-oomd: every way a
    /// pause ends goes through here, so no mark outlives its pause. The record, for what else is
    /// to be undone.
    pub(super) fn end_pause(&mut self, name: &str) -> Option<Pause> {
        let p = self.jobs.get_mut(name)?.pause.take()?;
        if !p.oomd_omit.is_empty() {
            let off = crate::seam::unmark(self.host.as_ref(), &p.oomd_omit);
            tracing::info!(
                job = name,
                "took {off} of {} systemd-oomd mark(s) off",
                p.oomd_omit.len()
            );
        }
        Some(p)
    }

    /// What came of a Slurm call.
    pub(super) fn slurm_done(
        &mut self,
        name: &str,
        call: &SlurmCall,
        id: &str,
        result: Result<SlurmAnswer, crate::seam::SlurmError>,
        ending: Option<super::effect::Ending>,
        now_ms: u64,
    ) {
        match (call, result) {
            (SlurmCall::Hold, result) => self.slurm_hold_checked(name, id, result, now_ms),
            (SlurmCall::Holders, result) => {
                self.slurm.checking.remove(name);
                match result {
                    Ok(SlurmAnswer::Holders(nodes)) => self.note_slurm_holders(name, nodes, now_ms),
                    Ok(SlurmAnswer::Orphaned(dead)) => {
                        self.note_slurm_holders(name, Vec::new(), now_ms);
                        self.record(
                            now_ms,
                            Action::Resume,
                            name,
                            Reason::Slurm,
                            format!(
                                "Slurm job {id} was held suspended only by holds that had run out \
                                 (node(s) {}, gone without releasing them): resumed it",
                                dead.join(", ")
                            ),
                            false,
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(job = name, slurm_job_id = id, error = %e, "cannot read which nodes hold the Slurm job");
                        // Tried: the next read waits its turn, so a Slurm that cannot answer is
                        // not asked again at every sample.
                        let known = self
                            .jobs
                            .get(name)
                            .and_then(|j| j.slurm_holders.as_ref())
                            .map(|(_, nodes)| nodes.clone())
                            .unwrap_or_default();
                        self.note_slurm_holders(name, known, now_ms);
                    }
                }
            }
            (SlurmCall::Resume, Ok(SlurmAnswer::KeptBy(nodes))) => {
                self.note_slurm_holders(name, nodes.clone(), now_ms);
                tracing::info!(job = name, slurm_job_id = id, holders = ?nodes, "released this node's hold; the Slurm job stays suspended while other nodes hold it");
            }
            (SlurmCall::Suspend, result) => {
                let ours = self
                    .jobs
                    .get(name)
                    .and_then(|j| j.pause.as_ref())
                    .is_some_and(|p| {
                        p.phase == PausePhase::Pausing
                            && p.suspended().is_some_and(|s| s.job_id == id)
                    });
                if !ours {
                    // Resumed meanwhile: the resume was queued behind this suspend.
                    return;
                }
                match result {
                    Ok(_) => {
                        tracing::info!(
                            job = name,
                            slurm_job_id = id,
                            "suspended the whole Slurm job (scontrol suspend)"
                        );
                        self.set_held(name);
                    }
                    Err(e) => {
                        tracing::warn!(job = name, error = %e, "cannot suspend the Slurm job; stopping this node's tasks with signals");
                        if let Err(e) = self.pause_by_signals(name) {
                            self.record(
                                now_ms,
                                Action::Error,
                                name,
                                Reason::Slurm,
                                format!("Slurm did not suspend the job and signals failed: {e}"),
                                false,
                            );
                        }
                    }
                }
            }
            (SlurmCall::Resume, Err(e)) => {
                // Never left stopped: this node's tasks are continued by hand.
                tracing::error!(job = name, error = %e, "cannot resume the Slurm job memwatch suspended; continuing this node's tasks with signals");
                if let Some(j) = self.jobs.get(name) {
                    self.continue_tasks(j);
                }
            }
            (SlurmCall::Signal(_), Err(e)) => {
                tracing::warn!(job = name, error = %e, "cannot signal the Slurm job; signalling its leader");
                let sig = crate::config::SignalName::parse(&self.cfg.policy.checkpoint_signal);
                if let (Some(sig), Some(j)) = (sig, self.jobs.get(name)) {
                    if let Err(e) = self.signal_root(j, sig) {
                        tracing::warn!(job = name, error = %e, "checkpoint signal failed");
                    }
                }
            }
            (SlurmCall::Requeue | SlurmCall::Cancel, result) => {
                if let Some(ending) = ending {
                    self.ended_through_slurm(name, call, id, result.map(drop), ending, now_ms);
                }
            }
            (SlurmCall::Resume | SlurmCall::Signal(_), Ok(_)) => {}
        }
    }

    /// What a check of a Slurm job this node holds found (`SlurmCall::Hold`): when the job was
    /// running behind this node's back and is suspended again, this node's tasks are stopped again
    /// too (a resume through signals continued them; the freezer's thaw did not) and it is said.
    fn slurm_hold_checked(
        &mut self,
        name: &str,
        id: &str,
        result: Result<SlurmAnswer, crate::seam::SlurmError>,
        now_ms: u64,
    ) {
        self.slurm.checking.remove(name);
        let held = self
            .jobs
            .get(name)
            .and_then(|j| j.pause.as_ref())
            .is_some_and(|p| p.suspended().is_some_and(|s| s.job_id == id));
        if !held {
            return;
        }
        match result {
            Ok(SlurmAnswer::Holders(nodes)) => self.note_slurm_holders(name, nodes, now_ms),
            Ok(SlurmAnswer::Resuspended) => {
                let restopped = match self.jobs.contains_key(name).then(|| self.stop_tasks(name)) {
                    Some(Ok(stopped)) => {
                        let n = stopped.len();
                        if let Some(p) = self.jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
                            for r in stopped {
                                if !p.stopped.contains(&r) {
                                    p.stopped.push(r);
                                }
                            }
                        }
                        self.save();
                        n
                    }
                    Some(Err(e)) => {
                        tracing::warn!(job = name, error = %e, "cannot stop this node's tasks again");
                        0
                    }
                    None => 0,
                };
                self.record(
                    now_ms,
                    Action::Pause,
                    name,
                    Reason::Slurm,
                    format!(
                        "Slurm job {id} was running while this node still needs it suspended (resumed behind its back): suspended it again ({restopped} process(es) here stopped)"
                    ),
                    false,
                );
                self.dirty = true;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(job = name, slurm_job_id = id, error = %e, "cannot check the Slurm job this node holds suspended")
            }
        }
    }

    /// Sends SIGCONT to every task of a Slurm job on this node, children first: what is left when
    /// Slurm cannot resume the job it suspended.
    pub(super) fn continue_tasks(&self, j: &crate::job::Job) {
        for s in super::slurm::tasks_of(self.view.as_ref(), j)
            .unwrap_or_default()
            .iter()
            .rev()
        {
            if s.is_stopped() && self.view.owner_may_signal(s.pid, j.owner_uid) {
                let _ = self.host.signal(s.proc_ref(), None, SignalName::CONT);
            }
        }
    }
}
