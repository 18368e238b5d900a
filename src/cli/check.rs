//! `memwatch check`: reads this machine (or takes it from the command line), estimates what the model
//! needs per ZeRO layout, and prints a recommendation with ready DeepSpeed and accelerate configs.

use std::fmt::Write as _;

use crate::check::{self, Machine, Model, Report};
use crate::config::Config;
use crate::sample::gpu::GpuSource;

/// The command line's model and machine options.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Model parameters: 1.5e9, 1.5B, 350M, 7B (K, M, B or T: thousands to trillions)
    #[arg(long, value_parser = parse_params)]
    pub params: Option<f64>,
    /// A Hugging Face config.json (GPT-2, Llama, Mistral, BERT or T5 style): the parameter count,
    /// layers, hidden size, heads and sequence length come from it (the flags override)
    #[arg(long, value_name = "PATH")]
    pub model_config: Option<std::path::PathBuf>,
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
    /// GPUs per node to train on [default: the GPUs seen]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub gpus: Option<u64>,
    /// Nodes (machines) the run spans, each with --gpus GPUs
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: u64,
    /// Plan for GPUs of this much memory (GiB) instead of the ones seen
    #[arg(long, value_name = "GIB", value_parser = parse_gib)]
    pub gpu_memory_gib: Option<f64>,
    /// Plan for this much available host RAM per node (GiB) instead of what is available now
    #[arg(long, value_name = "GIB", value_parser = parse_gib)]
    pub ram_gib: Option<f64>,
    #[arg(long)]
    pub json: bool,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `memwatch check`: exit 0 when the model fits a layout, 3 when it fits none.
pub(super) fn run(cli: &super::Cli, a: &CheckArgs) -> Result<(), super::Failure> {
    let config = super::load_config(cli)?;
    let machine = machine(&config, a)?;
    let model = model(a, machine.gpus.len()).map_err(super::usage)?;
    let report = check::check(machine, model);
    let fits = report.recommendation.fits != Some(false);
    let found = crate::proc::neighbours::read(&config.host.process_root, &config.host.root);
    let beside = check::neighbours::notes(
        &found,
        &config.policy.host_memory,
        report.machine.ram_total_bytes,
    );
    if a.json {
        let (per_node, nodes) = world(&report);
        let rec = &report.recommendation;
        let v = serde_json::json!({
            "report": report,
            "oom_killers": { "found": found, "notes": beside },
            "deepspeed": fits.then(|| check::deepspeed_json(rec, per_node * nodes)),
            "accelerate": fits.then(|| check::accelerate_yaml(rec, per_node, nodes)),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&report));
        print!("{}", render_beside(&beside));
    }
    if fits {
        Ok(())
    } else {
        Err(super::Failure {
            code: 3,
            error: anyhow::anyhow!("the model does not fit in any layout (see the notes)"),
        })
    }
}

/// A parameter count: a number (1.5e9) or one with a suffix K, M, B (or G) or T.
pub fn parse_params(s: &str) -> Result<f64, super::arg_error::ArgError> {
    use super::arg_error::ArgError;
    let t = s.trim();
    let (num, scale) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let scale = match c.to_ascii_uppercase() {
                'K' => 1e3,
                'M' => 1e6,
                'B' | 'G' => 1e9,
                'T' => 1e12,
                _ => return Err(ArgError::Suffix(s.to_owned(), c)),
            };
            (&t[..i], scale)
        }
        _ => (t, 1.0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| ArgError::Params(s.to_owned()))?;
    let v = v * scale;
    if !(v.is_finite() && v >= 1.0) {
        return Err(ArgError::NotPositive(s.to_owned()));
    }
    Ok(v)
}

/// A positive size in GiB.
fn parse_gib(s: &str) -> Result<f64, super::arg_error::ArgError> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(super::arg_error::ArgError::Gib(s.to_owned())),
    }
}

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
    let shape = match &a.model_config {
        Some(path) => {
            use std::io::Read as _;
            let what = path.display().to_string();
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(4 << 20).read_to_string(&mut text))
                .map_err(|e| anyhow::anyhow!("--model-config {what}: {e}"))?;
            Some(check::model_config::parse(&text, &what).map_err(|e| anyhow::anyhow!(e))?)
        }
        None => None,
    };
    let Some(params) = a.params.or(shape.as_ref().map(|s| s.params)) else {
        if a.layers.is_some() || a.hidden.is_some() || a.heads.is_some() || a.seq_len.is_some() {
            anyhow::bail!(
                "--layers, --hidden, --heads and --seq-len describe a model: give --params or --model-config too"
            );
        }
        return Ok(None);
    };
    Ok(Some(Model {
        params,
        layers: a.layers.or(shape.as_ref().map(|s| s.layers)),
        hidden: a.hidden.or(shape.as_ref().map(|s| s.hidden)),
        heads: a.heads.or(shape.as_ref().map(|s| s.heads)),
        seq_len: a.seq_len.or(shape.as_ref().and_then(|s| s.max_seq)),
        largest_layer_params: a.largest_layer.or(shape.as_ref().map(|s| s.largest_layer)),
        gpus_per_node: a.gpus.unwrap_or(gpus_seen.max(1) as u64),
        nodes: a.nodes,
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
            "model: {:.3e} parameters on {} node(s) × {} GPU(s), largest layer {:.3e}",
            md.params,
            md.nodes,
            md.gpus_per_node,
            md.largest_layer()
        );
        let _ = writeln!(
            o,
            "\n{:<46}{:>14}{:>16}{:>10}{:>10}",
            "layout", "per GPU", "host RAM/node", "fits GPU", "fits RAM"
        );
        for v in &r.verdicts {
            let yes = |b: bool| if b { "yes" } else { "no" };
            let _ = writeln!(
                o,
                "{:<46}{:>14}{:>16}{:>10}{:>10}",
                v.option.name,
                gib(v.gpu_needed_bytes),
                gib(v.option.cpu_bytes),
                v.fits_gpu.map(yes).unwrap_or("-"),
                yes(v.fits_ram)
            );
        }
        let _ = writeln!(
            o,
            "(GiB = 2^30 bytes; per GPU: model states, plus activations at micro-batch 1 with checkpointing when the shape is given)"
        );
    }
    let rec = &r.recommendation;
    let _ = writeln!(o, "\nrecommendation (the notes' tier: {})", rec.tier);
    if let Some(opt) = &rec.option {
        let _ = writeln!(o, "  layout: {}", opt.name);
    }
    let (per_node, nodes) = world(r);
    let gpus = per_node * nodes;
    if rec.fits != Some(false) {
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
    }
    for n in &rec.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    match rec.fits {
        Some(true) => {
            let ds =
                serde_json::to_string_pretty(&check::deepspeed_json(rec, gpus)).unwrap_or_default();
            let _ = writeln!(
                o,
                "\nDeepSpeed config (ds_config.json):\n{ds}\n\naccelerate config (accelerate.yaml):\n{}",
                check::accelerate_yaml(rec, per_node, nodes)
            );
        }
        Some(false) => {
            let _ = writeln!(o, "\nnothing fits: no config is emitted (exit status 3)");
        }
        None => {}
    }
    o
}

/// The other OOM killers' notes, after the report: a warning says what to change.
pub fn render_beside(notes: &[check::neighbours::Note]) -> String {
    let mut o = String::new();
    if notes.is_empty() {
        return o;
    }
    let _ = writeln!(o, "\nbeside other OOM killers");
    for n in notes {
        let _ = writeln!(
            o,
            "  {}: {}",
            if n.warning { "warning" } else { "note" },
            n.text
        );
    }
    o
}

/// (GPUs per node, nodes) the report plans for.
pub fn world(r: &Report) -> (u64, u64) {
    r.model
        .as_ref()
        .map(|m| (m.gpus_per_node.max(1), m.nodes.max(1)))
        .unwrap_or((r.machine.gpus.len().max(1) as u64, 1))
}

#[cfg(test)]
mod tests {
    use super::parse_params;

    #[test]
    fn parameter_counts_take_suffixes() {
        assert_eq!(parse_params("1.5B"), Ok(1.5e9));
        assert_eq!(parse_params("350M"), Ok(350e6));
        assert_eq!(parse_params("7b"), Ok(7e9));
        assert_eq!(parse_params("1.5e9"), Ok(1.5e9));
        assert_eq!(parse_params("70000"), Ok(7e4));
        for bad in ["0", "-1B", "7X", "B", "", "nan"] {
            assert!(parse_params(bad).is_err(), "{bad:?} was accepted");
        }
        use super::super::arg_error::ArgError;
        assert_eq!(parse_params("7X"), Err(ArgError::Suffix("7X".into(), 'X')));
        assert_eq!(parse_params("0"), Err(ArgError::NotPositive("0".into())));
        assert_eq!(parse_params("B"), Err(ArgError::Params("B".into())));
    }
}
