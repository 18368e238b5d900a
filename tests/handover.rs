//! A pause the policy made survives the daemon's death as a pause when a successor comes: the daemon
//! is killed (its guardian left alive, as systemd's `KillMode=process` leaves it), a new daemon starts
//! on the same state directory within the guardian's grace, and the job — stopped with signals, or
//! frozen in its own cgroup — is held the whole time: the guardian leaves it to the successor, which
//! re-adopts it still paused and resumes it only when its cause (a hot GPU) recovers. Nothing ever
//! lets the job run in between: a watcher reads its state every millisecond across the hand-over.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Daemon, Opts, eventually, proc_state};

fn gpu_state(temp: u32, pid: u32) -> String {
    format!(
        r#"{{"devices":[{{"name":"Fake","uuid":"GPU-x","memory_total":1000000000,"memory_used":100000000,
        "temperature":{temp},"threshold_slowdown":90,"threshold_shutdown":98,
        "processes":[{{"pid":{pid},"used_memory":100000000}}]}}]}}"#
    )
}

const GPU_PAUSES: &str =
    "[policy.gpu_temperature]\naction = \"pause\"\nenter_hold_ms = 0\nleave_hold_ms = 0\n";

fn start(state: &Path, gpu: &str) -> Daemon {
    Daemon::start(Opts {
        root: "/".into(),
        gpu_state: Some(gpu),
        extra_config: GPU_PAUSES,
        state: Some(state.to_owned()),
        control: "successor_grace_ms = 5000",
        ..Opts::default()
    })
}

/// A cgroup of the job's own that memwatch can freeze, if one can be made here.
fn own_cgroup() -> Option<PathBuf> {
    let name = format!("memwatch-handover-{}", std::process::id());
    [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/freezer",
    ]
    .iter()
    .map(|b| Path::new(b).join(&name))
    .find(|d| {
        std::fs::create_dir(d).is_ok()
            && (d.join("cgroup.freeze").exists()
                || d.join("freezer.state").exists()
                || std::fs::remove_dir(d).is_err())
    })
}

fn frozen(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1")
        || std::fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
}

/// Held: frozen in its cgroup, or every process stopped.
fn held(pids: &[u32], cgroup: Option<&Path>) -> bool {
    match cgroup {
        Some(dir) => frozen(dir),
        None => pids.iter().all(|p| proc_state(*p) == Some('T')),
    }
}

#[test]
fn a_successor_within_the_grace_holds_a_policy_pause() {
    let cgroup = own_cgroup();
    assert!(
        cgroup.is_some(),
        "no freezable cgroup could be made (needs root and cgroup2 or the v1 freezer)"
    );
    for place in [None, cgroup.clone()] {
        let what = if place.is_some() {
            "freezer"
        } else {
            "signals"
        };
        let (mut child, pids) = common::memhog_tree(place.as_deref(), 3);
        let (hot, cool) = (gpu_state(97, pids[0]), gpu_state(60, pids[0]));
        let state_dir = common::tempdir();
        let state = state_dir.path().join("state");
        let mut d = start(&state, &hot);
        assert_eq!(d.ctl(&["attach", &pids[0].to_string(), "--name", "h"]).0, 0);
        d.wait_until(
            |d| d.job_state("h").as_deref() == Some("paused"),
            "the hot GPU never paused the job",
        );
        assert!(
            eventually(5.0, || held(&pids, place.as_deref())),
            "{what}: paused but not held"
        );
        // Watch the job across the hand-over.
        let stop = Arc::new(AtomicBool::new(false));
        let (looks, released) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let watcher = {
            let (stop, looks, released) = (stop.clone(), looks.clone(), released.clone());
            let (pids, place) = (pids.clone(), place.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    looks.fetch_add(1, Ordering::Relaxed);
                    if !held(&pids, place.as_deref()) {
                        released.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        let guardian = d.wait_guardian_pid();
        d.child.kill().unwrap();
        d.child.wait().unwrap();
        let killed = Instant::now();
        let d2 = start(&state, &hot);
        let took_over = killed.elapsed();
        d2.wait_event("the successor re-adopted the job still paused", |e| {
            e["action"] == "attach"
                && e["reason"] == "restart"
                && e["detail"]
                    .as_str()
                    .is_some_and(|t| t.contains("still paused"))
        });
        assert_eq!(d2.job_state("h").as_deref(), Some("paused"), "{what}");
        assert!(
            eventually(10.0, || proc_state(guardian).is_none_or(|s| s == 'Z')),
            "{what}: the old guardian stayed after the successor took over"
        );
        // The guardian is gone: the successor, not the guardian, owns the pause now.
        stop.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        let (looks, released) = (
            looks.load(Ordering::Relaxed),
            released.load(Ordering::Relaxed),
        );
        eprintln!(
            "{what}: successor up {took_over:?} after the kill; {looks} looks at the job, released in {released}"
        );
        assert!(looks > 20, "{what}: the watcher hardly looked ({looks})");
        assert_eq!(
            released,
            0,
            "{what}: the job ran during the hand-over; the successor's events: {:?}\nlog: {}",
            d2.events(),
            d2.log_text()
        );
        // Its cause recovers: the successor resumes it.
        d2.set_gpu_state(&cool);
        assert!(
            eventually(10.0, || !held(&pids, place.as_deref())
                && pids.iter().all(|p| proc_state(*p) != Some('T'))),
            "{what}: not resumed when the GPU cooled"
        );
        d2.wait_event("the successor's resume", |e| {
            e["action"] == "resume" && e["job"] == "h" && e["reason"] == "recovered"
        });
        drop(d2);
        common::end_tree(&mut child, &pids);
    }
    if let Some(dir) = cgroup {
        for _ in 0..100 {
            if std::fs::remove_dir(&dir).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
