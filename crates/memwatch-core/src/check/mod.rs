//! `memwatch check`: what a model needs and what this machine can give, before a run starts — the
//! users' check_system script done right. Pure: machine and model in, estimates and a recommendation out.
//!
//! Model states follow DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs`,
//! `estimate_zero3_model_states_mem_needs`, with zero_init and their 1.5 buffer factor for host RAM);
//! activations follow Korthikanti et al. 2022 (16-bit, per transformer layer: s·b·h·(34 + 5·a·s/h)
//! bytes without recomputation, about 2·s·b·h with full recomputation).

pub mod model_config;
pub mod neighbours;
pub mod nothing_fits;
#[cfg(test)]
mod nothing_fits_tests;
#[cfg(test)]
mod tests;

use serde::Serialize;

/// DeepSpeed's host-memory buffer factor.
const BUFFER: f64 = 1.5;
/// Share of a GPU's memory a plan may use (the rest: CUDA context, allocator slack, fragmentation).
const GPU_USABLE: f64 = 0.90;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The machine, as sampled or as given on the command line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Machine {
    /// Host RAM in all.
    pub ram_total_bytes: u64,
    /// Host RAM available now (MemAvailable), or as given.
    pub ram_available_bytes: u64,
    /// Free swap.
    pub swap_free_bytes: u64,
    /// GPUs: (index, name, total bytes, free bytes).
    pub gpus: Vec<(u32, String, u64, u64)>,
}

impl Machine {
    /// The smallest GPU's memory (plans must fit every rank).
    pub fn gpu_memory_bytes(&self) -> Option<u64> {
        self.gpus.iter().map(|g| g.2).min()
    }
}

/// The model, as far as the user describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    /// Parameters.
    pub params: f64,
    /// Transformer layers, if known.
    pub layers: Option<u64>,
    /// Hidden size, if known.
    pub hidden: Option<u64>,
    /// Attention heads, if known.
    pub heads: Option<u64>,
    /// Sequence length, if known.
    pub seq_len: Option<u64>,
    /// Parameters of the largest single layer; 4·h² (the MLP's up-projection) when only h is known.
    pub largest_layer_params: Option<f64>,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Nodes.
    pub nodes: u64,
}

impl Model {
    /// Every GPU of the run: the world size.
    pub fn total_gpus(&self) -> u64 {
        self.gpus_per_node.max(1) * self.nodes.max(1)
    }

    /// Parameters of the largest layer: as given, else 4·h², else the parameters over the layers
    /// (24 when unknown).
    pub fn largest_layer(&self) -> f64 {
        self.largest_layer_params
            .or_else(|| self.hidden.map(|h| 4.0 * (h as f64) * (h as f64)))
            .unwrap_or(self.params / self.layers.unwrap_or(24).max(1) as f64)
    }
}

/// One way to lay the model states out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Option_ {
    /// Its name, e.g. "ZeRO-2 + CPU offload".
    pub name: &'static str,
    /// DeepSpeed ZeRO stage (0–3).
    pub zero_stage: u8,
    /// Optimizer states in host RAM.
    pub offload_optimizer: bool,
    /// Parameters in host RAM.
    pub offload_params: bool,
    /// Model states per GPU (parameters, gradients, optimizer), bytes.
    pub gpu_bytes: f64,
    /// Host RAM the node needs, bytes.
    pub cpu_bytes: f64,
}

/// Model-state estimates for every option, as DeepSpeed's current code computes them
/// (`estimate_zero2_model_states_mem_needs` in stage_1_and_2.py and
/// `estimate_zero3_model_states_mem_needs` in stage3.py, zero_init for ZeRO-3): per GPU, and host RAM
/// per node. In order of preference: no offload before offload, ZeRO-2 before ZeRO-3.
pub fn options(m: &Model) -> Vec<Option_> {
    let p = m.params;
    let per_node = m.gpus_per_node.max(1) as f64;
    let nodes = m.nodes.max(1) as f64;
    let n = per_node * nodes;
    let ll = 4.0 * m.largest_layer();
    let option =
        |name, zero_stage, offload_optimizer, offload_params, gpu_bytes, cpu_bytes| Option_ {
            name,
            zero_stage,
            offload_optimizer,
            offload_params,
            gpu_bytes,
            cpu_bytes,
        };
    vec![
        // 2 = 16-bit params; 18 = 16-bit and 32-bit grads, 32-bit params, Adam's two moments.
        option(
            "ZeRO-2",
            2,
            false,
            false,
            2.0 * p + (18.0 * p / n).trunc(),
            p * 4.0 * per_node * BUFFER,
        ),
        option(
            "ZeRO-3",
            3,
            false,
            false,
            ll + (18.0 * p / n).trunc(),
            m.largest_layer() * 4.0 * per_node * BUFFER,
        ),
        option(
            "ZeRO-2 + CPU optimizer offload",
            2,
            true,
            false,
            2.0 * p,
            p * (4.0 * n).max(16.0) * BUFFER,
        ),
        option(
            "ZeRO-3 + CPU optimizer offload",
            3,
            true,
            false,
            ll + (2.0 * p / n).trunc(),
            p * 16.0 / nodes * BUFFER,
        ),
        option(
            "ZeRO-3 + CPU offload (params and optimizer)",
            3,
            true,
            true,
            ll,
            p * 18.0 / nodes * BUFFER,
        ),
    ]
}

/// Activation memory per GPU for micro-batch `b` (16-bit), if the shape is known.
pub fn activations(m: &Model, b: u64, recompute: bool) -> Option<f64> {
    let (l, h, a, s) = (m.layers?, m.hidden?, m.heads?, m.seq_len?);
    let (s, b, h, a) = (s as f64, b as f64, h as f64, a as f64);
    let per_layer = if recompute {
        2.0 * s * b * h
    } else {
        s * b * h * (34.0 + 5.0 * a * s / h)
    };
    Some(per_layer * l as f64)
}

/// The notes' tiers (note 004), by GPU memory per GPU: (name, zero stage, offload, micro-batch,
/// accumulation, sequence length).
pub fn notes_tier(gpu_bytes: u64) -> (&'static str, u8, bool, u64, u64, u64) {
    let g = gpu_bytes as f64 / GIB;
    if g > 12.0 {
        ("> 12 GiB: ZeRO-2", 2, false, 4, 4, 2048)
    } else if g >= 6.0 {
        (
            "6–12 GiB: ZeRO-2 + CPU optimizer offload",
            2,
            true,
            3,
            6,
            1792,
        )
    } else if g >= 4.0 {
        ("4–6 GiB: ZeRO-3", 3, false, 2, 8, 1536)
    } else {
        ("< 4 GiB: ZeRO-3 + CPU offload", 3, true, 1, 16, 1024)
    }
}

/// One option judged against this machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The layout judged.
    pub option: Option_,
    /// Model states plus activations at micro-batch 1 with checkpointing, per GPU.
    pub gpu_needed_bytes: f64,
    /// Whether it fits the GPU; `None` without a GPU to judge against.
    pub fits_gpu: Option<bool>,
    /// Whether the node's RAM holds what the layout puts there.
    pub fits_ram: bool,
}

impl Verdict {
    /// Whether the layout fits both the GPU and the node's RAM.
    pub fn fits(&self) -> bool {
        self.fits_gpu == Some(true) && self.fits_ram
    }
}

/// Judges every layout of `m` against `machine`: the table's rows. Every claim `check` makes about
/// what fits (the layout chosen, and what would fit when nothing does) goes through this one check.
pub fn judge(machine: &Machine, m: &Model) -> Vec<Verdict> {
    let gpu_mem = machine.gpu_memory_bytes();
    // The floor: micro-batch 1 with full recomputation (gradient checkpointing).
    let act1 = activations(m, 1, true).unwrap_or(0.0);
    options(m)
        .into_iter()
        .map(|o| {
            let need = o.gpu_bytes + act1;
            Verdict {
                fits_gpu: gpu_mem.map(|g| need <= g as f64 * GPU_USABLE),
                fits_ram: o.cpu_bytes <= machine.ram_available_bytes as f64,
                option: o,
                gpu_needed_bytes: need,
            }
        })
        .collect()
}

/// The layout to run: the first of `verdicts` (the least offloading) that fits both the GPU and host
/// RAM.
pub fn first_fit(verdicts: &[Verdict]) -> Option<&Verdict> {
    verdicts.iter().find(|v| v.fits())
}

/// What `check` recommends.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// The machine's tier, in words (e.g. "8–16 GiB: ZeRO-2").
    pub tier: String,
    /// The layout recommended, if one fits.
    pub option: Option<Option_>,
    /// Micro-batch per GPU.
    pub micro_batch: u64,
    /// Gradient accumulation steps.
    pub accumulation: u64,
    /// Sequence length.
    pub seq_len: u64,
    /// DataLoader workers per rank.
    pub workers: u64,
    /// DataLoader pin_memory.
    pub pin_memory: bool,
    /// Whether to turn on gradient (activation) checkpointing.
    pub gradient_checkpointing: bool,
    /// Why, and what to watch, for people.
    pub notes: Vec<String>,
    /// With a model: whether any layout fits (`memwatch check` exits 3 when none does, and emits no
    /// config).
    pub fits: Option<bool>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The machine judged against.
    pub machine: Machine,
    /// The model, if one was described.
    pub model: Option<Model>,
    /// Each layout, judged.
    pub verdicts: Vec<Verdict>,
    /// What to run with.
    pub recommendation: Recommendation,
}

/// Host RAM below which DataLoader workers and pin_memory go (note 001's threshold).
const LOW_RAM: u64 = 10 << 30;

/// Judges every layout of `model` against `machine` and recommends one (with no model: the settings
/// the machine's tier allows).
pub fn check(machine: Machine, model: Option<Model>) -> Report {
    let gpu_mem = machine.gpu_memory_bytes();
    let (tier_name, tier_stage, tier_offload, mut micro, mut accum, mut seq) = match gpu_mem {
        Some(g) => notes_tier(g),
        // No GPU: note 002's RAM tiers for a CPU run.
        None if machine.ram_total_bytes < 8 << 30 => ("no GPU, < 8 GB RAM", 0, false, 1, 16, 128),
        None if machine.ram_total_bytes < 16 << 30 => ("no GPU, 8–16 GB RAM", 0, false, 4, 4, 256),
        None => ("no GPU, ≥ 16 GB RAM", 0, false, 8, 1, 512),
    };
    let mut notes = Vec::new();
    let low_ram = machine.ram_available_bytes < LOW_RAM;
    let gpus = machine.gpus.len().max(1) as u64;
    let workers = if low_ram { 0 } else { 4.min(2 * gpus) };
    if low_ram {
        notes.push(format!(
            "only {:.1} GiB of RAM available: num_workers 0 and pin_memory off, stream the dataset",
            machine.ram_available_bytes as f64 / GIB
        ));
    }
    let mut verdicts = Vec::new();
    let mut chosen = None;
    let mut checkpointing = false;
    if let Some(m) = &model {
        if let Some(s) = m.seq_len {
            seq = s;
        }
        if activations(m, 1, true).is_none() {
            notes.push(
                "activations were not counted (give --layers, --hidden, --heads and --seq-len): the \
                 micro-batch and sequence length come from the notes' tier, and the layout's room per \
                 GPU must hold them"
                    .into(),
            );
        }
        verdicts = judge(&machine, m);
        chosen = first_fit(&verdicts).map(|v| v.option.clone());
        match (&chosen, gpu_mem) {
            (Some(o), Some(g)) => {
                let room = g as f64 * GPU_USABLE - o.gpu_bytes;
                // The largest micro-batch (up to the tier's) whose activations fit, then with
                // recomputation if none does.
                let fit = |rc: bool| {
                    (1..=micro.max(1) * 4)
                        .rev()
                        .find(|b| activations(m, *b, rc).is_some_and(|a| a <= room))
                };
                match (fit(false), fit(true)) {
                    (Some(b), _) => micro = b.min(micro.max(1) * 4),
                    (None, Some(b)) => {
                        micro = b;
                        checkpointing = true;
                        notes.push("activations fit only with gradient checkpointing".into());
                    }
                    (None, None) if activations(m, 1, true).is_some() => {
                        micro = 1;
                        checkpointing = true;
                        notes.push(
                            "even micro-batch 1 with checkpointing is tight: shorten the sequences"
                                .into(),
                        );
                    }
                    _ => {}
                }
                let target = notes_tier(g).3 * notes_tier(g).4;
                accum = target.div_ceil(micro).max(1);
                if o.offload_optimizer {
                    notes.push(format!(
                        "CPU offload needs {:.1} GiB of host RAM; {:.1} GiB is available",
                        o.cpu_bytes / GIB,
                        machine.ram_available_bytes as f64 / GIB
                    ));
                }
            }
            (None, Some(_)) => notes.extend(nothing_fits::notes(&machine, m, &verdicts)),
            _ => notes.push(
                "no GPU seen: the estimates are per GPU for --gpu-memory-gib / --gpus".into(),
            ),
        }
    }
    let tier = tier_name.to_owned();
    let _ = (tier_stage, tier_offload);
    Report {
        recommendation: Recommendation {
            tier,
            fits: model.as_ref().map(|_| chosen.is_some()),
            option: chosen,
            micro_batch: micro,
            accumulation: accum,
            seq_len: seq,
            workers,
            pin_memory: !low_ram,
            gradient_checkpointing: checkpointing,
            notes,
        },
        machine,
        model,
        verdicts,
    }
}

/// (ZeRO stage, optimizer offloaded, parameters offloaded) of the recommendation; ZeRO-2 when none fits.
fn layout(r: &Recommendation) -> (u8, bool, bool) {
    r.option
        .as_ref()
        .map(|o| (o.zero_stage, o.offload_optimizer, o.offload_params))
        .unwrap_or((2, false, false))
}

fn device(on: bool) -> &'static str {
    if on { "cpu" } else { "none" }
}

/// A ready DeepSpeed config for the recommendation, for a world of `gpus` GPUs.
pub fn deepspeed_json(r: &Recommendation, gpus: u64) -> serde_json::Value {
    let (stage, opt, params) = layout(r);
    serde_json::json!({
        "train_micro_batch_size_per_gpu": r.micro_batch,
        "gradient_accumulation_steps": r.accumulation,
        "train_batch_size": r.micro_batch * r.accumulation * gpus.max(1),
        "bf16": { "enabled": true },
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": { "device": device(opt), "pin_memory": r.pin_memory },
            "offload_param": { "device": device(params), "pin_memory": r.pin_memory },
            "overlap_comm": true,
            "contiguous_gradients": true
        },
        "activation_checkpointing": { "partition_activations": r.gradient_checkpointing }
    })
}

/// A ready accelerate config (YAML) for the recommendation, on `nodes` machines of `gpus_per_node`
/// GPUs. Only fields accelerate reads: the micro-batch is the training script's (accelerate takes it
/// from the DataLoader), so it is not here.
pub fn accelerate_yaml(r: &Recommendation, gpus_per_node: u64, nodes: u64) -> String {
    let (stage, opt, params) = layout(r);
    format!(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  gradient_accumulation_steps: {}\n  zero_stage: {stage}\n  offload_optimizer_device: {}\n  offload_param_device: {}\n  zero3_init_flag: {}\nmixed_precision: bf16\nnum_machines: {}\nnum_processes: {}\n",
        r.accumulation,
        device(opt),
        device(params),
        stage == 3,
        nodes.max(1),
        gpus_per_node.max(1) * nodes.max(1)
    )
}
