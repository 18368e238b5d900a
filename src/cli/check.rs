//! `memwatch check`: reads this machine (or takes it from the command line), estimates what the model
//! needs per ZeRO layout, and prints a recommendation with ready DeepSpeed and accelerate configs.

use std::fmt::Write as _;

use crate::check::{self, Machine, Model, Report};
use crate::config::Config;
use crate::sample::gpu::GpuSource;

/// The command line's model and machine options.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Model parameters, e.g. 1.5e9
    #[arg(long)]
    pub params: Option<f64>,
    #[arg(long)]
    pub layers: Option<u64>,
    #[arg(long)]
    pub hidden: Option<u64>,
    #[arg(long)]
    pub heads: Option<u64>,
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// Parameters of the largest layer [default: 4·hidden²]
    #[arg(long)]
    pub largest_layer: Option<f64>,
    /// bf16 or fp16 (the estimates are DeepSpeed's, for mixed precision)
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// adam or adamw (the estimates assume Adam's two moments, as DeepSpeed's do)
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// GPUs to train on [default: the GPUs seen]
    #[arg(long)]
    pub gpus: Option<u64>,
    /// Plan for GPUs of this much memory instead of the ones seen
    #[arg(long, value_name = "GIB")]
    pub gpu_memory_gib: Option<f64>,
    /// Plan for this much available host RAM instead of what is available now
    #[arg(long, value_name = "GIB")]
    pub ram_gib: Option<f64>,
    #[arg(long)]
    pub json: bool,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / GIB)
}

/// Reads the machine through the same readers the daemon uses.
pub fn machine(config: &Config, a: &CheckArgs) -> anyhow::Result<Machine> {
    let m = crate::sample::meminfo::read(&config.host.root)?;
    let mut gpus = Vec::new();
    if config.gpu.enabled {
        let mut nvml = crate::sample::nvml::NvmlSource::new(config.gpu.library.clone());
        if let Ok(r) = nvml.sample() {
            for g in r.gpus {
                if let (Some(t), Some(f)) = (g.memory_total_bytes, g.memory_free_bytes) {
                    gpus.push((g.index, g.name.unwrap_or_default(), t, f));
                }
            }
        }
    }
    if let Some(gb) = a.gpu_memory_gib {
        let n = a.gpus.unwrap_or(gpus.len().max(1) as u64) as u32;
        let bytes = (gb * GIB) as u64;
        gpus = (0..n)
            .map(|i| (i, format!("planned {gb} GiB GPU"), bytes, bytes))
            .collect();
    } else if let Some(n) = a.gpus {
        gpus.truncate(n as usize);
    }
    Ok(Machine {
        ram_total_bytes: m.total_bytes,
        ram_available_bytes: a
            .ram_gib
            .map(|g| (g * GIB) as u64)
            .unwrap_or(m.available_bytes),
        swap_free_bytes: m.swap_free_bytes,
        gpus,
    })
}

pub fn model(a: &CheckArgs, gpus_seen: usize) -> anyhow::Result<Option<Model>> {
    if !matches!(a.precision.as_str(), "bf16" | "fp16") {
        anyhow::bail!(
            "--precision {}: memwatch's estimates are for mixed precision (bf16 or fp16)",
            a.precision
        );
    }
    if !matches!(a.optimizer.as_str(), "adam" | "adamw") {
        anyhow::bail!(
            "--optimizer {}: memwatch's estimates assume Adam or AdamW, as DeepSpeed's do",
            a.optimizer
        );
    }
    let Some(params) = a.params else {
        if a.layers.is_some() || a.hidden.is_some() || a.heads.is_some() || a.seq_len.is_some() {
            anyhow::bail!(
                "--layers, --hidden, --heads and --seq-len describe a model: give --params too"
            );
        }
        return Ok(None);
    };
    if !(params.is_finite() && params >= 1.0) {
        anyhow::bail!("--params {params}: expected a positive number of parameters such as 1.5e9");
    }
    Ok(Some(Model {
        params,
        layers: a.layers,
        hidden: a.hidden,
        heads: a.heads,
        seq_len: a.seq_len,
        largest_layer_params: a.largest_layer,
        gpus: a.gpus.unwrap_or(gpus_seen.max(1) as u64),
    }))
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let m = &r.machine;
    let _ = writeln!(
        o,
        "machine: RAM {} ({} available), swap {} free",
        gib(m.ram_total_bytes as f64),
        gib(m.ram_available_bytes as f64),
        gib(m.swap_free_bytes as f64)
    );
    if m.gpus.is_empty() {
        let _ = writeln!(
            o,
            "GPUs: none seen (plan for some with --gpus N --gpu-memory-gib G)"
        );
    }
    for (i, name, total, free) in &m.gpus {
        let _ = writeln!(
            o,
            "GPU {i}: {name}, {} ({} free)",
            gib(*total as f64),
            gib(*free as f64)
        );
    }
    if let Some(md) = &r.model {
        let _ = writeln!(
            o,
            "model: {:.3e} parameters on {} GPU(s), largest layer {:.3e}",
            md.params,
            md.gpus,
            md.largest_layer()
        );
        let _ = writeln!(
            o,
            "\n{:<46}{:>14}{:>14}{:>10}{:>10}",
            "layout", "per GPU", "host RAM", "fits GPU", "fits RAM"
        );
        for v in &r.verdicts {
            let yes = |b: bool| if b { "yes" } else { "no" };
            let _ = writeln!(
                o,
                "{:<46}{:>14}{:>14}{:>10}{:>10}",
                v.option.name,
                gib(v.gpu_needed_bytes),
                gib(v.option.cpu_bytes),
                v.fits_gpu.map(yes).unwrap_or("-"),
                yes(v.fits_ram)
            );
        }
        let _ = writeln!(
            o,
            "(per GPU: model states, plus activations at micro-batch 1 when the shape is given)"
        );
    }
    let rec = &r.recommendation;
    let _ = writeln!(o, "\nrecommendation (the notes' tier: {})", rec.tier);
    if let Some(opt) = &rec.option {
        let _ = writeln!(o, "  layout: {}", opt.name);
    }
    let gpus = r
        .model
        .as_ref()
        .map(|m| m.gpus)
        .unwrap_or(r.machine.gpus.len().max(1) as u64);
    let _ = writeln!(
        o,
        "  micro-batch {}, gradient accumulation {} (effective batch {} over {gpus} GPU(s)), sequence length {}",
        rec.micro_batch,
        rec.accumulation,
        rec.micro_batch * rec.accumulation * gpus,
        rec.seq_len
    );
    let _ = writeln!(
        o,
        "  DataLoader workers {}, pin_memory {}, gradient checkpointing {}",
        rec.workers, rec.pin_memory, rec.gradient_checkpointing
    );
    for n in &rec.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    if r.model.is_some() {
        let ds =
            serde_json::to_string_pretty(&check::deepspeed_json(rec, gpus)).unwrap_or_default();
        let _ = writeln!(
            o,
            "\nDeepSpeed config (ds_config.json):\n{ds}\n\naccelerate config (accelerate.yaml):\n{}",
            check::accelerate_yaml(rec, gpus)
        );
    }
    o
}
