//! The cost of a v2 job's reads (reported in BENCHMARKS.md, not a test): the daemon's own wake
//! thread (`memwatch::wake::Wakers`) reading one v2 job's usage against the engine's lines, with its
//! reflex armed (`memwatch::reflex::Armory`), the job held at a fill of its limit, and the thread's
//! CPU and wake-ups counted from its own `/proc/self/task/TID/schedstat` over a window.
//!
//! cgroup v2 has no usage thresholds, so the wake thread reads the job's `memory.current` again
//! after the time 4 GiB/s of growth would take to cover the room left to the line and half the margin
//! from the line to the limit (1 ms to 1 s): the nearer the line, the more often. This machine has no cgroup v2 memory controller, so the job's
//! cgroup is a directory on tmpfs holding `memory.current`, `memory.stat` and `cgroup.freeze`; a file
//! there is opened afresh on each read (on cgroupfs it is kept open and re-read with pread), so the
//! figures are a little above the daemon's on a real v2 cgroup. The line is never reached: nothing
//! fires.
//!
//! `cargo bench --bench reflex_poll` (SECS=10 per row; LIMITS_MIB=512,16384; FILLS=10,50,90,94 in
//! percent of the limit).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memwatch::job::held::Frozen;
use memwatch::reflex::{Armory, Reflex};
use memwatch::sample::cgroup::Version;

const MIB: u64 = 1 << 20;

fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// The wake thread's (run time ns, times it ran) from its schedstat.
fn schedstat(tid: &str) -> (u64, u64) {
    let text =
        std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
    let f: Vec<u64> = text
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    (
        f.first().copied().unwrap_or(0),
        f.get(2).copied().unwrap_or(0),
    )
}

/// The task id of this process's thread named `wake`.
fn wake_tid() -> Option<String> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            (comm.trim() == "wake").then(|| t.file_name().to_string_lossy().into_owned())
        })
}

fn cgroup(dir: &Path, usage: u64) {
    std::fs::create_dir_all(dir).expect("the fixture cgroup");
    std::fs::write(dir.join("memory.current"), format!("{usage}\n")).expect("memory.current");
    std::fs::write(
        dir.join("memory.stat"),
        format!("anon {usage}\ninactive_file 0\n"),
    )
    .expect("memory.stat");
    std::fs::write(dir.join("cgroup.freeze"), "0\n").expect("cgroup.freeze");
    std::fs::write(dir.join("cgroup.procs"), "").expect("cgroup.procs");
}

fn main() {
    let secs: u64 = std::env::var("SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let limits = env_list("LIMITS_MIB", "512,16384");
    let fills = env_list("FILLS", "10,50,90,94");
    let base = tempfile::Builder::new()
        .prefix("memwatch-reflex-poll")
        .tempdir_in("/dev/shm")
        .expect("a directory on tmpfs");
    let armory = Arc::new(Armory::default());
    let wakers = memwatch::wake::Wakers::start(
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(memwatch::wake::Notified::default()),
        armory.clone(),
        Arc::new(tokio::sync::Notify::new()),
        1,
    )
    .expect("the wake thread");
    std::thread::sleep(Duration::from_millis(100));
    let tid = wake_tid().expect("the wake thread's task");
    println!(
        "| limit | fill | room to the line | read every (planned) | reads/s (wake-ups) | CPU of a core | CPU per wake-up |"
    );
    println!("|---|---|---|---|---|---|---|");
    // Idle first: the thread with no reflex armed.
    let (t0, n0) = schedstat(&tid);
    std::thread::sleep(Duration::from_secs(secs));
    let (t1, n1) = schedstat(&tid);
    println!(
        "| none armed | | | never | {:.2} | {:.4} % | |",
        (n1 - n0) as f64 / secs as f64,
        (t1 - t0) as f64 / (secs as f64 * 1e9) * 100.0
    );
    for limit in &limits {
        for fill in &fills {
            let limit_b = limit * MIB;
            let critical = (limit_b as f64 * 0.95).ceil() as u64;
            let usage = limit_b * fill / 100;
            let dir = base.path().join(format!("job-{limit}-{fill}"));
            cgroup(&dir, usage);
            let frozen = Frozen {
                version: Version::V2,
                dir: dir.clone(),
            };
            let act = Reflex::freezer(&frozen).expect("cgroup.freeze opens");
            armory.arm(Reflex::open(
                "job",
                &dir,
                Version::V2,
                critical,
                0,
                Path::new("/"),
                act,
            ));
            let thresholds = [limit_b / 2, limit_b * 8 / 10, critical];
            wakers
                .read_usage("job", &dir, &thresholds, critical, limit_b)
                .expect("memory.current opens");
            wakers.rearm();
            // Settle, then a window.
            std::thread::sleep(Duration::from_millis(200));
            let (t0, n0) = schedstat(&tid);
            let started = Instant::now();
            std::thread::sleep(Duration::from_secs(secs));
            let (t1, n1) = schedstat(&tid);
            let el = started.elapsed().as_secs_f64();
            let wakes = (n1 - n0) as f64;
            let cpu = (t1 - t0) as f64;
            armory.disarm("job");
            wakers.unwatch("job");
            let room = critical.saturating_sub(usage);
            println!(
                "| {limit} MiB | {fill} % | {:.1} MiB | {:.2} ms | {:.1} | {:.4} % | {:.1} µs |",
                room as f64 / MIB as f64,
                memwatch::reflex::poll_after(room, limit_b - critical).as_secs_f64() * 1000.0,
                wakes / el,
                cpu / (el * 1e9) * 100.0,
                if wakes > 0.0 {
                    cpu / wakes / 1000.0
                } else {
                    0.0
                },
            );
            assert_eq!(
                std::fs::read_to_string(dir.join("cgroup.freeze"))
                    .unwrap_or_default()
                    .trim(),
                "0",
                "below the line, nothing fires"
            );
        }
    }
}
