//! A stand-in `libnvidia-ml.so` for tests on machines without an NVIDIA GPU.
//!
//! It exports the NVML C functions memwatch calls. They answer from a JSON state file named by the
//! environment variable `MEMWATCH_FAKE_NVML_STATE`, re-read when the last reading is more than
//! [`FRESH_FOR`] old: a test can change GPU memory, temperature or processes while the daemon runs, and
//! can make any function return an NVML error, and the calls of one sample see one state, as they would
//! a driver's, without the fake's own file reads and JSON parses weighing in the daemon's measured CPU.
//! memwatch loads this library through nvml-wrapper's `lib_path`, so its real NVML code path runs
//! against it.
//!
//! State file shape (every device field is optional; a missing one answers `NVML_ERROR_NOT_SUPPORTED`):
//! ```json
//! { "driver_version": "550.54.15",
//!   "init_error": null,
//!   "errors": { "nvmlDeviceGetPowerUsage": 3 },
//!   "devices": [ { "name": "NVIDIA A100", "uuid": "GPU-…", "pci_bus_id": "00000000:01:00.0",
//!                  "memory_total": 1, "memory_used": 0, "temperature": 40,
//!                  "threshold_slowdown": 87, "threshold_shutdown": 92, "threshold_gpu_max": 85,
//!                  "power_mw": 70000, "power_limit_mw": 250000, "utilization_gpu": 10,
//!                  "utilization_memory": 5, "throttle_reasons": 0,
//!                  "processes": [ { "pid": 1, "used_memory": 1 } ],
//!                  "errors": { "nvmlDeviceGetTemperature": 3 } } ] }
//! ```
//! Function names in `errors` are the exported C names; codes are NVML's `nvmlReturn_t` values.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_ulonglong};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlProcessInfo_t, nvmlReturn_t,
    nvmlUtilization_t,
};
use serde::Deserialize;

/// The environment variable naming the state file.
pub const STATE_ENV: &str = "MEMWATCH_FAKE_NVML_STATE";

const SUCCESS: nvmlReturn_t = 0;
const ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
const ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
const ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
const ERROR_UNKNOWN: nvmlReturn_t = 999;

/// The whole fake machine, as read from the state file.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct State {
    pub driver_version: Option<String>,
    pub init_error: Option<nvmlReturn_t>,
    pub errors: HashMap<String, nvmlReturn_t>,
    pub devices: Vec<Device>,
}

/// One fake GPU.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Device {
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_used: Option<u64>,
    pub temperature: Option<u32>,
    pub threshold_slowdown: Option<u32>,
    pub threshold_shutdown: Option<u32>,
    pub threshold_gpu_max: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub utilization_gpu: Option<u32>,
    pub utilization_memory: Option<u32>,
    pub throttle_reasons: Option<u64>,
    pub processes: Option<Vec<Process>>,
    pub errors: HashMap<String, nvmlReturn_t>,
}

/// A process holding GPU memory.
#[derive(Debug, Default, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub used_memory: Option<u64>,
}

/// How long one reading of the state file answers calls: far below the daemon's sample and probe
/// intervals (the tests' are 100 ms), far above the span of one sample's calls.
pub const FRESH_FOR: Duration = Duration::from_millis(10);

fn read() -> Result<State, nvmlReturn_t> {
    let path = std::env::var_os(STATE_ENV).ok_or(ERROR_DRIVER_NOT_LOADED)?;
    let text = std::fs::read_to_string(path).map_err(|_| ERROR_DRIVER_NOT_LOADED)?;
    serde_json::from_str(&text).map_err(|_| ERROR_UNKNOWN)
}

type Reading = (Instant, Arc<Result<State, nvmlReturn_t>>);

/// The state as last read, re-read when older than [`FRESH_FOR`]; a failed read is kept as long.
fn load() -> Arc<Result<State, nvmlReturn_t>> {
    static LAST: Mutex<Option<Reading>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match &*last {
        Some((at, state)) if at.elapsed() < FRESH_FOR => Arc::clone(state),
        _ => {
            let state = Arc::new(read());
            *last = Some((Instant::now(), Arc::clone(&state)));
            state
        }
    }
}

/// Loads the state, applies a global injected error for `func`, and hands the state to `f`.
fn with_state(func: &str, f: impl FnOnce(&State) -> nvmlReturn_t) -> nvmlReturn_t {
    match &*load() {
        Ok(state) => match state.errors.get(func) {
            Some(&code) => code,
            None => f(state),
        },
        Err(code) => *code,
    }
}

/// Like [`with_state`] for a device call: resolves the handle and the device's own injected errors.
fn with_device(
    func: &str,
    handle: nvmlDevice_t,
    f: impl FnOnce(&Device) -> nvmlReturn_t,
) -> nvmlReturn_t {
    with_state(func, |state| {
        let index = (handle as usize).wrapping_sub(1);
        match state.devices.get(index) {
            None => ERROR_INVALID_ARGUMENT,
            Some(dev) => match dev.errors.get(func) {
                Some(&code) => code,
                None => f(dev),
            },
        }
    })
}

/// Writes `value` through `out`, or reports NOT_SUPPORTED when the state leaves it out.
unsafe fn put<T>(out: *mut T, value: Option<T>) -> nvmlReturn_t {
    match (out.is_null(), value) {
        (true, _) => ERROR_INVALID_ARGUMENT,
        (false, None) => ERROR_NOT_SUPPORTED,
        (false, Some(v)) => {
            unsafe { out.write(v) };
            SUCCESS
        }
    }
}

/// Copies a string into a C buffer of `len` bytes, NUL-terminated.
unsafe fn put_str(buf: *mut c_char, len: c_uint, value: Option<&str>) -> nvmlReturn_t {
    let Some(value) = value else {
        return ERROR_NOT_SUPPORTED;
    };
    if buf.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let bytes = value.as_bytes();
    if bytes.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    match &*load() {
        Ok(state) => state.init_error.unwrap_or(SUCCESS),
        Err(code) => *code,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(_result: nvmlReturn_t) -> *const c_char {
    c"fake NVML error".as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    with_state("nvmlSystemGetDriverVersion", |s| unsafe {
        put_str(buf, len, s.driver_version.as_deref())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    with_state("nvmlDeviceGetCount_v2", |s| unsafe {
        put(count, Some(s.devices.len() as c_uint))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_state("nvmlDeviceGetHandleByIndex_v2", |s| {
        if index as usize >= s.devices.len() {
            return ERROR_INVALID_ARGUMENT;
        }
        unsafe { put(device, Some((index as usize + 1) as nvmlDevice_t)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetName", device, |d| unsafe {
        put_str(buf, len, d.name.as_deref())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetUUID", device, |d| unsafe {
        put_str(buf, len, d.uuid.as_deref())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPciInfo_v3", device, |d| {
        let Some(bus_id) = d.pci_bus_id.as_deref() else {
            return ERROR_NOT_SUPPORTED;
        };
        if pci.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the caller passes a valid, writable nvmlPciInfo_t.
        unsafe {
            let info: nvmlPciInfo_t = std::mem::zeroed();
            pci.write(info);
            let out = &mut *pci;
            for (dst, src) in out.busId.iter_mut().zip(bus_id.bytes().take(31)) {
                *dst = src as c_char;
            }
            for (dst, src) in out.busIdLegacy.iter_mut().zip(bus_id.bytes().take(15)) {
                *dst = src as c_char;
            }
        }
        SUCCESS
    })
}

fn memory(d: &Device) -> Option<(u64, u64)> {
    Some((d.memory_total?, d.memory_used?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMemoryInfo_v2", device, |d| unsafe {
        let v = memory(d).map(|(total, used)| nvmlMemory_v2_t {
            version: (*out).version,
            total,
            reserved: 0,
            free: total.saturating_sub(used),
            used,
        });
        put(out, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetMemoryInfo", device, |d| unsafe {
        let v = memory(d).map(|(total, used)| nvmlMemory_t {
            total,
            free: total.saturating_sub(used),
            used,
        });
        put(out, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTemperature", device, |d| unsafe {
        put(out, if sensor == 0 { d.temperature } else { None })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetTemperatureThreshold", device, |d| {
        let v = match kind {
            0 => d.threshold_shutdown,
            1 => d.threshold_slowdown,
            3 => d.threshold_gpu_max,
            _ => None,
        };
        unsafe { put(out, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetPowerUsage", device, |d| unsafe {
        put(out, d.power_mw)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetEnforcedPowerLimit", device, |d| unsafe {
        put(out, d.power_limit_mw)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetUtilizationRates", device, |d| {
        let v = match (d.utilization_gpu, d.utilization_memory) {
            (Some(gpu), Some(memory)) => Some(nvmlUtilization_t { gpu, memory }),
            _ => None,
        };
        unsafe { put(out, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        device,
        |d| unsafe { put(out, d.throttle_reasons) },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    with_device("nvmlDeviceGetComputeRunningProcesses_v3", device, |d| {
        let Some(procs) = d.processes.as_ref() else {
            return ERROR_NOT_SUPPORTED;
        };
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: `count` is valid; `infos` holds `*count` entries when not null.
        unsafe {
            let room = *count as usize;
            *count = procs.len() as c_uint;
            if infos.is_null() || room < procs.len() {
                return if procs.is_empty() {
                    SUCCESS
                } else {
                    ERROR_INSUFFICIENT_SIZE
                };
            }
            for (i, p) in procs.iter().enumerate() {
                infos.add(i).write(nvmlProcessInfo_t {
                    pid: p.pid,
                    // NVML's NVML_VALUE_NOT_AVAILABLE for memory it cannot see (e.g. under WDDM).
                    usedGpuMemory: p.used_memory.unwrap_or(u64::MAX),
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                });
            }
        }
        SUCCESS
    })
}
