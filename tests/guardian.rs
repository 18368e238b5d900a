//! The guardian: when the daemon dies and nothing restarts it, every job it paused runs again within
//! 5 s, by signals and by the freezer; after a clean stop the guardian leaves; a killed guardian is
//! replaced.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, Opts, eventually, proc_state};

fn daemon() -> Daemon {
    Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    })
}

/// memhog with 3 workers, in `cgroup` when given; returns the child and its pids, root first.
fn job(cgroup: Option<&PathBuf>) -> (std::process::Child, Vec<u32>) {
    common::memhog_tree(cgroup.map(|p| p.as_path()), 3)
}

fn end(mut child: std::process::Child, pids: &[u32]) {
    common::end_tree(&mut child, pids);
}

fn frozen(dir: &std::path::Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1")
        || std::fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
}

#[test]
fn a_dead_daemon_that_is_not_restarted_leaves_no_job_stopped() {
    let mut d = daemon();
    let (child, pids) = job(None);
    assert_eq!(d.ctl(&["attach", &pids[0].to_string(), "--name", "g"]).0, 0);
    assert_eq!(d.ctl(&["pause", "g"]).0, 0);
    // SIGSTOP is delivered as each process next leaves the kernel: states show T a moment later.
    assert!(eventually(1.0, || pids
        .iter()
        .all(|p| proc_state(*p) == Some('T'))));
    let guardian = d.guardian_pid().expect("no guardian");
    let killed = Instant::now();
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(
        eventually(5.0, || pids.iter().all(|p| proc_state(*p) != Some('T'))),
        "still stopped 5 s after the daemon died: {:?}",
        pids.iter().map(|p| proc_state(*p)).collect::<Vec<_>>()
    );
    eprintln!(
        "signals: running again {:?} after the kill",
        killed.elapsed()
    );
    // Its work done, the guardian is gone too, and the state file says nothing is paused.
    assert!(eventually(5.0, || proc_state(guardian).is_none_or(|s| s == 'Z')));
    let state = std::fs::read_to_string(d.state.join("state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert!(v["jobs"][0]["paused"].is_null(), "{state}");
    // A later daemon re-adopts the job, running.
    let d2 = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        state: Some(d.state.clone()),
        ..Opts::default()
    });
    assert_eq!(d2.job_state("g").as_deref(), Some("running"));
    end(child, &pids);
}

#[test]
fn a_frozen_cgroup_is_thawed_when_the_daemon_dies() {
    let name = format!("memwatch-guardian-{}", std::process::id());
    let dir = [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/freezer",
    ]
    .iter()
    .map(|b| std::path::Path::new(b).join(&name))
    .find(|d| {
        std::fs::create_dir(d).is_ok()
            && (d.join("cgroup.freeze").exists()
                || d.join("freezer.state").exists()
                || std::fs::remove_dir(d).is_err())
    })
    .expect("no freezable cgroup could be made (needs root and cgroup2 or the v1 freezer)");
    let mut d = daemon();
    let (child, pids) = job(Some(&dir));
    assert_eq!(d.ctl(&["attach", &pids[0].to_string(), "--name", "f"]).0, 0);
    assert_eq!(d.ctl(&["pause", "f"]).0, 0);
    assert!(frozen(&dir), "{}: not frozen", dir.display());
    let killed = Instant::now();
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(
        eventually(5.0, || !frozen(&dir)),
        "{}: still frozen 5 s after the daemon died",
        dir.display()
    );
    eprintln!("freezer: thawed {:?} after the kill", killed.elapsed());
    end(child, &pids);
    for _ in 0..100 {
        if std::fs::remove_dir(&dir).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_guardian_leaves_after_a_clean_stop_and_is_replaced_when_killed() {
    let mut d = daemon();
    let first = d.guardian_pid().expect("no guardian");
    assert_eq!(proc_state(first).map(|s| s != 'Z'), Some(true));
    // Killed: the daemon starts another at its next full sample.
    let _ = Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status();
    d.wait_until(
        |d| d.guardian_pid().is_some_and(|g| g != first),
        "the daemon did not replace its killed guardian",
    );
    let second = d.guardian_pid().unwrap();
    assert_eq!(proc_state(second).map(|s| s != 'Z'), Some(true));
    // SIGTERM and SIGINT do not move it (systemd's stop of a crashed unit's cgroup must not end it
    // before it acts), but the daemon's end does.
    let _ = Command::new("kill")
        .args(["-TERM", &second.to_string()])
        .status();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(proc_state(second).map(|s| s != 'Z'), Some(true));
    assert_eq!(d.terminate(), Some(0));
    assert!(
        eventually(5.0, || proc_state(second).is_none_or(|s| s == 'Z')),
        "the guardian outlived a clean stop"
    );
}
