//! When no layout fits: what blocks each family of layouts (GPU memory, host RAM at load, host RAM for
//! offloaded states), and the smallest changes that make one fit. Every "would fit" said here is the
//! table's own check ([`judge`]) run again on the changed machine or model, never a separate formula.

use super::{GIB, GPU_USABLE, Machine, Model, Verdict, first_fit, judge};

/// The most GPUs in all that the search for more GPUs tries.
pub const MAX_GPUS: u64 = 4096;

/// What keeps a family of layouts (without offload, or with CPU offload) from fitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocker {
    /// None of the family's layouts fits the GPU.
    GpuMemory,
    /// A layout without offload fits the GPU, but the node's RAM cannot hold the model while each local
    /// rank loads it.
    RamAtLoad,
    /// A layout with CPU offload fits the GPU, but the node's RAM cannot hold the states moved there.
    RamOffload,
}

/// Why nothing fits, per family of layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diagnosis {
    /// The layouts without offload (ZeRO-2, ZeRO-3).
    pub no_offload: Blocker,
    /// The layouts with CPU offload.
    pub offload: Blocker,
}

impl Diagnosis {
    /// The blocker to name first: host RAM at load when a layout without offload fits the GPUs, else the
    /// offload family's (host RAM for offloaded states, or GPU memory when nothing fits the GPUs).
    pub fn main(&self) -> Blocker {
        if self.no_offload == Blocker::RamAtLoad {
            Blocker::RamAtLoad
        } else {
            self.offload
        }
    }
}

/// What blocks each family, from `verdicts` of which none fits: a family with a layout that fits the
/// GPU is short of host RAM; one without is short of GPU memory.
pub fn diagnose(verdicts: &[Verdict]) -> Diagnosis {
    let family = |offload: bool, ram: Blocker| {
        if least_ram(verdicts, Some(offload)).is_some() {
            ram
        } else {
            Blocker::GpuMemory
        }
    };
    Diagnosis {
        no_offload: family(false, Blocker::RamAtLoad),
        offload: family(true, Blocker::RamOffload),
    }
}

/// Of the layouts that fit the GPU (in the family, if one is named), the one needing the least host RAM.
fn least_ram(verdicts: &[Verdict], offload: Option<bool>) -> Option<&Verdict> {
    verdicts
        .iter()
        .filter(|v| {
            v.fits_gpu == Some(true) && offload.is_none_or(|o| v.option.offload_optimizer == o)
        })
        .min_by(|a, b| a.option.cpu_bytes.total_cmp(&b.option.cpu_bytes))
}

/// Of the layouts (in the family, if one is named), the one needing the least GPU memory.
fn least_gpu(verdicts: &[Verdict], offload: Option<bool>) -> Option<&Verdict> {
    verdicts
        .iter()
        .filter(|v| offload.is_none_or(|o| v.option.offload_optimizer == o))
        .min_by(|a, b| a.gpu_needed_bytes.total_cmp(&b.gpu_needed_bytes))
}

/// A change to the run under which a layout fits: the changed machine and model, and the table's
/// verdict on them.
#[derive(Debug, Clone, PartialEq)]
pub struct Fix {
    /// The change, in words and flags, to follow "would fit" (e.g. "with --ram-gib 24.4 (…)").
    pub change: String,
    /// The machine after the change.
    pub machine: Machine,
    /// The model after the change.
    pub model: Model,
    /// The layout the check chooses after the change, with its needs.
    pub verdict: Verdict,
}

impl Fix {
    /// The fix in words, with the numbers the check found.
    pub fn note(&self) -> String {
        let usable = self.machine.gpu_memory_bytes().unwrap_or(0) as f64 * GPU_USABLE;
        format!(
            "{} would fit {}: {} per GPU of {} usable, {} of host RAM per node of {} available",
            self.verdict.option.name,
            self.change,
            gib(self.verdict.gpu_needed_bytes),
            gib(usable),
            gib(self.verdict.option.cpu_bytes),
            gib(self.machine.ram_available_bytes as f64)
        )
    }
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / GIB)
}

/// Runs the table's check on a changed machine and model: the fix, if a layout then fits.
fn try_fix(change: impl FnOnce() -> String, machine: &Machine, model: &Model) -> Option<Fix> {
    let verdict = first_fit(&judge(machine, model))?.clone();
    Some(Fix {
        change: change(),
        machine: machine.clone(),
        model: model.clone(),
        verdict,
    })
}

/// More host RAM: the least a layout that fits the GPU needs, rounded up to the 0.1 GiB that
/// `--ram-gib` takes. `None` when no layout fits the GPU.
pub fn more_ram(machine: &Machine, m: &Model, verdicts: &[Verdict]) -> Option<Fix> {
    let need = least_ram(verdicts, None)?.option.cpu_bytes;
    let tenths = (need / GIB * 10.0).ceil() as u64;
    // The rounding is checked, not trusted: the next tenths are tried if a float falls short.
    (tenths..tenths + 3).find_map(|t| {
        let ram = t as f64 / 10.0;
        let changed = Machine {
            ram_available_bytes: (ram * GIB) as u64,
            ..machine.clone()
        };
        let more = ram - machine.ram_available_bytes as f64 / GIB;
        try_fix(
            || format!("with --ram-gib {ram:.1} (a node with {ram:.1} GiB of RAM available, {more:.1} GiB more)"),
            &changed,
            m,
        )
    })
}

/// Fewer GPUs per node on as many nodes: the most that fit (each local rank loads the model, so host
/// RAM at load shrinks with them).
pub fn fewer_gpus_per_node(machine: &Machine, m: &Model) -> Option<Fix> {
    let nodes = m.nodes.max(1);
    (1..m.gpus_per_node.max(1)).rev().find_map(|k| {
        let changed = Model {
            gpus_per_node: k,
            ..m.clone()
        };
        try_fix(
            || {
                format!(
                    "on {k} GPU(s) per node (--gpus {k}: {} GPU(s) in all)",
                    k * nodes
                )
            },
            machine,
            &changed,
        )
    })
}

/// The same GPUs in all, over more nodes with fewer per node: the fewest nodes that fit.
pub fn same_gpus_over_more_nodes(machine: &Machine, m: &Model) -> Option<Fix> {
    let total = m.total_gpus();
    (m.nodes.max(1) + 1..=total)
        .filter(|n| total % n == 0)
        .find_map(|n| {
            let per = total / n;
            let changed = Model {
                gpus_per_node: per,
                nodes: n,
                ..m.clone()
            };
            try_fix(
                || {
                    format!(
                        "on the same {total} GPUs as {n} nodes × {per} (--nodes {n} --gpus {per})"
                    )
                },
                machine,
                &changed,
            )
        })
}

/// More GPUs of this size: the fewest in all (up to [`MAX_GPUS`]) that fit, with more per node on as
/// many nodes first, then more nodes of as many GPUs.
pub fn more_gpus(machine: &Machine, m: &Model) -> Option<Fix> {
    let (per, nodes) = (m.gpus_per_node.max(1), m.nodes.max(1));
    (per * nodes + 1..=MAX_GPUS).find_map(|total| {
        let shapes = [
            (total % nodes == 0).then(|| (total / nodes, nodes)),
            (total % per == 0).then(|| (per, total / per)),
        ];
        shapes.into_iter().flatten().find_map(|(p, n)| {
            let changed = Model {
                gpus_per_node: p,
                nodes: n,
                ..m.clone()
            };
            try_fix(
                || format!("on {total} GPUs of this size (--gpus {p} --nodes {n})"),
                machine,
                &changed,
            )
        })
    })
}

/// A smaller model with the same layers, hidden size and largest layer, on this machine and these GPUs:
/// the largest parameter count that fits (searched with the check itself, which is monotone in the
/// count), rounded down to the three digits printed. `None` when not even a model no larger than its
/// largest layer fits.
pub fn smaller_model(machine: &Machine, m: &Model) -> Option<Fix> {
    let at = |params: f64| Model {
        params,
        ..m.clone()
    };
    let fits = |params: f64| first_fit(&judge(machine, &at(params))).is_some();
    // The largest layer is fixed when given or when the hidden size is; else it scales with the model.
    let floor = if m.largest_layer_params.is_some() || m.hidden.is_some() {
        m.largest_layer().max(1.0)
    } else {
        1.0
    };
    if floor >= m.params || !fits(floor) {
        return None;
    }
    let (mut lo, mut hi) = (floor, m.params);
    for _ in 0..200 {
        if hi - lo <= lo * 1e-6 {
            break;
        }
        let mid = (lo + hi) / 2.0;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let scale = 10f64.powi(lo.log10().floor() as i32 - 2);
    let digits = (lo / scale).floor();
    let params = (0..3)
        .map(|i| (digits - i as f64) * scale)
        .find(|p| *p >= floor && fits(*p))
        .unwrap_or(lo);
    try_fix(
        || {
            format!(
                "as a model of at most {params:.2e} parameters with the same layers, hidden size and largest layer, on these {} GPU(s) and this host RAM",
                m.total_gpus()
            )
        },
        machine,
        &at(params),
    )
}

/// Every fix found, smallest change first: more host RAM, fewer GPUs per node, the same GPUs over more
/// nodes, more GPUs (when the layouts without offload are short of GPU memory), a smaller model.
pub fn fixes(machine: &Machine, m: &Model, verdicts: &[Verdict]) -> Vec<Fix> {
    let d = diagnose(verdicts);
    [
        more_ram(machine, m, verdicts),
        fewer_gpus_per_node(machine, m),
        same_gpus_over_more_nodes(machine, m),
        if d.no_offload == Blocker::GpuMemory && d.offload != Blocker::GpuMemory {
            more_gpus(machine, m)
        } else {
            None
        },
        smaller_model(machine, m),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The notes when nothing fits (`verdicts` are `judge(machine, m)` and none fits): the blocker of each
/// family of layouts with its numbers, then each change that makes a layout fit, checked as the table is.
pub fn notes(machine: &Machine, m: &Model, verdicts: &[Verdict]) -> Vec<String> {
    let Some(g) = machine.gpu_memory_bytes() else {
        return Vec::new();
    };
    let usable = gib(g as f64 * GPU_USABLE);
    let ram = gib(machine.ram_available_bytes as f64);
    let d = diagnose(verdicts);
    let mut out = Vec::new();
    // Each `least_*` below is present: the diagnosis says which family fits the GPU.
    let short_gpu = |offload| {
        least_gpu(verdicts, offload).map(|v| {
            format!(
                "even {} needs {} per GPU of {usable} usable",
                v.option.name,
                gib(v.gpu_needed_bytes)
            )
        })
    };
    match d.main() {
        Blocker::RamAtLoad => {
            if let Some(v) = least_ram(verdicts, Some(false)) {
                out.push(format!(
                    "nothing fits, and host RAM at load is the blocker, not GPU memory: {} fits the GPUs without offload ({} per GPU of {usable} usable) but needs {} of host RAM per node to load the model, and {ram} is available",
                    v.option.name,
                    gib(v.gpu_needed_bytes),
                    gib(v.option.cpu_bytes)
                ));
            }
            out.push(format!(
                "host RAM at load grows with the GPUs per node: each of the {} local ranks loads the model (all of it for ZeRO-2, its largest layer for ZeRO-3 with zero_init)",
                m.gpus_per_node.max(1)
            ));
            match d.offload {
                Blocker::RamOffload => {
                    if let Some(v) = least_ram(verdicts, Some(true)) {
                        out.push(format!(
                            "with CPU offload host RAM is short too: {} fits the GPUs but needs {} per node for the states it moves there",
                            v.option.name,
                            gib(v.option.cpu_bytes)
                        ));
                    }
                }
                _ => out.extend(
                    short_gpu(Some(true))
                        .map(|s| format!("with CPU offload the GPUs are short: {s}")),
                ),
            }
        }
        Blocker::RamOffload => {
            if let (Some(s), Some(v)) = (short_gpu(Some(false)), least_ram(verdicts, Some(true))) {
                out.push(format!(
                    "nothing fits: the model fits the GPUs only with CPU offload (without it, {s}), and host RAM cannot hold what offload moves there: {} needs {} per node, and {ram} is available",
                    v.option.name,
                    gib(v.option.cpu_bytes)
                ));
            }
        }
        Blocker::GpuMemory => {
            out.extend(short_gpu(None).map(|s| {
                format!("nothing fits, and GPU memory is the blocker: the model does not fit these GPUs in any ZeRO layout ({s})")
            }));
            // The layout that offloads the most keeps only the largest layer (and the activations) on
            // the GPU, whatever the number of GPUs.
            out.push(
                "even the largest layer with its activations does not fit a GPU: parameter offload to NVMe (ZeRO-Infinity), a model with smaller layers, or GPUs with more memory".into(),
            );
        }
    }
    let found = fixes(machine, m, verdicts);
    out.extend(found.iter().map(Fix::note));
    if d.no_offload == Blocker::GpuMemory
        && d.offload != Blocker::GpuMemory
        && !found.iter().any(|f| f.model.total_gpus() > m.total_gpus())
    {
        out.push(format!(
            "no number of these GPUs up to {MAX_GPUS} fits with this host RAM per node"
        ));
    }
    if !found.iter().any(|f| f.model.params < m.params) {
        out.push(format!(
            "no smaller model with the same layers, hidden size and largest layer fits these {} GPU(s) and this host RAM",
            m.total_gpus()
        ));
    }
    out
}
