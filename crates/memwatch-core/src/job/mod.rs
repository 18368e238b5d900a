//! A job's measurement as data (its processes' memory and its cgroup's at one moment: memwatch's
//! `job::measure` walks the tree and fills it in), where it runs (`origin`: its container, pod or
//! Slurm job) and who owns its cgroup (`owner`), both read from its cgroup path; the pause memwatch
//! holds on it (`Pause`, the one record) and what the API shows of it (`JobView`).

mod attached;
pub mod members;
pub mod origin;
pub mod owner;
mod pause;
mod view;

pub use attached::{Job, MIN_GROWTH, Measurement, Watch};
pub use pause::{GrowthAtPause, Held, Pause, PausePhase};
pub use view::{EndedJob, JobView, Launched, Limit, PauseDeadline, tightest};

use serde::{Deserialize, Serialize};

use crate::sample::cgroup::CgroupMemory;

/// One process of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    /// The process id.
    pub pid: u32,
    /// Its parent.
    pub ppid: u32,
    /// Its command name (/proc/PID/comm).
    pub name: String,
    /// Its state letter from /proc/PID/stat (R, S, D, T …).
    pub state: String,
    /// Resident memory from /proc/PID/stat, read at this sample.
    pub rss_bytes: u64,
    /// Proportional set size from /proc/PID/smaps_rollup, read at `pss_read_ms`: resident pages,
    /// each shared one divided among the processes that map it, file pages (libraries) included.
    pub pss_bytes: u64,
    /// When `pss_bytes` and `swap_bytes` were read (the daemon's clock, ms); `None` when the read
    /// failed and they are 0.
    #[serde(default)]
    pub pss_read_ms: Option<u64>,
    /// RSS when PSS was read: how far RSS moved since says whether the reading is still close.
    #[serde(skip)]
    pub rss_at_pss_read: u64,
    /// Swapped-out memory, from the same read as PSS.
    pub swap_bytes: u64,
    /// GPU memory this process holds, summed over GPUs; `None` when NVML does not say.
    pub gpu_bytes: Option<u64>,
}

/// A job at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSample {
    /// When the tree was walked (ms since the epoch).
    pub timestamp_ms: u64,
    /// Every process of the tree (left out of summaries; see `process_count`).
    pub processes: Vec<ProcessSample>,
    /// How many processes the tree has (also where `processes` is left out of a summary).
    #[serde(default)]
    pub process_count: usize,
    /// RSS summed over the tree (shared pages counted once per process), read at this sample.
    pub rss_bytes: u64,
    /// PSS summed over the tree, from readings no older than `pss_read_ms`.
    pub pss_bytes: u64,
    /// The oldest PSS reading in the sum (ms); `None` when no process's could be read.
    #[serde(default)]
    pub pss_read_ms: Option<u64>,
    /// Swapped-out memory summed over the tree.
    pub swap_bytes: u64,
    /// The job's memory cgroup at this sample, if it has one.
    pub cgroup: Option<CgroupMemory>,
    /// GPU memory held by the tree; `None` when no GPU reports processes.
    pub gpu_bytes: Option<u64>,
    /// GPUs the tree holds memory on; `None` when NVML does not say.
    pub gpus: Option<Vec<u32>>,
}
