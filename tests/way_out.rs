//! A pause must lead somewhere. A real PyTorch job (tests/trainer/dataloader.py: batch 32 ×
//! accumulation 2, a DataLoader with 4 workers and pin_memory) runs in a real memory cgroup that fits it
//! with 2 workers, not 4; the workers fill their caches within a second of epoch 0, so no epoch boundary
//! comes before the pause. memwatch must find the way out:
//! (a) a trainer speaking the protocol applies the cut mid-epoch on emergency swap (zram), finishes every
//!     epoch with the effective batch kept and no OOM kill, and the swap is cleared and removed;
//! (b) a trainer that knows nothing of memwatch, under `memwatch launch`, saves its checkpoint when asked
//!     (SIGUSR1), is stopped cleanly, relaunched with 2 workers from the rewritten config, and finishes
//!     (its ladder without the swap rung, which would push its held memory out and resume it whole
//!     before any checkpoint: `tests/reclaim.rs`);
//! (c) with every way out disabled the job ends at the maximum pause with a clear account, and no
//!     process of it is left stopped;
//! and a daemon killed while the job runs on emergency swap leaves, after a restart, no swap device.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::python::ready_python;
use common::{Daemon, Opts, eventually};

/// The trainer's config: fits 850 MiB with 2 workers of 160 MiB each, not with 4.
fn write_config(dir: &Path, epochs: u32) -> PathBuf {
    let cfg = dir.join("train.json");
    std::fs::write(
        &cfg,
        format!(
            "{{\"train\": {{\"micro_batch\": 32, \"accumulation\": 2, \"workers\": 4, \"pin_memory\": true}},\n \
             \"epochs\": {epochs}, \"samples\": 2048, \"cache_mib\": 160, \"step_ms\": 20}}\n"
        ),
    )
    .unwrap();
    cfg
}

const LIMIT: u64 = 850 << 20;

fn wait_exit(child: &mut Child, secs: u64) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn account(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out).unwrap_or_default()).unwrap_or_default()
}

/// The events of the daemon's state directory (the API redacts their details).
fn events_text(d: &Daemon) -> String {
    std::fs::read_to_string(d.dir.path().join("state/events.jsonl")).unwrap_or_default()
}

/// The emergency swap devices memwatch recorded (in state directory `state`) and has not removed.
fn swap_records(state: &Path) -> usize {
    std::fs::read_dir(state.join("emergency-swap"))
        .map(|r| r.count())
        .unwrap_or(0)
}

/// The emergency swap devices a daemon made, from its events ("… MiB on /dev/zramN").
fn devices_made(events: &str) -> Vec<String> {
    let mut out: Vec<String> = events
        .split(" MiB on ")
        .skip(1)
        .filter_map(|s| s.split(['"', ' ']).next().map(str::to_owned))
        .collect();
    out.dedup();
    out
}

/// Held by a test while it makes emergency swap: zram numbers are reused, so a device another test
/// made at once could pass for one this test's daemon left behind.
static SWAP_MAKERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn making_swap() -> std::sync::MutexGuard<'static, ()> {
    SWAP_MAKERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Which of `devices` are still swap devices (in /proc/swaps) or still exist.
fn still_there(devices: &[String]) -> Vec<String> {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    devices
        .iter()
        .filter(|d| {
            swaps
                .lines()
                .any(|l| l.split_whitespace().next() == Some(d.as_str()))
                || Path::new(&d.replace("/dev/", "/sys/block/")).exists()
        })
        .cloned()
        .collect()
}

/// Processes left stopped (state T) whose command line names `marker`.
fn stopped_left(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
                        && common::proc_state(*pid) == Some('T')
                })
                .count()
        })
        .unwrap_or(0)
}

/// One line for scripts/bench-way-out.sh (seen with --nocapture).
fn bench_line(
    scenario: &str,
    finished: bool,
    oom_kills: u64,
    marker: &str,
    seconds: f64,
    events: &str,
) {
    let peak: u64 = events
        .split("(peak use ")
        .skip(1)
        .filter_map(|s| s.split(' ').next()?.parse().ok())
        .max()
        .unwrap_or(0);
    println!(
        "bench: {}",
        serde_json::json!({
            "scenario": scenario, "finished": finished, "oom_kills": oom_kills,
            "stopped_left": stopped_left(marker), "seconds": seconds, "swap_peak_mib": peak,
        })
    );
}

fn protocol_trainer(
    d: &Daemon,
    cg: &common::cgroup::MemCgroup,
    python: &Path,
    cfg: &Path,
    out: &Path,
) -> Child {
    let script = common::repo().join("tests/trainer/dataloader.py");
    cg.spawn(
        Path::new("/usr/bin/env"),
        &[
            &format!("MEMWATCH_SOCKET={}", d.socket.display()),
            &format!("MEMWATCH_URL={}", d.url()),
            python.to_str().unwrap(),
            script.to_str().unwrap(),
            cfg.to_str().unwrap(),
            out.to_str().unwrap(),
            "protocol",
        ],
    )
}

#[test]
fn a_protocol_trainer_takes_the_fix_now_on_emergency_swap() {
    fix_now_on_swap("", "zram", "a");
}

/// The same without zram: a swapfile on a local disk.
#[test]
fn a_protocol_trainer_takes_the_fix_now_on_an_emergency_swapfile() {
    fix_now_on_swap(
        "zram = false\nswapfile_dir = \"/var/tmp\"\nswap_max_mib = 1024\n",
        "swapfile",
        "a-swapfile",
    );
}

fn fix_now_on_swap(way_out: &str, kind: &str, scenario: &str) {
    let _alone = making_swap();
    let Some(python) = ready_python("way_out") else {
        return;
    };
    let config = format!(
        "[policy]\nmax_pause_seconds = 120\n[adapt]\nverify_seconds = 15\n\
         [way_out]\nsteps = [\"swap\", \"checkpoint\"]\ndecide_seconds = 2\nfix_seconds = 40\n{way_out}"
    );
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: &config,
        ..Opts::default()
    });
    let cfg = write_config(d.dir.path(), 3);
    let out = d.dir.path().join("out.json");
    let cg = common::cgroup::MemCgroup::new(LIMIT).expect("a memory cgroup (needs root)");
    let started = Instant::now();
    let mut trainer = protocol_trainer(&d, &cg, &python, &cfg, &out);
    let status = wait_exit(&mut trainer, 240);
    let seconds = started.elapsed().as_secs_f64();
    let a = account(&out);
    // The swap is cleared and removed (once RAM can take its pages back); the event comes after the
    // record is gone, when the daemon hears that the removal is done.
    let cleared = eventually(60.0, || swap_records(&d.dir.path().join("state")) == 0);
    let events = common::wait::poll(
        || events_text(&d),
        |e| !cleared || e.contains("cleared and removed"),
    )
    .unwrap_or_else(|last| last);
    bench_line(
        scenario,
        status.is_some_and(|s| s.success()) && a["epochs_done"] == 3,
        cg.oom_kills(),
        out.to_str().unwrap(),
        seconds,
        &events,
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "the trainer did not finish: {status:?}\n{a}\n{events}"
    );
    assert_eq!(cg.oom_kills(), 0, "{events}");
    assert_eq!(a["epochs_done"], 3, "{a}");
    assert!(
        a["urgent"].as_u64() >= Some(1),
        "no urgent change: {a}\n{events}"
    );
    // Workers 4 → 2 mid-epoch, then 2 at every later epoch; the effective batch never moved.
    let workers: Vec<u64> = a["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_u64())
        .collect();
    assert_eq!(workers.first(), Some(&4), "{a}");
    assert_eq!(workers.last(), Some(&2), "{a}");
    assert!(
        a["effective"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e.as_u64() == Some(64)),
        "{a}"
    );
    assert!(
        events.contains(&format!("of emergency swap ({kind})")),
        "{events}"
    );
    assert!(events.contains("applied mid-epoch"), "{events}");
    assert!(cleared, "{events}");
    assert!(events.contains("cleared and removed"), "{events}");
    let made = devices_made(&events);
    assert!(!made.is_empty(), "{events}");
    assert!(still_there(&made).is_empty(), "{made:?} left: {events}");
}

#[test]
fn a_trainer_that_knows_nothing_is_checkpointed_stopped_and_relaunched() {
    let Some(python) = ready_python("way_out") else {
        return;
    };
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: "[policy]\nmax_pause_seconds = 120\ncheckpoint_signal = \"SIGUSR1\"\n\
                       [way_out]\nsteps = [\"lend\", \"checkpoint\"]\ndecide_seconds = 2\n\
                       checkpoint_grace_seconds = 3\n",
        ..Opts::default()
    });
    let cfg = write_config(d.dir.path(), 3);
    let out = d.dir.path().join("out.json");
    let script = common::repo().join("tests/trainer/dataloader.py");
    let started = Instant::now();
    let launch = Command::new(common::bin())
        .args(["launch", "--name", "plain", "--memory-max", "850M"])
        .args(["--max-restarts", "3", "--config-file"])
        .arg(&cfg)
        .args(["--profile", "generic"])
        .args(["--key", "batch=train.micro_batch"])
        .args(["--key", "accumulation=train.accumulation"])
        .args(["--key", "workers=train.workers"])
        .args(["--key", "pin_memory=train.pin_memory"])
        .arg("--socket")
        .arg(&d.socket)
        .arg("--")
        .arg(&python)
        .arg(&script)
        .arg(&cfg)
        .arg(&out)
        .args(["plain", "{resume}"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let result = launch.wait_with_output().unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let text = format!(
        "{}{}\n{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr),
        events_text(&d)
    );
    let a = account(&out);
    let oom_kills = text.matches("OOM killer fired").count() as u64;
    bench_line(
        "b",
        result.status.success() && a["epochs_done"] == 3,
        oom_kills,
        out.to_str().unwrap(),
        seconds,
        &text,
    );
    assert!(result.status.success(), "{text}");
    assert_eq!(oom_kills, 0, "{text}");
    assert_eq!(a["epochs_done"], 3, "{a}\n{text}");
    assert_eq!(a["resumed"], true, "{a}\n{text}");
    assert!(a["checkpoints"].as_u64() >= Some(1), "{a}");
    // The relaunched run read the rewritten config: 2 workers.
    assert_eq!(a["workers"].as_array().unwrap().last().unwrap(), 2, "{a}");
    assert!(text.contains("checkpoint requested (SIGUSR1)"), "{text}");
    assert!(text.contains("stopped by memwatch"), "{text}");
    assert!(text.contains("run 2: finished"), "{text}");
}

#[test]
fn with_no_way_out_the_job_ends_with_an_account_and_nothing_stopped() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: "[policy]\nmax_pause_seconds = 4\n[way_out]\nsteps = []\ndecide_seconds = 1\n",
        ..Opts::default()
    });
    let cg = common::cgroup::MemCgroup::new(512 << 20).expect("a memory cgroup (needs root)");
    let go = d.dir.path().join("go");
    let mut hog = cg.spawn_hog(&go, &["--workers", "2"]);
    let pid = hog.id();
    let (code, text, err) = d.ctl(&["attach", &pid.to_string(), "--name", "stuck"]);
    assert_eq!(code, 0, "{text}{err}");
    std::fs::write(&go, "").unwrap();
    assert!(
        eventually(20.0, || d.job_state("stuck").as_deref() == Some("paused")),
        "never paused: {:?}",
        d.jobs()
    );
    assert!(wait_exit(&mut hog, 30).is_some(), "the job was not ended");
    let events = events_text(&d);
    assert!(
        events.contains("no way out (no step configured)"),
        "{events}"
    );
    assert!(
        events.contains("stopped cleanly 4 s into its pause"),
        "{events}"
    );
    assert_eq!(cg.oom_kills(), 0, "{events}");
    // Nothing of it left stopped: the cgroup empties (workers included).
    assert!(
        eventually(15.0, || std::fs::read_to_string(
            cg.dir.join("cgroup.procs")
        )
        .is_ok_and(|p| p.trim().is_empty())),
        "left behind: {:?}",
        std::fs::read_to_string(cg.dir.join("cgroup.procs"))
    );
    // `memwatch jobs` says how it ended.
    assert!(eventually(5.0, || {
        let (_, text, _) = d.ctl(&["jobs"]);
        text.contains("stopped by memwatch")
    }));
}

fn limit_of(cg: &common::cgroup::MemCgroup) -> u64 {
    let file = if cg.version == 1 {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    std::fs::read_to_string(cg.dir.join(file))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The lend step (opted in): the job's own limit is raised for the fix and put back once it fits.
#[test]
fn a_protocol_trainer_takes_the_fix_now_on_a_lent_limit() {
    let Some(python) = ready_python("way_out") else {
        return;
    };
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: "[policy]\nmax_pause_seconds = 120\n[adapt]\nverify_seconds = 15\n\
                       [way_out]\nsteps = [\"lend\", \"checkpoint\"]\nlend = true\ndecide_seconds = 2\nfix_seconds = 40\n",
        ..Opts::default()
    });
    let cfg = write_config(d.dir.path(), 2);
    let out = d.dir.path().join("out.json");
    let cg = common::cgroup::MemCgroup::new(LIMIT).expect("a memory cgroup (needs root)");
    let mut trainer = protocol_trainer(&d, &cg, &python, &cfg, &out);
    let status = wait_exit(&mut trainer, 240);
    let a = account(&out);
    let back = eventually(30.0, || events_text(&d).contains("back at 850 MiB"));
    let events = events_text(&d);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{a}\n{events}"
    );
    assert_eq!(cg.oom_kills(), 0, "{events}");
    assert_eq!(a["epochs_done"], 2, "{a}");
    assert!(events.contains("from 850 to"), "never lent: {events}");
    assert!(events.contains("applied mid-epoch"), "{events}");
    assert!(back, "the limit was not put back: {events}");
    assert_eq!(limit_of(&cg), LIMIT);
}

#[test]
fn a_daemon_killed_on_emergency_swap_leaves_no_swap_after_restart() {
    let _alone = making_swap();
    let config = "[policy]\nmax_pause_seconds = 120\n\
                  [way_out]\nsteps = [\"swap\"]\ndecide_seconds = 2\nfix_seconds = 60\n";
    // Killed as soon as the swap is on: while the job runs on it to its fix.
    let made = std::cell::RefCell::new(Vec::new());
    crash_on_the_way_out(
        config,
        |state, _| {
            *made.borrow_mut() = devices_made(&read_events(state));
            !made.borrow().is_empty()
        },
        |_, _| {
            let made = made.borrow();
            assert_eq!(still_there(&made), *made, "the swap went with the daemon");
        },
        |state, _| still_there(&made.borrow()).is_empty() && swap_records(state) == 0,
    );
}

/// A daemon killed while it lends leaves, after a restart, the limit as it was.
#[test]
fn a_daemon_killed_while_lending_leaves_no_raised_limit_after_restart() {
    let config = "[policy]\nmax_pause_seconds = 120\n\
                  [way_out]\nsteps = [\"lend\"]\nlend = true\ndecide_seconds = 2\nfix_seconds = 60\n";
    crash_on_the_way_out(
        config,
        |_, cg| limit_of(cg) > LIMIT,
        |_, cg| assert!(limit_of(cg) > LIMIT, "the loan went with the daemon"),
        |_, cg| limit_of(cg) == LIMIT,
    );
}

fn read_events(state: &Path) -> String {
    std::fs::read_to_string(state.join("events.jsonl")).unwrap_or_default()
}

/// Runs the protocol trainer (50 epochs) under a daemon with `config`; once `taken` holds, kills the
/// daemon and its guardian (`after_crash` checks what was left), ends the job as if it had been killed
/// while the daemon was down, restarts the daemon on the same state and waits for `settled`.
fn crash_on_the_way_out(
    config: &str,
    taken: impl Fn(&Path, &common::cgroup::MemCgroup) -> bool,
    after_crash: impl Fn(&Path, &common::cgroup::MemCgroup),
    settled: impl Fn(&Path, &common::cgroup::MemCgroup) -> bool,
) {
    let Some(python) = ready_python("way_out") else {
        return;
    };
    let dir = common::tempdir();
    let state = dir.path().join("state");
    let start = || {
        Daemon::start(Opts {
            root: "/".into(),
            gpu_state: None,
            extra_config: config,
            state: Some(state.clone()),
            ..Opts::default()
        })
    };
    let mut d = start();
    let cfg = write_config(d.dir.path(), 50);
    let out = d.dir.path().join("out.json");
    let cg = common::cgroup::MemCgroup::new(LIMIT).expect("a memory cgroup (needs root)");
    let mut trainer = protocol_trainer(&d, &cg, &python, &cfg, &out);
    assert!(
        eventually(90.0, || taken(&state, &cg)),
        "the step was never taken: {}",
        read_events(&state)
    );
    d.wait_guardian_pid();
    d.crash(true);
    after_crash(&state, &cg);
    for pid in std::fs::read_to_string(cg.dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
    {
        let _ = Command::new("kill").args(["-KILL", pid]).status();
    }
    let _ = trainer.wait();
    let _d = start();
    assert!(
        eventually(30.0, || settled(&state, &cg)),
        "not settled after the restart: limit {}, {}",
        limit_of(&cg),
        read_events(&state)
    );
}
