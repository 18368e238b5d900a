//! A job that grows fast from its attach is stopped by its reflex while its v1 thresholds are still
//! being registered. The kernel takes each threshold under an RCU grace period (about 14 ms each
//! here, 250 to 300 ms for a job's 20), and each wakes the wake thread from its own write on, the
//! one nearest above the usage first. So the reflex is armed at the attach, not once the last one is
//! in.
//!
//! The hog holds 440 MiB of its 512 MiB limit (86 %, a worker's) before it is attached, and grows at
//! 512 MiB/s as soon as the attach returns: it crosses its critical line (95 %), whose threshold is
//! the first written, about 90 ms later, and would reach the limit about 140 ms later, inside the
//! registration. The engine probes once a second (as in tests/reflex.rs), so the stop is the
//! reflex's, or the engine's once it is woken by that same threshold (its event then does not name
//! the reflex). The daemon's log also says the reflex was armed before the thresholds were all
//! registered (where that took 50 ms or more). Before the reflex was armed from the registration's
//! start, the engine stopped the hog in 5 runs of 5. Kept in its own test binary so no other test competes with it
//! for the CPU.

mod common;

use common::cgroup::MemCgroup;
use common::{Daemon, eventually, memhog, proc_state};

const MIB: u64 = 1 << 20;

#[test]
fn a_job_growing_from_its_attach_is_stopped_by_its_reflex_while_its_thresholds_register() {
    let cg = MemCgroup::new(512 * MIB).expect("a memory cgroup (needs root)");
    if cg.version != 1 {
        common::skip::cannot_run(
            "reflex_attach",
            "no v1 memory controller: this reflex rides on v1 thresholds (the VM's scenarios test v2's)",
        );
        return;
    }
    let d = Daemon::level_only();
    let go = d.dir.path().join("go");
    let (mut hog, _out) = cg.hog(
        &memhog(),
        &[
            "--workers",
            "1",
            "--worker-mib",
            "440",
            "--rate-mib",
            "512",
            "--total-mib",
            "200",
            "--hold-ms",
            "60000",
        ],
        &go,
    );
    let pid = hog.id();
    assert!(
        eventually(10.0, || cg.usage() >= 440 * MIB),
        "the worker never held its 440 MiB: usage {} MiB",
        cg.usage() / MIB
    );
    let (code, _, err) = d.ctl(&["attach", &pid.to_string(), "--name", "hog"]);
    assert_eq!(code, 0, "attach: {err}");
    std::fs::write(&go, "").unwrap();
    assert!(
        eventually(5.0, || cg.paused(pid)),
        "not paused (state {:?}, OOM kills {})\n{}",
        proc_state(pid),
        cg.oom_kills(),
        d.log_text()
    );
    let pause = |d: &Daemon| {
        d.events()
            .into_iter()
            .find(|e| e["job"] == "hog" && e["action"] == "pause")
            .map(|e| e["detail"].as_str().unwrap_or_default().to_owned())
    };
    d.wait_until(|d| pause(d).is_some(), "the pause event");
    let detail = pause(&d).unwrap_or_default();
    // The most the cgroup held (v1 keeps its peak): what the hog took before it stopped.
    let peak = std::fs::read_to_string(cg.dir.join("memory.max_usage_in_bytes"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(0);
    println!(
        "peak {:.1} MiB, {:.2} % of the limit",
        peak as f64 / MIB as f64,
        peak as f64 * 100.0 / (512 * MIB) as f64
    );
    assert!(
        detail.contains("stopped by the reflex"),
        "the pause was not the reflex's: {detail}\n{}",
        d.log_text()
    );
    assert_eq!(cg.oom_kills(), 0, "the OOM killer fired");
    d.wait_until(
        |d| d.log_text().contains("v1 thresholds registered"),
        "the registration's end",
    );
    // The daemon's own order of things: its log is written line by line as they happen. The reflex
    // is armed before the last threshold is in. Where the kernel took them all in under 50 ms
    // there is no window worth the name, and the order says nothing either way.
    let log = d.log_text();
    let at = |what: &str| log.lines().position(|l| l.contains(what));
    let (armed, stopped, registered) = (
        at("\"reflex armed\""),
        at("the reflex stopped the job at its critical line"),
        at("v1 thresholds registered"),
    );
    let took_ms = registered
        .and_then(|i| log.lines().nth(i))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .and_then(|v| v["fields"]["took_ms"].as_f64())
        .unwrap_or(0.0);
    if took_ms >= 50.0 {
        assert!(
            armed.is_some() && armed < registered,
            "the reflex was not armed while the thresholds registered ({took_ms:.0} ms; log \
             lines {armed:?} and {registered:?}):\n{log}"
        );
    } else {
        println!("the kernel registered the thresholds in {took_ms:.1} ms: no window to arm in");
    }
    // Whether the hog reached its line inside the registration depends on how soon it ran: on a
    // busy machine it may cross later, where the reflex stops it all the same.
    println!(
        "{detail}; registered in {took_ms:.0} ms, the stop {} the last threshold",
        if stopped < registered {
            "before"
        } else {
            "after"
        }
    );
    hog.kill().unwrap();
    hog.wait().unwrap();
}
