//! Registration benchmark (needs root and the v1 memory controller; reported in BENCHMARKS.md, not a
//! test): how long the daemon's owner task is out of reach while a new job's v1 memory thresholds are
//! registered.
//!
//! The kernel registers each threshold (a write to `cgroup.event_control`) under an RCU grace
//! period. A daemon that makes those writes on its owner task answers no control request, probes no
//! job and arms no reflex until they are done.
//!
//! Each round starts a daemon (full samples 1 s apart), starts memhog in a v1 memory cgroup limited
//! to 4 GiB, attaches it on the control socket and lets it grow at 1 GiB/s to 1.5 GiB (a job busy in
//! the kernel's page faults, as in tests/survival.rs: the kernel's grace periods, and so each
//! threshold's registration, take longer beside one), then sends `jobs` requests one after the other
//! for 600 ms (the first probe, which learns the limit, comes right after the attach). The figure is
//! the slowest answer in the round, from the request's write to its answer line.
//!
//! With `BASE_BIN=<an earlier memwatch>` that build runs too, round by round alternated with this one.
//!
//! `cargo bench --bench register` (RUNS=20 by default).

use std::time::{Duration, Instant};

mod common;

use common::cgroup::MemCgroup;
use common::{Daemon, pct};

/// One round: the slowest `jobs` answer within 600 ms of the attach, in ms; and how many answers.
fn round(bin: &std::path::Path, cg: &MemCgroup, n: usize) -> (f64, usize) {
    let d = Daemon::start_bin(bin, "[sampling]\ninterval_ms = 1000\n");
    let go = std::env::temp_dir().join(format!("memwatch-register-go-{}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let (mut hog, _out) = cg.hog(
        &common::memhog(),
        &["--rate-mib", "1024", "--total-mib", "1536"],
        &go,
    );
    let r = d.request(&format!(
        r#"{{"cmd":"attach","pid":{},"name":"reg"}}"#,
        hog.id()
    ));
    assert!(r.contains("\"ok\":true"), "{r}");
    std::fs::write(&go, "").expect("the hog's go file");
    let start = Instant::now();
    let (mut worst, mut answers) = (0.0f64, 0);
    while start.elapsed() < Duration::from_millis(600) {
        let t = Instant::now();
        let r = d.request(r#"{"cmd":"jobs"}"#);
        assert!(r.contains("\"ok\":true"), "{r}");
        worst = worst.max(t.elapsed().as_secs_f64() * 1000.0);
        answers += 1;
    }
    drop(d);
    let _ = hog.kill();
    let _ = hog.wait();
    let _ = std::fs::remove_file(&go);
    (worst, answers)
}

fn main() {
    if common::listing() {
        return;
    }
    let Some(cg) = MemCgroup::new(4 << 30) else {
        eprintln!("register: needs root and the v1 memory controller; skipped");
        return;
    };
    if cg.version != 1 {
        eprintln!("register: v1 only (v2 has no thresholds to register); skipped");
        return;
    }
    let runs = common::runs(20);
    let mut builds = vec![("this build".to_owned(), common::memwatch_bin())];
    if let Some(b) = common::base_bin() {
        builds.push((format!("base ({})", b.display()), b));
    }
    let mut worst: Vec<Vec<f64>> = builds.iter().map(|_| Vec::new()).collect();
    let mut answers: Vec<usize> = builds.iter().map(|_| 0).collect();
    for r in 0..runs {
        for (k, (_, bin)) in builds.iter().enumerate() {
            let (w, n) = round(bin, &cg, r * builds.len() + k);
            worst[k].push(w);
            answers[k] += n;
        }
    }
    println!("| build | rounds | slowest answer per round: p50 | p90 | max | answers per round |");
    println!("|---|---|---|---|---|---|");
    for (k, (name, _)) in builds.iter().enumerate() {
        let w = &mut worst[k];
        println!(
            "| {name} | {runs} | {:.1} ms | {:.1} ms | {:.1} ms | {:.0} |",
            pct(w, 0.5),
            pct(w, 0.9),
            pct(w, 1.0),
            answers[k] as f64 / runs as f64
        );
    }
}
