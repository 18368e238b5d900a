//! What the API, the metrics and `memwatch jobs` show of a job: its view, its limits and the
//! tightest, its pause's deadline, how a launched job's runs went, and the jobs that ended.

use serde::{Deserialize, Serialize};

use super::{JobSample, Pause, origin};
use crate::{held, way_out};

/// Where a job's memory is heading against one limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    /// Which limit ("cgroup", "host" or "gpu N" in the API).
    pub limit: crate::policy::LimitKind,
    /// Bytes left before the limit.
    pub headroom_bytes: u64,
    /// Growth toward it, bytes/s (negative while shrinking).
    pub growth_bytes_per_second: f64,
    /// `None` when not growing.
    pub time_to_exhaustion_seconds: Option<f64>,
}

impl Limit {
    /// A limit's projection from its headroom and growth.
    pub fn new(
        limit: crate::policy::LimitKind,
        headroom_bytes: u64,
        growth_bytes_per_second: f64,
    ) -> Self {
        let tte = crate::policy::Projection {
            limit,
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
    /// How the kernel watches its cgroup: `watched` (v1 thresholds all registered, or the wake
    /// thread's reads of v2 usage), `registering` (v1 thresholds being registered, each live from
    /// its own write) or `probed` (no kernel notification: the engine probes it).
    #[serde(default)]
    pub watch: crate::job::Watch,
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
    /// The CUDA OOMs its trainer reported: how many it recovered from, how many stopped it, and the
    /// latest report (its snapshot path and message are details); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_oom: Option<crate::cuda_oom::CudaOoms>,
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
        // Of the CUDA OOMs, the counts and the last report's numbers: not the snapshot's path nor
        // the exception's words.
        if let Some(l) = self.cuda_oom.as_mut().and_then(|o| o.last.as_mut()) {
            l.report = l.report.clone().public();
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
    /// Its trainer stopped at its floor micro-batch after a CUDA OOM, with a checkpoint saved (its
    /// last `oom` report): `memwatch launch` relaunches it too, whatever its exit status.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cuda_oom_stop: bool,
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
