//! Survival: a hog touching memory at 1 GiB/s inside a real memory cgroup limited to 512 MiB, with the
//! daemon attached, is paused before the cgroup's OOM killer fires — in every one of 20 runs — and held
//! while there is no room. Then the limit is raised, the hog is resumed and finishes, and the cgroup's
//! OOM-kill count is unchanged.
//! Kept in its own test binary so no other test competes with it for the CPU.

mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, eventually, memhog, proc_state};

const MIB: u64 = 1 << 20;

#[test]
fn hog_is_paused_before_the_oom_killer_in_every_run() {
    let Some(cg) = MemCgroup::new(512 * MIB) else {
        panic!("cannot create a memory cgroup: this test needs root and a memory controller");
    };
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 1000,
        ..Opts::default()
    });
    let runs = 20;
    let mut paused_at = Vec::new();
    for run in 0..runs {
        cg.set_limit(512 * MIB);
        let go = d.dir.path().join(format!("go-{run}"));
        let mut hog = cg.spawn(
            &memhog(),
            &[
                "--rate-mib",
                "1024",
                "--total-mib",
                "768",
                "--wait-file",
                go.to_str().unwrap(),
            ],
        );
        let pid = hog.id();
        let mut out = BufReader::new(hog.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let name = format!("hog{run}");
        let (code, _, err) = d.ctl(&["attach", &pid.to_string(), "--name", &name]);
        assert_eq!(code, 0, "{err}");
        let oom_before = cg.oom_kills();
        std::fs::write(&go, "").unwrap();

        assert!(
            eventually(5.0, || proc_state(pid) == Some('T')),
            "run {run}: the hog was not paused (state {:?}, OOM kills {} → {})",
            proc_state(pid),
            oom_before,
            cg.oom_kills()
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
        // A pause on a projection is brief (it ends once the job has been held for reaction_ms and no
        // longer grows, as a burst that ended would); a hog that goes on growing is then stopped at the
        // critical level by the kernel's threshold notification, and held: there is no room.
        std::thread::sleep(Duration::from_millis(1000));
        assert!(
            eventually(2.0, || proc_state(pid) == Some('T')),
            "run {run}: not held with no room (state {:?})",
            proc_state(pid)
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            proc_state(pid),
            Some('T'),
            "run {run}: resumed with no room"
        );
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
    let events = d.events();
    let pauses = events.iter().filter(|e| e["action"] == "pause").count();
    let resumes = events.iter().filter(|e| e["action"] == "resume").count();
    assert!(
        pauses >= runs && resumes >= runs,
        "{pauses} pauses, {resumes} resumes"
    );
    eprintln!("paused at cgroup usage (MiB of 512): {paused_at:?}");
}

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
    assert!(
        eventually(25.0, || pids.iter().all(gone)),
        "left behind: {:?}",
        pids.iter().map(|p| (p, proc_state(*p))).collect::<Vec<_>>()
    );
    assert_eq!(cg.oom_kills(), oom_before, "the OOM killer fired");
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
