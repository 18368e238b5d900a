//! What memwatch samples, as data, the collectors that sample it, and the parsers of the kernel's
//! text. memwatch's readers (its `sample` module) open the files, keep them open, and hand their
//! text here; nothing here does I/O.

pub mod cgroup;
pub mod error;
pub mod gpu;
pub mod keyed;
pub mod meminfo;
pub mod psi;
pub mod thermal;
pub mod vmstat;

use crate::expo::Writer;
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

/// A collector: one group of readers, timed, counted and reported together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collector {
    /// /proc/meminfo.
    Meminfo,
    /// /proc/vmstat.
    Vmstat,
    /// /proc/pressure.
    Pressure,
    /// The daemon's own cgroup.
    Cgroup,
    /// hwmon and thermal zones.
    Thermal,
    /// NVML.
    Gpu,
}

impl Collector {
    /// Every collector, in the order they run and are reported.
    pub const ALL: [Collector; 6] = [
        Collector::Meminfo,
        Collector::Vmstat,
        Collector::Pressure,
        Collector::Cgroup,
        Collector::Thermal,
        Collector::Gpu,
    ];

    /// The collector of that name (as `name` gives it).
    pub fn by_name(name: &str) -> Option<Collector> {
        Collector::ALL.into_iter().find(|c| c.name() == name)
    }

    /// What it reads, for people: "the /proc/meminfo collector".
    pub const fn what(self) -> &'static str {
        match self {
            Collector::Meminfo => "the /proc/meminfo collector",
            Collector::Vmstat => "the /proc/vmstat collector",
            Collector::Pressure => "the PSI collector (/proc/pressure)",
            Collector::Cgroup => "the collector of the daemon's own cgroup",
            Collector::Thermal => "the hwmon and thermal zone collector",
            Collector::Gpu => "the NVML collector",
        }
    }

    /// Its name in `memwatch_collector_*{collector}` and the API.
    pub const fn name(self) -> &'static str {
        match self {
            Collector::Meminfo => "meminfo",
            Collector::Vmstat => "vmstat",
            Collector::Pressure => "pressure",
            Collector::Cgroup => "cgroup",
            Collector::Thermal => "thermal",
            Collector::Gpu => "gpu",
        }
    }
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

impl Sample {
    /// Its series, in this order: when it was taken, how each collector did, then each part's own
    /// (`MemInfo::series`, `VmStat::series`, `Pressure::series`, `CgroupMemory::series`,
    /// `thermal::series`, `gpu::series`). A part the sample lacks writes nothing.
    pub fn series(&self, w: &mut Writer) {
        w.gauge(
            "memwatch_last_collection_timestamp_seconds",
            "When the latest sample was taken, Unix time.",
        )
        .add(&[], self.timestamp_ms as f64 / 1000.0);
        let mut f = w.gauge(
            "memwatch_collector_duration_seconds",
            "Time the collector took in the latest sample.",
        );
        for c in &self.collectors {
            f.add(&[("collector", &c.name)], c.duration_seconds);
        }
        drop(f);
        let mut f = w.gauge(
            "memwatch_collector_success",
            "1 if the collector succeeded in the latest sample.",
        );
        for c in &self.collectors {
            f.add(&[("collector", &c.name)], if c.success { 1.0 } else { 0.0 });
        }
        drop(f);
        let mut f = w.counter(
            "memwatch_collector_errors_total",
            "Collector failures since the daemon started.",
        );
        for c in &self.collectors {
            f.add(&[("collector", &c.name)], c.errors_total as f64);
        }
        drop(f);
        let h = &self.host;
        if let Some(m) = &h.memory {
            m.series(w);
        }
        if let Some(v) = &h.vmstat {
            v.series(h.page_size_bytes, w);
        }
        h.pressure.series(w);
        if let Some(c) = &h.cgroup {
            c.series(w);
        }
        thermal::series(&h.temperatures, w);
        gpu::series(&self.gpus, w);
    }
}
