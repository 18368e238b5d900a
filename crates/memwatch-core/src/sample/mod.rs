//! What memwatch samples, as data, and the parsers of the kernel's text. memwatch's readers (its
//! `sample` module) open the files, keep them open, and hand their text here; nothing here does I/O.

pub mod cgroup;
pub mod error;
pub mod gpu;
pub mod keyed;
pub mod meminfo;
pub mod psi;
pub mod thermal;
pub mod vmstat;

use serde::{Deserialize, Serialize};

pub use error::ReadError;
use gpu::GpuSample;

/// Everything memwatch knows about the host at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostSample {
    /// /proc/meminfo, if it could be read.
    pub memory: Option<meminfo::MemInfo>,
    /// /proc/vmstat, if it could be read.
    pub vmstat: Option<vmstat::VmStat>,
    /// PSI, each resource where the kernel has it.
    pub pressure: psi::Pressure,
    /// The daemon's own cgroup's memory.
    pub cgroup: Option<cgroup::CgroupMemory>,
    /// Every temperature sensor.
    pub temperatures: Vec<thermal::TempSensor>,
    /// The page size, to turn vmstat's page counts into bytes.
    pub page_size_bytes: u64,
    /// The machine's host name (`/proc/sys/kernel/hostname`), for views that show many machines.
    #[serde(default)]
    pub hostname: Option<String>,
}

/// How one collector fared in this sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectorStatus {
    /// The collector's name.
    pub name: String,
    /// Whether it read what it reads.
    pub success: bool,
    /// How long it took.
    pub duration_seconds: f64,
    /// Failures since the daemon started.
    pub errors_total: u64,
}

/// One timestamped sample: host, GPUs, and how each collector did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the Unix epoch when the sample was taken.
    pub timestamp_ms: u64,
    /// The host.
    pub host: HostSample,
    /// Each GPU.
    pub gpus: Vec<GpuSample>,
    /// How each collector did.
    pub collectors: Vec<CollectorStatus>,
}
