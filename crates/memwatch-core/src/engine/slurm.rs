//! Slurm jobs followed by job id: adopted when their first task appears on this node (a prolog
//! attaches them before it does), paused whole through Slurm, and ended by a requeue.

use std::collections::{BTreeMap, BTreeSet};

use super::{Engine, ListedPids};
use crate::audit::{Action, Reason};
use crate::control::{Caller, Refusal};
use crate::held::{Slurmctl, Suspended};
use crate::host::ProcRef;
use crate::job::Job;
use crate::seam::HostView;
use crate::seam::SignalError;
use crate::slurm;

/// How often a node that does not hold a Slurm job Slurm holds suspended here reads which nodes do
/// (one `scontrol show job` each time, on every such node).
pub(super) const HOLDERS_EVERY_MS: u64 = 10_000;

/// This node's part in the Slurm jobs it follows.
pub(super) struct Node {
    /// This host's Slurm node name (`[slurm] node_name`, else the host name): whose `slurm_NODE`
    /// cgroup root holds this node's jobs.
    pub(super) name: String,
    /// The calls memwatch makes to Slurm from `[slurm]`, with this node's name in the holds.
    pub(super) ctl: Slurmctl,
    /// Slurm jobs attached by id, waiting for their first process on this node.
    pub(super) pending: BTreeMap<String, PendingSlurm>,
    /// Jobs whose Slurm suspension is being checked (`SlurmCall::Hold` under way): one at a time.
    pub(super) checking: BTreeSet<String>,
}

impl Node {
    /// Node `name`, following no job yet.
    pub(super) fn new(cfg: &crate::config::Slurm, name: String) -> Node {
        Node {
            ctl: Slurmctl::new(cfg, &name),
            name,
            pending: BTreeMap::new(),
            checking: BTreeSet::new(),
        }
    }
}

/// A Slurm job attached by id before any of its processes ran on this node.
#[derive(Debug, Clone)]
pub(super) struct PendingSlurm {
    name: Option<String>,
    caller: Caller,
    since_ms: u64,
    /// Its processes on this node ended and memwatch follows it into its next step here (a job
    /// without `PrologFlags=Contain` has none between its steps on a node without its batch script).
    next_step: bool,
}

/// Every task of a Slurm job attached by id on this node, oldest first; the leader's tree alone for
/// any other job (`None`: nothing to add to it).
pub(super) fn tasks_of(view: &dyn HostView, j: &Job) -> Option<Vec<crate::proc::Stat>> {
    j.slurm.as_ref()?;
    let dir = j.cgroup_dir.as_ref()?;
    let mut pids = Vec::new();
    view.pids_below(&dir.dir, &mut pids);
    Some(view.slurm_tasks(&pids))
}

/// The tops of a Slurm job's task trees on this node but the root: what a pause stops besides the
/// root's tree (`Engine::stop_tasks`). Empty for any other job.
pub(super) fn tops_of(view: &dyn HostView, j: &Job) -> Vec<ProcRef> {
    let tasks = tasks_of(view, j).unwrap_or_default();
    slurm::tops(&tasks)
        .into_iter()
        .filter(|t| t.pid != j.root.pid)
        .map(|t| t.proc_ref())
        .collect()
}

impl Engine {
    /// How a pause of `j` goes through Slurm, if it does: the job belongs to a Slurm job, job-wide
    /// pauses are on, and the Slurm job is the job owner's (or its owner is not known here).
    pub(super) fn slurm_suspend_of(&self, j: &Job) -> Option<Suspended> {
        if !self.cfg.slurm.job_wide_pause {
            return None;
        }
        let id = j.slurm_job_id()?;
        let uid = self
            .view
            .slurm_job(id, &self.slurm.name)
            .and_then(|c| c.uid);
        if uid.is_some_and(|u| u != j.owner_uid) {
            tracing::warn!(
                job = j.name,
                slurm_job_id = id,
                "the Slurm job is another user's: pausing only this job's processes"
            );
            return None;
        }
        Some(Suspended {
            job_id: id.to_owned(),
            ctl: self.slurm.ctl.clone(),
        })
    }

    /// Once a full sample, for each Slurm job this node holds suspended (and keeps holds for):
    /// its state and holds read back, its hold renewed, and the job suspended again if it runs
    /// behind this node's back. For each job Slurm holds suspended here that this node does not
    /// hold: which nodes do, read every [`HOLDERS_EVERY_MS`]. One call per job at a time.
    pub(super) fn check_slurm_holds(&mut self, now_ms: u64) {
        use crate::seam::SlurmCall;
        let due: Vec<(String, SlurmCall, Suspended)> = self
            .jobs
            .values()
            .filter(|j| !self.slurm.checking.contains(&j.name))
            .filter_map(|j| {
                if let Some((p, s)) = j.pause.as_ref().and_then(|p| Some((p, p.suspended()?))) {
                    return (p.phase == crate::job::PausePhase::Held
                        && !p.dry_run
                        && !s.ctl.holder.is_empty())
                    .then(|| (j.name.clone(), SlurmCall::Hold, s.clone()));
                }
                j.slurm_suspended_since_ms?;
                let read = j.slurm_holders.as_ref().map(|(at, _)| *at);
                let due = read.is_none_or(|at| now_ms.saturating_sub(at) >= HOLDERS_EVERY_MS);
                (self.cfg.slurm.holds && due).then(|| {
                    let ctl = self.slurm.ctl.clone();
                    let job_id = j.slurm_job_id()?.to_owned();
                    Some((
                        j.name.clone(),
                        SlurmCall::Holders,
                        Suspended { job_id, ctl },
                    ))
                })?
            })
            .collect();
        for (name, call, s) in due {
            self.slurm.checking.insert(name.clone());
            self.emit(super::effect::Effect::Slurm(super::SlurmRequest {
                job: name,
                call,
                id: s.job_id,
                ctl: s.ctl,
                ending: None,
            }));
        }
    }

    /// The nodes that hold a Slurm job suspended, as a call read them back.
    pub(super) fn note_slurm_holders(&mut self, name: &str, nodes: Vec<String>, now_ms: u64) {
        if let Some(j) = self.jobs.get_mut(name) {
            j.slurm_holders = Some((now_ms, nodes));
            self.dirty = true;
        }
    }

    /// Stops a job with signals: the tree under its root, and for a Slurm job attached by id, every
    /// other task tree of it on this node (its steps' tasks are not the batch script's descendants).
    /// The pause recorded those trees' tops before this stop; a top it did not name (a step's task
    /// started since) is recorded first, the state file written, so that whoever undoes the pause
    /// after a crash continues it too. One that cannot be recorded is left running, and said so.
    pub(super) fn stop_tasks(&mut self, name: &str) -> Result<Vec<ProcRef>, SignalError> {
        let Some(j) = self.jobs.get(name) else {
            return Ok(Vec::new());
        };
        let (pidfd, owner) = (j.pidfd.clone(), j.owner_uid);
        let mut stopped = self
            .host
            .stop_tree(j.root, pidfd.as_deref(), owner, &j.pinned)?;
        let on_record = |t: &ProcRef| {
            j.pause
                .as_ref()
                .is_some_and(|p| p.stopped.iter().any(|r| r.pid == t.pid))
        };
        let (mut tops, late): (Vec<ProcRef>, Vec<ProcRef>) = tops_of(self.view.as_ref(), j)
            .into_iter()
            .filter(|t| !stopped.iter().any(|r| r.pid == t.pid))
            .partition(|t| on_record(t));
        if !late.is_empty() {
            let record = |jobs: &mut std::collections::BTreeMap<String, Job>, add: bool| {
                if let Some(p) = jobs.get_mut(name).and_then(|j| j.pause.as_mut()) {
                    p.stopped.retain(|r| !late.iter().any(|t| t.pid == r.pid));
                    if add {
                        p.stopped.extend(late.iter().copied());
                    }
                }
            };
            record(&mut self.jobs, true);
            match self.write_state() {
                Ok(()) => tops.extend(late.iter().copied()),
                Err(e) => {
                    record(&mut self.jobs, false);
                    tracing::warn!(job = name, tasks = late.len(), error = %e, "task trees started since the pause was recorded cannot be recorded; leaving them running");
                }
            }
        }
        for top in tops {
            match self.host.stop_tree(top, None, owner, &[]) {
                Ok(s) => stopped.extend(s),
                Err(SignalError::Gone(_)) => {}
                Err(e) => {
                    self.host.continue_tree(&stopped, pidfd.as_deref());
                    return Err(e);
                }
            }
        }
        Ok(stopped)
    }

    /// `memwatch attach --slurm-job ID`: attaches the job now if a task of it runs on this node,
    /// else (root only: a prolog) waits for its first one. Returns the job's name.
    pub(super) fn attach_slurm(
        &mut self,
        id: &str,
        name: Option<String>,
        caller: Caller,
        listed: Option<ListedPids>,
        now_ms: u64,
    ) -> Result<String, Refusal> {
        if !slurm::valid_id(id) {
            return Err(Refusal::invalid(format!(
                "{id:?} is not a Slurm job id (digits only)"
            )));
        }
        if let Some(j) = self.jobs.values().find(|j| j.slurm.as_deref() == Some(id)) {
            return Err(Refusal::conflict(format!(
                "Slurm job {id} is already attached as {:?}",
                j.name
            )));
        }
        if let Some(p) = self.slurm.pending.get(id) {
            // The prolog of a job that ran here before (a requeued job's next run): it attaches the
            // job again, as it would had its epilog run first.
            if !p.next_step || !(caller.is_root() || caller.uid == p.caller.uid) {
                return Err(Refusal::conflict(format!(
                    "Slurm job {id} is already attached and waits for its first process on this node"
                )));
            }
            self.slurm.pending.remove(id);
        }
        if let Some(attached) = self.adopt_slurm(id, name.clone(), caller, listed, now_ms)? {
            return Ok(attached);
        }
        if !caller.is_root() {
            return Err(Refusal::not_found(format!(
                "Slurm job {id} has no process on this node (only root may attach a job before it starts)"
            )));
        }
        let shown = name.clone().unwrap_or_else(|| format!("slurm-{id}"));
        self.slurm.pending.insert(
            id.to_owned(),
            PendingSlurm {
                name,
                caller,
                since_ms: now_ms,
                next_step: false,
            },
        );
        self.record_for(
            now_ms,
            Action::Attach,
            &shown,
            Some(id.to_owned()),
            Reason::Slurm,
            format!(
                "Slurm job {id}: waiting for its first process on this node (at most {} s)",
                self.cfg.slurm.adopt_within_seconds
            ),
            false,
        );
        Ok(shown)
    }

    /// Attaches Slurm job `id` by its leader if one of its tasks runs on this node (`Ok(None)`: none
    /// yet). The job's cgroup is its Slurm job cgroup, and its processes all its tasks here.
    fn adopt_slurm(
        &mut self,
        id: &str,
        name: Option<String>,
        caller: Caller,
        listed: Option<ListedPids>,
        now_ms: u64,
    ) -> Result<Option<String>, Refusal> {
        let cgroup = self.view.slurm_job(id, &self.slurm.name);
        let tasks = match &cgroup {
            Some(c) => {
                let mut pids = Vec::new();
                self.view.pids_below(&c.memory.dir, &mut pids);
                self.view.slurm_tasks(&pids)
            }
            // No cgroup plugin: Slurm's own list (only when asked, never in the waiting loop),
            // the one the host made before the request where it did.
            None if !self.slurm.pending.contains_key(id) => {
                let listed = match listed.filter(|l| l.job_id == id) {
                    Some(l) => l.result,
                    None => self.view.slurm_listpids(&self.slurm.ctl, id),
                };
                match listed {
                    Ok(pids) => self.view.slurm_tasks(&pids),
                    Err(e) => {
                        tracing::debug!(slurm_job_id = id, error = %e, "scontrol listpids");
                        Vec::new()
                    }
                }
            }
            None => Vec::new(),
        };
        let Some(leader) = slurm::leader(&tasks) else {
            return Ok(None);
        };
        let attached = self.attach_as(leader.pid, name, None, caller, now_ms, Some(id))?;
        if let Some(j) = self.jobs.get_mut(&attached) {
            if let Some(c) = cgroup {
                j.origin = crate::job::origin::of_path(&c.memory.path).or(j.origin.take());
                j.cgroup_dir = Some(c.memory);
                j.cgroup_owner = self.view.cgroup_owner(j.cgroup_dir.as_ref());
            }
            // Slurm's processes share the job's cgroup: it is never memwatch's to freeze.
            j.freezer = None;
        }
        self.save();
        tracing::info!(
            job = attached,
            slurm_job_id = id,
            leader = leader.pid,
            "attached the Slurm job"
        );
        Ok(Some(attached))
    }

    /// A Slurm job attached by id whose processes on this node all ended (its root did, and no
    /// task of it is left here) is followed into its next step on this node: memwatch waits for it
    /// as for a first process, until the job's epilog detaches it or `slurm.adopt_within_seconds`
    /// pass with no step here. A step already running is adopted on this same sample.
    pub(super) fn follow_next_step(&mut self, id: &str, name: &str, owner_uid: u32, now_ms: u64) {
        self.slurm.pending.insert(
            id.to_owned(),
            PendingSlurm {
                name: Some(name.to_owned()),
                caller: Caller {
                    uid: owner_uid,
                    pid: None,
                },
                since_ms: now_ms,
                next_step: true,
            },
        );
        self.record_for(
            now_ms,
            Action::Attach,
            name,
            Some(id.to_owned()),
            Reason::Slurm,
            format!(
                "Slurm job {id}: its processes on this node ended; following it into its next step here \
                 (until its epilog, at most {} s without one)",
                self.cfg.slurm.adopt_within_seconds
            ),
            false,
        );
    }

    /// Adopts the Slurm jobs waiting for their first process, and forgets those that waited too long.
    pub(super) fn adopt_pending_slurm(&mut self, now_ms: u64) {
        let waiting: Vec<(String, PendingSlurm)> = self
            .slurm
            .pending
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, p) in waiting {
            let shown = p.name.clone().unwrap_or_else(|| format!("slurm-{id}"));
            let outcome = self.adopt_slurm(&id, p.name.clone(), p.caller, None, now_ms);
            let expired = now_ms.saturating_sub(p.since_ms)
                > self.cfg.slurm.adopt_within_seconds.saturating_mul(1000);
            let within = self.cfg.slurm.adopt_within_seconds;
            let gave_up = match outcome {
                Ok(Some(_)) => {
                    self.slurm.pending.remove(&id);
                    None
                }
                Ok(None) if !expired => None,
                Ok(None) if p.next_step => Some((
                    Action::Detach,
                    format!(
                        "Slurm job {id} ran no further step on this node within {within} s; no longer following it"
                    ),
                )),
                Ok(None) => Some((
                    Action::Error,
                    format!(
                        "Slurm job {id} started no process on this node within {within} s; no longer waiting for it"
                    ),
                )),
                Err(e) => Some((Action::Error, format!("cannot attach Slurm job {id}: {e}"))),
            };
            if let Some((action, why)) = gave_up {
                self.slurm.pending.remove(&id);
                self.record_for(
                    now_ms,
                    action,
                    &shown,
                    Some(id.clone()),
                    Reason::Slurm,
                    why,
                    false,
                );
            }
        }
    }

    /// `memwatch detach --slurm-job ID` (the epilog): stops waiting for the job, or detaches it.
    pub(super) fn detach_slurm(
        &mut self,
        id: &str,
        caller: Caller,
        now_ms: u64,
    ) -> Result<String, Refusal> {
        if let Some(p) = self.slurm.pending.get(id) {
            if !caller.is_root() && caller.uid != p.caller.uid {
                return Err(Refusal::forbidden(format!(
                    "permission denied: Slurm job {id} was attached by root"
                )));
            }
            let shown = p.name.clone().unwrap_or_else(|| format!("slurm-{id}"));
            let how = if p.next_step {
                format!("Slurm job {id} ended (its epilog ran)")
            } else {
                format!("Slurm job {id}, before any process of it ran here")
            };
            self.slurm.pending.remove(id);
            self.record_for(
                now_ms,
                Action::Detach,
                &shown,
                Some(id.to_owned()),
                Reason::Slurm,
                how,
                false,
            );
            return Ok(shown);
        }
        let attached = self
            .jobs
            .values()
            .find(|j| j.slurm_job_id() == Some(id))
            .map(|j| j.name.clone());
        if let Some(name) = attached {
            return self.detach(&name, caller, now_ms);
        }
        // Its processes ended before the epilog ran: memwatch already let it go.
        let ended = self
            .ended
            .iter()
            .rev()
            .find(|e| e.slurm_job_id.as_deref() == Some(id))
            .filter(|e| caller.is_root() || caller.uid == e.owner_uid)
            .map(|e| e.name.clone());
        match ended {
            Some(name) => {
                self.record(
                    now_ms,
                    Action::Detach,
                    &name,
                    Reason::Slurm,
                    format!("Slurm job {id} ended (its epilog ran)"),
                    false,
                );
                Ok(name)
            }
            None => Err(Refusal::not_found(format!(
                "no attached job belongs to Slurm job {id}"
            ))),
        }
    }
}
