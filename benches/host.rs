//! Host-level benchmark against earlyoom (needs root; reported in BENCHMARKS.md, not a test).
//!
//! earlyoom watches the host's MemAvailable, so the fair comparison is a hog with no cgroup limit
//! that drains the host's memory. Driving this shared machine to exhaustion is not an option, so each
//! run sets a floor 1.5 GiB under the MemAvailable it starts from and gives every watcher that floor:
//! earlyoom `-M FLOOR` (it sends SIGTERM below it; with no swap configured its swap condition holds),
//! and memwatch with `[policy.host_memory]` critical at the same share of MemTotal, once level only
//! (`reaction_ms = 0`) and once with the shipped prediction. The hog touches 6 GiB in 1 MiB chunks at
//! 0.5, 1, 2 and 4 GiB/s; the watchers are alternated run by run.
//!
//! Measured from outside every 200 µs: when MemAvailable first read at or under the floor, when the
//! hog was first seen stopped (memwatch) or gone (earlyoom), and MemAvailable then. The "latency" is
//! the time between the two (negative: acted before the crossing). The hog that earlyoom handles is
//! killed; the one memwatch handles is paused, and resumed (then ended by the benchmark).
//!
//! `RUNS=10 cargo bench --bench host` (`RATES=1024,2048` for some rates alone; `SHOW_EVENTS=1` prints
//! memwatch's events of a run where it did not hold the hog).

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Daemon, memhog, pct, state};

const MIB: u64 = 1 << 20;
const DRAIN: u64 = 1536 * MIB;
/// What the hog touches in all, well past the floor: MemAvailable can fall by less than half of what
/// a hog touches here (3 GiB touched left it above a floor 1.5 GiB down in 7 of 120 runs).
const TOUCH: u64 = 6144 * MIB;

#[derive(Clone, Copy, PartialEq)]
enum Watcher {
    Earlyoom,
    /// memwatch; `true`: the shipped prediction, `false`: level only.
    Memwatch(bool),
}

impl Watcher {
    fn label(self) -> &'static str {
        match self {
            Watcher::Earlyoom => "earlyoom 1.7 (-M floor)",
            Watcher::Memwatch(false) => "memwatch, level only",
            Watcher::Memwatch(true) => "memwatch, shipped policy",
        }
    }
}

fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

struct Outcome {
    /// The hog was paused (and lived).
    paused: bool,
    /// The hog was killed by a signal (earlyoom's SIGTERM, or SIGKILL).
    killed: bool,
    /// Acted (paused or killed) before MemAvailable was read at the floor.
    before: bool,
    /// Neither paused nor killed though MemAvailable was read at the floor: the hog ran to its end.
    missed: bool,
    /// ms from the crossing to the action, when both were seen.
    latency_ms: Option<f64>,
    /// MiB of MemAvailable under the floor when the pause was seen (negative: above it); a killed
    /// hog's memory is freed as it dies, so only a pause says this.
    under_floor_mib: Option<f64>,
}

/// Starts the watcher for `floor`: earlyoom, or a daemon with the hog attached.
fn watch(w: Watcher, floor: u64, pid: u32) -> (Option<Child>, Option<Daemon>) {
    match w {
        Watcher::Earlyoom => {
            let mut e = Command::new("earlyoom")
                .args([
                    "-r",
                    "0",
                    "-M",
                    &(floor / 1024).to_string(),
                    "--prefer",
                    "^memhog$",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("earlyoom (Debian: apt-get install earlyoom)");
            // It prints its settings (on stderr), then watches: wait for the line that says so.
            let mut out = BufReader::new(e.stderr.take().expect("earlyoom's stderr"));
            let mut line = String::new();
            while out.read_line(&mut line).is_ok_and(|n| n > 0) {
                if line.contains("sending SIGTERM when") {
                    break;
                }
                line.clear();
            }
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            (Some(e), None)
        }
        Watcher::Memwatch(predict) => {
            let total = meminfo("MemTotal") as f64;
            let critical = 1.0 - floor as f64 / total;
            let d = Daemon::start(&format!(
                "[policy]\n{}\n[policy.host_memory]\nwarn = {:.5}\nwarn_leave = {:.5}\ncritical = {critical:.5}\n\
                 critical_leave = {:.5}\nenter_hold_ms = 0\n",
                if predict { "" } else { "reaction_ms = 0" },
                critical - 0.02,
                critical - 0.03,
                critical - 0.01,
            ));
            assert!(
                d.ctl(&["attach", &pid.to_string(), "--name", "hog"]),
                "attach failed"
            );
            (None, Some(d))
        }
    }
}

/// Waits until MemAvailable holds still (two reads 250 ms apart within 16 MiB, at most 10 s): the
/// previous run's hog may still be handing its memory back, and a floor taken meanwhile is one the
/// next hog never reaches.
fn settle() {
    let mut last = meminfo("MemAvailable");
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(250));
        let now = meminfo("MemAvailable");
        if now.abs_diff(last) < 16 * MIB {
            return;
        }
        last = now;
    }
}

fn run(hog: &Path, rate: u64, w: Watcher, i: usize) -> Outcome {
    settle();
    let go = std::env::temp_dir().join(format!("memwatch-host-go-{}-{i}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let mut child = Command::new(hog)
        .args([
            "--rate-mib",
            &rate.to_string(),
            "--total-mib",
            &(TOUCH / MIB).to_string(),
            "--chunk-mib",
            "1",
            "--hold-ms",
            "200",
            "--wait-file",
            go.to_str().unwrap_or_default(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("memhog");
    let pid = child.id();
    let mut line = String::new();
    // Kept open to the end: a hog that finishes prints `done`, which must not meet a closed pipe.
    let mut out = BufReader::new(child.stdout.take().expect("memhog's stdout"));
    let _ = out.read_line(&mut line);
    let floor = meminfo("MemAvailable").saturating_sub(DRAIN);
    let (mut earlyoom, daemon) = watch(w, floor, pid);
    std::fs::write(&go, "").unwrap();
    let t0 = Instant::now();
    let mut crossed = None;
    let mut acted = None;
    while t0.elapsed() < Duration::from_secs(10) {
        let avail = meminfo("MemAvailable");
        let now = t0.elapsed().as_secs_f64() * 1000.0;
        if crossed.is_none() && avail <= floor {
            crossed = Some(now);
        }
        match state(pid) {
            Some('T') | Some('t') | None | Some('Z') => {
                acted = Some((now, avail));
                break;
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let paused = matches!(state(pid), Some('T') | Some('t'));
    let seen = state(pid);
    if let (Some(d), false) = (&daemon, paused) {
        // memwatch did not hold the hog: what it decided, for the report.
        if std::env::var_os("SHOW_EVENTS").is_some() {
            eprintln!(
                "run {i} at {rate} MiB/s, {}: acted {acted:?}, crossed {crossed:?}, state now {seen:?}, floor {} MiB, MemAvailable now {} MiB\n{}",
                w.label(),
                floor / MIB,
                meminfo("MemAvailable") / MIB,
                d.events()
            );
        }
    }
    let _ = child.kill();
    let status = child.wait().ok();
    // A hog memwatch paused is killed here by the benchmark, after it was seen stopped.
    let killed = !paused && status.is_some_and(|s| s.signal().is_some());
    if let Some(d) = &daemon {
        d.ctl(&["detach", "hog"]);
    }
    drop(daemon);
    if let Some(e) = earlyoom.as_mut() {
        let _ = e.kill();
        let _ = e.wait();
    }
    drop(out);
    let _ = std::fs::remove_file(&go);
    let acted = acted.filter(|_| paused || killed);
    Outcome {
        paused,
        killed,
        before: acted.is_some() && crossed.is_none(),
        missed: acted.is_none() && crossed.is_some(),
        latency_ms: acted.zip(crossed).map(|((t, _), c)| t - c),
        under_floor_mib: acted
            .filter(|_| paused)
            .map(|(_, avail)| (floor as f64 - avail as f64) / MIB as f64),
    }
}

fn main() {
    if common::listing() {
        return;
    }
    let runs = common::runs(10);
    let hog = memhog();
    let watchers = [
        Watcher::Earlyoom,
        Watcher::Memwatch(false),
        Watcher::Memwatch(true),
    ];
    println!(
        "MemTotal {} MiB, swap {} MiB; floor = MemAvailable at the start of each run - {} MiB",
        meminfo("MemTotal") / MIB,
        meminfo("SwapTotal") / MIB,
        DRAIN / MIB
    );
    // RATES=1024,2048 runs those alone.
    let rates: Vec<u64> = std::env::var("RATES")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![512, 1024, 2048, 4096]);
    for rate in rates {
        let mut outs: Vec<Vec<Outcome>> = watchers.iter().map(|_| Vec::new()).collect();
        for i in 0..runs {
            for (k, w) in watchers.iter().enumerate() {
                outs[k].push(run(&hog, rate, *w, i));
            }
        }
        for (w, o) in watchers.iter().zip(&outs) {
            let paused = o.iter().filter(|o| o.paused).count();
            let killed = o.iter().filter(|o| o.killed).count();
            let before = o.iter().filter(|o| o.before).count();
            let mut lat: Vec<f64> = o.iter().filter_map(|o| o.latency_ms).collect();
            let mut under: Vec<f64> = o.iter().filter_map(|o| o.under_floor_mib).collect();
            let max = lat.iter().copied().fold(f64::NAN, f64::max);
            let missed = o.iter().filter(|o| o.missed).count();
            println!(
                "{:<26} {rate:>5} MiB/s: paused {paused:>2}/{runs}, killed {killed:>2}/{runs}, \
                 neither {:>2} (of which the floor was crossed in {missed}), acted before the crossing {before:>2}, \
                 crossing→action p50 {:>7.1} ms, max {:>7.1} ms, MemAvailable under the floor at a pause: median {:>6.0} MiB",
                w.label(),
                runs - paused - killed,
                pct(&mut lat, 0.5),
                max,
                pct(&mut under, 0.5),
            );
        }
    }
}
