//! Quiet when calm, on the real host (its PSI trigger is what lets memwatch stretch): no job, nothing
//! near a line, and nobody reading, the daemon takes no full sample for its calm interval; a read of
//! the data asks for one and gets it.

mod common;

use common::{Daemon, Opts};

/// Lines far from anything a busy test machine reaches, so that only calm is tested here.
const LINES: &str = "[policy.host_memory]\nwarn = 0.96\ncritical = 0.98\n\
                     [policy.swap]\nwarn = 0.96\ncritical = 0.98\n\
                     [policy.pressure]\nwarn = 0.96\ncritical = 0.98\n";

fn points(d: &Daemon) -> Vec<u64> {
    let (status, body) = d.get("/api/v1/history?seconds=600");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["timestamp_ms"].as_u64().unwrap())
        .collect()
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn a_calm_daemon_samples_when_read_and_not_in_between() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 200,
        calm_interval_ms: Some(60_000),
        extra_config: LINES,
        ..Default::default()
    });
    let first = points(&d);
    let newest = *first.last().expect("a read gets a sample");
    // Three seconds unread: at 200 ms a daemon that is not calm takes 15 samples.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let asked = wall_ms();
    let second = points(&d);
    let taken: Vec<u64> = second.iter().copied().filter(|t| *t > newest).collect();
    assert!(
        taken.len() <= 2,
        "{} full samples in 3 s unread, calm: {taken:?}\n{}",
        taken.len(),
        d.log_text()
    );
    // The read asked for a sample and got it: the newest is the read's own, not 3 s old.
    let fresh = *taken.last().expect("the read took a fresh sample");
    assert!(
        fresh + 1000 >= asked,
        "the newest sample is {} ms older than the read",
        asked.saturating_sub(fresh)
    );
}

/// `memwatch_sample_interval_seconds`: the full-sample interval now (stretched while calm).
fn interval_s(d: &Daemon) -> f64 {
    d.metrics()
        .lines()
        .find_map(|l| {
            l.strip_prefix("memwatch_sample_interval_seconds ")?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// The job's newest walk: when its tree was walked, and the pids found.
fn walk(d: &Daemon) -> (u64, Vec<u64>) {
    let jobs = d.jobs();
    let s = &jobs[0]["sample"];
    let mut pids: Vec<u64> = s["processes"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["pid"].as_u64()).collect())
        .unwrap_or_default();
    pids.sort_unstable();
    (s["timestamp_ms"].as_u64().unwrap_or(0), pids)
}

/// A calm job's processes are learned from its cgroup's `cgroup.procs`: while the same processes are
/// in it, its tree is not walked again; a fork or an exit in it is seen at the next full sample.
#[test]
fn a_calm_jobs_tree_is_walked_again_only_when_its_cgroup_changes() {
    let cg = common::cgroup::MemCgroup::new(1 << 30).expect("a memory cgroup (needs root)");
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fork");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // A shell in the cgroup that starts a sleeping child for each line written to the fifo (bash:
    // it reaps a child that ends while it waits on the fifo).
    let script = format!(
        "while :; do if read l < {}; then sleep 600 & fi; done",
        fifo.display()
    );
    let mut job = cg.spawn(std::path::Path::new("/bin/bash"), &["-c", &script]);
    let fork = || std::fs::write(&fifo, "x\n").unwrap();
    fork();
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 100,
        calm_interval_ms: Some(400),
        extra_config: LINES,
        ..Default::default()
    });
    let (code, _, err) = d.ctl(&["attach", &job.id().to_string(), "--name", "quiet"]);
    assert_eq!(code, 0, "{err}");
    d.wait_until(|d| walk(d).1.len() == 2, "the shell and its first child");
    d.wait_until(|d| interval_s(d) >= 0.4, "calm with the job attached");
    let (walked, pids) = walk(&d);
    // Full samples come (a read of /metrics asks for one), the cgroup's members stay: no walk.
    d.wait_samples(5);
    assert_eq!(
        walk(&d),
        (walked, pids.clone()),
        "the tree was walked again with nothing changed in its cgroup\n{}",
        d.log_text()
    );
    // A fork: the next full sample sees the cgroup change and walks the tree.
    fork();
    let procs = || {
        let mut p: Vec<u64> = std::fs::read_to_string(cg.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        p.sort_unstable();
        p
    };
    assert!(
        common::eventually(10.0, || {
            let (_, now) = walk(&d);
            now.len() > pids.len() && now == procs()
        }),
        "the new child not seen: the cgroup holds {:?}, the last walk {:?}\n{}",
        procs(),
        walk(&d),
        d.log_text()
    );
    assert!(walk(&d).0 > walked);
    // An exit: seen the same way.
    for child in procs().iter().filter(|p| !pids.contains(p)) {
        assert!(
            std::process::Command::new("kill")
                .arg(child.to_string())
                .status()
                .unwrap()
                .success()
        );
    }
    d.wait_until(|d| walk(d).1 == pids, "the children's exit seen");
    let _ = job.kill();
    let _ = job.wait();
}
