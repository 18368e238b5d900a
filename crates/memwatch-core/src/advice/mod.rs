//! The advice engine: what a seasoned engineer would tell the user about this machine and these jobs.
//! Pure: (previous sample, sample, jobs, what is known of each job's training config) → advice.
//! Each item has an id, a severity, the numbers behind it, the concrete change and the expected saving.

pub mod cuda_oom;
mod ram;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::adapt::rules::smaller_divisor;
use crate::job::JobSample;
use crate::policy::{Level, LevelState, Resource};
use crate::rewrite::profile::Knob;
use crate::sample::Sample;
use crate::sample::cgroup::CgroupMemory;

/// How urgent an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; nothing is at risk.
    Info,
    /// Something is at warn, or a run is slower than it needs to be.
    Warn,
    /// Something is at critical: a run is at risk now.
    Critical,
}

impl Severity {
    /// The name the API and the metrics use (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Critical => "critical",
        }
    }
}

/// One piece of advice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// Stable id, e.g. `swap-clear`, `workers:train`, `gpu-power-cap:0`.
    pub id: String,
    /// How urgent it is.
    pub severity: Severity,
    /// The job it concerns, if any.
    pub job: Option<String>,
    /// One line, for a list.
    pub title: String,
    /// The numbers behind it.
    pub evidence: Vec<String>,
    /// The concrete change.
    pub change: String,
    /// What it is expected to save or gain.
    pub saving: Option<String>,
}

/// The training knobs memwatch knows for a job, where known: what the trainer reports it runs with
/// (`progress.running`), else what its config file says.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Knobs {
    /// Micro-batch per device.
    pub micro_batch: Option<u64>,
    /// Gradient accumulation steps.
    pub accumulation: Option<u64>,
    /// DataLoader workers per rank.
    pub workers: Option<u64>,
    /// DataLoader pin_memory.
    pub pin_memory: Option<bool>,
    /// Sequence length.
    pub seq_len: Option<u64>,
    /// Ranks in the run.
    pub world_size: Option<u64>,
    /// The knobs above that come from the trainer's report of what runs; the others come from the
    /// config file, which says what the next start (or epoch) will run with.
    #[serde(default)]
    pub reported: Vec<Knob>,
}

impl Knobs {
    /// Where `knob`'s value comes from, for evidence.
    fn source(&self, knob: Knob) -> &'static str {
        if self.reported.contains(&knob) {
            "the trainer reports running with it"
        } else {
            "the config file; the trainer has not reported what it runs with"
        }
    }
}

/// What advice reads of an attached job.
#[derive(Debug, Clone, Copy)]
pub struct JobSeen<'a> {
    /// The job's name.
    pub name: &'a str,
    /// Its newest measurement of the tree.
    pub sample: Option<&'a JobSample>,
    /// Its memory cgroup as last read (between two walks of the tree, newer than the
    /// measurement's).
    pub cgroup: Option<&'a CgroupMemory>,
}

/// Everything the engine looks at.
pub struct Input<'a> {
    /// The newest sample.
    pub sample: &'a Sample,
    /// The sample before, for swap rates.
    pub previous: Option<&'a Sample>,
    /// The attached jobs.
    pub jobs: &'a [JobSeen<'a>],
    /// Knobs per job name.
    pub knobs: &'a [(String, Knobs)],
    /// Thermal pauses per job in the last hour.
    pub thermal_pauses: &'a [(String, u32)],
    /// The policy's levels by key (`host_memory`, `job_cgroup:NAME`, `gpu_memory:INDEX`): memory
    /// advice starts where one is at warn or worse (`LevelState::settled`: not while only a leave
    /// hold keeps it there), and cites it.
    pub levels: &'a BTreeMap<Resource, LevelState>,
}

/// "`what` is at critical: 97 % used (`detail`)" when the level at `key` is warn or worse, as
/// `LevelState::settled` has it: a GPU back at 30 % is not "nearly full" for the 5 s its level is
/// held critical.
fn at_warn(input: &Input, key: &Resource, what: &str, detail: &str) -> Option<(Level, String)> {
    let l = input.levels.get(key)?;
    let level = l.settled();
    if level < Level::Warn {
        return None;
    }
    let pct = l
        .value
        .map(|v| format!(": {:.0} % used", v * 100.0))
        .unwrap_or_default();
    Some((
        level,
        format!("{what} is at {}{pct} ({detail})", level.as_str()),
    ))
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Bytes in GiB with one decimal, for evidence.
pub fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB)
}

pub(crate) fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / 1048576.0)
}

/// swapoff reads swap back at roughly this rate (a SATA SSD; NVMe is faster, disks much slower).
const SWAPOFF_BYTES_PER_SECOND: f64 = 200.0 * 1048576.0;

/// All advice for this moment, most severe first.
pub fn advise(input: &Input) -> Vec<Advice> {
    let mut out = Vec::new();
    swap(input, &mut out);
    ram::host_ram(input, &mut out);
    gpu_memory(input, &mut out);
    temperature(input, &mut out);
    sort(&mut out);
    out
}

/// Most severe first, then by id: the order advice is listed in.
pub fn sort(advice: &mut [Advice]) {
    advice.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.id.cmp(&b.id)));
}

fn swap(input: &Input, out: &mut Vec<Advice>) {
    let Some(m) = &input.sample.host.memory else {
        return;
    };
    let used = m.swap_used_bytes();
    if used < 64 * 1048576 {
        return;
    }
    let mut evidence = vec![
        format!("swap holds {} of {}", gib(used), gib(m.swap_total_bytes)),
        format!("RAM available: {}", gib(m.available_bytes)),
    ];
    // Swap traffic since the previous sample shows whether the job is thrashing.
    let mut thrashing = false;
    if let (Some(prev), Some(now)) = (
        input
            .previous
            .and_then(|p| p.host.vmstat.as_ref().map(|v| (p.timestamp_ms, v))),
        &input.sample.host.vmstat,
    ) {
        let dt = input.sample.timestamp_ms.saturating_sub(prev.0) as f64 / 1000.0;
        if dt > 0.0 {
            let page = input.sample.host.page_size_bytes as f64;
            let rin = now.pswpin.saturating_sub(prev.1.pswpin) as f64 * page / dt;
            let rout = now.pswpout.saturating_sub(prev.1.pswpout) as f64 * page / dt;
            evidence.push(format!(
                "swapping in {:.1} MiB/s, out {:.1} MiB/s",
                rin / 1048576.0,
                rout / 1048576.0
            ));
            thrashing = rin > 1048576.0 && rout > 1048576.0;
        }
    }
    if thrashing {
        out.push(Advice {
            id: "swap-thrash".into(),
            severity: Severity::Critical,
            job: None,
            title: "The machine is swapping in and out at once: training steps can run several times slower".into(),
            evidence: evidence.clone(),
            change: "Free RAM first (fewer DataLoader workers, pin_memory off, stream the dataset); memwatch pauses the job if pressure keeps rising".into(),
            saving: Some("swap-bound steps run at disk speed; users report 2× slower steps".into()),
        });
    }
    // Keep a margin of 10 % of RAM (at least 1 GiB) after swap is read back.
    let margin = (m.total_bytes / 10).max(1 << 30);
    if m.available_bytes >= used + margin {
        let secs = used as f64 / SWAPOFF_BYTES_PER_SECOND;
        out.push(Advice {
            id: "swap-clear".into(),
            severity: Severity::Info,
            job: None,
            title: format!("Swap holds {}; RAM can absorb it", gib(used)),
            evidence,
            change: "sudo swapoff -a && sudo swapon -a".into(),
            saving: Some(format!(
                "pages come back to RAM once instead of on every touch; takes about {secs:.0} s at ~200 MB/s, leaving {} available",
                gib(m.available_bytes - used)
            )),
        });
    } else {
        out.push(Advice {
            id: "swap-keep".into(),
            severity: Severity::Warn,
            job: None,
            title: format!("Swap holds {}, more than RAM can take back now: do not run swapoff", gib(used)),
            evidence,
            change: format!(
                "Leave swap on; free at least {} of RAM first (see the RAM advice), then `swapoff -a && swapon -a`",
                gib((used + margin).saturating_sub(m.available_bytes))
            ),
            saving: Some("swapoff now would push RAM to the OOM killer".into()),
        });
    }
}

pub(crate) fn knobs<'a>(input: &'a Input, job: &str) -> Option<&'a Knobs> {
    input.knobs.iter().find(|(n, _)| n == job).map(|(_, k)| k)
}

pub(crate) fn gpu_ratio(g: &crate::sample::gpu::GpuSample) -> Option<f64> {
    match (g.memory_used_bytes, g.memory_total_bytes) {
        (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
        _ => None,
    }
}

fn gpu_memory(input: &Input, out: &mut Vec<Advice>) {
    let available = input.sample.host.memory.as_ref().map(|m| m.available_bytes);
    for g in &input.sample.gpus {
        let (used, total) = (
            g.memory_used_bytes.unwrap_or(0),
            g.memory_total_bytes.unwrap_or(0),
        );
        let Some((level, trigger)) = at_warn(
            input,
            &Resource::GpuMemory(g.index),
            &format!("GPU {}'s memory", g.index),
            &format!("{} of {}", gib(used), gib(total)),
        ) else {
            continue;
        };
        let jobs: Vec<&JobSeen> = input
            .jobs
            .iter()
            .filter(|j| {
                j.sample
                    .as_ref()
                    .and_then(|s| s.gpus.as_ref())
                    .is_none_or(|gs| gs.contains(&g.index))
            })
            .collect();
        let evidence = vec![trigger];
        for job in &jobs {
            let k = knobs(input, job.name).cloned().unwrap_or_default();
            let change = match (k.micro_batch, k.accumulation) {
                (Some(b), Some(a)) if b > 1 => {
                    let nb = smaller_divisor(b);
                    format!("micro-batch {b} → {nb}, gradient accumulation {a} → {}: the effective batch stays {}", a * b / nb, a * b * k.world_size.unwrap_or(1))
                }
                _ => "halve the micro-batch and double gradient accumulation, so micro × accumulation × GPUs stays the same".into(),
            };
            out.push(Advice {
                id: format!("gpu-batch:{}:{}", job.name, g.index),
                severity: if level == Level::Critical { Severity::Critical } else { Severity::Warn },
                job: Some(job.name.to_owned()),
                title: format!("GPU {} is nearly full: smaller micro-batch, more accumulation", g.index),
                evidence: evidence.clone(),
                change,
                saving: Some("activations scale with the micro-batch: halving it roughly halves their memory".into()),
            });
        }
        let offload = match available {
            Some(a) => format!(
                "ZeRO stage 2/3 with CPU optimizer offload moves optimizer state (~12 bytes per parameter) to host RAM: only if host RAM can take it ({} available now)",
                gib(a)
            ),
            None => "ZeRO CPU offload only if host RAM can take the optimizer state".into(),
        };
        out.push(Advice {
            id: format!("gpu-memory-techniques:{}", g.index),
            severity: Severity::Info,
            job: None,
            title: format!("Other ways to fit GPU {}", g.index),
            evidence,
            change: format!("shorter sequences; gradient checkpointing (activations ~s·b·h·34 bytes/layer → ~2·s·b·h); bf16; {offload}. These need a restart"),
            saving: None,
        });
    }
}

fn temperature(input: &Input, out: &mut Vec<Advice>) {
    for g in &input.sample.gpus {
        let Some(t) = g.temperature_celsius else {
            continue;
        };
        let slowdown = g.temperature_slowdown_celsius.unwrap_or(87.0);
        if t < slowdown - 5.0 {
            continue;
        }
        let cap = g.power_limit_watts.map(|l| (l * 0.8).round());
        let mut evidence = vec![format!(
            "GPU {} at {t:.0} °C; slows down at {slowdown:.0} °C",
            g.index
        )];
        if let Some(s) = g.temperature_shutdown_celsius {
            evidence.push(format!("shuts down at {s:.0} °C"));
        }
        if let (Some(p), Some(l)) = (g.power_watts, g.power_limit_watts) {
            evidence.push(format!("drawing {p:.0} W of a {l:.0} W limit"));
        }
        out.push(Advice {
            id: format!("gpu-power-cap:{}", g.index),
            severity: if t >= slowdown { Severity::Critical } else { Severity::Warn },
            job: None,
            title: format!("GPU {} runs hot: cap its power", g.index),
            evidence,
            change: match cap {
                Some(c) => format!("sudo nvidia-smi -i {} -pl {c:.0}   (80 % of the limit); improve airflow; memwatch pauses the job before shutdown", g.index),
                None => format!("sudo nvidia-smi -i {} -pl <watts>; improve airflow; memwatch pauses the job before shutdown", g.index),
            },
            saving: Some("a 20 % lower power cap typically costs a few percent of speed and several degrees".into()),
        });
    }
    for (job, n) in input.thermal_pauses.iter().filter(|(_, n)| *n >= 2) {
        out.push(Advice {
            id: format!("thermal-pauses:{job}"),
            severity: Severity::Warn,
            job: Some(job.clone()),
            title: format!("{job} was paused {n} times for heat in the last hour"),
            evidence: vec![format!("{n} thermal pauses")],
            change: "cap GPU power (nvidia-smi -pl), clean filters / raise fan curves, or lower the ambient temperature".into(),
            saving: Some("each pause costs the time the GPU needs to cool".into()),
        });
    }
    for t in &input.sample.host.temperatures {
        let Some(crit) = t.crit_celsius else { continue };
        if t.celsius >= crit - 15.0 {
            // A drive or a network card near its critical point is a cooling problem of its own:
            // it pauses nothing (unless `[policy.sensors] count_as_cpu` names it), and fewer
            // DataLoader workers does not cool it.
            let (id, change) = if t.cpu {
                (
                    "cpu-temperature",
                    "check cooling; fewer DataLoader workers also lowers CPU load".to_owned(),
                )
            } else {
                (
                    "sensor-temperature",
                    format!(
                        "check the cooling of {} (airflow, a heatsink); memwatch pauses no job for it unless [policy.sensors] count_as_cpu names it",
                        t.chip
                    ),
                )
            };
            out.push(Advice {
                id: format!("{id}:{}:{}", t.chip, t.sensor),
                severity: if t.celsius >= crit - 5.0 {
                    Severity::Critical
                } else {
                    Severity::Warn
                },
                job: None,
                title: format!(
                    "{} {} is at {:.0} °C, {:.0} °C below critical",
                    t.chip,
                    t.sensor,
                    t.celsius,
                    crit - t.celsius
                ),
                evidence: vec![format!("{:.0} °C, critical at {crit:.0} °C", t.celsius)],
                change,
                saving: None,
            });
        }
    }
}
