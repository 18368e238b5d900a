//! One optimizer step that survives running out of memory.
//!
//! A window is the optimizer step's samples (micro-batch × accumulation of them), drawn once at its
//! start and cut into micro-batches with `narrow`, so the samples and their order never depend on
//! the micro-batch. Each micro-batch's mean loss is weighted by its share of the window, so the
//! accumulated gradient is the window's whatever the cut.
//!
//! When the forward or backward pass of a micro-batch fails with an out-of-memory error (CUDA's
//! "CUDA out of memory", or the CPU allocator's "DefaultCPUAllocator: can't allocate memory"), the
//! failed attempt's tensors are dropped on the way out (so what it held is free again), the
//! micro-batch is halved, and:
//! - after a failed *forward*, nothing of it reached the gradients: the same samples run again as
//!   two halves, and the rest of the window (and of the run) at the half;
//! - after a failed *backward*, some parameters may already hold part of its gradient: the gradients
//!   are zeroed and the whole window runs again from its start at the half (the weights do not change
//!   within a window, so the earlier micro-batches give the same gradients again).
//!
//! A half that fails is halved again, down to `min_micro_batch`; an out-of-memory error at it ends
//! the window unfinished, and the caller checkpoints and stops. Every retry halves, so it never loops.
//!
//! On CUDA, the caching allocator has already released its cached blocks and retried before it
//! reports an out-of-memory error, and what the failed attempt held goes back to its pool when the
//! tensors drop, where the halves reuse it. tch 0.26 has no call to empty the cache
//! (`torch.cuda.empty_cache`), and none is needed for that.

use tch::{Device, TchError, Tensor, nn};

use crate::model::Gpt;
use crate::settings::Fault;

/// The pass a micro-batch ran out of memory in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    #[default]
    Forward,
    Backward,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
        }
    }
}

/// One out-of-memory error inside a step.
#[derive(Debug, Clone)]
pub struct Oom {
    pub phase: Phase,
    /// The micro-batch running when it happened.
    pub micro_before: i64,
    /// The micro-batch from then on; `None` at the floor (the window is left unfinished).
    pub micro_after: Option<i64>,
    /// The error's first line, at most 500 characters.
    pub message: String,
    pub requested_bytes: Option<u64>,
}

/// How a window ended.
pub enum Window {
    /// The optimizer may step: the gradients are the window's, and this is its loss.
    Done { loss: f64 },
    /// Out of memory at the floor: the window is unfinished and the gradients are not to be used.
    Floor,
}

enum ChunkError {
    Oom(Phase, String),
    Other(Phase, TchError),
}

/// The text of a libtorch error (without tch's "Internal torch error: " prefix).
fn text(e: &TchError) -> String {
    match e {
        TchError::Torch(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Whether libtorch's error message says memory ran out: CUDA's caching allocator or the CPU one.
pub fn is_oom(message: &str) -> bool {
    message.contains("CUDA out of memory")
        || message.contains("DefaultCPUAllocator: can't allocate memory")
}

/// The first non-empty line of `message`, at most 500 characters.
pub fn first_line(message: &str) -> String {
    let line = message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    line.chars().take(500).collect()
}

/// The size of the allocation that failed, when the message says: CUDA's "Tried to allocate 2.00
/// GiB" or the CPU allocator's "you tried to allocate 1048576 bytes".
pub fn requested_bytes(message: &str) -> Option<u64> {
    let lower = message.to_ascii_lowercase();
    let at = lower.find("tried to allocate ")? + "tried to allocate ".len();
    let mut words = lower[at..].split_whitespace();
    let number: f64 = words
        .next()?
        .trim_end_matches([',', '.', ';'])
        .parse()
        .ok()?;
    let unit = words
        .next()
        .unwrap_or("")
        .trim_end_matches([',', '.', ';', ')']);
    let scale: f64 = match unit {
        "b" | "byte" | "bytes" => 1.0,
        "kib" | "kb" => 1024.0,
        "mib" | "mb" => 1024.0 * 1024.0,
        "gib" | "gb" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "tb" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    (number.is_finite() && number >= 0.0).then(|| (number * scale).round() as u64)
}

/// Runs windows for one model, keeping count of the micro-batches run (for `[fault]`).
pub struct Stepper<'a> {
    gpt: &'a Gpt,
    device: Device,
    fault: Option<Fault>,
    ran: u64,
}

impl<'a> Stepper<'a> {
    pub fn new(gpt: &'a Gpt, device: Device, fault: Option<Fault>) -> Stepper<'a> {
        Stepper {
            gpt,
            device,
            fault,
            ran: 0,
        }
    }

    /// `[fault]`: fails a micro-batch of `len` samples in `phase` as a full GPU would.
    fn injected(&self, len: i64, phase: Phase) -> Result<(), ChunkError> {
        let Some(f) = &self.fault else {
            return Ok(());
        };
        match f.oom_above_micro_batch {
            Some(n) if len > n && f.phase == phase && self.ran >= f.after_micro_batches => {
                Err(ChunkError::Oom(
                    phase,
                    format!(
                        "CUDA out of memory. Tried to allocate {:.2} MiB. GPU 0 has room for {n} samples \
                         (memwatch-train's [fault] oom_above_micro_batch = {n})",
                        len as f64
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Forward and backward of `len` samples from `start`, weighted by their share of the window's
    /// `total`; the micro-batch's weighted loss.
    fn chunk(
        &self,
        x: &Tensor,
        y: &Tensor,
        start: i64,
        len: i64,
        total: i64,
    ) -> Result<f64, ChunkError> {
        let tag = |phase: Phase| {
            move |e: TchError| {
                let t = text(&e);
                if is_oom(&t) {
                    ChunkError::Oom(phase, t)
                } else {
                    ChunkError::Other(phase, e)
                }
            }
        };
        let forward = tag(Phase::Forward);
        let xs = x.f_narrow(0, start, len).map_err(forward)?;
        let ys = y.f_narrow(0, start, len).map_err(forward)?;
        self.injected(len, Phase::Forward)?;
        let loss = self
            .gpt
            .f_loss(&xs, &ys, self.device)
            .and_then(|l| l.f_div(&crate::model::scalar(total as f32 / len as f32)?))
            .map_err(forward)?;
        let backward = tag(Phase::Backward);
        loss.f_backward().map_err(backward)?;
        self.injected(len, Phase::Backward)?;
        loss.f_double_value(&[]).map_err(backward)
    }

    /// One optimizer step's gradients: zeroes them, then forward and backward over the window's
    /// samples (`x`, `y`: `[window, seq]`) `micro` at a time. On an out-of-memory error it halves
    /// `micro` (and keeps it halved) and calls `on_oom`; see the module's comment.
    pub fn window(
        &mut self,
        opt: &mut nn::Optimizer,
        x: &Tensor,
        y: &Tensor,
        micro: &mut i64,
        min_micro: i64,
        mut on_oom: impl FnMut(&Oom),
    ) -> anyhow::Result<Window> {
        let total = x.size().first().copied().unwrap_or(0);
        'window: loop {
            opt.zero_grad();
            let (mut loss, mut pos) = (0.0, 0);
            while pos < total {
                let len = (*micro).min(total - pos);
                match self.chunk(x, y, pos, len, total) {
                    Ok(l) => {
                        loss += l;
                        pos += len;
                        self.ran += 1;
                    }
                    Err(ChunkError::Other(phase, e)) => anyhow::bail!(
                        "the {} pass failed (micro-batch {len}): {}",
                        phase.name(),
                        first_line(&text(&e))
                    ),
                    Err(ChunkError::Oom(phase, message)) => {
                        let after = smaller(len, total, min_micro);
                        on_oom(&Oom {
                            phase,
                            micro_before: *micro,
                            micro_after: after,
                            requested_bytes: requested_bytes(&message),
                            message: first_line(&message),
                        });
                        let Some(after) = after else {
                            opt.zero_grad();
                            return Ok(Window::Floor);
                        };
                        *micro = after;
                        if phase == Phase::Backward {
                            continue 'window;
                        }
                    }
                }
            }
            return Ok(Window::Done { loss });
        }
    }
}

/// The micro-batch after an out-of-memory error at `micro`: the largest at most half of it that
/// divides the `window` samples of an optimizer step (so micro-batch × accumulation stays the
/// effective batch, also in the config memwatch stages for a relaunch); None below `min_micro`.
pub fn smaller(micro: i64, window: i64, min_micro: i64) -> Option<i64> {
    (1..=micro / 2)
        .rev()
        .find(|m| window % m == 0)
        .filter(|m| *m >= min_micro.max(1))
}

/// The accumulation that covers a window of `window` samples `micro` at a time.
pub fn accumulation(window: i64, micro: i64) -> i64 {
    (window + micro.max(1) - 1) / micro.max(1)
}

/// The report memwatch gets: `POST /api/v1/jobs/{job}/oom` (docs/protocol.md).
pub fn report(
    oom: &Oom,
    epoch: u64,
    step: u64,
    window: i64,
    min_micro: i64,
    device: Device,
    checkpointed: bool,
) -> serde_json::Value {
    let mut body = serde_json::json!({
        "epoch": epoch,
        "step": step,
        "phase": oom.phase.name(),
        "micro_batch_before": oom.micro_before,
        "recovered": oom.micro_after.is_some(),
        "min_micro_batch": min_micro,
        "checkpointed": checkpointed,
        "message": oom.message,
    });
    if let Some(after) = oom.micro_after {
        body["micro_batch_after"] = after.into();
        body["accumulation_after"] = accumulation(window, after).into();
    }
    if let Some(b) = oom.requested_bytes {
        body["requested_bytes"] = b.into();
    }
    if let Device::Cuda(i) = device {
        body["device"] = (i as u32).into();
    }
    body
}

/// `[fault] address_space_headroom_mib`: caps this process's address space (RLIMIT_AS, the soft
/// limit) at its size now plus `headroom_mib` MiB; the cap in bytes.
pub fn cap_address_space(headroom_mib: u64) -> anyhow::Result<u64> {
    use nix::libc;
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("/proc/self/statm: {statm:?}"))?;
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let cap = pages * page + (headroom_mib << 20);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write to.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 {
        anyhow::bail!("getrlimit: {}", std::io::Error::last_os_error());
    }
    limit.rlim_cur = cap.min(limit.rlim_max);
    // SAFETY: `limit` is a valid rlimit to read.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } != 0 {
        anyhow::bail!("setrlimit: {}", std::io::Error::last_os_error());
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_and_reads_the_messages() {
        let cuda = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB\nException raised from malloc";
        assert!(is_oom(cuda));
        assert_eq!(requested_bytes(cuda), Some(2 << 30));
        assert_eq!(
            first_line(cuda),
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB"
        );
        let cpu = "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1048576 bytes. Error code 12 (Cannot allocate memory)";
        assert!(is_oom(cpu));
        assert_eq!(requested_bytes(cpu), Some(1_048_576));
        assert!(!is_oom("shape '[2, 3]' is invalid for input of size 7"));
        assert_eq!(requested_bytes("CUDA out of memory."), None);
        assert_eq!(first_line(&"x".repeat(900)).len(), 500);
    }

    #[test]
    fn halving_keeps_the_effective_batch_whole() {
        assert_eq!(smaller(32, 64, 1), Some(16));
        assert_eq!(smaller(6, 12, 1), Some(3));
        assert_eq!(smaller(5, 10, 1), Some(2));
        assert_eq!(smaller(4, 8, 4), None);
        assert_eq!(smaller(1, 8, 1), None);
    }

    #[test]
    fn the_accumulation_covers_the_window() {
        assert_eq!(accumulation(64, 16), 4);
        assert_eq!(accumulation(15, 4), 4);
        assert_eq!(accumulation(15, 8), 2);
    }
}
