//! Readers: one per source, each taking a root path so tests run on fixture trees. No decisions here;
//! what they read, as data, and the parsers of its text are memwatch-core's (`memwatch_core::sample`,
//! re-exported in each reader's module).
//!
//! [`Sampler`] runs every reader once per tick and assembles a [`Sample`]. It is the only place that
//! keeps reader state (error bookkeeping, the NVML handle) and reads the clock.

pub mod cgroup;
pub mod error;
pub mod kept;
pub mod keyed;
pub mod meminfo;
pub mod nvml;
pub mod own_cgroup;
pub mod psi;
pub mod thermal;
pub mod vmstat;

use std::path::PathBuf;
use std::time::Instant;

pub use error::ReadError;
use gpu::GpuSource;
pub use memwatch_core::sample::Collector;
pub use memwatch_core::sample::gpu;
pub use memwatch_core::sample::{CollectorStatus, HostSample, Sample};

/// The machine's host name under `root` (`proc/sys/kernel/hostname`), at most 64 characters.
pub fn hostname(root: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(root.join("proc/sys/kernel/hostname"))
        .ok()
        .map(|h| h.trim().chars().take(64).collect::<String>())
        .filter(|h| !h.is_empty())
}

#[derive(Default)]
struct Bookkeeping {
    errors_total: u64,
    /// Error kinds already logged at warn; cleared when the collector recovers.
    logged: Vec<&'static str>,
}

/// Runs the readers. Owns the GPU source and the per-collector error counts.
pub struct Sampler {
    gpu: Option<Box<dyn GpuSource>>,
    books: [Bookkeeping; Collector::ALL.len()],
    page_size: u64,
    /// Read once: every sample carries it, and it does not change under a running daemon.
    hostname: Option<String>,
    /// /proc/meminfo, /proc/vmstat and /proc/pressure/{memory,cpu,io}, kept open.
    kept: [kept::KeptFile; 5],
    /// The temperature sensors, listed once a minute, their readings kept open.
    sensors: thermal::Sensors,
    /// The daemon's own memory cgroup, located once a minute.
    own_cgroup: own_cgroup::Own,
}

impl Sampler {
    /// A sampler reading under `root`, with GPUs from `gpu` if given.
    pub fn new(root: PathBuf, gpu: Option<Box<dyn GpuSource>>) -> Self {
        let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(4096);
        let proc = root.join("proc");
        let kept = [
            "meminfo",
            "vmstat",
            "pressure/memory",
            "pressure/cpu",
            "pressure/io",
        ]
        .map(|f| kept::KeptFile::new(proc.join(f)));
        Sampler {
            hostname: hostname(&root),
            kept,
            sensors: thermal::Sensors::new(&root),
            own_cgroup: own_cgroup::Own::new(&root),
            gpu,
            books: Default::default(),
            page_size,
        }
    }

    /// Runs `f` as collector `c`, timing it and recording the outcome; errors are logged once per kind.
    fn run<T>(
        &mut self,
        c: Collector,
        statuses: &mut Vec<CollectorStatus>,
        f: impl FnOnce(&mut Self) -> Result<T, (&'static str, String)>,
    ) -> Option<T> {
        let start = Instant::now();
        let result = f(self);
        let duration_seconds = start.elapsed().as_secs_f64();
        let name = c.name();
        let book = &mut self.books[c as usize];
        let value = match result {
            Ok(v) => {
                if !book.logged.is_empty() {
                    tracing::info!(collector = name, "collector recovered");
                    book.logged.clear();
                }
                Some(v)
            }
            Err((kind, message)) => {
                book.errors_total += 1;
                if book.logged.contains(&kind) {
                    tracing::debug!(collector = name, error = %message, "collector failed again");
                } else {
                    tracing::warn!(collector = name, error = %message, "collector failed; further errors of this kind are logged at debug level");
                    book.logged.push(kind);
                }
                None
            }
        };
        statuses.push(CollectorStatus {
            name: name.to_owned(),
            success: value.is_some(),
            duration_seconds,
            errors_total: book.errors_total,
        });
        value
    }

    /// Takes one sample.
    pub fn sample(&mut self) -> Sample {
        let timestamp_ms = crate::clock::wall_ms();
        let mut st = Vec::with_capacity(Collector::ALL.len());
        let fail = |e: ReadError| (e.kind(), e.to_string());
        let memory = self.run(Collector::Meminfo, &mut st, |s| {
            let (path, text) = s.kept[0].read().map_err(fail)?;
            meminfo::parse(path, text).map_err(fail)
        });
        let vmstat = self.run(Collector::Vmstat, &mut st, |s| {
            let (path, text) = s.kept[1].read().map_err(fail)?;
            vmstat::parse(path, text).map_err(fail)
        });
        let pressure = self
            .run(Collector::Pressure, &mut st, |s| {
                let [_, _, memory, cpu, io] = &mut s.kept;
                Ok(psi::Pressure {
                    memory: psi::read_kept(memory).map_err(fail)?,
                    cpu: psi::read_kept(cpu).map_err(fail)?,
                    io: psi::read_kept(io).map_err(fail)?,
                })
            })
            .unwrap_or_default();
        let cgroup = self
            .run(Collector::Cgroup, &mut st, |s| {
                s.own_cgroup.read().map_err(fail)
            })
            .flatten();
        let temperatures = self
            .run(Collector::Thermal, &mut st, |s| Ok(s.sensors.read()))
            .unwrap_or_default();
        let gpus = self
            .run(Collector::Gpu, &mut st, |s| {
                let Some(src) = s.gpu.as_mut() else {
                    return Ok(Vec::new());
                };
                let report = src.sample().map_err(|e| ("nvml", e.to_string()))?;
                for e in &report.field_errors {
                    tracing::debug!(error = %e, "GPU field unavailable");
                }
                Ok(report.gpus)
            })
            .unwrap_or_default();
        debug_assert!(
            st.iter()
                .map(|c| c.name.as_str())
                .eq(Collector::ALL.iter().map(|c| c.name())),
            "collectors run in Collector::ALL's order"
        );
        Sample {
            timestamp_ms,
            host: HostSample {
                memory,
                vmstat,
                pressure,
                cgroup,
                temperatures,
                page_size_bytes: self.page_size,
                hostname: self.hostname.clone(),
            },
            gpus,
            collectors: st,
        }
    }
}
