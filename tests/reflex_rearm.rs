//! A job resumed between full samples gets its reflex back at once. The daemon samples every 30 s
//! and probes in between; a hog at 1 GiB/s into a 512 MiB v1 memory cgroup is stopped by its reflex
//! at the critical line, the test raises the limit, and a probe sees the room and resumes the hog.
//! From that resume the reflex must be armed again (recorded in the state file, at the new limit's
//! line) long before the next full sample: a job resumed while it still grows is never left
//! without its reflex until then. Kept in its own test binary, as tests/reflex.rs.

mod common;

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, eventually, memhog, recorded_pause};

const MIB: u64 = 1 << 20;

#[test]
fn a_job_resumed_by_a_probe_is_armed_again_before_the_next_sample() {
    let cg = MemCgroup::new(512 * MIB).expect("a memory cgroup (needs root)");
    if cg.version != 1 {
        common::skip::cannot_run(
            "reflex_rearm",
            "no v1 memory controller: this reflex rides on v1 thresholds (the VM's scenarios test v2's)",
        );
        return;
    }
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 30_000,
        extra_config: "[policy]\nreaction_ms = 0\n",
        sampling: "probe_interval_ms = 200\nfast_interval_ms = 100",
        ..Opts::default()
    });
    let go = d.dir.path().join("go");
    let (mut hog, _out) = cg.hog(
        &memhog(),
        &[
            "--rate-mib",
            "1024",
            "--total-mib",
            "768",
            "--hold-ms",
            "60000",
        ],
        &go,
    );
    let (code, _, err) = d.ctl(&["attach", &hog.id().to_string(), "--name", "hog"]);
    assert_eq!(code, 0, "attach: {err}");
    let armed =
        |d: &Daemon| recorded_pause(&d.runtime, "hog").is_some_and(|p| p["phase"] == "armed");
    d.wait_until(armed, "the reflex armed at attach");
    std::fs::write(&go, "").unwrap();
    d.wait_until(
        |d| {
            d.events()
                .iter()
                .any(|e| e["action"] == "pause" && e["job"] == "hog")
        },
        "the hog paused at its line",
    );
    d.wait_until(
        |d| recorded_pause(&d.runtime, "hog").is_some_and(|p| p["phase"] == "held"),
        "the pause held",
    );
    // Room: the next probe reads the new limit and resumes the hog, which grows on.
    cg.set_limit(3072 * MIB);
    d.wait_until(
        |d| {
            d.events()
                .iter()
                .any(|e| e["action"] == "resume" && e["job"] == "hog")
        },
        "the hog resumed once its limit was raised",
    );
    // Armed again well within the 30 s to the next full sample.
    assert!(
        eventually(5.0, || armed(&d)),
        "no reflex 5 s after the resume: {:?}\nevents: {:#?}",
        recorded_pause(&d.runtime, "hog"),
        d.events()
    );
    let line =
        d.jobs().into_iter().find(|j| j["name"] == "hog").unwrap()["reflex"]["critical_bytes"]
            .as_u64()
            .unwrap_or(0);
    assert!(
        line > 2048 * MIB,
        "the reflex is not at the raised limit's line: {line}"
    );
    assert_eq!(cg.oom_kills(), 0, "the OOM killer fired");
    hog.kill().unwrap();
    hog.wait().unwrap();
}
