//! Scale benchmark (needs root; reported in BENCHMARKS.md, not a test): what a job of 8, 64, 256 and
//! 1 024 processes costs the daemon, and how long pausing it takes.
//!
//! - Cost: memwatch (release build, default config, GPU off) attached to a calm job of N processes;
//!   the daemon's CPU from /proc/PID/stat (utime + stime) over `SECONDS` (default 20), as a share of
//!   one core, and per process and full sample. Its RSS at the end.
//! - Time to stop: `memwatch pause` over the control socket; from sending the request until every
//!   process of the job shows state T (signals) or its freezer cgroup reads FROZEN (freezer), polled
//!   every 100 µs. Median and worst of `RUNS` (default 10) pauses, each followed by a resume.
//!
//! `cargo bench --bench scale` (ONLY=calm for the calm figures alone; CALM_SECONDS, default 60).
//!
//! `ONLY=stop` times the stop by signals alone, for jobs of `SIZES` processes (default 1024):
//! `BLOCKS` (default 3) blocks of `RUNS` pauses each, a fresh daemon per block, and with
//! `BASE_BIN=<an earlier memwatch>` that build's blocks alternated with this one's. With
//! `JOB_USER=<a local user>` the job runs as that user (the daemon stays root), so that its
//! signals go out under the owner's check, as for every job that is not root's (the kernel's, with
//! the user's uids taken for them; a status read each in builds before `act/as_owner.rs`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Daemon, memhog, state};

fn ticks(pid: u32) -> u64 {
    let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest: Vec<&str> = t[t.rfind(')').map_or(0, |i| i + 2)..].split(' ').collect();
    rest.get(11)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + rest
            .get(12)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Times `runs` pauses by signals of the job `pids` attached to `d` as "scale": request → every
/// process stopped (ms), each pause followed by a resume.
fn stop_times(d: &Daemon, pids: &[u32], runs: usize) -> Vec<f64> {
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let r = d.request(r#"{"cmd":"pause","target":"scale"}"#);
        assert!(r.contains("\"ok\":true"), "{r}");
        while !pids.iter().all(|p| state(*p) == Some('T')) {
            std::thread::sleep(Duration::from_micros(100));
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        let r = d.request(r#"{"cmd":"resume","target":"scale"}"#);
        assert!(r.contains("\"ok\":true"), "{r}");
        while pids.iter().any(|p| state(*p) == Some('T')) {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    times
}

/// `ONLY=stop`: this build's stop by signals, and `BASE_BIN`'s beside it, block by block.
fn stops_only(hog: &Path, runs: usize) {
    let sizes: Vec<usize> = std::env::var("SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1024]);
    let blocks: usize = std::env::var("BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut builds = vec![("this build", common::memwatch_bin())];
    if let Some(b) = common::base_bin() {
        builds.push(("base", b));
    }
    for n in sizes {
        let mut times: Vec<Vec<f64>> = builds.iter().map(|_| Vec::new()).collect();
        for _ in 0..blocks {
            for (k, (_, bin)) in builds.iter().enumerate() {
                let d = Daemon::start_bin(bin, "");
                let (child, pids) = job(hog, n, None);
                let r = d.request(&format!(
                    r#"{{"cmd":"attach","pid":{},"name":"scale"}}"#,
                    pids[0]
                ));
                assert!(r.contains("\"ok\":true"), "{r}");
                std::thread::sleep(Duration::from_secs(2));
                times[k].extend(stop_times(&d, &pids, runs));
                drop(d);
                end(child, &pids);
            }
        }
        for ((name, _), t) in builds.iter().zip(&mut times) {
            println!(
                "  {n:>5} processes{}, SIGSTOP, {name}: request → all stopped p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms ({} pauses)",
                std::env::var("JOB_USER")
                    .map(|u| format!(" of {u}"))
                    .unwrap_or_default(),
                common::pct(t, 0.5),
                common::pct(t, 0.9),
                common::pct(t, 1.0),
                t.len()
            );
        }
    }
}

/// A job of `n` processes (memhog and n − 1 sleeping workers of 1 MiB), in `freezer` when given.
fn job(hog: &Path, n: usize, freezer: Option<&Path>) -> (Child, Vec<u32>) {
    let enter = freezer
        .map(|d| format!("echo $$ > {}/cgroup.procs && ", d.display()))
        .unwrap_or_default();
    let mut command = Command::new("sh");
    if let Some(name) = std::env::var("JOB_USER").ok().filter(|u| !u.is_empty()) {
        use std::os::unix::process::CommandExt as _;
        let user = nix::unistd::User::from_name(&name)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("JOB_USER {name:?} is not a local user"));
        // std drops root's supplementary groups when it sets the uid.
        command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    let mut child = command
        .args([
            "-c",
            &format!(
                "{enter}exec {} --workers {} --worker-mib 1 --total-mib 1 --hold-ms 3600000",
                hog.display(),
                n - 1
            ),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = child.id();
    let mut pids = vec![pid];
    pids.extend(
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok()),
    );
    assert_eq!(
        pids.len(),
        n,
        "memhog started {} of {n} processes",
        pids.len()
    );
    (child, pids)
}

fn end(mut child: Child, pids: &[u32]) {
    for p in pids.iter().rev() {
        // SAFETY: kill(2) on processes this benchmark started.
        unsafe {
            nix::libc::kill(*p as i32, nix::libc::SIGCONT);
            nix::libc::kill(*p as i32, nix::libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

fn main() {
    if common::listing() {
        return;
    }
    let secs: u64 = std::env::var("SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let calm_secs: u64 = std::env::var("CALM_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let runs = common::runs(10);
    let hog = memhog();
    if std::env::var("ONLY").is_ok_and(|v| v == "stop") {
        stops_only(&hog, runs);
        return;
    }
    let clk = 100.0; // CLK_TCK
    let freezer = PathBuf::from(format!(
        "/sys/fs/cgroup/freezer/memwatch-scale-{}",
        std::process::id()
    ));
    let have_freezer = std::fs::create_dir_all(&freezer).is_ok();
    println!(
        "calm, {calm_secs} s each (CLK_TCK 100: one tick is {:.4} % of a core):",
        100.0 / clk / calm_secs as f64
    );
    {
        let d = Daemon::start("");
        std::thread::sleep(Duration::from_secs(2));
        let t0 = ticks(d.child.id());
        std::thread::sleep(Duration::from_secs(calm_secs));
        let used = (ticks(d.child.id()) - t0) as f64 / clk;
        println!(
            "  memwatch, no job: {:.3} % of a core ({} ticks), RSS {} KiB",
            used / calm_secs as f64 * 100.0,
            (used * clk).round() as u64,
            rss_kib(d.child.id())
        );
    }
    {
        // The calm attached job of 8 processes, with the guardian's share (it sleeps on a pipe).
        let d = Daemon::start("");
        let (child, pids) = job(&hog, 8, None);
        let r = d.request(&format!(
            r#"{{"cmd":"attach","pid":{},"name":"calm"}}"#,
            pids[0]
        ));
        assert!(r.contains("\"ok\":true"), "{r}");
        std::thread::sleep(Duration::from_secs(2));
        let guardian: Vec<u32> = std::fs::read_to_string(format!(
            "/proc/{}/task/{}/children",
            d.child.id(),
            d.child.id()
        ))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
        let all = |v: &[u32]| v.iter().map(|p| ticks(*p)).sum::<u64>();
        let (t0, g0) = (ticks(d.child.id()), all(&guardian));
        std::thread::sleep(Duration::from_secs(calm_secs));
        let used = (ticks(d.child.id()) - t0) as f64 / clk;
        let g = (all(&guardian) - g0) as f64 / clk;
        println!(
            "  memwatch, calm job of 8 processes: {:.3} % of a core ({} ticks), guardian {} ticks, RSS {} KiB (guardian {} KiB)",
            used / calm_secs as f64 * 100.0,
            (used * clk).round() as u64,
            (g * clk).round() as u64,
            rss_kib(d.child.id()),
            guardian.iter().map(|p| rss_kib(*p)).sum::<u64>()
        );
        drop(d);
        end(child, &pids);
    }
    match Command::new("earlyoom")
        .args(["-r", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(mut e) => {
            std::thread::sleep(Duration::from_secs(2));
            let t0 = ticks(e.id());
            std::thread::sleep(Duration::from_secs(calm_secs));
            let used = (ticks(e.id()) - t0) as f64 / clk;
            println!(
                "  earlyoom (defaults): {:.3} % of a core ({} ticks), RSS {} KiB",
                used / calm_secs as f64 * 100.0,
                (used * clk).round() as u64,
                rss_kib(e.id())
            );
            let _ = e.kill();
            let _ = e.wait();
        }
        Err(e) => println!("  earlyoom not run: {e}"),
    }
    // ONLY=calm stops here.
    if std::env::var("ONLY").is_ok_and(|v| v == "calm") {
        return;
    }
    println!("jobs of N processes, {secs} s each:");
    for n in [8usize, 64, 256, 1024] {
        let d = Daemon::start("");
        let (child, pids) = job(&hog, n, None);
        let r = d.request(&format!(
            r#"{{"cmd":"attach","pid":{},"name":"scale"}}"#,
            pids[0]
        ));
        assert!(r.contains("\"ok\":true"), "{r}");
        std::thread::sleep(Duration::from_secs(2));
        let t0 = ticks(d.child.id());
        std::thread::sleep(Duration::from_secs(secs));
        let used = (ticks(d.child.id()) - t0) as f64 / clk;
        let share = used / secs as f64 * 100.0;
        let per_proc_us = used / secs as f64 / n as f64 * 1e6;
        println!(
            "  {n:>5} processes: {share:.3} % of a core ({} ticks), {per_proc_us:.1} µs per process per second, RSS {} KiB",
            (used * clk) as u64,
            rss_kib(d.child.id())
        );
        // Time to stop, by signals.
        let mut times = stop_times(&d, &pids, runs);
        times.sort_by(f64::total_cmp);
        println!(
            "  {n:>5} processes, SIGSTOP: request → all stopped median {:.2} ms, worst {:.2} ms ({runs} pauses)",
            times[times.len() / 2],
            times[times.len() - 1]
        );
        drop(d);
        end(child, &pids);
        if have_freezer {
            let d = Daemon::start("");
            let (child, pids) = job(&hog, n, Some(&freezer));
            let r = d.request(&format!(
                r#"{{"cmd":"attach","pid":{},"name":"scale"}}"#,
                pids[0]
            ));
            assert!(r.contains("\"ok\":true"), "{r}");
            let frozen = || {
                std::fs::read_to_string(freezer.join("freezer.state"))
                    .is_ok_and(|s| s.trim() == "FROZEN")
            };
            let mut times = Vec::new();
            for _ in 0..runs {
                let t = Instant::now();
                let r = d.request(r#"{"cmd":"pause","target":"scale"}"#);
                assert!(r.contains("\"ok\":true"), "{r}");
                while !frozen() {
                    std::thread::sleep(Duration::from_micros(100));
                }
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                let r = d.request(r#"{"cmd":"resume","target":"scale"}"#);
                assert!(r.contains("\"ok\":true"), "{r}");
                while frozen() {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            times.sort_by(f64::total_cmp);
            println!(
                "  {n:>5} processes, freezer: request → FROZEN median {:.2} ms, worst {:.2} ms ({runs} pauses)",
                times[times.len() / 2],
                times[times.len() - 1]
            );
            drop(d);
            end(child, &pids);
        }
    }
    let _ = std::fs::remove_dir(&freezer);
}
