//! A CUDA out-of-memory error inside a training step, as the trainer reports it (`{"cmd": "oom"}`
//! on the control socket, `POST /api/v1/jobs/{job}/oom`): what it tried, what it did about it
//! (halved the micro-batch, or stopped at its floor with a checkpoint), the allocator's figures at
//! the moment, and what memwatch makes of them (the event's words, the fragmentation rule behind
//! the `expandable_segments` advice). Plain data and pure functions; docs/protocol.md, "CUDA OOM
//! reports", is the wire format's reference.

use serde::{Deserialize, Serialize};

/// The longest `message` kept (characters of its first line).
pub const MAX_MESSAGE: usize = 500;
/// The longest `snapshot` path accepted (bytes).
pub const MAX_SNAPSHOT: usize = 4096;

/// One CUDA OOM, as the trainer reports it. Unknown fields are ignored; all but the first five are
/// optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomReport {
    /// The epoch it happened in.
    pub epoch: u64,
    /// Micro-batches handed out in the epoch (the Python package), or the optimizer step
    /// (memwatch-train).
    pub step: u64,
    /// `forward` or `backward`.
    pub phase: String,
    /// The micro-batch the step ran with.
    pub micro_batch_before: u32,
    /// Whether the trainer recovered (re-ran the samples as two halves, and runs on at the smaller
    /// micro-batch); else it stopped at its floor.
    pub recovered: bool,
    /// The micro-batch it runs with now (when recovered); when it stopped, the micro-batch to
    /// relaunch at, if it names one (an OOM that cannot be recovered in the step above the floor: a
    /// DDP backward pass with gradient sync, a Lightning run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch_after: Option<u32>,
    /// The gradient accumulation it runs with now (when recovered), or to relaunch at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulation_after: Option<u32>,
    /// The smallest micro-batch the trainer runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_micro_batch: Option<u32>,
    /// Not recovered: the trainer saved a checkpoint before it stops.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpointed: bool,
    /// What the allocator tried to allocate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// `torch.cuda.memory_allocated()` at the OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// `torch.cuda.memory_reserved()` at the OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// The GPU's free memory at the OOM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_free_bytes: Option<u64>,
    /// The GPU's total memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_total_bytes: Option<u64>,
    /// The CUDA device index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// The reporting rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Ranks in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// Where the trainer saved a CUDA memory snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The exception's first line (at most [`MAX_MESSAGE`] characters kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A job's CUDA OOMs since it was attached: the API's `cuda_oom`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaOoms {
    /// OOMs the trainer recovered from.
    pub recovered: u64,
    /// OOMs at its floor micro-batch, after which it stopped.
    pub stopped: u64,
    /// The latest report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastOom>,
}

/// The latest report, with when it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastOom {
    /// The report.
    #[serde(flatten)]
    pub report: OomReport,
    /// When it came (engine clock, ms since the epoch).
    pub at_ms: u64,
}

impl CudaOoms {
    /// Counts `report`, received at `at_ms`.
    pub fn note(&mut self, report: OomReport, at_ms: u64) {
        if report.recovered {
            self.recovered += 1;
        } else {
            self.stopped += 1;
        }
        self.last = Some(LastOom { report, at_ms });
    }

    /// How the job's end reads when its trainer's last report says it stopped at its floor with a
    /// checkpoint saved: `memwatch launch` relaunches such a run.
    pub fn stopped_with_checkpoint(&self) -> Option<String> {
        let r = &self.last.as_ref()?.report;
        (!r.recovered && r.checkpointed).then(|| match r.micro_batch_after {
            Some(after) => format!(
                "CUDA OOM at micro-batch {} not recoverable in the step; checkpoint saved, relaunched at micro-batch {after}",
                r.micro_batch_before
            ),
            None => format!(
                "CUDA OOM at its floor micro-batch {}; checkpoint saved",
                r.micro_batch_before
            ),
        })
    }
}

/// What became of the recovered micro-batch in the job's config file, for the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Staging {
    /// Nothing to stage: not recovered, and no micro-batch named to relaunch at.
    None,
    /// To be written to the job's config file, for the next start.
    ConfigFile,
    /// Not staged, and why.
    Not(String),
}

impl OomReport {
    /// The report as kept, or what is wrong with it: nonsense is refused, not recorded. Keeps the
    /// message's first line (at most [`MAX_MESSAGE`] characters) and drops what only a recovery or
    /// only a stop means.
    pub fn checked(mut self) -> Result<OomReport, String> {
        if self.phase != "forward" && self.phase != "backward" {
            return Err(format!(
                "phase must be \"forward\" or \"backward\", not {:?}",
                self.phase
            ));
        }
        let before = self.micro_batch_before;
        if before == 0 {
            return Err("micro_batch_before must be at least 1".into());
        }
        if self.recovered || self.micro_batch_after.is_some() || self.accumulation_after.is_some() {
            let after = self.micro_batch_after.ok_or(if self.recovered {
                "a recovered OOM needs micro_batch_after"
            } else {
                "a stopped OOM that names accumulation_after needs micro_batch_after"
            })?;
            if after == 0 || after >= before {
                return Err(format!(
                    "micro_batch_after must be at least 1 and below micro_batch_before ({before}), not {after}"
                ));
            }
            match self.accumulation_after {
                None => {
                    return Err(
                        "an OOM that names micro_batch_after needs accumulation_after".into(),
                    );
                }
                Some(0) => return Err("accumulation_after must be at least 1".into()),
                Some(_) => {}
            }
            if let Some(min) = self.min_micro_batch.filter(|m| after < *m) {
                return Err(format!(
                    "micro_batch_after ({after}) is below min_micro_batch ({min})"
                ));
            }
            if self.recovered {
                self.checkpointed = false;
            }
        }
        if let (Some(a), Some(r)) = (self.allocated_bytes, self.reserved_bytes) {
            if a > r {
                return Err(format!(
                    "allocated_bytes ({a}) exceeds reserved_bytes ({r}): PyTorch allocates within what it reserves"
                ));
            }
        }
        if let (Some(f), Some(t)) = (self.gpu_free_bytes, self.gpu_total_bytes) {
            if f > t {
                return Err(format!(
                    "gpu_free_bytes ({f}) exceeds gpu_total_bytes ({t})"
                ));
            }
        }
        match (self.rank, self.world_size) {
            (_, Some(0)) => return Err("world_size must be at least 1".into()),
            (Some(r), Some(w)) if r >= w => {
                return Err(format!("rank {r} is not below world_size {w}"));
            }
            _ => {}
        }
        if self
            .snapshot
            .as_ref()
            .is_some_and(|s| s.len() > MAX_SNAPSHOT)
        {
            return Err(format!("snapshot is longer than {MAX_SNAPSHOT} bytes"));
        }
        self.message = self.message.map(|m| {
            m.lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(MAX_MESSAGE)
                .collect()
        });
        Ok(self)
    }

    /// The accumulation the trainer ran with before, where the halving says it exactly:
    /// micro-batch × accumulation is the same before and after.
    pub fn accumulation_before(&self) -> Option<u64> {
        let (after, acc) = (
            u64::from(self.micro_batch_after?),
            u64::from(self.accumulation_after?),
        );
        let before = u64::from(self.micro_batch_before);
        (after * acc % before == 0).then(|| after * acc / before)
    }

    /// The event's words: where it happened, what the trainer did, the allocator's figures, and what
    /// memwatch does with the config file; no path, as events are everyone's. `launched`: the job
    /// runs under `memwatch launch`.
    pub fn describe(&self, staging: &Staging, launched: bool) -> String {
        let mut s = String::from("CUDA OOM");
        if let Some(d) = self.device {
            s.push_str(&format!(" on GPU {d}"));
        }
        match (self.rank, self.world_size) {
            (Some(r), Some(w)) => s.push_str(&format!(" (rank {r} of {w})")),
            (Some(r), None) => s.push_str(&format!(" (rank {r})")),
            _ => {}
        }
        s.push_str(&format!(
            " in the {} pass at epoch {}, step {}",
            self.phase, self.epoch, self.step
        ));
        match (self.micro_batch_after, self.accumulation_after) {
            (Some(after), Some(acc)) if self.recovered => {
                let was = match self.accumulation_before() {
                    Some(a) => format!("{} × {a}", self.micro_batch_before),
                    None => format!("micro-batch {}", self.micro_batch_before),
                };
                s.push_str(&format!(
                    ": recovered at micro-batch {after} × accumulation {acc} (was {was})"
                ));
            }
            (Some(after), Some(acc)) => {
                s.push_str(&format!(
                    " at micro-batch {}, not recoverable in the step (the trainer's own word); the relaunch runs at micro-batch {after} × accumulation {acc}",
                    self.micro_batch_before
                ));
                s.push_str(match (self.checkpointed, launched) {
                    (true, true) => {
                        ": the trainer saved a checkpoint and stops; memwatch launch relaunches it"
                    }
                    (true, false) => {
                        ": the trainer saved a checkpoint and stops; start it again to resume"
                    }
                    (false, _) => ": the trainer stops without a checkpoint",
                });
            }
            _ => {
                s.push_str(&format!(
                    " at the floor micro-batch {}",
                    self.micro_batch_before
                ));
                if let Some(min) = self.min_micro_batch {
                    s.push_str(&format!(" (min_micro_batch {min})"));
                }
                s.push_str(match (self.checkpointed, launched) {
                    (true, true) => {
                        ": the trainer saved a checkpoint and stops; memwatch launch relaunches it"
                    }
                    (true, false) => {
                        ": the trainer saved a checkpoint and stops; start it again to resume"
                    }
                    (false, _) => ": the trainer stops without a checkpoint",
                });
            }
        }
        let mut figures = Vec::new();
        if let Some(r) = self.requested_bytes {
            figures.push(format!("tried to allocate {}", size(r)));
        }
        match (self.gpu_free_bytes, self.gpu_total_bytes) {
            (Some(f), Some(t)) => figures.push(format!("with {} free of {}", size(f), size(t))),
            (Some(f), None) => figures.push(format!("with {} free", size(f))),
            (None, Some(t)) => figures.push(format!("of {}", size(t))),
            (None, None) => {}
        }
        if !figures.is_empty() {
            s.push_str("; ");
            s.push_str(&figures.join(" "));
        }
        match (self.allocated_bytes, self.reserved_bytes) {
            (Some(a), Some(r)) => s.push_str(&format!(
                "; PyTorch had {} allocated of {} reserved",
                size(a),
                size(r)
            )),
            (Some(a), None) => s.push_str(&format!("; PyTorch had {} allocated", size(a))),
            (None, Some(r)) => s.push_str(&format!("; PyTorch had {} reserved", size(r))),
            (None, None) => {}
        }
        // No path: everyone sees events. The job's owner finds it in the job's `cuda_oom.last`.
        if self.snapshot.is_some() {
            s.push_str("; a CUDA memory snapshot was saved (its path: the job's cuda_oom.last)");
        }
        match staging {
            Staging::None => {}
            Staging::ConfigFile => {
                s.push_str("; the new micro-batch goes to its config file for the next start")
            }
            Staging::Not(why) => s.push_str(&format!("; not staged: {why}")),
        }
        s
    }

    /// The report as everyone may see it: without the paths and words it quotes (`snapshot`,
    /// `message`), which stay with the job's owner and root.
    pub fn public(mut self) -> OomReport {
        self.snapshot = None;
        self.message = None;
        self
    }

    /// Whether the allocator's figures show fragmentation, and how much: see [`Fragmentation`].
    pub fn fragmentation(&self) -> Option<Fragmentation> {
        let requested = self.requested_bytes?;
        let allocated = self.allocated_bytes?;
        let reserved = self.reserved_bytes?;
        let cached = reserved.checked_sub(allocated)?;
        // reserved ≥ 1.25 × allocated, in integers: 4 × reserved ≥ 5 × allocated.
        let large = u128::from(reserved) * 4 >= u128::from(allocated) * 5;
        (requested > 0 && cached >= requested && large).then_some(Fragmentation {
            requested,
            allocated,
            reserved,
        })
    }
}

/// The allocator's figures at an OOM that fragmentation explains: PyTorch's caching allocator held
/// reserved − allocated ≥ the request in cached blocks (the request would have fit, had they been
/// one block), and that cache is at least a fifth of what it reserved (reserved ≥ 1.25 × allocated),
/// so it is no rounding slack. Then `expandable_segments:True` lets the allocator grow segments in
/// place instead of leaving unusable gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragmentation {
    /// What the allocator tried to allocate.
    pub requested: u64,
    /// What tensors held.
    pub allocated: u64,
    /// What the allocator held from the driver.
    pub reserved: u64,
}

impl Fragmentation {
    /// Reserved but not allocated: the cached blocks none of which fit the request.
    pub fn cached(&self) -> u64 {
        self.reserved - self.allocated
    }
}

/// Bytes as PyTorch's OOM message writes them: "2.00 GiB", "512.00 MiB".
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.2} {unit}")
}

#[cfg(test)]
mod tests;
