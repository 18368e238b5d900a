//! Reaction benchmark (needs root and the v1 memory and freezer controllers; reported in BENCHMARKS.md,
//! not a test).
//!
//! A hog touches memory at 0.5, 1, 2 and 4 GiB/s inside a v1 memory cgroup limited to 512 MiB. Side by
//! side in one run, each watcher gets the same hog:
//!  - memwatch, level only (`reaction_ms = 0`: it acts when the working set crosses 95 %), with the hog
//!    stopped by signals, and with the hog owning a v1 freezer cgroup (memwatch freezes it);
//!  - memwatch with the shipped policy (prediction on);
//!  - a minimal watcher woken by the kernel's memory threshold eventfd at 95 %, which sends SIGSTOP;
//!  - a minimal 10 ms poller of the cgroup's usage, which sends SIGSTOP at 95 %;
//!  - earlyoom with its defaults (it watches host memory only).
//!
//! Latency is read from the usage the hog reached when it was stopped (usage no longer changes then):
//! (usage at stop − 95 % of the limit) ÷ the hog's measured rate; negative means stopped before the
//! crossing. Survival means the cgroup's OOM killer did not fire.
//!
//! Then false pauses: a bursty job that never reaches the limit (one 256 MiB burst at 2 GiB/s that
//! levels off at 50 %, and 256 MiB taken and freed every 300 ms at 2 GiB/s, like a step's buffers),
//! with the shipped policy: how often it was paused, and how long after its last burst it ran again.
//!
//! `cargo bench --bench reaction` (RUNS=30 by default; ONLY=bursty for the false pauses alone;
//! ONLY=level for the two memwatch level-only rows alone, with one line per run; RATES=1024,2048 for
//! some rates only, in MiB/s).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::cgroup::MemCgroup;
use common::{Daemon, memhog, pct, state};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 512 * MIB;
const CRITICAL: u64 = LIMIT * 95 / 100;

/// The bench's cgroup: 512 MiB of v1 memory with a freezer cgroup beside, which a hog joins only on
/// the freezer path.
type Cg = MemCgroup;

fn new_cgroup() -> Cg {
    let mut cg = MemCgroup::new(LIMIT).expect("create a v1 memory cgroup (run as root)");
    assert!(
        cg.version == 1 && cg.with_freezer(),
        "needs the v1 memory and freezer controllers"
    );
    cg
}

#[derive(Clone, Copy, PartialEq)]
enum Watcher {
    /// memwatch; `true`: the hog owns a freezer cgroup.
    Memwatch(bool),
    Eventfd,
    Poller,
    Nothing,
}

/// A baseline watcher running beside the hog: stops it with SIGSTOP at 95 %.
fn baseline(
    w: Watcher,
    cg: &Cg,
    pid: u32,
    stop: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    let mem = cg.dir.clone();
    match w {
        Watcher::Eventfd => {
            let (efd, usage) = common::threshold(&mem, CRITICAL);
            Some(std::thread::spawn(move || {
                let _usage = usage;
                if common::wait_eventfd(&efd, &stop).is_some() {
                    // SAFETY: kill(2) on the hog's pid.
                    unsafe { nix::libc::kill(pid as i32, nix::libc::SIGSTOP) };
                }
            }))
        }
        Watcher::Poller => Some(std::thread::spawn(move || {
            if common::poll_usage(&mem, CRITICAL, Duration::from_millis(10), &stop) {
                // SAFETY: kill(2) on the hog's pid.
                unsafe { nix::libc::kill(pid as i32, nix::libc::SIGSTOP) };
            }
        })),
        _ => None,
    }
}

struct Outcome {
    killed: bool,
    /// ms from the 95 % crossing to the stop (negative: before); `None`: never stopped.
    latency_ms: Option<f64>,
    usage_at_stop: u64,
    /// MiB/s the hog reached between 25 % and 75 % of the limit.
    rate: f64,
}

fn run(cg: &Cg, hog: &Path, rate: u64, w: Watcher, d: Option<&Daemon>, i: usize) -> Outcome {
    cg.set_limit(LIMIT);
    cg.thaw();
    let go = std::env::temp_dir().join(format!("memwatch-bench-go-{}-{i}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let own_freezer = w == Watcher::Memwatch(true);
    let args = format!("--rate-mib {rate} --total-mib 768 --chunk-mib 1 --hold-ms 200");
    let all: Vec<&str> = args.split_whitespace().collect();
    let (mut child, _) = cg.hog_with(hog, &all, &go, own_freezer);
    let pid = child.id();
    let name = format!("bench{i}");
    if let Some(d) = d {
        assert!(
            d.ctl(&["attach", &pid.to_string(), "--name", &name]),
            "attach failed"
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = baseline(w, cg, pid, stop.clone());
    let oom = cg.oom_kills();
    std::fs::write(&go, "").unwrap();
    let t0 = Instant::now();
    let (mut quarter, mut three_quarters) = (None, None);
    let mut stopped = false;
    while t0.elapsed() < Duration::from_secs(5) {
        let u = cg.usage();
        let now = t0.elapsed().as_secs_f64();
        if quarter.is_none() && u >= LIMIT / 4 {
            quarter = Some((now, u));
        }
        if three_quarters.is_none() && u >= LIMIT * 3 / 4 {
            three_quarters = Some((now, u));
        }
        let s = state(pid);
        if s == Some('T') || (own_freezer && cg.frozen()) {
            stopped = true;
            break;
        }
        if s.is_none() || s == Some('Z') || cg.oom_kills() > oom {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Stopped: what it reached no longer changes.
    let usage_at_stop = if stopped { cg.usage() } else { 0 };
    let killed = cg.oom_kills() > oom;
    let measured = match (quarter, three_quarters) {
        (Some((t1, u1)), Some((t2, u2))) if t2 > t1 => (u2 - u1) as f64 / MIB as f64 / (t2 - t1),
        _ => rate as f64,
    };
    let latency_ms =
        stopped.then(|| (usage_at_stop as f64 - CRITICAL as f64) / MIB as f64 / measured * 1000.0);
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = watcher {
        let _ = h.join();
    }
    common::let_go(cg, d, &name, pid);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&go);
    Outcome {
        killed,
        latency_ms,
        usage_at_stop,
        rate: measured,
    }
}

fn report(label: &str, rate: u64, runs: usize, outs: &[Outcome]) {
    let killed = outs.iter().filter(|o| o.killed).count();
    let mut lat: Vec<f64> = outs.iter().filter_map(|o| o.latency_ms).collect();
    let before = lat.iter().filter(|l| **l < 0.0).count();
    let mut usage: Vec<f64> = outs
        .iter()
        .filter(|o| o.latency_ms.is_some())
        .map(|o| o.usage_at_stop as f64 / MIB as f64)
        .collect();
    let mut rates: Vec<f64> = outs.iter().map(|o| o.rate).collect();
    println!(
        "{label:<26} {rate:>5} MiB/s (measured {:>5.0}): survived {:>2}/{runs}, stopped {:>2}, before 95 %: {:>2}, \
         crossing→stop p50 {:>5.2} ms p99 {:>5.2} ms, usage at stop median {:.0} MiB",
        pct(&mut rates, 0.5),
        runs - killed,
        lat.len(),
        before,
        pct(&mut lat.clone(), 0.5),
        pct(&mut lat, 0.99),
        pct(&mut usage, 0.5),
    );
}

/// A bursty job that never reaches the limit, with the shipped policy: pauses, and how long after the
/// last burst ended it ran again.
fn bursty(cg: &Cg, hog: &Path, runs: usize) {
    let d = Daemon::start("");
    for (label, args, last_burst_ms) in [
        (
            "one 256 MiB burst at 2 GiB/s",
            "--rate-mib 2048 --total-mib 256 --hold-ms 4000",
            125u64,
        ),
        (
            "256 MiB every 300 ms at 2 GiB/s",
            "--rate-mib 2048 --total-mib 256 --cycles 10 --cycle-ms 300 --hold-ms 3000",
            2825,
        ),
    ] {
        let (mut paused_runs, mut pauses, mut late) = (0, 0, Vec::new());
        for i in 0..runs {
            cg.set_limit(LIMIT);
            let go = std::env::temp_dir()
                .join(format!("memwatch-bench-burst-{}-{i}", std::process::id()));
            let _ = std::fs::remove_file(&go);
            let all: Vec<&str> = args.split_whitespace().collect();
            // Its stdout stays open for the run, as the hog writes to it at the end.
            let (mut child, _out) = cg.hog_with(hog, &all, &go, false);
            let pid = child.id();
            let name = format!("burst{i}");
            assert!(d.ctl(&["attach", &pid.to_string(), "--name", &name]));
            std::fs::write(&go, "").unwrap();
            let t0 = Instant::now();
            let (mut was_stopped, mut n, mut last_stop_end) = (false, 0, None::<f64>);
            while t0.elapsed() < Duration::from_millis(last_burst_ms + 3500) {
                let s = state(pid) == Some('T');
                if s && !was_stopped {
                    n += 1;
                }
                if !s && was_stopped {
                    last_stop_end = Some(t0.elapsed().as_secs_f64() * 1000.0);
                }
                was_stopped = s;
                std::thread::sleep(Duration::from_millis(1));
            }
            if n > 0 {
                paused_runs += 1;
                pauses += n;
                // Paused time stretches the bursts; count from the moment it ran again.
                late.push(match (was_stopped, last_stop_end) {
                    (true, _) => f64::INFINITY,
                    (false, Some(t)) => (t - last_burst_ms as f64).max(0.0),
                    (false, None) => 0.0,
                });
            }
            d.ctl(&["detach", &name]);
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&go);
        }
        let worst = late.iter().copied().fold(0.0, f64::max);
        println!(
            "bursty, {label:<32}: paused in {paused_runs}/{runs} runs ({pauses} pauses); \
             worst time from the scheduled end of the last burst to running again: {worst:.0} ms"
        );
    }
}

/// The memwatch level-only rows alone (SIGSTOP and freezer, alternated), one line per run.
fn level_only(cg: &Cg, hog: &Path, rates: &[u64], runs: usize) {
    let level = Daemon::start("[policy]\nreaction_ms = 0\n");
    for &rate in rates {
        let mut outs: [Vec<Outcome>; 2] = Default::default();
        for i in 0..runs {
            for (k, (label, freezer)) in [("sigstop", false), ("freezer", true)].iter().enumerate()
            {
                let o = run(cg, hog, rate, Watcher::Memwatch(*freezer), Some(&level), i);
                println!(
                    "run {label} rate={rate} i={i} killed={} latency_ms={} usage_mib={:.1} measured={:.0}",
                    o.killed,
                    o.latency_ms.map_or("none".into(), |l| format!("{l:.3}")),
                    o.usage_at_stop as f64 / MIB as f64,
                    o.rate
                );
                outs[k].push(o);
            }
        }
        for (label, o) in ["memwatch level, SIGSTOP", "memwatch level, freezer"]
            .iter()
            .zip(&outs)
        {
            report(label, rate, runs, o);
        }
    }
}

fn main() {
    if common::listing() {
        return;
    }
    let runs = common::runs(30);
    let hog = memhog();
    let cg = new_cgroup();
    // ONLY=bursty runs the false-pause part alone.
    if std::env::var("ONLY").is_ok_and(|v| v == "bursty") {
        bursty(&cg, &hog, runs.min(10));
        return;
    }
    // RATES=1024,2048 runs some rates only (MiB/s).
    let rates: Vec<u64> = std::env::var("RATES")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![512, 1024, 2048, 4096]);
    // ONLY=level runs the two memwatch level-only rows alone and prints each run.
    if std::env::var("ONLY").is_ok_and(|v| v == "level") {
        level_only(&cg, &hog, &rates, runs);
        return;
    }
    let level = Daemon::start("[policy]\nreaction_ms = 0\n");
    let default = Daemon::start("");
    for &rate in &rates {
        let mut outs: [Vec<Outcome>; 5] = Default::default();
        // Alternate the watchers run by run, so that noise falls on all of them alike.
        for i in 0..runs {
            outs[0].push(run(
                &cg,
                &hog,
                rate,
                Watcher::Memwatch(false),
                Some(&level),
                i,
            ));
            outs[1].push(run(
                &cg,
                &hog,
                rate,
                Watcher::Memwatch(true),
                Some(&level),
                i,
            ));
            outs[2].push(run(
                &cg,
                &hog,
                rate,
                Watcher::Memwatch(false),
                Some(&default),
                i,
            ));
            outs[3].push(run(&cg, &hog, rate, Watcher::Eventfd, None, i));
            outs[4].push(run(&cg, &hog, rate, Watcher::Poller, None, i));
        }
        for (label, o) in [
            "memwatch level, SIGSTOP",
            "memwatch level, freezer",
            "memwatch default",
            "eventfd watcher, SIGSTOP",
            "10 ms poller, SIGSTOP",
        ]
        .iter()
        .zip(&outs)
        {
            report(label, rate, runs, o);
        }
    }
    drop(level);
    drop(default);
    bursty(&cg, &hog, runs.min(10));
    // earlyoom watches host MemAvailable and SwapFree only; in a cgroup the kernel's OOM killer decides.
    match Command::new("earlyoom")
        .args(["-r", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(mut e) => {
            for rate in [512u64, 1024, 2048, 4096] {
                let n = runs.min(10);
                let killed = (0..n)
                    .filter(|i| run(&cg, &hog, rate, Watcher::Nothing, None, *i).killed)
                    .count();
                println!("earlyoom (defaults)        {rate:>5} MiB/s: OOM-killed {killed}/{n}");
            }
            let _ = e.kill();
            let _ = e.wait();
        }
        Err(e) => println!("earlyoom not run: {e}"),
    }
}
