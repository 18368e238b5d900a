//! A job held under its critical line by a little page cache, on a real v1 memory cgroup limited to
//! 2 GiB, whose own memory then grows through the line: it first reads a file of 21.5 MiB, which
//! the kernel keeps as clean cache, then memhog touches 1 990 MiB at 512 MiB/s. Its unreclaimable
//! memory (usage less clean cache) reaches its line (95 %, 1 945.6 MiB) when usage is 1 967.1 MiB,
//! just past the threshold at 96 % (1 966.1 MiB), and the next threshold is at 96.5 % (1 976.3
//! MiB), 0.5 % of the limit further: a reflex woken by thresholds alone fires there, 9 MiB of growth
//! past the line. The crossing at 96 % finds the job over its line by its cache, so the wake thread
//! reads its usage and cache on its own timer, timed to the line, and the reflex freezes the job
//! within a read of the crossing: its unreclaimable memory, read from the kernel once it is frozen,
//! is at most 3 MiB past the line, and the OOM killer never fires.
//!
//! Kept in its own test binary so no other test competes with it for the CPU.

mod common;

use std::io::BufRead;
use std::process::Command;

use common::eventually;

const MIB: u64 = 1 << 20;

/// The cgroup's memory less its clean page cache, as memwatch counts a job's level (v1
/// `memory.stat`, hierarchical keys).
fn unreclaimable(cg: &common::cgroup::MemCgroup) -> u64 {
    let stat = std::fs::read_to_string(cg.dir.join("memory.stat")).unwrap();
    let key = |k: &str| -> u64 {
        stat.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    };
    let clean = (key("total_inactive_file") + key("total_active_file"))
        .saturating_sub(key("total_dirty") + key("total_writeback"));
    cg.usage().saturating_sub(clean)
}

#[test]
fn a_job_over_its_line_by_a_little_cache_is_frozen_at_the_line_not_at_the_next_threshold() {
    let limit = 2048 * MIB;
    let Some((cg, d)) = common::cache::cgroup_and_daemon("reflex_cached", limit) else {
        return;
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // 43 blocks of 512 KiB past the page cache: the job's read of it is what caches it, all of it
    // and no more (nothing lies past its end to read ahead).
    let file = dir.path().join("data");
    let dd = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .args(["bs=512K", "count=43", "oflag=direct", "status=none"])
        .status()
        .unwrap();
    assert!(dd.success());
    // The programs the job runs, cached here first, so that their pages are not charged to it.
    let memhog = common::memhog();
    for program in [memhog.as_path(), "/bin/sh".as_ref(), "/bin/dd".as_ref()] {
        std::fs::read(program).unwrap();
    }
    let go = dir.path().join("go");
    let script = format!(
        "echo ready; while [ ! -e {go} ]; do sleep 0.01; done; \
         dd if={file} of=/dev/null bs=512K status=none; echo cached; \
         exec {memhog} --rate-mib 512 --total-mib 1990 --hold-ms 60000",
        go = go.display(),
        memhog = memhog.display(),
        file = file.display()
    );
    let (mut job, mut out) = common::cache::attached_job(&cg, &d, &script, "cached");
    let oom_before = cg.oom_kills();
    std::fs::write(&go, "").unwrap();
    let mut said = String::new();
    out.read_line(&mut said).unwrap();
    assert_eq!(said.trim(), "cached", "the job did not read its file");
    let cache = cg.usage() - unreclaimable(&cg);
    assert!(
        (21 * MIB..23 * MIB).contains(&cache),
        "the job's clean cache is {:.2} MiB, not its file's 21.5",
        cache as f64 / MIB as f64
    );
    let line = (limit as f64 * 0.95).ceil() as u64;
    assert!(
        eventually(30.0, || cg.frozen()),
        "the job was never frozen (usage {} MiB, unreclaimable {} MiB):\n{}",
        cg.usage() / MIB,
        unreclaimable(&cg) / MIB,
        d.log_text()
    );
    let at_stop = unreclaimable(&cg);
    let past = (at_stop as f64 - line as f64) / MIB as f64;
    let paused = d
        .events()
        .into_iter()
        .find(|e| e["job"] == "cached" && e["action"] == "pause")
        .map(|e| e["detail"].to_string())
        .unwrap_or_default();
    eprintln!("frozen {past:.2} MiB past the line, {cache} bytes of cache: {paused}");
    assert!(
        at_stop <= line + 3 * MIB,
        "frozen {past:.2} MiB past its line: {paused}"
    );
    assert_eq!(cg.oom_kills(), oom_before, "the OOM killer fired");
    let _ = job.kill();
    cg.thaw();
    let _ = job.wait();
}
