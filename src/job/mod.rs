//! Attached jobs: who they are (root process, owner), what was measured, how fast they grow, and
//! whether memwatch holds them paused.

pub mod measure;
pub mod members;
pub mod owner;

use serde::{Deserialize, Serialize};

pub use measure::{JobSample, ProcessSample};
pub use memwatch_core::growth::Growth;
pub use memwatch_core::job::origin;
pub use memwatch_core::{held, way_out};

use crate::policy::By;
use crate::proc::ProcRef;
use crate::sample::cgroup::{CgroupDir, CgroupMemory};

/// A pause memwatch is holding: the one record of it (the policy reads it through [`Pause::policy`]
/// and keeps no copy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    /// When the pause began (engine clock, ms).
    pub since_ms: u64,
    /// The policy or a user.
    pub by: By,
    /// Why, for people.
    pub reason: String,
    /// Where the pause stands: being made (a Slurm suspend under way, a freeze settling) or held.
    pub phase: PausePhase,
    /// What holds it: signals, the job's own cgroup frozen (v1 or v2), or the whole Slurm job
    /// suspended through Slurm (every rank on every node).
    pub mechanism: held::Mechanism,
    /// What was stopped with signals, root first: the whole pause when the mechanism is signals, the
    /// fallback when a freeze or Slurm failed (empty in dry-run mode).
    pub stopped: Vec<ProcRef>,
    /// Decided in dry-run mode: nothing was stopped.
    pub dry_run: bool,
    /// The cgroups marked `user.oomd_omit=1` for this pause, each with what it held before: a pause
    /// the policy holds on a cgroup v2 job keeps systemd-oomd off the job; the marks go with the
    /// pause (`act::oomd`).
    #[serde(default)]
    pub oomd_omit: Vec<held::OomdMark>,
    /// How fast the job's cgroup and the host were filling (bytes/s) when the pause began: the
    /// steeper slope (`Growth::rate_per_second`), for the room a way out makes. A paused job does
    /// not grow, so nothing measured later says it. Not kept across restarts.
    #[serde(skip)]
    pub growth_at_start: GrowthAtPause,
    /// What the policy decided the pause on (its causes, a projection's limit and rate, whether it
    /// is strict or has run past the longest pause). Not kept across restarts, which resume or
    /// re-decide every pause.
    #[serde(skip)]
    pub held: Held,
    /// Processes the OOM killer ended in the job's cgroups (its step and task cgroups too) since the
    /// pause began: room that came back this way is not the job's recovery. Not kept across
    /// restarts.
    #[serde(skip)]
    pub oom_killed: u64,
}

/// Where a pause stands: a pause is a state with steps, not one act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PausePhase {
    /// Recorded and under way: Slurm was asked to suspend the job, or a freeze is settling. A
    /// second pause of the job does nothing (the record is keyed by the job).
    Pausing,
    /// In effect.
    Held,
}

impl Pause {
    /// The cgroup memwatch froze for this pause, if its mechanism is a freezer.
    pub fn frozen(&self) -> Option<&held::Frozen> {
        self.mechanism.frozen()
    }

    /// The Slurm job memwatch suspended for this pause, if it went through Slurm.
    pub fn suspended(&self) -> Option<&held::Suspended> {
        self.mechanism.suspended()
    }
}

/// The policy's part of a pause record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    /// What caused it.
    pub reasons: Vec<crate::policy::Cause>,
    /// The limit and growth rate when a projection caused it.
    pub projected: Option<(String, f64)>,
    /// The maximum pause was reached and the job stays paused.
    pub expired: bool,
    /// A repeated pause on a projection: resuming needs room for the rate seen at the pause.
    pub strict: bool,
}

impl Pause {
    /// The pause as the policy sees it.
    pub fn policy(&self) -> crate::policy::PauseState {
        crate::policy::PauseState {
            since_ms: self.since_ms,
            by: self.by,
            reasons: self.held.reasons.clone(),
            projected: self.held.projected.clone(),
            expired: self.held.expired,
            strict: self.held.strict,
        }
    }
}

impl From<crate::policy::PauseState> for Held {
    fn from(p: crate::policy::PauseState) -> Held {
        Held {
            reasons: p.reasons,
            projected: p.projected,
            expired: p.expired,
            strict: p.strict,
        }
    }
}

/// Growth rates when a pause began, bytes/s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GrowthAtPause {
    /// The job's cgroup working set.
    pub cgroup: f64,
    /// The host's used memory.
    pub host: f64,
}

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
    /// Working set of the job's cgroup over time.
    pub cgroup_growth: Growth,
    /// The tree's GPU memory over time.
    pub gpu_growth: Growth,
    /// The pause memwatch holds on it.
    pub pause: Option<Pause>,
    /// The training config memwatch may rewrite.
    pub config: Option<crate::adapt::JobConfig>,
    /// A pidfd on the root, kept since attach: the root is checked and signalled only through it.
    pub pidfd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// The cgroup the job owns (and a pause would freeze), as of the last full sample.
    pub freezer: Option<held::Frozen>,
    /// The kernel wakes the daemon when this job's cgroup crosses a threshold (see `wake`).
    pub watched: bool,
    /// The reflex the wake thread holds ready to stop it at its critical line, as recorded.
    pub armed: Option<held::Armed>,
    /// When the job's tree was last walked and measured (engine clock, ms).
    pub walked_at_ms: u64,
    /// The members of its cgroup read at that walk, when they hold the whole tree: while they stay
    /// the same, so does the tree (`members`).
    pub members: Option<members::Members>,
    /// `on_max_pause = "terminate"` ended it at this time: it is never paused again, and what is left
    /// of it after the grace is killed.
    pub terminating_since_ms: Option<u64>,
    /// What is left of a terminating job was sent SIGKILL.
    pub killed: bool,
    /// Started by `memwatch launch`.
    pub launch: Option<Launched>,
    /// The way out of its memory pause, while memwatch looks for one (and after, until the next).
    pub way_out: Option<way_out::WayOut>,
    /// Why memwatch is stopping it (a terminate, the way out's checkpoint step, no way out).
    pub stop_reason: Option<String>,
    /// Its cause, in a word: the reason of the kill that may follow (`max_pause`, `way_out`).
    pub stop_cause: Option<crate::reason::Reason>,
    /// When its config was last read (and maybe rewritten) by the rules.
    pub adapted_at_ms: Option<u64>,
    /// The job's process counts at its last full samples (at most `RECENT`), newest last.
    pub recent_processes: std::collections::VecDeque<usize>,
    /// Its container or Slurm job, from its cgroup path.
    pub origin: Option<origin::Origin>,
    /// Who owns its memory cgroup (systemd or nobody), from its cgroup path when it is attached or
    /// adopted: its loans are made and given back through it.
    pub cgroup_owner: held::CgroupOwner,
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
}

impl Job {
    /// The pause memwatch's policy holds on the job, if any (a pause by hand is not the policy's).
    pub fn policy_pause(&self) -> Option<&Pause> {
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
            freezer: None,
            watched: false,
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
            cgroup_owner: held::CgroupOwner::Cgroupfs,
            slurm: None,
            slurm_suspended_since_ms: None,
            slurm_holders: None,
            armed: None,
            oom_kills: None,
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

    /// Whether a probe came since the last full sample (then growth is tracked from probes).
    pub fn probing(&self) -> bool {
        self.probe.is_some() && self.probed_at_ms >= self.sampled_at_ms
    }
}

pub use crate::policy::MIN_GROWTH;

/// Where a job's memory is heading against one limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    /// "cgroup", "host" or "gpu N".
    pub limit: String,
    /// Bytes left before the limit.
    pub headroom_bytes: u64,
    /// Growth toward it, bytes/s (negative while shrinking).
    pub growth_bytes_per_second: f64,
    /// `None` when not growing.
    pub time_to_exhaustion_seconds: Option<f64>,
}

impl Limit {
    /// A limit's projection from its headroom and growth.
    pub fn new(limit: String, headroom_bytes: u64, growth_bytes_per_second: f64) -> Self {
        let tte = crate::policy::Projection {
            limit: limit.clone(),
            headroom_bytes,
            growth_bytes_per_second,
        }
        .time_to_exhaustion_seconds();
        Limit {
            limit,
            headroom_bytes,
            growth_bytes_per_second,
            time_to_exhaustion_seconds: tte,
        }
    }
}

/// The tightest of `limits`: the soonest exhausted, or when nothing grows, the least headroom.
pub fn tightest(limits: &[Limit]) -> Option<&Limit> {
    let growing = limits
        .iter()
        .filter_map(|l| l.time_to_exhaustion_seconds.map(|t| (t, l)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, l)| l);
    growing.or_else(|| limits.iter().min_by_key(|l| l.headroom_bytes))
}

/// What the API, the metrics and `memwatch jobs` show of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// The job's name.
    pub name: String,
    /// Its root's pid.
    pub pid: u32,
    /// Its root's start time (clock ticks after boot), which tells a reused pid apart.
    pub start_time: u64,
    /// The uid that owns it.
    pub owner_uid: u32,
    /// When it was attached (ms since the epoch).
    pub attached_at_ms: u64,
    /// "running" or "paused" (memwatch holds it, or Slurm holds it suspended on this node).
    pub state: String,
    /// The pause memwatch holds on it.
    pub pause: Option<Pause>,
    /// The reflex armed to stop it at its cgroup's critical line (`policy.reflex`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflex: Option<held::ArmedView>,
    /// A Slurm job that Slurm holds suspended on this node (its cgroups frozen by Slurm): since when,
    /// whoever asked (this node's memwatch, another node's, a person). `state` is then "paused".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_suspended_since_ms: Option<u64>,
    /// While Slurm holds the job suspended: the nodes whose memwatch holds it so (their holds in the
    /// job's `AdminComment`), as last read; empty when none does (a person suspended it) or before
    /// the first read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slurm_holders: Vec<String>,
    /// The newest measurement.
    pub sample: Option<JobSample>,
    /// Every known limit, and the tightest.
    pub limits: Vec<Limit>,
    /// The limit that runs out first.
    pub tightest: Option<Limit>,
    /// The training config memwatch manages, its staged and applied changes, the trainer's progress.
    #[serde(default)]
    pub config: Option<crate::adapt::JobConfigView>,
    /// Started by `memwatch launch`: its run and how the earlier runs ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Launched>,
    /// The way out of its memory pause: the step, what was tried, the room memwatch holds for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub way_out: Option<way_out::WayOut>,
    /// For a paused job: when its longest pause (`policy.max_pause_seconds`) runs out, and what
    /// memwatch does then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_deadline: Option<PauseDeadline>,
    /// Its container (Docker, containerd, CRI-O, Podman; with its Kubernetes pod) or Slurm job, read
    /// from its cgroup path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<origin::Origin>,
    /// Whether this view holds the job's details (its processes and its config): for its owner,
    /// root, or whoever presents its token. Everyone else sees the summary (docs/api.md, "Who sees
    /// what").
    #[serde(default = "yes")]
    pub details: bool,
}

fn yes() -> bool {
    true
}

impl JobView {
    /// The view every local user may see: name, owner, state, why and since when it is paused, its
    /// numbers and limits, its process count and config generations; not its processes, config
    /// file, knobs, directives or progress.
    pub fn summary(mut self) -> JobView {
        if let Some(s) = self.sample.as_mut() {
            s.processes.clear();
        }
        // Of the config, only how far its changes have got.
        if let Some(c) = self.config.as_mut() {
            c.file = std::path::PathBuf::new();
            c.profile.clear();
            c.knobs.clear();
            c.directives.clear();
            c.progress = None;
            c.last_error = None;
            c.checkpoint = None;
        }
        self.details = false;
        self
    }
}

/// When a pause runs out and what follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PauseDeadline {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// "resume", "terminate" or "stay" (`policy.on_max_pause`), or "way out" where the engine's way
    /// out is in charge of the pause.
    pub then: String,
}

/// A job that ended, and how: shown for a while after it is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndedJob {
    /// The job's name.
    pub name: String,
    /// Its root's pid.
    pub pid: u32,
    /// The uid that owned it.
    pub owner_uid: u32,
    /// When it was attached (ms since the epoch).
    pub attached_at_ms: u64,
    /// When it ended (ms since the epoch).
    pub ended_at_ms: u64,
    /// Whether memwatch held it paused when its root exited.
    pub was_paused: bool,
    /// Processes of the job memwatch continued, and the cgroup it thawed, after the root exited.
    pub continued: usize,
    /// The cgroup memwatch thawed after the root exited, if any.
    pub thawed: Option<std::path::PathBuf>,
    /// For people.
    pub how: String,
    /// memwatch stopped it (a way out's checkpoint step, no way out, a terminate): `memwatch launch`
    /// relaunches such a job whatever its exit status.
    #[serde(default)]
    pub stopped_by_memwatch: bool,
    /// The way out it took, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub way_out: Option<String>,
    /// The Slurm job it belonged to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
}

/// A job started by `memwatch launch`: which run this is, and how the earlier runs ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launched {
    /// 1 for the first run.
    pub run: u32,
    /// How many times `memwatch launch` relaunches it at most.
    pub max_restarts: u32,
    /// How each earlier run ended, oldest first (at most 16 kept).
    pub previous: Vec<String>,
    /// `memwatch launch --lend`: the way out may raise this job's cgroup limit for a while.
    #[serde(default)]
    pub lend: bool,
}

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
