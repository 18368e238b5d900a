//! Survival: a hog touching memory at 1 GiB/s inside a real memory cgroup limited to 512 MiB, with the
//! daemon attached, is paused before the cgroup's OOM killer fires — in every one of 20 runs — and held
//! while there is no room. Then the limit is raised, the hog is resumed and finishes, and the cgroup's
//! OOM-kill count is unchanged. The runs alternate between the two ways memwatch pauses: signals
//! (the hog's cgroup is not one it can freeze) and the freezer (on v1 the hog also has a freezer
//! cgroup of its own; on v2 every run is frozen).
//! Kept in its own test binary so no other test competes with it for the CPU.

mod common;

use std::io::BufRead;

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, eventually, proc_state};

const MIB: u64 = 1 << 20;

/// The daemon's last 80 log lines, for a failure's message.
fn log_tail(d: &Daemon) -> String {
    let log = d.log_text();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// A series of the daemon's /metrics, by its name and labels as printed.
fn metric(d: &Daemon, series: &str) -> Option<f64> {
    d.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn hog_is_paused_before_the_oom_killer_in_every_run() {
    let (signalled, frozen) = MemCgroup::pair(512 * MIB);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 1000,
        ..Opts::default()
    });
    let runs = 20;
    let mut paused_at = Vec::new();
    let mut ways = (0, 0);
    for run in 0..runs {
        let cg = if run % 2 == 0 { &signalled } else { &frozen };
        let name = format!("hog{run}");
        let (mut hog, mut out, go) = d.fast_hog(cg, &name);
        let pid = hog.id();
        let mut line = String::new();
        let oom_before = cg.oom_kills();
        std::fs::write(&go, "").unwrap();

        assert!(
            eventually(5.0, || cg.paused(pid)),
            "run {run}: the hog was not paused (state {:?}, OOM kills {} → {})\n{:?}\nlog:\n{}",
            proc_state(pid),
            oom_before,
            cg.oom_kills(),
            d.events(),
            log_tail(&d)
        );
        let usage: u64 = std::fs::read_to_string(cg.dir.join(if cg.version == 1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        }))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
        paused_at.push(usage / MIB);
        // A pause on a projection holds until the limit has room for the growth that caused it (the
        // nil growth of a frozen hog resumes nothing); a pause at the critical level, by the kernel's
        // threshold notification, holds too: either way there is no room.
        let next_samples = |n: f64| {
            let from = metric(&d, "memwatch_samples_total").unwrap_or(0.0);
            d.wait_until(
                |d| metric(d, "memwatch_samples_total").unwrap_or(0.0) >= from + n,
                "no more samples",
            );
        };
        next_samples(2.0);
        assert!(
            eventually(2.0, || cg.paused(pid)),
            "run {run}: not held with no room (state {:?}, OOM kills {} → {})\n{:#?}\nlog:\n{}",
            proc_state(pid),
            oom_before,
            cg.oom_kills(),
            d.events().iter().rev().take(12).collect::<Vec<_>>(),
            log_tail(&d)
        );
        // Held over the next two full samples, each of which could have resumed it.
        next_samples(2.0);
        assert!(
            cg.paused(pid) && d.job_state(&name).as_deref() == Some("paused"),
            "run {run}: resumed with no room (state {:?}, OOM kills {} → {})\n{:#?}",
            proc_state(pid),
            oom_before,
            cg.oom_kills(),
            d.events().iter().rev().take(12).collect::<Vec<_>>()
        );
        let frozen_now = proc_state(pid) != Some('T');
        if frozen_now {
            ways.1 += 1;
        } else {
            ways.0 += 1;
        }
        assert_eq!(
            cg.oom_kills(),
            oom_before,
            "run {run}: the OOM killer fired"
        );

        cg.set_limit(3072 * MIB);
        let status = hog.wait().unwrap();
        assert!(
            status.success(),
            "run {run}: the hog did not finish: {status:?}"
        );
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done 768", "run {run}");
        assert_eq!(
            cg.oom_kills(),
            oom_before,
            "run {run}: the OOM killer fired"
        );
        assert!(
            eventually(5.0, || d.job_state(&name).is_none()),
            "run {run}: the finished job stayed attached"
        );
    }
    // The API shows the last run's events once a view with them is published.
    let count = |events: &[serde_json::Value], action: &str| {
        events.iter().filter(|e| e["action"] == action).count()
    };
    d.wait_events(&format!("{runs} pauses and {runs} resumes"), |events| {
        count(events, "pause") >= runs && count(events, "resume") >= runs
    });
    eprintln!("paused at cgroup usage (MiB of 512): {paused_at:?}");
    eprintln!("held by signals {} times, frozen {} times", ways.0, ways.1);
    // Both pause mechanisms ran (v1); v2 freezes every job that owns its cgroup.
    if signalled.version == 1 {
        assert_eq!(ways, (runs / 2, runs / 2), "signals, freezer");
    }
}
