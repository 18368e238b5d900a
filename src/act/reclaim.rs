//! A held job's memory pushed out to swap, run off the owner task (the way out's swap step for a job
//! no fix helps: `engine::WayOutTask::Reclaim`).
//!
//! - cgroup v2: `memory.reclaim`, in steps of `STEP`, anonymous memory first (`swappiness=max`
//!   where the kernel takes it, 6.11 and later; plain before), until `bytes` moved, a step frees
//!   almost nothing, or `LIMIT` has passed.
//! - cgroup v1: `memory.force_empty`, which on a populated cgroup reclaims everything it can (its
//!   page cache dropped, its anonymous memory swapped). v1 has nothing that stops at an amount
//!   without changing a setting: lowering `memory.limit_in_bytes` does, but a daemon killed before
//!   putting it back would leave the job a lower limit; `force_empty` leaves nothing to undo
//!   (both measured in BENCHMARKS.md, "Reclaim while held").
//!
//! What moved is the cgroup's usage before less after; its swap and `workingset_refault_anon` are
//! read after, so that refaults after the resume can be counted from there.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::sample::cgroup::CgroupDir;
use memwatch_core::host::Version;
use memwatch_core::way_out::Reclaimed;

/// One `memory.reclaim` write asks for this much.
const STEP: u64 = 64 << 20;
/// A push stops after this long, whatever it moved.
const LIMIT: Duration = Duration::from_secs(60);

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A `memory.stat` key's value.
fn stat(dir: &Path, key: &str) -> Option<u64> {
    let file = dir.join("memory.stat");
    let text = std::fs::read_to_string(&file).ok()?;
    crate::sample::keyed::stat_values(&file, &text, [key])[0]
}

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(text.as_bytes())
}

/// Pushes up to `bytes` of cgroup `dir`'s memory out to swap (v1: all it can).
pub fn run(dir: &CgroupDir, bytes: u64) -> Result<Reclaimed, String> {
    let d = &dir.dir;
    let (usage_file, swap_of): (&str, fn(&Path) -> Option<u64>) = match dir.version {
        Version::V1 => ("memory.usage_in_bytes", |d| stat(d, "swap")),
        Version::V2 => ("memory.current", |d| {
            read_u64(&d.join("memory.swap.current"))
        }),
    };
    let usage = || read_u64(&d.join(usage_file));
    let before = usage().ok_or_else(|| format!("cannot read {}", d.join(usage_file).display()))?;
    let started = Instant::now();
    let (how, failed) = match dir.version {
        Version::V1 => ("memory.force_empty", v1(d).err()),
        Version::V2 => ("memory.reclaim", v2(d, bytes, usage).err()),
    };
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let after = usage().unwrap_or(before);
    let r = Reclaimed {
        how: how.into(),
        usage_before: before,
        usage_after: after,
        swap_after: swap_of(d).unwrap_or(0),
        ms,
        refaults_at: stat(d, "workingset_refault_anon"),
    };
    match failed {
        // What it moved before it stopped still counts.
        Some(e) if r.moved() < 16 << 20 => Err(e),
        _ => Ok(r),
    }
}

fn v1(d: &Path) -> Result<(), String> {
    let file = d.join("memory.force_empty");
    write(&file, "0").map_err(|e| format!("{}: {e}", file.display()))
}

fn v2(d: &Path, bytes: u64, usage: impl Fn() -> Option<u64>) -> Result<(), String> {
    let file = d.join("memory.reclaim");
    if !file.exists() {
        return Err(format!(
            "{}: no such file (the kernel reclaims on request from 5.19)",
            file.display()
        ));
    }
    let started = Instant::now();
    let mut moved = 0u64;
    let mut anon_first = true;
    while moved < bytes && started.elapsed() < LIMIT {
        let ask = STEP.min(bytes - moved);
        let before = usage().unwrap_or(0);
        let text = if anon_first {
            format!("{ask} swappiness=max")
        } else {
            ask.to_string()
        };
        match write(&file, &text) {
            Ok(()) => {}
            // A kernel before 6.11 takes no swappiness.
            Err(e) if anon_first && e.raw_os_error() == Some(nix::libc::EINVAL) => {
                anon_first = false;
                continue;
            }
            // Short of the amount asked: what it freed counts, and the next step says if more can.
            Err(e) if e.raw_os_error() == Some(nix::libc::EAGAIN) => {}
            Err(e) => return Err(format!("{}: {e}", file.display())),
        }
        let freed = before.saturating_sub(usage().unwrap_or(before));
        if freed < 1 << 20 {
            break;
        }
        moved += freed;
    }
    Ok(())
}
