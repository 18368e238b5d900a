//! The trainer's own TOML config. memwatch rewrites `[train]` micro_batch, accumulation and seq_len.
//! `[fault]` (testing only) stands in for a GPU's memory on a machine without one.

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub train: Train,
    pub model: ModelShape,
    pub data: Data,
    pub memwatch: Link,
    #[serde(default)]
    pub fault: Option<Fault>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Train {
    pub micro_batch: i64,
    pub accumulation: i64,
    pub seq_len: i64,
    pub learning_rate: f64,
    pub epochs: u64,
    pub steps_per_epoch: u64,
    #[serde(default)]
    pub seed: i64,
    /// The smallest micro-batch an out-of-memory error halves down to; an out-of-memory error at
    /// it ends the run with a checkpoint (see recover.rs).
    #[serde(default = "one")]
    pub min_micro_batch: i64,
}

fn one() -> i64 {
    1
}

/// Testing only: makes memory run out where the machine has plenty, to exercise the recovery from
/// an out-of-memory error inside a step on a machine without a GPU.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// A micro-batch of more samples than this fails with CUDA's out-of-memory error, as on a GPU
    /// with room for this many.
    pub oom_above_micro_batch: Option<i64>,
    /// In which pass it fails: "forward", or "backward" (after the backward pass ran, so that every
    /// parameter already holds the failed micro-batch's share of the gradient).
    #[serde(default)]
    pub phase: crate::recover::Phase,
    /// The first this many micro-batches of the run pass whatever their size.
    #[serde(default)]
    pub after_micro_batches: u64,
    /// A real allocation failure instead: once the model is built and has run once, the trainer
    /// caps its own address space (RLIMIT_AS) at its size then plus this many MiB, so that a tensor
    /// past it fails in libtorch's CPU allocator.
    pub address_space_headroom_mib: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    pub embed: i64,
    pub heads: i64,
    pub layers: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Data {
    /// Relative to the config file.
    pub corpus: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub url: String,
    pub socket: PathBuf,
    pub name: String,
    pub progress_every: u64,
    pub checkpoint_dir: PathBuf,
    pub checkpoint_signal: String,
}

impl Settings {
    pub fn load(path: &Path) -> anyhow::Result<Settings> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let mut s: Settings =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let t = &s.train;
        if t.micro_batch < 1
            || t.accumulation < 1
            || t.min_micro_batch < 1
            || t.seq_len < 2
            || t.epochs == 0
            || t.steps_per_epoch == 0
        {
            anyhow::bail!(
                "{}: micro_batch, accumulation, min_micro_batch, epochs and steps_per_epoch must be ≥ 1, seq_len ≥ 2",
                path.display()
            );
        }
        if s.model.embed % s.model.heads != 0 {
            anyhow::bail!(
                "{}: model.embed must be a multiple of model.heads",
                path.display()
            );
        }
        let base = path.parent().unwrap_or(Path::new("."));
        if s.data.corpus.is_relative() {
            s.data.corpus = base.join(&s.data.corpus);
        }
        if s.memwatch.checkpoint_dir.is_relative() {
            s.memwatch.checkpoint_dir = base.join(&s.memwatch.checkpoint_dir);
        }
        Ok(s)
    }
}
