//! One attached job as the engine holds it: who it is (root process, owner), what was measured, how
//! fast it grows, and whether memwatch holds it paused. It holds the root's pidfd and its pinned
//! processes as opaque handles, opened and used by the host (`seam`).

use super::JobSample;
use crate::growth::Growth;
use crate::host::ProcRef;
use crate::policy::By;
use crate::sample::cgroup::{CgroupDir, CgroupMemory};

/// One attached job.
#[derive(Debug, Clone)]
pub struct Job {
    /// The job's name, unique in the daemon.
    pub name: String,
    /// Its root process.
    pub root: ProcRef,
    /// The uid that owns it.
    pub owner_uid: u32,
    /// When it was attached (engine clock, ms).
    pub attached_at_ms: u64,
    /// Its memory cgroup, if it has one.
    pub cgroup_dir: Option<CgroupDir>,
    /// The latest full measurement.
    pub last: Option<JobSample>,
    /// The latest cheap cgroup probe.
    pub probe: Option<CgroupMemory>,
    /// When the probe was taken and when the last full sample arrived (engine clock, ms): probes
    /// stop while the kernel watches the cgroup, and a stale probe must not hide a fresh sample.
    pub probed_at_ms: u64,
    /// When the last full sample arrived (engine clock, ms).
    pub sampled_at_ms: u64,
    /// The job's cgroup's unreclaimable memory over time.
    pub cgroup_growth: Growth,
    /// The tree's GPU memory over time.
    pub gpu_growth: Growth,
    /// The pause memwatch holds on it.
    pub pause: Option<super::Pause>,
    /// The training config memwatch may rewrite.
    pub config: Option<crate::adapt::JobConfig>,
    /// A pidfd on the root, kept since attach: the root is checked and signalled only through it.
    pub pidfd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// The processes below the root pinned at the last walk (`act::pin::pin_members`): a pause
    /// signals them through their pidfds before it reads anything.
    pub pinned: Vec<crate::host::Pinned>,
    /// The cgroup the job owns (and a pause would freeze), as of the last full sample.
    pub freezer: Option<crate::held::Frozen>,
    /// Whether the kernel wakes the daemon when this job's cgroup crosses a threshold (see `wake`).
    pub watch: Watch,
    /// The reflex the wake thread holds ready to stop it at its critical line, as recorded.
    pub armed: Option<crate::held::Armed>,
    /// When the job's tree was last walked and measured (engine clock, ms).
    pub walked_at_ms: u64,
    /// The members of its cgroup read at that walk, when they hold the whole tree: while they stay
    /// the same, so does the tree (`members`).
    pub members: Option<super::members::Members>,
    /// `on_max_pause = "terminate"` ended it at this time: it is never paused again, and what is left
    /// of it after the grace is killed.
    pub terminating_since_ms: Option<u64>,
    /// What is left of a terminating job was sent SIGKILL.
    pub killed: bool,
    /// Started by `memwatch launch`.
    pub launch: Option<super::Launched>,
    /// The way out of its memory pause, while memwatch looks for one (and after, until the next).
    pub way_out: Option<crate::way_out::WayOut>,
    /// Why memwatch is stopping it (a terminate, the way out's checkpoint step, no way out).
    pub stop_reason: Option<String>,
    /// Its cause, in a word: the reason of the kill that may follow (`max_pause`, `way_out`).
    pub stop_cause: Option<crate::reason::Reason>,
    /// When its config was last read (and maybe rewritten) by the rules.
    pub adapted_at_ms: Option<u64>,
    /// The job's process counts at its last full samples (at most `RECENT`), newest last.
    pub recent_processes: std::collections::VecDeque<usize>,
    /// Its container or Slurm job, from its cgroup path.
    pub origin: Option<super::origin::Origin>,
    /// Who owns its memory cgroup (systemd or nobody), from its cgroup path when it is attached or
    /// adopted: its loans are made and given back through it.
    pub cgroup_owner: crate::held::CgroupOwner,
    /// Attached by Slurm job id (`memwatch attach --slurm-job`): its processes are every task in the
    /// job's cgroup on this node, and `cgroup_dir` is the job's cgroup.
    pub slurm: Option<String>,
    /// Since when Slurm holds the job suspended on this node, as the last full sample found its
    /// cgroups frozen by Slurm (`slurm::suspended_here`), whoever asked.
    pub slurm_suspended_since_ms: Option<u64>,
    /// While Slurm holds the job suspended: the nodes whose holds keep it so, and when that was read
    /// (`SlurmCall::Hold` on a node that holds it, `SlurmCall::Holders` on one that does not).
    pub slurm_holders: Option<(u64, Vec<String>)>,
    /// Its cgroup's OOM kills (`oom_kill` of memory.events or memory.oom_control): as first read
    /// after the attach, and as last read.
    pub oom_kills: Option<(u64, u64)>,
    /// The CUDA OOMs its trainer reported (`{"cmd": "oom"}`), if any.
    pub cuda_oom: Option<crate::cuda_oom::CudaOoms>,
}

impl Job {
    /// The pause memwatch's policy holds on the job, if any (a pause by hand is not the policy's).
    pub fn policy_pause(&self) -> Option<&super::Pause> {
        self.pause.as_ref().filter(|p| p.by == By::Policy)
    }

    /// A job just attached: nothing measured yet.
    pub fn new(
        name: String,
        root: ProcRef,
        owner_uid: u32,
        now_ms: u64,
        cgroup_dir: Option<CgroupDir>,
        window_ms: u64,
    ) -> Self {
        Job {
            name,
            root,
            owner_uid,
            attached_at_ms: now_ms,
            cgroup_dir,
            last: None,
            probe: None,
            probed_at_ms: 0,
            sampled_at_ms: 0,
            cgroup_growth: Growth::new(window_ms),
            gpu_growth: Growth::new(window_ms.max(5000)),
            pause: None,
            config: None,
            pidfd: None,
            pinned: Vec::new(),
            freezer: None,
            watch: Watch::Probed,
            walked_at_ms: 0,
            members: None,
            terminating_since_ms: None,
            killed: false,
            launch: None,
            way_out: None,
            stop_reason: None,
            stop_cause: None,
            adapted_at_ms: None,
            recent_processes: std::collections::VecDeque::new(),
            origin: None,
            cgroup_owner: crate::held::CgroupOwner::Cgroupfs,
            slurm: None,
            slurm_suspended_since_ms: None,
            slurm_holders: None,
            armed: None,
            oom_kills: None,
            cuda_oom: None,
        }
    }

    /// Notes its cgroup's OOM kill count as just read.
    pub fn note_oom_kills(&mut self, n: Option<u64>) {
        if let Some(n) = n {
            let first = self.oom_kills.map_or(n, |(f, _)| f.min(n));
            self.oom_kills = Some((first, n));
        }
    }

    /// Processes of its cgroup the kernel's OOM killer killed since the attach, as last read.
    pub fn oom_kills_since_attach(&self) -> u64 {
        self.oom_kills.map_or(0, |(f, l)| l.saturating_sub(f))
    }

    /// The Slurm job it belongs to: the one it was attached by, else the one its cgroup names.
    pub fn slurm_job_id(&self) -> Option<&str> {
        self.slurm.as_deref().or_else(|| {
            self.origin
                .as_ref()
                .filter(|o| o.kind == "slurm")
                .map(|o| o.id.as_str())
        })
    }

    /// How many of the last full samples `usual_processes` looks at.
    pub const RECENT: usize = 5;

    /// Notes the process count of a full sample.
    pub fn note_processes(&mut self, n: usize) {
        if self.recent_processes.len() == Self::RECENT {
            self.recent_processes.pop_front();
        }
        self.recent_processes.push_back(n);
    }

    /// The job's usual process count: its count now, or the most frequent over its last full
    /// samples where that is more (the larger on a tie). Between two epochs a DataLoader has no
    /// workers for a moment: that dip is not the job's usual count.
    pub fn usual_processes(&self) -> Option<usize> {
        let now = *self.recent_processes.back()?;
        most_frequent(self.recent_processes.iter().copied()).map(|m| m.max(now))
    }

    /// The freshest view of the job's cgroup: the probe unless a full sample came after it.
    pub fn cgroup(&self) -> Option<&CgroupMemory> {
        let sampled = self.last.as_ref().and_then(|l| l.cgroup.as_ref());
        if self.probing() || sampled.is_none() {
            self.probe.as_ref()
        } else {
            sampled
        }
    }

    /// A reading of the job's cgroup between full samples (a probe's, or the reflex's): its
    /// unreclaimable memory joins the growth, and it is the job's cgroup until the next sample.
    pub fn note_probe(&mut self, cg: CgroupMemory, now_ms: u64) {
        self.cgroup_growth
            .push(now_ms, cg.unreclaimable_bytes() as f64);
        self.probe = Some(cg);
        self.probed_at_ms = now_ms;
    }

    /// Whether a probe came since the last full sample (then growth is tracked from probes).
    pub fn probing(&self) -> bool {
        self.probe.is_some() && self.probed_at_ms >= self.sampled_at_ms
    }
}

pub use crate::policy::MIN_GROWTH;

/// The most frequent of `counts` (the larger on a tie).
fn most_frequent(counts: impl Iterator<Item = usize>) -> Option<usize> {
    let mut seen = std::collections::BTreeMap::new();
    for n in counts {
        *seen.entry(n).or_insert(0u32) += 1;
    }
    seen.into_iter()
        .max_by_key(|(n, c)| (*c, *n))
        .map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cgroup(usage_bytes: u64, limit_bytes: u64) -> CgroupMemory {
        CgroupMemory {
            version: crate::sample::cgroup::Version::V1,
            path: "/job".into(),
            usage_bytes,
            limit_bytes: Some(limit_bytes),
            limit_source: None,
            oom_kills: Some(0),
            inactive_file_bytes: Some(0),
            active_file_bytes: None,
            dirty_bytes: None,
            anon_bytes: None,
            file_bytes: None,
        }
    }

    #[test]
    fn a_stale_probe_does_not_hide_a_fresh_sample() {
        let root = ProcRef {
            pid: 1,
            start_time: 1,
        };
        let mut j = Job::new("j".into(), root, 0, 0, None, 10_000);
        for n in [1, 1, 5, 5, 5, 1] {
            j.note_processes(n);
        }
        assert_eq!(j.recent_processes.len(), Job::RECENT);
        assert_eq!(
            j.usual_processes(),
            Some(5),
            "the dip between epochs is passing"
        );
        j.note_processes(9);
        assert_eq!(
            j.usual_processes(),
            Some(9),
            "never less than the count now"
        );
        j.probe = Some(cgroup(400, 8000));
        j.probed_at_ms = 1_000;
        assert_eq!(j.cgroup().map(|c| c.usage_bytes), Some(400));
        // The limit came down and the kernel watches the cgroup now: no more probes, only samples.
        j.last = Some(JobSample {
            timestamp_ms: 2_000,
            processes: Vec::new(),
            process_count: 0,
            rss_bytes: 0,
            pss_bytes: 0,
            pss_read_ms: None,
            swap_bytes: 0,
            gpu_bytes: None,
            gpus: None,
            cgroup: Some(cgroup(650, 760)),
        });
        j.sampled_at_ms = 2_000;
        assert!(!j.probing());
        assert_eq!(j.cgroup().map(|c| c.limit_bytes), Some(Some(760)));
        // A newer probe wins again.
        j.probe = Some(cgroup(700, 760));
        j.probed_at_ms = 2_100;
        assert!(j.probing());
        assert_eq!(j.cgroup().map(|c| c.usage_bytes), Some(700));
    }

    #[test]
    fn the_usual_count_ignores_passing_ones() {
        // 1 main process and 4 workers, with an epoch's gap and a worker still starting.
        let counts = [5, 5, 1, 5, 3, 5];
        assert_eq!(most_frequent(counts.into_iter()), Some(5));
        assert_eq!(most_frequent([3, 5, 5, 3].into_iter()), Some(5));
        assert_eq!(most_frequent(std::iter::empty()), None);
    }
}

/// What a full sample learned of one job.
#[derive(Debug, Clone)]
pub enum Measurement {
    /// Its tree, walked (`memwatch::job::measure::measure`).
    Walked {
        /// The measurement.
        sample: JobSample,
        /// The cgroup's members, when they hold the whole tree.
        members: Option<super::members::Members>,
    },
    /// Its cgroup holds the same processes as at the last walk, its usage has not moved far from
    /// that walk's and no OOM kill came: the tree was not walked; this is the cgroup now.
    Unchanged(CgroupMemory),
    /// Its root is gone, or was replaced.
    Gone,
}

/// How the kernel watches a job's cgroup for the daemon (the API's `watch`: `probed`,
/// `registering` or `watched`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Watch {
    /// It does not (no thresholds or reads of its usage yet, or none could be had): the engine
    /// probes the job.
    #[default]
    Probed,
    /// Its v1 thresholds are being registered. Each wakes the daemon from its own write on, and
    /// the wake thread reads the job's usage until the last is in, so a reflex may ride on them,
    /// but the job is probed until all of them are in.
    Registering,
    /// Its v1 thresholds, or the wake thread's reads of its v2 usage, wake the daemon at each
    /// crossing.
    Watched,
}

impl Watch {
    /// Whether a crossing of the job's critical line wakes the wake thread, which may then fire
    /// the job's reflex.
    pub fn wakes_at_the_line(self) -> bool {
        self != Watch::Probed
    }
}
