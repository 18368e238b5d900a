//! The host seam. Every change memwatch makes to a job's processes, cgroups, limits and Slurm job
//! goes through a [`HostDriver`]: [`Host`] makes it on this machine; a test's driver records it
//! instead (the engine's simulator, `tests/simulator.rs`). Which mechanism holds one job's pause is
//! a closed enum, [`Mechanism`], chosen for the job in one function ([`Mechanism::choose`]), and
//! undone from its record alone ([`release`]): what a restarted daemon and the guardian do, with no
//! config.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::signal::Signal;

use super::cgroup_error::CgroupError;
use super::pin::Pinned;
use super::signal::SignalError;
use super::slurm::SlurmError;
use super::{freeze::Freezing as _, lend::Lending as _, oomd::Marking as _, slurm::Scontrol as _};
pub use crate::job::held::Mechanism;
use crate::job::held::{Fired, Frozen, Loan, OomdMark, Slurmctl};
use crate::proc::ProcRef;
use crate::sample::cgroup::CgroupDir;

/// A call memwatch makes to Slurm for a whole job, on every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmCall {
    /// `scontrol suspend`.
    Suspend,
    /// `scontrol resume`.
    Resume,
    /// `scontrol requeue`.
    Requeue,
    /// `scancel`.
    Cancel,
    /// `scancel --full --signal=NAME` (a name such as "USR1").
    Signal(String),
    /// While this node holds the job: its state and holds read back (`scontrol show job`), this
    /// node's hold renewed, and the job suspended again if it was resumed behind this node's back.
    Hold,
    /// While Slurm holds the job suspended and this node does not: which nodes hold it (`scontrol
    /// show job`, read only).
    Holders,
}

/// What Slurm did with a call that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmAnswer {
    /// What was asked.
    Done,
    /// A resume that was not made: these other nodes still hold the job suspended. This node's
    /// hold is released.
    KeptBy(Vec<String>),
    /// A `Hold` found the job running and suspended it again.
    Resuspended,
    /// The nodes whose holds keep the job suspended now (a `Hold` that found it suspended, after
    /// renewing this node's; `Holders`).
    Holders(Vec<String>),
}

impl std::fmt::Display for SlurmCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlurmCall::Suspend => f.write_str("scontrol suspend"),
            SlurmCall::Resume => f.write_str("scontrol resume"),
            SlurmCall::Requeue => f.write_str("scontrol requeue"),
            SlurmCall::Cancel => f.write_str("scancel"),
            SlurmCall::Signal(s) => write!(f, "scancel --signal={s}"),
            SlurmCall::Hold | SlurmCall::Holders => f.write_str("scontrol show job"),
        }
    }
}

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
        sig: Signal,
    ) -> Result<(), SignalError>;
    /// Stops the tree under `root` on behalf of user `owner`, root first, then `members` (its
    /// processes pinned at the last walk, `act::pin::pin_members`); the processes it stopped.
    fn stop_tree(
        &self,
        root: ProcRef,
        pinned: Option<&OwnedFd>,
        owner: u32,
        members: &[Pinned],
    ) -> Result<Vec<ProcRef>, SignalError>;
    /// Continues `stopped`, children before parents; those that are gone.
    fn continue_tree(&self, stopped: &[ProcRef], pinned: Option<&OwnedFd>) -> Vec<ProcRef>;
    /// Freezes a cgroup: `Ok(true)` settled, `Ok(false)` still settling.
    fn freeze(&self, cgroup: &Frozen) -> std::io::Result<bool>;
    /// Thaws a cgroup; one that is gone is nothing to thaw.
    fn thaw(&self, cgroup: &Frozen) -> std::io::Result<()>;
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
    /// What `job`'s reflex (`crate::reflex`) did, if it fired and the engine has not taken it over
    /// yet (taken: the engine holds or undoes it, once). Asked before the engine stops the job
    /// itself, so that a stop the reflex made is the pause.
    fn fired_reflex(&self, _job: &str) -> Option<Fired> {
        None
    }
}

/// What the reflexes armed in the wake thread did, not yet handed to the engine
/// (`crate::reflex::Armory`).
pub trait FiredReflexes: Send + Sync + std::fmt::Debug {
    /// What `job`'s reflex did, if it fired and is not taken yet (taken: handled once).
    fn take(&self, job: &str) -> Option<Fired>;
}

/// The driver that acts on this machine, through `/proc` and the cgroup tree under `root`.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
    /// What the wake thread's reflexes did, where the daemon arms any.
    armory: Option<Arc<dyn FiredReflexes>>,
}

impl Host {
    /// The machine whose `/proc` and `/sys` are under `root` (`/` but in tests).
    pub fn new(root: &Path) -> Self {
        Host {
            root: root.to_path_buf(),
            armory: None,
        }
    }

    /// The same, taking over what the reflexes of `armory` did before a stop of the engine's own.
    pub fn with_armory(root: &Path, armory: Arc<dyn FiredReflexes>) -> Self {
        Host {
            root: root.to_path_buf(),
            armory: Some(armory),
        }
    }
}

impl HostDriver for Host {
    fn pin(&self, target: ProcRef) -> Result<Option<Arc<OwnedFd>>, SignalError> {
        super::signal::open(&self.root, target)
    }

    fn signal(
        &self,
        target: ProcRef,
        pinned: Option<&OwnedFd>,
        sig: Signal,
    ) -> Result<(), SignalError> {
        match pinned {
            Some(fd) => super::signal::send_pinned(fd, target.pid, sig),
            None => super::signal::send(&self.root, target, sig),
        }
    }

    fn stop_tree(
        &self,
        root: ProcRef,
        pinned: Option<&OwnedFd>,
        owner: u32,
        members: &[Pinned],
    ) -> Result<Vec<ProcRef>, SignalError> {
        super::pause::stop_tree(&self.root, root, pinned, owner, members)
    }

    fn continue_tree(&self, stopped: &[ProcRef], pinned: Option<&OwnedFd>) -> Vec<ProcRef> {
        super::pause::resume(&self.root, stopped, pinned)
    }

    fn freeze(&self, cgroup: &Frozen) -> std::io::Result<bool> {
        cgroup.freeze()
    }

    fn thaw(&self, cgroup: &Frozen) -> std::io::Result<()> {
        cgroup.thaw()
    }

    fn slurm(&self, ctl: &Slurmctl, call: &SlurmCall, id: &str) -> Result<SlurmAnswer, SlurmError> {
        let done = |r: Result<(), SlurmError>| r.map(|()| SlurmAnswer::Done);
        match call {
            SlurmCall::Suspend => done(ctl.suspend(id)),
            SlurmCall::Resume => ctl.resume(id),
            SlurmCall::Requeue => done(ctl.requeue(id)),
            SlurmCall::Cancel => done(ctl.cancel(id)),
            SlurmCall::Signal(s) => done(ctl.signal(id, s)),
            SlurmCall::Hold => ctl.hold(id),
            SlurmCall::Holders => ctl.holders(id),
        }
    }

    fn set_limit(&self, loan: &Loan) -> Result<(), CgroupError> {
        loan.raise()
    }

    fn restore_limit(&self, loan: &Loan, margin: u64) -> Result<bool, CgroupError> {
        loan.restore(margin)
    }

    fn oomd_candidates(&self, cg: &CgroupDir, owner: u32) -> Vec<OomdMark> {
        super::oomd::candidates(&cg.mount, &cg.dir, owner)
    }

    fn oomd_mark(&self, mark: &OomdMark) -> Result<(), CgroupError> {
        if super::oomd::read(&mark.dir)?.as_deref() == Some("1") {
            return Ok(());
        }
        mark.set()
    }

    fn oomd_unmark(&self, mark: &OomdMark) -> Result<(), CgroupError> {
        mark.restore()
    }

    fn fired_reflex(&self, job: &str) -> Option<Fired> {
        self.armory.as_ref()?.take(job)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::held::Suspended;
    use crate::sample::cgroup::Version;

    fn frozen(version: Version) -> Frozen {
        Frozen {
            version,
            dir: PathBuf::from("/sys/fs/cgroup/job"),
        }
    }

    fn suspended() -> Suspended {
        Suspended {
            job_id: "7".into(),
            ctl: Slurmctl {
                scontrol: "scontrol".into(),
                scancel: "scancel".into(),
                timeout_ms: 1000,
                holder: String::new(),
                hold_seconds: 0,
            },
        }
    }

    /// Slurm wins over a cgroup (a Slurm job's cgroup is never frozen), v2 and v1 freezers are told
    /// apart by the cgroup's version, and nothing else leaves signals.
    #[test]
    fn one_function_chooses_the_mechanism() {
        assert_eq!(
            Mechanism::choose(Some(suspended()), Some(frozen(Version::V2))),
            Mechanism::Slurm(suspended())
        );
        assert_eq!(
            Mechanism::choose(None, Some(frozen(Version::V2))),
            Mechanism::FreezeV2(frozen(Version::V2))
        );
        assert_eq!(
            Mechanism::choose(None, Some(frozen(Version::V1))),
            Mechanism::FreezeV1(frozen(Version::V1))
        );
        assert_eq!(Mechanism::choose(None, None), Mechanism::Signals);
        assert_eq!(Mechanism::Signals.frozen(), None);
        assert_eq!(
            Mechanism::FreezeV1(frozen(Version::V1)).name(),
            "cgroup_v1_freezer"
        );
    }
}
