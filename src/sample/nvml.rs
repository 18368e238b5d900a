//! The NVML GPU source, through nvml-wrapper.
//!
//! No driver, no library or no GPU is not an error for the daemon: the source reports an empty GPU list,
//! one log line says why, and initialisation is retried every minute in case a driver appears.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TemperatureThreshold};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use super::gpu::{GpuProcess, GpuReport, GpuSample, GpuSource};

const RETRY_INIT: Duration = Duration::from_secs(60);

/// NVML, loaded from a configurable library path.
pub struct NvmlSource {
    library: OsString,
    nvml: Option<Nvml>,
    last_try: Option<Instant>,
    told_unavailable: bool,
}

impl NvmlSource {
    /// Tries to load NVML now; on failure logs once and keeps retrying in the background of sampling.
    pub fn new(library: impl Into<OsString>) -> Self {
        let mut s = NvmlSource {
            library: library.into(),
            nvml: None,
            last_try: None,
            told_unavailable: false,
        };
        s.try_init();
        s
    }

    fn try_init(&mut self) {
        self.last_try = Some(Instant::now());
        match Nvml::builder().lib_path(&self.library).init() {
            Ok(nvml) => {
                let count = nvml.device_count().unwrap_or(0);
                let driver = nvml
                    .sys_driver_version()
                    .unwrap_or_else(|_| "unknown".into());
                tracing::info!(library = ?self.library, gpus = count, driver, "NVML loaded");
                self.nvml = Some(nvml);
            }
            Err(e) => {
                if !self.told_unavailable {
                    tracing::info!(library = ?self.library, error = %e,
                        "no NVIDIA GPU available (no driver or library); GPU section stays empty");
                    self.told_unavailable = true;
                }
            }
        }
    }

    /// Whether the NVML library was loaded.
    pub fn is_loaded(&self) -> bool {
        self.nvml.is_some()
    }
}

/// Turns an NVML answer into an optional field: "not supported" is absence; other errors are noted.
fn field<T>(
    errors: &mut Vec<String>,
    index: u32,
    what: &str,
    r: Result<T, NvmlError>,
) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            errors.push(format!("gpu {index} {what}: {e}"));
            None
        }
    }
}

fn sample_device(
    nvml: &Nvml,
    index: u32,
    errors: &mut Vec<String>,
) -> Result<GpuSample, NvmlError> {
    let dev = nvml.device_by_index(index)?;
    let e = errors;
    let mem = field(e, index, "memory", dev.memory_info());
    let temp_threshold = |e: &mut Vec<String>, t, what| {
        field(e, index, what, dev.temperature_threshold(t)).map(f64::from)
    };
    let util = field(e, index, "utilization", dev.utilization_rates());
    Ok(GpuSample {
        index,
        name: field(e, index, "name", dev.name()),
        uuid: field(e, index, "uuid", dev.uuid()),
        pci_bus_id: field(e, index, "pci", dev.pci_info()).map(|p| p.bus_id),
        memory_total_bytes: mem.as_ref().map(|m| m.total),
        memory_used_bytes: mem.as_ref().map(|m| m.used),
        memory_free_bytes: mem.as_ref().map(|m| m.free),
        temperature_celsius: field(
            e,
            index,
            "temperature",
            dev.temperature(TemperatureSensor::Gpu),
        )
        .map(f64::from),
        temperature_slowdown_celsius: temp_threshold(e, TemperatureThreshold::Slowdown, "slowdown"),
        temperature_shutdown_celsius: temp_threshold(e, TemperatureThreshold::Shutdown, "shutdown"),
        temperature_max_operating_celsius: temp_threshold(
            e,
            TemperatureThreshold::GpuMax,
            "max operating",
        ),
        power_watts: field(e, index, "power", dev.power_usage()).map(|mw| f64::from(mw) / 1000.0),
        power_limit_watts: field(e, index, "power limit", dev.enforced_power_limit())
            .map(|mw| f64::from(mw) / 1000.0),
        utilization_gpu_ratio: util.as_ref().map(|u| f64::from(u.gpu.min(100)) / 100.0),
        utilization_memory_ratio: util.as_ref().map(|u| f64::from(u.memory.min(100)) / 100.0),
        throttle_reasons: field(e, index, "throttle reasons", dev.current_throttle_reasons())
            .map(|r| r.iter_names().map(|(name, _)| name.to_owned()).collect()),
        processes: field(e, index, "processes", dev.running_compute_processes()).map(|ps| {
            ps.into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect()
        }),
    })
}

impl GpuSource for NvmlSource {
    fn sample(&mut self) -> Result<GpuReport, super::gpu::GpuError> {
        if self.nvml.is_none() && self.last_try.is_none_or(|t| t.elapsed() >= RETRY_INIT) {
            self.try_init();
        }
        let Some(nvml) = &self.nvml else {
            return Ok(GpuReport::default());
        };
        let count = nvml.device_count().map_err(|e| super::gpu::GpuError {
            call: "device count",
            reason: e.to_string(),
        })?;
        let mut report = GpuReport::default();
        for index in 0..count {
            match sample_device(nvml, index, &mut report.field_errors) {
                Ok(g) => report.gpus.push(g),
                Err(e) => report.field_errors.push(format!("gpu {index}: {e}")),
            }
        }
        Ok(report)
    }
}
