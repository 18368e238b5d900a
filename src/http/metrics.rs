//! Renders a [`Sample`] as Prometheus text exposition format 0.0.4: the daemon's own series here,
//! then the sample's, which memwatch-core writes beside each part's type (`Sample::series`).
//!
//! Base units throughout (bytes, seconds, celsius, watts), ratios 0–1, counters end in `_total`, GPU
//! identity on `memwatch_gpu_info`. A value the sample lacks is left out, never written as zero.

use crate::sample::Sample;
use memwatch_core::expo::Writer;

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
    s.series(&mut w);
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
            "Kernel notifications that woke the daemon, by source: host_psi (a PSI trigger on /proc/pressure/memory), job_psi (one on a job cgroup's memory.pressure, cgroup v2), job_threshold (a cgroup v1 memory threshold), job_usage_read (the daemon's own read of a job's usage that found it across one of its lines: a cgroup v2 job's memory.current, since v2 has no usage thresholds, and a v1 job's memory.usage_in_bytes while its thresholds register).",
        );
        for (source, n) in counts {
            f.add(&[("source", source)], *n as f64);
        }
    }
    *out = w.out;
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
