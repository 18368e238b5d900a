//! [`RootView`]: the engine's reads of the host ([`HostView`]), made under a root directory
//! (normally "/"; a fixture tree in tests). Each method is one of the readers the rest of the
//! crate uses, given the root.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

pub use memwatch_core::seam::HostView;

use crate::act::slurm::{Scontrol as _, SlurmError};
use crate::adapt::{ConfigFileError, JobConfig};
use crate::job::held::{CgroupOwner, Device, Frozen, Slurmctl};
use crate::job::origin::Origin;
use crate::proc::{Stat, Status};
use crate::sample::cgroup::CgroupDir;
use crate::sample::error::ReadError;
use crate::slurm::JobCgroup;

/// The host under `root`, read through the crate's own readers.
#[derive(Debug, Clone)]
pub struct RootView {
    root: PathBuf,
}

impl RootView {
    /// The host whose /proc and /sys lie under `root`.
    pub fn new(root: &Path) -> Self {
        RootView {
            root: root.to_owned(),
        }
    }
}

impl HostView for RootView {
    fn stat(&self, pid: u32) -> Result<Stat, ReadError> {
        crate::proc::read_stat(&self.root, pid)
    }

    fn status(&self, pid: u32) -> Result<Status, ReadError> {
        crate::proc::read_status(&self.root, pid)
    }

    fn tree(&self, pid: u32) -> Option<Vec<Stat>> {
        crate::proc::descendants(&self.root, pid).map(|t| t.procs)
    }

    fn cgroup_of(&self, pid: u32) -> (Option<CgroupDir>, Option<Origin>) {
        crate::job::measure::cgroup_of(&self.root, pid)
    }

    fn cgroup_owner(&self, dir: Option<&CgroupDir>) -> CgroupOwner {
        crate::job::owner::of(&self.root, dir)
    }

    fn freezer_of(&self, tree: &[u32], owner: u32) -> Option<Frozen> {
        crate::act::freeze::owned(&self.root, tree, owner)
    }

    fn pids_below(&self, dir: &Path, out: &mut Vec<u32>) -> bool {
        crate::sample::cgroup::pids_below(dir, out)
    }

    fn has_child_cgroups(&self, dir: &Path) -> bool {
        std::fs::read_dir(dir).map_or(true, |entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        })
    }

    fn slurm_job(&self, id: &str, node: &str) -> Option<JobCgroup> {
        crate::slurm::find_job_on(&self.root, id, node)
    }

    fn oom_kills(&self, dir: &CgroupDir) -> Option<u64> {
        crate::sample::cgroup::read_oom_kills(dir)
    }

    fn cgroup_file(&self, dir: &CgroupDir, name: &str) -> Option<String> {
        std::fs::read_to_string(dir.dir.join(name)).ok()
    }

    fn swap_used(&self, device: &Device) -> Option<u64> {
        crate::act::swap::used_bytes(&self.root, device)
    }

    fn zram_control(&self) -> bool {
        self.root.join("sys/class/zram-control").is_dir()
    }

    fn own_pid(&self) -> u32 {
        std::process::id()
    }

    fn own_limit(&self, dir: &CgroupDir) -> Option<u64> {
        crate::act::lend::own_limit(&dir.dir, dir.version)
    }

    fn alive(&self, pidfd: &OwnedFd, pid: u32) -> bool {
        crate::act::signal::alive(pidfd, pid)
    }

    fn slurm_listpids(&self, ctl: &Slurmctl, id: &str) -> Result<Vec<u32>, SlurmError> {
        ctl.listpids(id)
    }

    fn open_config(
        &self,
        file: &Path,
        profile: &str,
        keys: &[String],
        owner: u32,
        within: Option<u32>,
    ) -> Result<JobConfig, ConfigFileError> {
        crate::work::adapt::open_config(file, profile, keys, owner, within)
    }

    fn mount_namespace(&self, pid: u32) -> Option<u64> {
        let link = std::fs::read_link(crate::proc::dir(&self.root, pid).join("ns/mnt")).ok()?;
        let text = link.to_str()?;
        text.strip_prefix("mnt:[")?.strip_suffix(']')?.parse().ok()
    }
}
