//! Benchmarks for the two hot paths: one host sample on the real /proc, and rendering /metrics.
//!
//! `cargo bench --bench sample` prints median and 90th percentile of many timed runs. The results
//! recorded in BENCHMARKS.md come from this and from scripts/bench-daemon.sh.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use memwatch::http::metrics::{DaemonInfo, render};
use memwatch::sample::Sampler;
use memwatch::sample::gpu::{GpuProcess, GpuSample};

fn measure(name: &str, runs: usize, mut f: impl FnMut()) {
    for _ in 0..runs / 10 {
        f();
    }
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    let p90 = times[times.len() * 9 / 10];
    println!(
        "{name:<44} median {:>9.1} µs   p90 {:>9.1} µs   ({runs} runs)",
        us(median),
        us(p90)
    );
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn gpu(index: u32) -> GpuSample {
    GpuSample {
        index,
        name: Some("NVIDIA A100-SXM4-80GB".into()),
        uuid: Some(format!("GPU-00000000-0000-0000-0000-00000000000{index}")),
        pci_bus_id: Some(format!("00000000:0{index}:00.0")),
        memory_total_bytes: Some(85_899_345_920),
        memory_used_bytes: Some(40_000_000_000),
        memory_free_bytes: Some(45_899_345_920),
        temperature_celsius: Some(61.0),
        temperature_slowdown_celsius: Some(87.0),
        temperature_shutdown_celsius: Some(92.0),
        temperature_max_operating_celsius: Some(85.0),
        power_watts: Some(312.5),
        power_limit_watts: Some(400.0),
        utilization_gpu_ratio: Some(0.97),
        utilization_memory_ratio: Some(0.41),
        throttle_reasons: Some(vec!["SW_POWER_CAP".into()]),
        processes: Some(vec![GpuProcess {
            pid: 1000 + index,
            used_bytes: Some(39_000_000_000),
        }]),
    }
}

fn main() {
    let mut real = Sampler::new(PathBuf::from("/"), None);
    measure("host sample, real /proc and /sys", 2000, || {
        black_box(real.sample());
    });

    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/root");
    let mut sample = Sampler::new(fixture, None).sample();
    sample.gpus = (0..8).map(gpu).collect();
    let info = DaemonInfo {
        version: env!("CARGO_PKG_VERSION"),
        samples_total: 12345,
        sample_interval_ms: 1000,
    };
    let bytes = render(Some(&sample), &info).len();
    measure(
        &format!("render /metrics, fixture host + 8 GPUs ({bytes} B)"),
        20_000,
        || {
            black_box(render(Some(&sample), &info));
        },
    );
    let me = std::process::id();
    let root = std::path::Path::new("/");
    let (cg, _) = memwatch::job::measure::cgroup_of(root, me);
    measure("probe: /proc/meminfo", 5000, || {
        black_box(memwatch::sample::meminfo::read(root).ok());
    });
    if let Some(cg) = &cg {
        measure(
            "probe: job cgroup, full read (usage, limits, stat)",
            5000,
            || {
                black_box(memwatch::sample::cgroup::read_dir(cg).ok());
            },
        );
        // The daemon's own probe reader (what `probe` in daemon.rs calls), not a bare file read.
        measure("probe: job cgroup, usage file only", 5000, || {
            black_box(memwatch::sample::cgroup::read_usage(cg).ok());
        });
    }
    let me_ref = memwatch::proc::read_stat(root, me)
        .map(|s| s.proc_ref())
        .ok();
    if let Some(r) = me_ref {
        measure("full: measure this process's tree", 2000, || {
            black_box(memwatch::job::measure::measure(
                root,
                r,
                cg.as_ref(),
                None,
                &[],
                0,
                None,
            ));
        });
    }
    sample.gpus.truncate(1);
    measure("render /metrics, fixture host + 1 GPU", 20_000, || {
        black_box(render(Some(&sample), &info));
    });
}
