//! [`HostDriver`]: what the engine does to the host, and [`release`], which undoes a pause from its
//! record alone through any driver.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use super::Pinned;
use super::error::{CgroupError, SignalError};
use super::view::HostView;
use crate::config::SignalName;
use crate::held::{Fired, Frozen, Loan, Mechanism, OomdMark, ReflexPlan, Slurmctl};
use crate::host::ProcRef;
use crate::sample::cgroup::CgroupDir;
use crate::slurm::call::{SlurmAnswer, SlurmCall, SlurmError};

/// What memwatch does to the host on a job's behalf. Every method acts on exactly what it is given
/// (a process named by pid and start time, a cgroup directory, a recorded loan); who may be acted on
/// is decided before the call, by the engine.
pub trait HostDriver: Send + Sync {
    /// A pidfd on `target` once it is checked to be that process (its start time), kept from attach
    /// on; `Ok(None)` where the kernel has none, `Err` when the process is not there.
    fn pin(&self, target: ProcRef) -> Result<Option<Arc<OwnedFd>>, SignalError>;
    /// Sends `sig` to exactly `target` (through `pinned` when given), or to nobody.
    fn signal(
        &self,
        target: ProcRef,
        pinned: Option<&OwnedFd>,
        sig: SignalName,
    ) -> Result<(), SignalError>;
    /// Stops the tree under `root` on behalf of user `owner`, root first, then `members` (its
    /// processes pinned at the last walk, `memwatch::act::pin::pin_members`); the processes it stopped.
    fn stop_tree(
        &self,
        root: ProcRef,
        pinned: Option<&OwnedFd>,
        owner: u32,
        members: &[Pinned],
    ) -> Result<Vec<ProcRef>, SignalError>;
    /// Continues `stopped`, children before parents; those that are gone.
    fn continue_tree(&self, stopped: &[ProcRef], pinned: Option<&OwnedFd>) -> Vec<ProcRef>;
    /// Freezes a cgroup: `Ok(true)` settled, `Ok(false)` still settling; an error names the
    /// freezer's file.
    fn freeze(&self, cgroup: &Frozen) -> Result<bool, CgroupError>;
    /// Thaws a cgroup; one that is gone is nothing to thaw.
    fn thaw(&self, cgroup: &Frozen) -> Result<(), CgroupError>;
    /// Runs one Slurm call for job `id`.
    fn slurm(&self, ctl: &Slurmctl, call: &SlurmCall, id: &str) -> Result<SlurmAnswer, SlurmError>;
    /// Raises a cgroup's limit as `loan` says.
    fn set_limit(&self, loan: &Loan) -> Result<(), CgroupError>;
    /// Puts a lent limit back once usage fits with `margin` to spare; `Ok(false)`: not yet.
    fn restore_limit(&self, loan: &Loan, margin: u64) -> Result<bool, CgroupError>;
    /// The cgroups systemd-oomd would choose among to kill the job in the cgroup v2 directory `cg`
    /// (owned by user `owner`), each with the `user.oomd_omit` value it has now (`act::oomd`).
    fn oomd_candidates(&self, cg: &CgroupDir, owner: u32) -> Vec<OomdMark>;
    /// Sets `user.oomd_omit=1` on the mark's cgroup (nothing when it is set already).
    fn oomd_mark(&self, mark: &OomdMark) -> Result<(), CgroupError>;
    /// Puts back what the mark found there (no attribute, or the old value); a cgroup that is gone
    /// is done.
    fn oomd_unmark(&self, mark: &OomdMark) -> Result<(), CgroupError>;
    /// What `job`'s reflex (`memwatch::reflex`) did, if it fired and the engine has not taken it over
    /// yet (taken: the engine holds or undoes it, once). Asked before the engine stops the job
    /// itself, so that a stop the reflex made is the pause.
    fn fired_reflex(&self, job: &str) -> Option<Fired>;
    /// Hands `job`'s reflex as `plan` says, recorded already, to what fires it (the daemon's wake
    /// thread), the job's usage read in its memory cgroup `memory`. `false` where nothing took it:
    /// the daemon's watches arm it at their next sync.
    fn arm_reflex(&self, job: &str, memory: &CgroupDir, plan: &ReflexPlan) -> bool;
}

/// What undoing a pause did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Released {
    /// How many recorded processes were continued.
    pub continued: usize,
    /// The cgroup that was thawed.
    pub thawed: Option<PathBuf>,
    /// The Slurm job resumed through Slurm.
    pub slurm_resumed: Option<String>,
    /// How many `user.oomd_omit` marks were taken off (their old values put back).
    pub unmarked: usize,
}

impl std::fmt::Display for Released {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(id) = &self.slurm_resumed {
            write!(f, "resumed Slurm job {id} (scontrol resume); ")?;
        }
        match &self.thawed {
            Some(dir) => write!(
                f,
                "thawed {} and continued {} process(es) a previous daemon had paused",
                dir.display(),
                self.continued
            ),
            None => write!(
                f,
                "continued {} process(es) a previous daemon had paused",
                self.continued
            ),
        }?;
        if self.unmarked > 0 {
            write!(f, "; took {} systemd-oomd mark(s) off", self.unmarked)?;
        }
        Ok(())
    }
}

/// Undoes a pause from its record alone — the mechanism that held it, the processes stopped (root
/// first) and the cgroups marked for systemd-oomd — with no config: Slurm resumes the job, the
/// cgroup is thawed, the stopped processes are continued, children first, and the marks are taken
/// off. Idempotent: continuing a running process, thawing a thawed cgroup or putting back a value
/// already back changes nothing.
pub fn release(
    host: &dyn HostDriver,
    mechanism: Option<&Mechanism>,
    stopped: &[ProcRef],
    oomd_omit: &[OomdMark],
    pinned: Option<&OwnedFd>,
) -> Released {
    let mut out = Released {
        unmarked: unmark(host, oomd_omit),
        ..Released::default()
    };
    if let Some(s) = mechanism.and_then(Mechanism::suspended) {
        match host.slurm(&s.ctl, &SlurmCall::Resume, &s.job_id) {
            Ok(SlurmAnswer::KeptBy(nodes)) => {
                tracing::info!(slurm_job_id = %s.job_id, holders = ?nodes, "released this node's hold on the Slurm job; other nodes still hold it suspended")
            }
            Ok(_) => out.slurm_resumed = Some(s.job_id.clone()),
            // Already running, or gone: Slurm says which; the processes are continued either way.
            Err(e) => {
                tracing::error!(slurm_job_id = %s.job_id, error = %e, "cannot resume a Slurm job memwatch suspended")
            }
        }
    }
    if let Some(f) = mechanism.and_then(Mechanism::frozen) {
        match host.thaw(f) {
            Ok(()) => out.thawed = Some(f.dir.clone()),
            Err(e) => {
                tracing::error!(cgroup = %f.dir.display(), error = %e, "cannot thaw a cgroup memwatch froze")
            }
        }
    }
    let gone = host.continue_tree(stopped, pinned);
    out.continued = stopped.len().saturating_sub(gone.len());
    out
}

/// Takes off the marks a pause set for systemd-oomd; how many came off. A failure is logged: the
/// pause ends all the same.
pub fn unmark(host: &dyn HostDriver, marks: &[OomdMark]) -> usize {
    marks
        .iter()
        .filter(|m| match host.oomd_unmark(m) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(cgroup = %m.dir.display(), error = %e, "cannot take off the systemd-oomd mark memwatch set");
                false
            }
        })
        .count()
}

/// Thaws and continues whatever the paused job `job` may have had stopped, from its record alone
/// ([`release`]), then every stopped member the record missed of the trees under its root and
/// under each process it records. `None` when the record holds no pause.
pub fn undo_pause(
    host: &dyn HostDriver,
    view: &dyn HostView,
    job: &crate::record::PersistedJob,
) -> Option<Released> {
    let p = job.paused.as_ref()?;
    let mechanism = p.hold.mechanism();
    if mechanism.is_none() {
        tracing::warn!(
            job = job.name,
            "a pause held by a mechanism this version does not know; continuing its processes"
        );
    }
    let mut out = release(host, mechanism.as_ref(), &p.stopped, &p.oomd_omit, None);
    // Whatever is still stopped of the trees under the root and under each recorded process: members
    // the record missed (a kill mid-walk), and the trees of a Slurm job's other tasks on this node,
    // which are not the root's descendants and are recorded before they are stopped. Each tree once.
    let mut seen = std::collections::HashSet::new();
    for top in std::iter::once(&job.root).chain(&p.stopped) {
        if seen.contains(&top.pid) {
            continue;
        }
        let ours = view
            .stat(top.pid)
            .is_ok_and(|s| s.start_time == top.start_time && s.state != 'Z');
        if !ours {
            continue;
        }
        for proc in view.tree(top.pid).unwrap_or_default().iter().rev() {
            let r = proc.proc_ref();
            if seen.insert(r.pid)
                && proc.is_stopped()
                && !p.stopped.contains(&r)
                && host.signal(r, None, SignalName::CONT).is_ok()
            {
                out.continued += 1;
            }
        }
    }
    Some(out)
}
