//! GPUs: what memwatch knows of each one, and the trait a GPU source implements.
//!
//! A field the driver reports as not supported is `None`, never a sentinel value.

use crate::expo::{Writer, bytes as b};
use serde::{Deserialize, Serialize};

/// One GPU at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// NVML's index.
    pub index: u32,
    /// The product name.
    pub name: Option<String>,
    /// The GPU's UUID.
    pub uuid: Option<String>,
    /// Its PCI bus id.
    pub pci_bus_id: Option<String>,
    /// Memory in all.
    pub memory_total_bytes: Option<u64>,
    /// Memory in use.
    pub memory_used_bytes: Option<u64>,
    /// Memory free.
    pub memory_free_bytes: Option<u64>,
    /// Temperature now.
    pub temperature_celsius: Option<f64>,
    /// The temperature at which the GPU starts to slow itself down.
    pub temperature_slowdown_celsius: Option<f64>,
    /// The temperature at which the GPU shuts down.
    pub temperature_shutdown_celsius: Option<f64>,
    /// The highest temperature the GPU is meant to run at.
    pub temperature_max_operating_celsius: Option<f64>,
    /// Power draw now.
    pub power_watts: Option<f64>,
    /// The power limit in force.
    pub power_limit_watts: Option<f64>,
    /// Share of time a kernel ran, 0–1.
    pub utilization_gpu_ratio: Option<f64>,
    /// Share of time memory was read or written, 0–1.
    pub utilization_memory_ratio: Option<f64>,
    /// Names of the active clock throttle reasons (NVML's flag names, e.g. `SW_THERMAL_SLOWDOWN`).
    pub throttle_reasons: Option<Vec<String>>,
    /// Processes with a compute context on this GPU.
    pub processes: Option<Vec<GpuProcess>>,
}

/// A process holding memory on a GPU. `pid` is as NVML reports it: a host pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// The process id (as the host sees it).
    pub pid: u32,
    /// GPU memory it holds, where the driver says.
    pub used_bytes: Option<u64>,
}

impl GpuSample {
    /// The label value that identifies this GPU in metrics: its index.
    pub fn label(&self) -> String {
        self.index.to_string()
    }
}

/// What one GPU collection produced: the GPUs, and the fields that failed for a reason other than
/// "not supported" (logged and counted, but the rest of the sample stands).
#[derive(Debug, Default)]
pub struct GpuReport {
    /// Every GPU.
    pub gpus: Vec<GpuSample>,
    /// Fields that failed, with why.
    pub field_errors: Vec<String>,
}

/// No GPU could be read at all: which call failed, and the library's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {reason}")]
pub struct GpuError {
    /// The call that failed (NVML's device count, say).
    pub call: &'static str,
    /// The library's words.
    pub reason: String,
}

/// A source of GPU samples. NVML in production; tests use NVML too, through a fake library.
pub trait GpuSource: Send {
    /// Samples every GPU. An `Err` means no GPU could be read at all.
    fn sample(&mut self) -> Result<GpuReport, GpuError>;
}

/// The GPUs' series: `memwatch_gpus`, `memwatch_gpu_info` and every `memwatch_gpu_*` by GPU.
pub fn series(gpus: &[GpuSample], w: &mut Writer) {
    w.gauge("memwatch_gpus", "GPUs memwatch can see through NVML.")
        .add(&[], gpus.len() as f64);
    let ids: Vec<(String, &str)> = gpus
        .iter()
        .map(|g| (g.label(), g.uuid.as_deref().unwrap_or("")))
        .collect();
    let mut f = w.gauge("memwatch_gpu_info", "GPU identity; the value is always 1.");
    for (g, (idx, uuid)) in gpus.iter().zip(&ids) {
        f.add(
            &[
                ("gpu", idx),
                ("uuid", uuid),
                ("name", g.name.as_deref().unwrap_or("")),
                ("pci_bus_id", g.pci_bus_id.as_deref().unwrap_or("")),
            ],
            1.0,
        );
    }
    drop(f);
    type Get = fn(&GpuSample) -> Option<f64>;
    let simple: [(&'static str, &'static str, Get); 12] = [
        (
            "memwatch_gpu_memory_total_bytes",
            "GPU memory in all.",
            |g| g.memory_total_bytes.map(b),
        ),
        (
            "memwatch_gpu_memory_used_bytes",
            "GPU memory in use.",
            |g| g.memory_used_bytes.map(b),
        ),
        ("memwatch_gpu_memory_free_bytes", "GPU memory free.", |g| {
            g.memory_free_bytes.map(b)
        }),
        (
            "memwatch_gpu_temperature_celsius",
            "GPU core temperature.",
            |g| g.temperature_celsius,
        ),
        (
            "memwatch_gpu_temperature_slowdown_celsius",
            "Temperature at which the GPU slows itself down.",
            |g| g.temperature_slowdown_celsius,
        ),
        (
            "memwatch_gpu_temperature_shutdown_celsius",
            "Temperature at which the GPU shuts down.",
            |g| g.temperature_shutdown_celsius,
        ),
        (
            "memwatch_gpu_temperature_max_operating_celsius",
            "Highest temperature the GPU is meant to run at.",
            |g| g.temperature_max_operating_celsius,
        ),
        ("memwatch_gpu_power_watts", "GPU power draw.", |g| {
            g.power_watts
        }),
        (
            "memwatch_gpu_power_limit_watts",
            "GPU power limit in force.",
            |g| g.power_limit_watts,
        ),
        (
            "memwatch_gpu_utilization_ratio",
            "Share of time a kernel ran on the GPU.",
            |g| g.utilization_gpu_ratio,
        ),
        (
            "memwatch_gpu_memory_utilization_ratio",
            "Share of time GPU memory was read or written.",
            |g| g.utilization_memory_ratio,
        ),
        (
            "memwatch_gpu_processes",
            "Processes with a compute context on the GPU.",
            |g| g.processes.as_ref().map(|p| p.len() as f64),
        ),
    ];
    for (name, help, get) in simple {
        let mut f = w.gauge(name, help);
        for (g, (idx, uuid)) in gpus.iter().zip(&ids) {
            f.opt(&[("gpu", idx), ("uuid", uuid)], get(g));
        }
    }
    let mut f = w.gauge(
        "memwatch_gpu_throttle_reason",
        "1 for each clock throttle reason active on the GPU.",
    );
    for (g, (idx, uuid)) in gpus.iter().zip(&ids) {
        for r in g.throttle_reasons.iter().flatten() {
            f.add(&[("gpu", idx), ("uuid", uuid), ("reason", r)], 1.0);
        }
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_gpu_process_memory_bytes",
        "GPU memory held by a process (host pid).",
    );
    for (g, (idx, uuid)) in gpus.iter().zip(&ids) {
        for p in g.processes.iter().flatten() {
            let pid = p.pid.to_string();
            f.opt(
                &[("gpu", idx), ("uuid", uuid), ("pid", &pid)],
                p.used_bytes.map(b),
            );
        }
    }
}
