//! `on_max_pause = "terminate"` on a real memory cgroup: the whole job ends and nothing of it is left
//! stopped. Apart from tests/survival.rs, whose 20 runs must not compete with it for the CPU.

mod common;

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, eventually, proc_state};

const MIB: u64 = 1 << 20;

/// `on_max_pause = "terminate"` ends the whole job, and never leaves part of it stopped: a hog with
/// three workers, paused before its cgroup's OOM killer, gets SIGTERM on every process (root and
/// workers) at the longest pause, is never paused again while it exits, and leaves no process behind,
/// stopped or running; the OOM killer never fires.
#[test]
fn terminate_ends_the_whole_job_and_leaves_nothing_stopped() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 100,
        extra_config: "[policy]\nmax_pause_seconds = 2\non_max_pause = \"terminate\"\n",
        ..Opts::default()
    });
    let cg = MemCgroup::new(512 * MIB).expect("a memory cgroup (needs root)");
    let go = d.dir.path().join("go");
    let mut hog = cg.spawn_hog(&go, &["--workers", "3", "--worker-mib", "8"]);
    let pid = hog.id();
    let pids: Vec<u32> = std::iter::once(pid)
        .chain(
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap()
                .split_whitespace()
                .map(|p| p.parse().unwrap()),
        )
        .collect();
    assert_eq!(pids.len(), 4, "memhog did not start its workers");
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "t"]).0, 0);
    let oom_before = cg.oom_kills();
    std::fs::write(&go, "").unwrap();
    assert!(
        eventually(5.0, || proc_state(pid) == Some('T')),
        "the hog was not paused"
    );
    // The longest pause passes; the job is terminated and ends, all of it. (Its root is reaped as it
    // exits, as a shell would.)
    let waiter = std::thread::spawn(move || hog.wait());
    let gone = |p: &u32| proc_state(*p).is_none_or(|s| s == 'Z');
    // On failure, what ended the root (an OOM kill first, say) and what the daemon did.
    assert!(
        eventually(25.0, || pids.iter().all(gone)),
        "left behind: {:?}; OOM kills in the cgroup {} → {}\nevents: {:#?}\nlog:\n{}",
        pids.iter().map(|p| (p, proc_state(*p))).collect::<Vec<_>>(),
        oom_before,
        cg.oom_kills(),
        d.events(),
        d.log_text()
    );
    assert_eq!(cg.oom_kills(), oom_before, "the OOM killer fired");
    // The event is published with the view after the step that sent SIGTERM; the processes can be
    // gone before a reader sees it.
    assert!(
        eventually(5.0, || d
            .events()
            .iter()
            .any(|e| e["action"] == "terminate")),
        "no terminate event: {:?}",
        d.events()
    );
    let events = d.events();
    let terminated_at = events
        .iter()
        .find(|e| e["action"] == "terminate")
        .and_then(|e| e["timestamp_ms"].as_u64())
        .unwrap_or_else(|| panic!("no terminate event: {events:?}"));
    assert!(
        !events
            .iter()
            .any(|e| e["action"] == "pause"
                && e["timestamp_ms"].as_u64().unwrap_or(0) > terminated_at),
        "paused again while terminating: {events:?}"
    );
    assert!(
        eventually(5.0, || d
            .get("/api/v1/jobs")
            .1
            .contains("stopped by memwatch: paused for the maximum of 2 s")),
        "{}",
        d.get("/api/v1/jobs").1
    );
    let _ = waiter.join();
}
