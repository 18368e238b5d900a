//! The reflex, on real v1 memory cgroups: a hog touching memory at 1 GiB/s in a cgroup limited to
//! 512 MiB is stopped at its critical line by the wake thread itself, once by signals (the hog's root,
//! through its pidfd) and once by the freezer (the hog owns a v1 freezer cgroup). For each:
//! - while it runs, the state file holds the reflex as a pause in phase `armed`, written before the
//!   wake thread got it (write-ahead when armed), and the API's `reflex` and
//!   `memwatch_job_reflex_armed` show it armed; paused, they show it no more;
//! - the pause event says the reflex stopped it; the engine then holds the pause as its own (phase
//!   `held`, by the mechanism the reflex used) and no OOM kill happened;
//! - with room made, the job is resumed and finishes.
//!
//! Each runs as root's job, then as a local user's (attached by that user), whose stop the kernel
//! checks against the user's uids.
//!
//! Then the same hog under a daemon with `reflex = false`: nothing is armed, and the pause comes
//! from the engine's probe (its event does not name the reflex), so the first part is the reflex's.
//! The first daemon's wake thread runs at real-time priority 1 (SCHED_FIFO, `policy.reflex_priority`'s
//! default); the second's, with `reflex_priority = 0`, at the normal policy.
//!
//! Kept in its own test binary so no other test competes with it for the CPU.

mod common;

use std::io::BufRead;

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, eventually, proc_state, recorded_pause};

const MIB: u64 = 1 << 20;

/// The scheduling policy and real-time priority of the daemon's thread named `wake`, from
/// /proc/PID/task/TID/stat (fields 41 and 40); None before the thread is there.
fn wake_thread_scheduling(d: &Daemon) -> Option<(u32, u32)> {
    let pid = d.child.id();
    let task = std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(Result::ok)
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "wake")
        })?;
    let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command's closing parenthesis come fields 3, 4, …: field N is at N - 3.
    Some((
        fields.get(41 - 3)?.parse().ok()?,
        fields.get(40 - 3)?.parse().ok()?,
    ))
}

/// Waits until the wake thread runs with `want` (policy, priority): it sets its own as it starts.
fn assert_wake_thread(d: &Daemon, want: (u32, u32)) {
    assert!(
        eventually(5.0, || wake_thread_scheduling(d) == Some(want)),
        "the wake thread's policy and priority: {:?}, want {want:?}\n{}",
        wake_thread_scheduling(d),
        d.log_text()
    );
}

const SCHED_OTHER: u32 = 0;
const SCHED_FIFO: u32 = 1;

/// One hog run under `d`, as local user `user` when given: returns the pause event's detail.
fn run(d: &Daemon, cg: &MemCgroup, name: &str, reflex: bool, user: Option<&str>) -> String {
    let (mut hog, mut out, go) = d.fast_hog_of(cg, name, user);
    let pid = hog.id();
    let mut line = String::new();
    if reflex {
        // Armed, and recorded so, before the hog starts.
        d.wait_until(
            |d| recorded_pause(&d.runtime, name).is_some_and(|p| p["phase"] == "armed"),
            "the reflex recorded as armed",
        );
        // The API and the metrics say so, with the line it fires at (95 % of 512 MiB).
        let armed = d.jobs().into_iter().find(|j| j["name"] == name).unwrap()["reflex"].clone();
        let critical = armed["critical_bytes"].as_u64().unwrap_or(0);
        assert!(
            critical > 480 * MIB && critical < 512 * MIB,
            "{name}: the API's reflex: {armed}"
        );
        assert_eq!(
            armed["how"],
            if name.starts_with("by-freezer") {
                "freezer"
            } else {
                "signals"
            }
        );
        let metrics = d.metrics();
        assert!(
            metrics.contains(&format!(
                "memwatch_job_reflex_armed{{job_name=\"{name}\"}} 1"
            )),
            "{name}: not armed in /metrics:\n{metrics}"
        );
        // Its thresholds: registering (each live from its own write), then all in.
        let watch = |d: &Daemon| {
            d.jobs().into_iter().find(|j| j["name"] == name).unwrap()["watch"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            ["registering", "watched"].contains(&watch(d).as_str()),
            "{name}: the API's watch of an armed job: {}",
            watch(d)
        );
        d.wait_until(
            |d| watch(d) == "watched",
            "the job's thresholds all registered",
        );
        // A v1 freezer reflex's freeze is not the kernel's first: the daemon holds an empty freezer
        // cgroup of its own frozen while it is armed.
        let held = held_active(d);
        if name.starts_with("by-freezer") {
            assert_eq!(
                std::fs::read_to_string(held.join("freezer.state"))
                    .map(|s| s.trim().to_owned())
                    .ok()
                    .as_deref(),
                Some("FROZEN"),
                "{name}: the v1 freezer not kept active"
            );
            let procs = std::fs::read_to_string(held.join("cgroup.procs")).unwrap_or_default();
            assert_eq!(procs.trim(), "", "{name}: the held cgroup has members");
        } else {
            assert!(!held.exists(), "{name}: held for a reflex by signals");
        }
    } else {
        d.wait_samples(d.samples() + 2);
        assert_eq!(
            recorded_pause(&d.runtime, name),
            None,
            "armed with reflex = false"
        );
    }
    let oom_before = cg.oom_kills();
    std::fs::write(&go, "").unwrap();
    assert!(
        eventually(5.0, || cg.paused(pid)),
        "{name}: not paused (state {:?}, OOM kills {} → {})\n{:#?}",
        proc_state(pid),
        oom_before,
        cg.oom_kills(),
        d.events()
    );
    let pause = |d: &Daemon| {
        d.events()
            .into_iter()
            .find(|e| e["job"] == name && e["action"] == "pause")
            .map(|e| e["detail"].as_str().unwrap_or_default().to_owned())
    };
    d.wait_until(|d| pause(d).is_some(), "the pause event");
    let detail = pause(d).unwrap();
    d.wait_until(
        |d| recorded_pause(&d.runtime, name).is_some_and(|p| p["phase"] == "held"),
        "the pause held and recorded",
    );
    let hold = recorded_pause(&d.runtime, name).unwrap()["hold"]["kind"].clone();
    let frozen = proc_state(pid) != Some('T');
    assert_eq!(
        hold,
        if frozen {
            "cgroup_v1_freezer"
        } else {
            "signals"
        },
        "{name}"
    );
    assert_eq!(cg.oom_kills(), oom_before, "{name}: the OOM killer fired");
    // A paused job has no reflex armed.
    d.wait_until(
        |d| {
            d.metrics().contains(&format!(
                "memwatch_job_reflex_armed{{job_name=\"{name}\"}} 0"
            ))
        },
        "the reflex shown disarmed while paused",
    );
    assert!(
        d.jobs().into_iter().find(|j| j["name"] == name).unwrap()["reflex"].is_null(),
        "{name}: a reflex shown for a paused job"
    );

    cg.set_limit(3072 * MIB);
    let status = hog.wait().unwrap();
    assert!(
        status.success(),
        "{name}: the hog did not finish: {status:?}"
    );
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "done 768", "{name}");
    assert_eq!(cg.oom_kills(), oom_before, "{name}: the OOM killer fired");
    assert!(
        eventually(5.0, || d.job_state(name).is_none()),
        "{name}: the finished job stayed attached"
    );
    assert!(
        eventually(5.0, || !held_active(d).exists()),
        "{name}: the v1 freezer kept active with no reflex armed"
    );
    detail
}

/// The empty v1 freezer cgroup `d` holds frozen while a v1 freezer reflex is armed.
fn held_active(d: &Daemon) -> std::path::PathBuf {
    std::path::Path::new("/sys/fs/cgroup/freezer")
        .join(format!("memwatch-freezer-active.{}", d.child.id()))
}

#[test]
fn the_reflex_stops_a_fast_hog_at_its_line_and_the_engine_holds_it() {
    let (signalled, frozen) = MemCgroup::pair(512 * MIB);
    if signalled.version != 1 {
        common::skip::cannot_run(
            "reflex",
            "no v1 memory controller: this reflex rides on v1 thresholds (the VM's scenarios test v2's)",
        );
        return;
    }
    // Level only: no projection pauses the hog before its line, and the engine's probe leaves each
    // crossing to the wake thread first.
    let d = Daemon::level_only();
    assert_wake_thread(&d, (SCHED_FIFO, 1));
    // Root's job, then a user's: the user's is stopped from a thread that took the user's uids,
    // so the kernel checks the owner at the signal (and at the freezer's check of its members).
    for (name, cg, user) in [
        ("by-signals", &signalled, None),
        ("by-freezer", &frozen, None),
        ("by-signals-of-a-user", &signalled, Some("memwatch-test")),
        ("by-freezer-of-a-user", &frozen, Some("memwatch-test")),
    ] {
        let detail = run(&d, cg, name, true, user);
        assert!(
            detail.contains("stopped by the reflex"),
            "{name}: the pause was not the reflex's: {detail}\n{}",
            d.log_text()
        );
    }
    drop(d);

    let off = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 1000,
        extra_config: "[policy]\nreaction_ms = 0\nreflex = false\nreflex_priority = 0\n",
        ..Opts::default()
    });
    assert_wake_thread(&off, (SCHED_OTHER, 0));
    let detail = run(&off, &signalled, "by-probe", false, None);
    assert!(
        !detail.contains("stopped by the reflex"),
        "reflex = false, yet the reflex paused the job: {detail}"
    );
}
