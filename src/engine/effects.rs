//! Carrying out decisions: pausing and resuming trees, checkpoint requests, termination, and keeping
//! the state file true so that no job is left frozen by a crash or a stop.

use nix::sys::signal::Signal;

use super::Engine;
use crate::act::persist::{self, Persisted, PersistedJob, PersistedPause};
use crate::act::{pause, signal};
use crate::job::{Job, Pause};
use crate::policy::{self, By, Decision};

/// The short cause of a decision, for counting: the first resource named, without its scope.
fn cause(reason: &str) -> String {
    reason
        .split([' ', ':', ';', ','])
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("policy")
        .to_owned()
}

impl Engine {
    /// Signals a job's root through its kept pidfd (or, without one, by pid and start time).
    fn signal_root(&self, j: &Job, sig: Signal) -> Result<(), signal::SignalError> {
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
                self.record(now_ms, "level", "", &key, detail, false);
            }
            Decision::Checkpoint { job, reason } => {
                let sig = signal::signal_by_name(&self.cfg.policy.checkpoint_signal);
                if let (Some(sig), Some(j), false) = (sig, self.jobs.get(&job), dry) {
                    if let Err(e) = self.signal_root(j, sig) {
                        tracing::warn!(job, error = %e, "checkpoint signal failed");
                    }
                }
                self.record(now_ms, "checkpoint", &job, &cause(&reason), reason, dry);
            }
            Decision::Pause { job, reason } => {
                let key = self
                    .policy
                    .jobs
                    .get(&job)
                    .and_then(|j| j.pause.as_ref())
                    .and_then(|p| p.reasons.first().cloned());
                let why = key.map(|k| cause(&k)).unwrap_or_else(|| cause(&reason));
                if let Err(e) = self.pause_job(&job, By::Policy, &reason, now_ms) {
                    if let Some(js) = self.policy.jobs.get_mut(&job) {
                        js.pause = None;
                    }
                    self.record(
                        now_ms,
                        "error",
                        &job,
                        &why,
                        format!("pause failed: {e}"),
                        dry,
                    );
                    if matches!(e, signal::SignalError::Gone(_)) {
                        self.job_gone(&job, now_ms);
                    }
                    return;
                }
                self.record(now_ms, "pause", &job, &why, reason, dry);
            }
            Decision::Resume { job, reason } => {
                self.resume_job(&job);
                let why = if reason.starts_with("paused for the maximum") {
                    "max_pause"
                } else {
                    "recovered"
                };
                self.record(now_ms, "resume", &job, why, reason, dry);
            }
            Decision::Terminate { job, reason } => {
                if let Some(j) = self.jobs.get(&job) {
                    if !dry {
                        // TERM each process, then CONT so the stopped ones can act on it.
                        let stopped = j
                            .pause
                            .as_ref()
                            .map(|p| p.stopped.clone())
                            .unwrap_or_default();
                        for r in &stopped {
                            let _ = signal::send(&self.process_root, *r, Signal::SIGTERM);
                        }
                        let _ = self.signal_root(j, Signal::SIGTERM);
                        pause::resume(&self.process_root, &stopped, j.pidfd.as_deref());
                        if let Some(f) = j.pause.as_ref().and_then(|p| p.frozen.as_ref()) {
                            // A frozen tree acts on the TERM once thawed.
                            let _ = f.thaw();
                        }
                    }
                }
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.pause = None;
                }
                self.save();
                self.record(now_ms, "terminate", &job, "max_pause", reason, dry);
            }
            Decision::StayPaused { job, reason } => {
                self.record(now_ms, "stay_paused", &job, "max_pause", reason, dry);
            }
        }
    }

    /// Stops a job's tree (unless dry-run) and records the pause.
    pub(super) fn pause_job(
        &mut self,
        name: &str,
        by: By,
        reason: &str,
        now_ms: u64,
    ) -> Result<(), signal::SignalError> {
        let dry = self.cfg.policy.dry_run;
        let Some(j) = self.jobs.get(name) else {
            return Ok(());
        };
        if j.pause.is_some() {
            return Ok(());
        }
        let (stopped, frozen) = if dry {
            (Vec::new(), None)
        } else {
            match self.freeze_owned(j) {
                Some(f) => (Vec::new(), Some(f)),
                None => (
                    pause::stop_tree(&self.process_root, j.root, j.pidfd.as_deref())?,
                    None,
                ),
            }
        };
        if let Some(j) = self.jobs.get_mut(name) {
            j.pause = Some(Pause {
                since_ms: now_ms,
                by,
                reason: reason.to_owned(),
                stopped,
                frozen,
                dry_run: dry,
            });
        }
        self.save();
        Ok(())
    }

    /// Continues whatever memwatch stopped of a job and records that it runs.
    pub(super) fn resume_job(&mut self, name: &str) {
        let Some(j) = self.jobs.get_mut(name) else {
            return;
        };
        if let Some(p) = j.pause.take() {
            pause::resume(&self.process_root, &p.stopped, j.pidfd.as_deref());
            if let Some(f) = &p.frozen {
                if let Err(e) = f.thaw() {
                    tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw a job's cgroup");
                }
            }
        }
        self.save();
    }

    /// Freezes the job's own cgroup, if it owns one and the freeze takes; `None` means: use signals.
    fn freeze_owned(&self, j: &Job) -> Option<crate::act::freeze::Frozen> {
        if !j.root_alive() {
            return None;
        }
        let tree = crate::proc::descendants(&self.process_root, j.root.pid)?;
        if tree.procs.first()?.start_time != j.root.start_time {
            return None;
        }
        let pids: Vec<u32> = tree.procs.iter().map(|p| p.pid).collect();
        let f = crate::act::freeze::owned(&self.process_root, &pids)?;
        match f.freeze() {
            Ok(()) => Some(f),
            Err(e) => {
                tracing::warn!(cgroup = %f.dir.display(), error = %e, "cannot freeze the job's cgroup; stopping it with signals");
                None
            }
        }
    }

    /// The job's root exited or its pid now names another process: drop it, signalling nothing.
    pub(super) fn job_gone(&mut self, name: &str, now_ms: u64) {
        if self.jobs.remove(name).is_some() {
            policy::forget(&mut self.policy, name);
            self.save();
            self.record(
                now_ms,
                "detach",
                name,
                "gone",
                "the job's process exited".into(),
                false,
            );
        }
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
                    }),
                    config: j.config.clone(),
                })
                .collect(),
        }
    }

    /// Writes the state file; a failure is logged (the pause itself stands).
    pub(super) fn save(&self) {
        if let Err(e) = persist::save(&self.cfg.control.state_dir, &self.persisted()) {
            tracing::error!(dir = %self.cfg.control.state_dir.display(), error = %e, "cannot write the state file");
        }
    }

    /// At start: continue whatever a previous daemon left stopped, and re-adopt its jobs that still run.
    pub fn recover(&mut self, now_ms: u64) {
        let state = match persist::load(&self.cfg.control.state_dir) {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the previous state; nothing to recover");
                return;
            }
        };
        for pj in state.jobs {
            if let Some(p) = &pj.paused {
                let gone = pause::resume(&self.process_root, &p.stopped, None);
                if let Some(f) = &p.frozen {
                    if let Err(e) = f.thaw() {
                        tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw a cgroup a previous daemon froze");
                    }
                }
                self.record(
                    now_ms,
                    "resume",
                    &pj.name,
                    "restart",
                    match &p.frozen {
                        Some(f) => format!(
                            "thawed {}, which a previous daemon had frozen",
                            f.dir.display()
                        ),
                        None => format!(
                            "continued {} process(es) a previous daemon had paused",
                            p.stopped.len() - gone.len()
                        ),
                    },
                    false,
                );
            }
            let alive = crate::proc::read_stat(&self.process_root, pj.root.pid)
                .is_ok_and(|s| s.start_time == pj.root.start_time && s.state != 'Z');
            if alive {
                let cg = crate::job::measure::cgroup_of(&self.process_root, pj.root.pid);
                let mut job = Job::new(
                    pj.name.clone(),
                    pj.root,
                    pj.owner_uid,
                    pj.attached_at_ms,
                    cg,
                    self.cfg.sampling.growth_window_ms.0,
                );
                job.config = pj.config.clone();
                job.pidfd = signal::open(&self.process_root, pj.root).ok().flatten();
                self.jobs.insert(pj.name.clone(), job);
                self.record(
                    now_ms,
                    "attach",
                    &pj.name,
                    "restart",
                    format!("re-adopted pid {}", pj.root.pid),
                    false,
                );
            }
        }
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
                "resume",
                &name,
                "shutdown",
                "the daemon is stopping".into(),
                false,
            );
        }
        self.save();
    }
}
