//! The guardian: when the daemon dies and nothing restarts it, every job it paused runs again once
//! the grace it gives a successor is over (1 s here), and not before, by signals and by the freezer;
//! after a clean stop the guardian leaves; a killed guardian is replaced. `handover.rs` tests a
//! successor that comes within the grace.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, Opts, eventually, proc_state};

/// The grace the guardian gives a successor, in these tests.
const GRACE: Duration = Duration::from_millis(1000);

fn daemon() -> Daemon {
    Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        control: "successor_grace_ms = 1000",
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
    let guardian = d.wait_guardian_pid();
    let killed = Instant::now();
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(
        eventually(6.0, || pids.iter().all(|p| proc_state(*p) != Some('T'))),
        "still stopped 6 s after the daemon died: {:?}",
        pids.iter().map(|p| proc_state(*p)).collect::<Vec<_>>()
    );
    let after = killed.elapsed();
    eprintln!("signals: running again {after:?} after the kill");
    assert!(
        after >= GRACE,
        "resumed {after:?} after the kill, before the grace for a successor was over"
    );
    // Its work done, the guardian is gone too, and the state file says nothing is paused.
    assert!(eventually(5.0, || proc_state(guardian).is_none_or(|s| s == 'Z')));
    let state = std::fs::read_to_string(d.runtime.join("state.json")).unwrap();
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
        eventually(6.0, || !frozen(&dir)),
        "{}: still frozen 6 s after the daemon died",
        dir.display()
    );
    let after = killed.elapsed();
    eprintln!("freezer: thawed {after:?} after the kill");
    assert!(
        after >= GRACE,
        "thawed {after:?} after the kill, within the grace"
    );
    end(child, &pids);
    for _ in 0..100 {
        if std::fs::remove_dir(&dir).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon's directories removed once it died (a test's temporary ones, a purge) are not made
/// again by its guardian: with nothing left to guard it leaves.
#[test]
fn a_guardian_whose_directories_are_gone_makes_nothing_and_leaves() {
    let d = daemon();
    let guardian = d.wait_guardian_pid();
    let top = d.dir.path().to_owned();
    let runtime = d.runtime.clone();
    assert!(runtime.join("daemon.lock").is_file());
    // The daemon killed first, then its directories removed (the harness's order on drop).
    drop(d);
    assert!(!top.exists());
    assert!(
        eventually(5.0, || proc_state(guardian).is_none_or(|s| s == 'Z')),
        "the guardian stayed"
    );
    assert!(!runtime.exists(), "{} made again", runtime.display());
    assert!(!top.exists(), "{} made again", top.display());
}

#[test]
fn the_guardian_leaves_after_a_clean_stop_and_is_replaced_when_killed() {
    let mut d = daemon();
    let first = d.wait_guardian_pid();
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

/// A pause that cannot be written ahead is refused: with the runtime directory (where the state file
/// lies) full, `pause` fails with a clear error and the job keeps running, so no crash can leave it
/// stopped unrecorded.
#[test]
fn a_pause_that_cannot_be_saved_is_refused() {
    let top = common::tempdir();
    let state = top.path().join("state");
    // The harness's runtime directory: `state` beside the socket, in `run`.
    let runtime = top.path().join("run/state");
    std::fs::create_dir_all(&runtime).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&runtime)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a small tmpfs (needs root)");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(runtime.clone());
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        state: Some(state),
        ..Opts::default()
    });
    assert_eq!(d.runtime, runtime);
    let (child, pids) = job(None);
    assert_eq!(
        d.ctl(&["attach", &pids[0].to_string(), "--name", "full"]).0,
        0
    );
    // Fill the rest of the file system.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", runtime.join("filler").display()))
        .output()
        .unwrap();
    let (code, _, err) = d.ctl(&["pause", "full"]);
    assert_ne!(code, 0, "a pause that could not be recorded was accepted");
    assert!(err.contains("cannot write"), "{err}");
    assert!(
        pids.iter().all(|p| proc_state(*p) != Some('T')),
        "the refused pause stopped something"
    );
    assert_eq!(d.job_state("full").as_deref(), Some("running"));
    // With room again it pauses.
    std::fs::remove_file(runtime.join("filler")).unwrap();
    assert_eq!(d.ctl(&["pause", "full"]).0, 0);
    assert!(eventually(2.0, || proc_state(pids[0]) == Some('T')));
    drop(d);
    end(child, &pids);
}

/// A restart after a crash resumes the paused jobs before it binds anything: with the HTTP port taken
/// the new daemon exits 1, and the job runs again all the same.
#[test]
fn a_restart_resumes_paused_jobs_even_when_the_port_is_taken() {
    let mut d = daemon();
    let (child, pids) = job(None);
    assert_eq!(d.ctl(&["attach", &pids[0].to_string(), "--name", "p"]).0, 0);
    assert_eq!(d.ctl(&["pause", "p"]).0, 0);
    assert!(eventually(2.0, || pids
        .iter()
        .all(|p| proc_state(*p) == Some('T'))));
    d.wait_guardian_pid();
    d.crash(true);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = std::fs::read_to_string(d.dir.path().join("memwatch.toml"))
        .unwrap()
        .replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"{}\"", taken.local_addr().unwrap()),
        );
    let path = d.dir.path().join("taken.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(common::bin())
        .arg("--config")
        .arg(&path)
        .arg("run")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        pids.iter().all(|p| proc_state(*p) != Some('T')),
        "the job stayed stopped while the port was taken"
    );
    end(child, &pids);
}

/// A paused job whose root is killed from outside (kill -9, as the OOM killer would) leaves no process
/// stopped: its orphaned workers are continued (signals) or thawed (a cgroup v2 freezer, where a
/// frozen root can die) before the job is dropped, and the job shows in the ended list with how it
/// ended.
#[test]
fn a_paused_job_whose_root_is_killed_leaves_nothing_stopped() {
    let mut places: Vec<Option<PathBuf>> = vec![None];
    for base in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"] {
        let dir =
            std::path::Path::new(base).join(format!("memwatch-orphans-{}", std::process::id()));
        if std::fs::create_dir(&dir).is_ok() {
            if dir.join("cgroup.freeze").exists() {
                places.push(Some(dir));
                break;
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    for place in places {
        let d = daemon();
        let (mut child, pids) = job(place.as_ref());
        // Killed however the test ends: stopped orphans would hold the test's output open.
        struct Reap(Vec<u32>);
        impl Drop for Reap {
            fn drop(&mut self) {
                for p in &self.0 {
                    let _ = Command::new("kill")
                        .args(["-KILL", &p.to_string()])
                        .status();
                }
            }
        }
        let _reap = Reap(pids.clone());
        assert_eq!(d.ctl(&["attach", &pids[0].to_string(), "--name", "o"]).0, 0);
        assert_eq!(d.ctl(&["pause", "o"]).0, 0);
        let held =
            |p: u32| proc_state(p) == Some('T') || place.as_ref().is_some_and(|dir| frozen(dir));
        assert!(
            eventually(2.0, || pids.iter().all(|p| held(*p))),
            "{place:?}: not paused"
        );
        // The root dies; its workers are orphaned, still held.
        let _ = Command::new("kill")
            .args(["-KILL", &pids[0].to_string()])
            .status();
        child.wait().unwrap();
        assert!(
            eventually(5.0, || pids[1..]
                .iter()
                .all(|p| proc_state(*p) == Some('S'))
                && place.as_ref().is_none_or(|dir| !frozen(dir))),
            "{place:?}: workers left held: {:?}",
            pids.iter().map(|p| proc_state(*p)).collect::<Vec<_>>()
        );
        assert!(eventually(2.0, || d.job_state("o").is_none()));
        // The API shows the ended job once a view without it is published.
        let v = d.wait_api("/api/v1/jobs", &format!("{place:?}: the ended job"), |v| {
            v["ended"][0]["name"] == "o"
        });
        let ended = &v["ended"][0];
        assert_eq!(ended["name"], "o", "{v}");
        assert_eq!(ended["was_paused"], true, "{v}");
        assert!(
            ended["how"]
                .as_str()
                .is_some_and(|h| h.contains("exited while paused")),
            "{v}"
        );
        let (_, out, _) = d.ctl(&["jobs"]);
        assert!(
            out.contains("ended:") && out.contains("exited while paused"),
            "{out}"
        );
        for p in &pids[1..] {
            let _ = Command::new("kill")
                .args(["-KILL", &p.to_string()])
                .status();
        }
        if let Some(dir) = place {
            assert!(eventually(5.0, || std::fs::remove_dir(&dir).is_ok()));
        }
    }
}
