//! GPUs: what memwatch knows of each one, and the trait a GPU source implements.
//!
//! A field the driver reports as not supported is `None`, never a sentinel value.

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
