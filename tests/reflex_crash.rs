//! Crash safety with reflexes armed: a hog at 1 GiB/s in a real v1 memory cgroup (256 MiB) runs into
//! its critical line, where the wake thread's reflex stops it (by signals, or by the freezer when the
//! hog owns a v1 freezer cgroup: the rounds alternate), and the daemon and its guardian are killed
//! with SIGKILL at a random moment around that stop: before the reflex fired, between its firing and
//! the engine's record, while the engine takes it over, or after. Then the limit is raised (room)
//! and a new daemon starts on the same state directory. After every restart the hog runs again:
//! the record written when the reflex was armed (phase `armed`) or the pause that took it over is
//! undone, so no kill leaves it stopped.
//!
//! `ROUNDS=N` runs N rounds (40 by default; the note's figure is from 200). Kept in its own test
//! binary so no other test competes with it for the CPU.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, Rng, eventually, memhog, proc_state, recorded_pause};

const MIB: u64 = 1 << 20;

fn start(state: &Path) -> Daemon {
    Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 100,
        extra_config: "[policy]\nreaction_ms = 0\n",
        state: Some(state.to_owned()),
        ..Opts::default()
    })
}

/// Whether the job's record in the state file (in `runtime`) is a reflex armed.
fn armed(runtime: &Path, job: &str) -> bool {
    recorded_pause(runtime, job).is_some_and(|p| p["phase"] == "armed")
}

/// The hog stopped, or its freezer cgroup frozen (or freezing).
fn held(cg: &MemCgroup, pid: u32) -> bool {
    proc_state(pid) == Some('T')
        || cg.freezer.as_ref().is_some_and(|f| {
            std::fs::read_to_string(f.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
        })
}

#[test]
fn no_job_is_left_stopped_after_a_kill_around_a_reflex() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let mut rng = Rng::from_clock();
    let (signalled, frozen) = MemCgroup::pair(256 * MIB);
    if signalled.version != 1 {
        common::skip::cannot_run(
            "reflex_crash",
            "no v1 memory controller: this reflex rides on v1 thresholds (the VM's scenarios test v2's)",
        );
        return;
    }
    let state_dir = common::tempdir();
    let state = state_dir.path().join("state");
    let mut d = start(&state);
    let runtime = d.runtime.clone();
    let (mut fired_at_kill, mut armed_at_kill, mut left_held) = (0, 0, 0);
    let mut resumed_ms = Vec::new();
    for round in 0..rounds {
        let cg = if round % 2 == 0 { &signalled } else { &frozen };
        cg.set_limit(256 * MIB);
        let go = state_dir.path().join(format!("go-{round}"));
        // 250 MiB: past the critical line (243 MiB), short of the limit, then held there.
        let (mut hog, _out) = cg.hog(
            &memhog(),
            &[
                "--rate-mib",
                "1024",
                "--total-mib",
                "250",
                "--hold-ms",
                "60000",
            ],
            &go,
        );
        let pid = hog.id();
        let name = format!("crashy{round}");
        let (code, _, err) = d.ctl(&["attach", &pid.to_string(), "--name", &name]);
        assert_eq!(code, 0, "{err}");
        d.wait_until(|_| armed(&runtime, &name), "the reflex armed");
        let oom_before = cg.oom_kills();
        std::fs::write(&go, "").unwrap();
        // The line is reached about 240 ms after the go: kill anywhere from 200 to 300 ms.
        std::thread::sleep(Duration::from_micros(200_000 + rng.below(100_000)));
        d.kill_both();
        if held(cg, pid) {
            fired_at_kill += 1;
            if armed(&runtime, &name) {
                // Fired, and the engine had not yet recorded its pause.
                armed_at_kill += 1;
            }
        }
        cg.set_limit(1024 * MIB);
        let began = Instant::now();
        d = start(&state);
        if eventually(5.0, || !held(cg, pid)) {
            resumed_ms.push(began.elapsed().as_secs_f64() * 1000.0);
        } else {
            left_held += 1;
            eprintln!(
                "round {round}: still held after the restart: state {:?}\n{}",
                proc_state(pid),
                d.log_text()
            );
        }
        assert_eq!(
            cg.oom_kills(),
            oom_before,
            "round {round}: the OOM killer fired"
        );
        let _ = hog.kill();
        let _ = hog.wait();
        assert!(
            eventually(5.0, || d.job_state(&name).is_none()),
            "round {round}: the ended job stayed attached"
        );
    }
    resumed_ms.sort_by(f64::total_cmp);
    let p = |q: f64| {
        resumed_ms
            .get(((resumed_ms.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    eprintln!(
        "{rounds} kills: the reflex had stopped the hog at {fired_at_kill} of them ({armed_at_kill} before \
         the engine recorded the pause); left held after the restart {left_held}; running again after \
         the restart began: p50 {:.1} ms, max {:.1} ms",
        p(0.5),
        p(1.0)
    );
    assert!(
        fired_at_kill > 0,
        "no kill landed after the reflex fired; the test tests nothing"
    );
    assert_eq!(
        left_held, 0,
        "{left_held} of {rounds} rounds left the hog held"
    );
}
