//! The host seam on this machine. Every change memwatch makes to a job's processes, cgroups, limits
//! and Slurm job goes through a [`HostDriver`] (memwatch-core's `seam`): [`Host`] makes it here; the
//! engine's simulator (memwatch-core's `engine::sim`) records it instead. Which mechanism holds one job's pause is
//! a closed enum, [`Mechanism`], chosen for the job in one function ([`Mechanism::choose`]), and
//! undone from its record alone ([`release`]): what a restarted daemon and the guardian do, with no
//! config.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::SignalName;

use super::cgroup_error::CgroupError;
use super::pin::Pinned;
use super::signal::SignalError;
use super::slurm::SlurmError;
use super::{freeze::Freezing as _, lend::Lending as _, oomd::Marking as _, slurm::Scontrol as _};
pub use crate::job::held::Mechanism;
use crate::job::held::{Fired, Frozen, Loan, OomdMark, ReflexPlan, Slurmctl};
use crate::proc::ProcRef;
use crate::sample::cgroup::CgroupDir;

pub use memwatch_core::seam::{HostDriver, SlurmAnswer, SlurmCall};

/// Why a reflex could not be made ready (`crate::reflex::Reflex::prepare`): its act cannot be
/// opened.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The freezer's state file does not open for writing (it names the file).
    #[error("the freezer cannot be written: {0}")]
    Freezer(#[from] CgroupError),
    /// The plan stops the job's root, and there is no pidfd on it (a kernel before 5.3).
    #[error("no pidfd on the job's root, pid {0}")]
    NoPidfd(u32),
}

/// The reflexes the wake thread holds (`crate::reflex::Armory`): what they did, not yet handed to
/// the engine, and a reflex handed to it.
pub trait Reflexes: Send + Sync + std::fmt::Debug {
    /// What `job`'s reflex did, if it fired and is not taken yet (taken: handled once).
    fn take(&self, job: &str) -> Option<Fired>;
    /// Arms `job`'s reflex as `plan` says (recorded already), reading the job's usage in its memory
    /// cgroup `memory`; `/proc` lies under `process_root`.
    fn arm(
        &self,
        job: &str,
        memory: &CgroupDir,
        plan: &ReflexPlan,
        process_root: &Path,
    ) -> Result<(), PrepareError>;
}

/// The driver that acts on this machine, through `/proc` and the cgroup tree under `root`.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
    /// What the wake thread's reflexes did, where the daemon arms any.
    armory: Option<Arc<dyn Reflexes>>,
}

impl Host {
    /// The machine whose `/proc` and `/sys` are under `root` (`/` but in tests).
    pub fn new(root: &Path) -> Self {
        Host {
            root: root.to_path_buf(),
            armory: None,
        }
    }

    /// The same, taking over what the reflexes of `armory` did before a stop of the engine's own,
    /// and arming a resumed job's reflex there.
    pub fn with_armory(root: &Path, armory: Arc<dyn Reflexes>) -> Self {
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
        sig: SignalName,
    ) -> Result<(), SignalError> {
        let sig = super::signal::nix_signal(sig, target.pid)?;
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

    fn freeze(&self, cgroup: &Frozen) -> Result<bool, CgroupError> {
        cgroup.freeze()
    }

    fn thaw(&self, cgroup: &Frozen) -> Result<(), CgroupError> {
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

    fn arm_reflex(&self, job: &str, memory: &CgroupDir, plan: &ReflexPlan) -> bool {
        let Some(armory) = &self.armory else {
            return false;
        };
        match armory.arm(job, memory, plan, &self.root) {
            Ok(()) => true,
            Err(e) => {
                tracing::info!(job, error = %e, "no reflex for this job; its probe decides");
                false
            }
        }
    }
}

pub use memwatch_core::seam::{Released, release, unmark};

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
