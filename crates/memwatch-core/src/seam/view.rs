//! [`HostView`]: what the engine reads of the host.

use std::os::fd::OwnedFd;
use std::path::Path;

use super::SlurmError;
use crate::adapt::{ConfigFileError, JobConfig};

use crate::held::{CgroupOwner, Device, Frozen, Slurmctl};
use crate::job::origin::Origin;
use crate::proc::{Stat, Status};
use crate::sample::cgroup::CgroupDir;
use crate::sample::error::ReadError;
use crate::slurm::JobCgroup;

/// What the engine reads of the host, and nothing else: processes, cgroups, swap areas and Slurm's
/// job cgroups, each named by value. The engine holds one and reads nothing on its own; the
/// `memwatch` crate's `view::RootView` reads them under a root directory (normally "/", a
/// fixture in tests). Its readings are facts of a moment: a process may be gone by the next call.
pub trait HostView: Send + Sync {
    /// The process's /proc/PID/stat.
    fn stat(&self, pid: u32) -> Result<Stat, ReadError>;
    /// The process's /proc/PID/status.
    fn status(&self, pid: u32) -> Result<Status, ReadError>;
    /// The process and its descendants, root first, then breadth-first; `None` when it is gone.
    fn tree(&self, pid: u32) -> Option<Vec<Stat>>;
    /// The cgroup that holds the process's memory, and where it came from (a unit, a scope, a
    /// container); `(None, None)` when it is gone or in no memory cgroup.
    fn cgroup_of(&self, pid: u32) -> (Option<CgroupDir>, Option<Origin>);
    /// Through whom the cgroup's limits are changed (systemd, or its files).
    fn cgroup_owner(&self, dir: Option<&CgroupDir>) -> CgroupOwner;
    /// The freezer cgroup that holds exactly the processes `tree` (root first) and nothing out of
    /// `owner`'s reach; `None` when there is none such.
    fn freezer_of(&self, tree: &[u32], owner: u32) -> Option<Frozen>;
    /// Appends the pids in `dir`'s `cgroup.procs` and those of every cgroup below it; `false` when
    /// `dir` cannot be read.
    fn pids_below(&self, dir: &Path, out: &mut Vec<u32>) -> bool;
    /// Whether `dir` has child cgroups; `true` when it cannot be listed (a freeze of it might reach
    /// further than its own processes).
    fn has_child_cgroups(&self, dir: &Path) -> bool;
    /// Slurm job `id`'s job cgroup on node `node`, if it is there.
    fn slurm_job(&self, id: &str, node: &str) -> Option<JobCgroup>;
    /// The OOM kills the kernel counted in the memory cgroup.
    fn oom_kills(&self, dir: &CgroupDir) -> Option<u64>;
    /// One of the cgroup's files (`memory.swap.current`, say), as text; `None` when unreadable.
    fn cgroup_file(&self, dir: &CgroupDir, name: &str) -> Option<String>;
    /// Bytes of swap in use on `device` (/proc/swaps); `None` when it is not a swap area now.
    fn swap_used(&self, device: &Device) -> Option<u64>;
    /// Whether this kernel can make zram devices (/sys/class/zram-control).
    fn zram_control(&self) -> bool;
    /// The pid of the process reading (the daemon): a job must never hold it.
    fn own_pid(&self) -> u32;
    /// The memory cgroup's own limit (memory.max, memory.limit_in_bytes); `None` for no limit.
    fn own_limit(&self, dir: &CgroupDir) -> Option<u64>;
    /// Whether the process `pidfd` holds (pid `pid`) is still running: its pidfd is not readable.
    fn alive(&self, pidfd: &OwnedFd, pid: u32) -> bool;
    /// The pids of Slurm job `id` on this node, as `scontrol listpids` gives them (where Slurm's
    /// cgroup plugin is not used). The daemon makes this read before the command reaches the engine
    /// (`engine::Prepared`); the engine asks here only where a command came without it.
    fn slurm_listpids(&self, ctl: &Slurmctl, id: &str) -> Result<Vec<u32>, SlurmError>;
    /// A job's training config at attach: `file` (absolute, inside the root of process `within`
    /// where given) read with user `owner`'s rights, its knobs found by `profile` and `keys`, and a
    /// new token for the job. Like `slurm_listpids`, read by the daemon before the command
    /// (`engine::Prepared`), and here only where it was not.
    fn open_config(
        &self,
        file: &Path,
        profile: &str,
        keys: &[String],
        owner: u32,
        within: Option<u32>,
    ) -> Result<JobConfig, ConfigFileError>;

    /// The mount namespace process `pid` is in (the inode of `/proc/PID/ns/mnt`), if it can be read.
    fn mount_namespace(&self, pid: u32) -> Option<u64>;

    /// Whether a process of user `owner` could signal `pid` itself ([`may_signal`]): false when
    /// its status cannot be read.
    fn owner_may_signal(&self, pid: u32, owner: u32) -> bool {
        owner == 0 || self.status(pid).is_ok_and(|s| may_signal(&s, owner))
    }

    /// Whether a freeze of a cgroup holding `pid` is within `owner`'s reach for that process: root,
    /// its own process, or one that exited since the cgroup's members were read.
    fn owner_may_freeze(&self, pid: u32, owner: u32) -> bool {
        owner == 0
            || match self.status(pid) {
                Ok(s) => may_signal(&s, owner),
                Err(e) => e.is_gone(),
            }
    }

    /// Whether every process in the frozen cgroup could be frozen by `owner` now (checked again
    /// just before a freeze: a process may have become root since the last full sample).
    fn within_reach(&self, frozen: &Frozen, owner: u32) -> bool {
        if owner == 0 {
            return true;
        }
        let mut pids = Vec::new();
        self.pids_below(&frozen.dir, &mut pids)
            && pids.iter().all(|p| self.owner_may_freeze(*p, owner))
    }

    /// The tasks of a Slurm job among `pids` (not `slurmstepd`, not zombies), oldest first.
    fn slurm_tasks(&self, pids: &[u32]) -> Vec<Stat> {
        crate::slurm::tasks(pids.iter().filter_map(|p| self.stat(*p).ok()))
    }
}

/// kill(2)'s rule for an unprivileged sender of uid `owner`: it may signal a process whose real
/// or saved uid is its own. Root (`owner` 0) may signal any.
pub fn may_signal(status: &Status, owner: u32) -> bool {
    owner == 0 || status.uids[0] == owner || status.uids[2] == owner
}
