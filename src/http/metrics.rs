//! Renders a [`Sample`] as Prometheus text exposition format 0.0.4.
//!
//! Base units throughout (bytes, seconds, celsius, watts), ratios 0–1, counters end in `_total`, GPU
//! identity on `memwatch_gpu_info`. A value the sample lacks is left out, never written as zero.

use super::expo::Writer;
use crate::sample::{Sample, psi};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Facts about the daemon itself that are not part of a sample.
pub struct DaemonInfo<'a> {
    /// The daemon's version.
    pub version: &'a str,
    /// Samples taken since the daemon started.
    pub samples_total: u64,
    /// The full-sample interval now, ms: `sampling.interval_ms`, or `calm_interval_ms` while calm.
    pub sample_interval_ms: u64,
}

fn b(v: u64) -> f64 {
    v as f64
}

/// Renders the latest sample (if any) and the daemon's own series.
pub fn render(sample: Option<&Sample>, info: &DaemonInfo) -> String {
    let mut w = Writer::new(String::with_capacity(8 * 1024));
    w.gauge("memwatch_up", "1 while the memwatch daemon is serving.")
        .add(&[], 1.0);
    w.gauge(
        "memwatch_build_info",
        "memwatch's version; the value is always 1.",
    )
    .add(&[("version", info.version)], 1.0);
    w.counter(
        "memwatch_samples_total",
        "Samples taken since the daemon started.",
    )
    .add(&[], info.samples_total as f64);
    w.gauge(
        "memwatch_sample_interval_seconds",
        "The full-sample interval now: sampling.interval_ms, stretched to calm_interval_ms while calm.",
    )
    .add(&[], info.sample_interval_ms as f64 / 1000.0);
    let Some(s) = sample else {
        return w.out;
    };
    w.gauge(
        "memwatch_last_collection_timestamp_seconds",
        "When the latest sample was taken, Unix time.",
    )
    .add(&[], s.timestamp_ms as f64 / 1000.0);
    collectors(&mut w, s);
    memory(&mut w, s);
    pressure(&mut w, s);
    cgroup(&mut w, s);
    temperatures(&mut w, s);
    gpus(&mut w, s);
    w.out
}

/// Appends `memwatch_notifications_total{channel, outcome}` (nothing when no channel is set up).
pub fn notifications(out: &mut String, counts: &[(String, &'static str, u64)]) {
    let mut w = Writer::new(std::mem::take(out));
    {
        let mut f = w.counter(
            "memwatch_notifications_total",
            "Notifications by channel and outcome: sent, retried (a try failed, another followed), failed (every try failed), held_back (rate limits), dropped (queue full).",
        );
        for (channel, outcome, n) in counts {
            f.add(&[("channel", channel), ("outcome", outcome)], *n as f64);
        }
    }
    *out = w.out;
}

/// Appends `memwatch_kernel_notifications_total{source}`: the kernel's wake-ups of the daemon.
pub fn kernel_notifications(out: &mut String, counts: &[(&'static str, u64)]) {
    let mut w = Writer::new(std::mem::take(out));
    {
        let mut f = w.counter(
            "memwatch_kernel_notifications_total",
            "Kernel notifications that woke the daemon, by source: host_psi (a PSI trigger on /proc/pressure/memory), job_psi (one on a job cgroup's memory.pressure, cgroup v2), job_threshold (a cgroup v1 memory threshold), job_usage_read (the daemon's own read of a cgroup v2 job's memory.current that found it across one of its lines: v2 has no usage thresholds).",
        );
        for (source, n) in counts {
            f.add(&[("source", source)], *n as f64);
        }
    }
    *out = w.out;
}

fn collectors(w: &mut Writer, s: &Sample) {
    let mut f = w.gauge(
        "memwatch_collector_duration_seconds",
        "Time the collector took in the latest sample.",
    );
    for c in &s.collectors {
        f.add(&[("collector", &c.name)], c.duration_seconds);
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_collector_success",
        "1 if the collector succeeded in the latest sample.",
    );
    for c in &s.collectors {
        f.add(&[("collector", &c.name)], if c.success { 1.0 } else { 0.0 });
    }
    drop(f);
    let mut f = w.counter(
        "memwatch_collector_errors_total",
        "Collector failures since the daemon started.",
    );
    for c in &s.collectors {
        f.add(&[("collector", &c.name)], c.errors_total as f64);
    }
}

fn memory(w: &mut Writer, s: &Sample) {
    if let Some(m) = &s.host.memory {
        w.gauge("memwatch_memory_total_bytes", "Usable RAM (MemTotal).")
            .add(&[], b(m.total_bytes));
        w.gauge(
            "memwatch_memory_available_bytes",
            "RAM available for new work without swapping (MemAvailable).",
        )
        .add(&[], b(m.available_bytes));
        w.gauge(
            "memwatch_memory_free_bytes",
            "RAM not used at all (MemFree).",
        )
        .add(&[], b(m.free_bytes));
        w.gauge("memwatch_memory_cached_bytes", "Page cache (Cached).")
            .opt(&[], m.cached_bytes.map(b));
        w.gauge(
            "memwatch_memory_buffers_bytes",
            "Block device buffers (Buffers).",
        )
        .opt(&[], m.buffers_bytes.map(b));
        w.gauge(
            "memwatch_memory_shmem_bytes",
            "Shared memory and tmpfs (Shmem).",
        )
        .opt(&[], m.shmem_bytes.map(b));
        w.gauge(
            "memwatch_memory_committed_bytes",
            "Memory promised to processes (Committed_AS).",
        )
        .opt(&[], m.committed_as_bytes.map(b));
        w.gauge(
            "memwatch_memory_commit_limit_bytes",
            "The commit limit (CommitLimit).",
        )
        .opt(&[], m.commit_limit_bytes.map(b));
        w.gauge("memwatch_swap_total_bytes", "Swap space (SwapTotal).")
            .add(&[], b(m.swap_total_bytes));
        w.gauge("memwatch_swap_free_bytes", "Unused swap space (SwapFree).")
            .add(&[], b(m.swap_free_bytes));
        w.gauge(
            "memwatch_swap_cached_bytes",
            "Memory both in RAM and in swap (SwapCached).",
        )
        .opt(&[], m.swap_cached_bytes.map(b));
    }
    if let Some(v) = &s.host.vmstat {
        let page = s.host.page_size_bytes as f64;
        w.counter(
            "memwatch_memory_swapped_in_bytes_total",
            "Bytes read in from swap (pswpin).",
        )
        .add(&[], v.pswpin as f64 * page);
        w.counter(
            "memwatch_memory_swapped_out_bytes_total",
            "Bytes written out to swap (pswpout).",
        )
        .add(&[], v.pswpout as f64 * page);
        w.counter(
            "memwatch_memory_major_faults_total",
            "Page faults that needed I/O (pgmajfault).",
        )
        .add(&[], v.pgmajfault as f64);
        w.counter(
            "memwatch_oom_kills_total",
            "Processes killed by the kernel's OOM killer (oom_kill).",
        )
        .opt(&[], v.oom_kill.map(|n| n as f64));
    }
}

fn pressure(w: &mut Writer, s: &Sample) {
    let p = &s.host.pressure;
    let lines = |full: bool| {
        psi::RESOURCES.iter().filter_map(move |r| {
            let psi = p.get(r)?;
            let line = if full { psi.full? } else { psi.some };
            Some((*r, line))
        })
    };
    let mut f = w.counter(
        "memwatch_pressure_waiting_seconds_total",
        "Time at least one task was stalled on the resource (PSI some total).",
    );
    for (r, l) in lines(false) {
        f.add(&[("resource", r)], l.total_seconds);
    }
    drop(f);
    let mut f = w.counter(
        "memwatch_pressure_stalled_seconds_total",
        "Time all non-idle tasks were stalled on the resource at once (PSI full total).",
    );
    for (r, l) in lines(true) {
        f.add(&[("resource", r)], l.total_seconds);
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_pressure_waiting_ratio",
        "Share of time at least one task was stalled, averaged over the window (PSI some avgN).",
    );
    for (r, l) in lines(false) {
        f.add(&[("resource", r), ("window", "10s")], l.avg10)
            .add(&[("resource", r), ("window", "60s")], l.avg60)
            .add(&[("resource", r), ("window", "300s")], l.avg300);
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_pressure_stalled_ratio",
        "Share of time all non-idle tasks were stalled, averaged over the window (PSI full avgN).",
    );
    for (r, l) in lines(true) {
        f.add(&[("resource", r), ("window", "10s")], l.avg10)
            .add(&[("resource", r), ("window", "60s")], l.avg60)
            .add(&[("resource", r), ("window", "300s")], l.avg300);
    }
}

fn cgroup(w: &mut Writer, s: &Sample) {
    let Some(cg) = &s.host.cgroup else {
        return;
    };
    let version = cg.version.to_string();
    let labels = [("cgroup", cg.path.as_str()), ("version", version.as_str())];
    w.gauge(
        "memwatch_cgroup_memory_usage_bytes",
        "Memory charged to memwatch's own memory cgroup.",
    )
    .add(&labels, b(cg.usage_bytes));
    w.gauge(
        "memwatch_cgroup_memory_limit_bytes",
        "Tightest memory limit on the path from memwatch's cgroup to the root; absent when unlimited.",
    )
    .opt(&labels, cg.limit_bytes.map(b));
    w.counter(
        "memwatch_cgroup_oom_kills_total",
        "OOM kills inside memwatch's own memory cgroup.",
    )
    .opt(&labels, cg.oom_kills.map(|n| n as f64));
}

fn temperatures(w: &mut Writer, s: &Sample) {
    let t = &s.host.temperatures;
    let mut f = w.gauge(
        "memwatch_temperature_celsius",
        "Temperature of a hwmon sensor or thermal zone.",
    );
    for x in t {
        f.add(&[("chip", &x.chip), ("sensor", &x.sensor)], x.celsius);
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_temperature_crit_celsius",
        "Critical temperature of the sensor, where known.",
    );
    for x in t {
        f.opt(&[("chip", &x.chip), ("sensor", &x.sensor)], x.crit_celsius);
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_temperature_max_celsius",
        "Maximum (hot) temperature of the sensor, where known.",
    );
    for x in t {
        f.opt(&[("chip", &x.chip), ("sensor", &x.sensor)], x.max_celsius);
    }
}

fn gpus(w: &mut Writer, s: &Sample) {
    w.gauge("memwatch_gpus", "GPUs memwatch can see through NVML.")
        .add(&[], s.gpus.len() as f64);
    let ids: Vec<(String, &str)> = s
        .gpus
        .iter()
        .map(|g| (g.label(), g.uuid.as_deref().unwrap_or("")))
        .collect();
    let mut f = w.gauge("memwatch_gpu_info", "GPU identity; the value is always 1.");
    for (g, (idx, uuid)) in s.gpus.iter().zip(&ids) {
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
    type Get = fn(&crate::sample::gpu::GpuSample) -> Option<f64>;
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
        for (g, (idx, uuid)) in s.gpus.iter().zip(&ids) {
            f.opt(&[("gpu", idx), ("uuid", uuid)], get(g));
        }
    }
    let mut f = w.gauge(
        "memwatch_gpu_throttle_reason",
        "1 for each clock throttle reason active on the GPU.",
    );
    for (g, (idx, uuid)) in s.gpus.iter().zip(&ids) {
        for r in g.throttle_reasons.iter().flatten() {
            f.add(&[("gpu", idx), ("uuid", uuid), ("reason", r)], 1.0);
        }
    }
    drop(f);
    let mut f = w.gauge(
        "memwatch_gpu_process_memory_bytes",
        "GPU memory held by a process (host pid).",
    );
    for (g, (idx, uuid)) in s.gpus.iter().zip(&ids) {
        for p in g.processes.iter().flatten() {
            let pid = p.pid.to_string();
            f.opt(
                &[("gpu", idx), ("uuid", uuid), ("pid", &pid)],
                p.used_bytes.map(b),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::gpu::GpuSample;

    #[test]
    fn absent_values_leave_out_the_series_and_labels_are_escaped() {
        let s = Sample {
            gpus: vec![GpuSample {
                index: 0,
                name: Some("we\"ird\\name\n".into()),
                temperature_celsius: Some(50.0),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(
            Some(&s),
            &DaemonInfo {
                version: "1",
                samples_total: 3,
                sample_interval_ms: 1000,
            },
        );
        assert!(text.contains(r#"name="we\"ird\\name\n""#), "{text}");
        assert!(text.contains("memwatch_gpu_temperature_celsius{gpu=\"0\",uuid=\"\"} 50\n"));
        assert!(!text.contains("memwatch_gpu_memory_used_bytes"));
        assert!(!text.contains("memwatch_memory_total_bytes"));
        assert!(!text.contains("memwatch_pressure"));
    }

    #[test]
    fn before_the_first_sample_only_daemon_series() {
        let text = render(
            None,
            &DaemonInfo {
                version: "1",
                samples_total: 0,
                sample_interval_ms: 1000,
            },
        );
        assert!(text.contains("memwatch_up 1\n"));
        assert!(!text.contains("memwatch_gpus"));
    }
}
