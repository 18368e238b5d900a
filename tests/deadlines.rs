//! Deadlines are kept however far apart samples are: with a full sample every 10 s, a pause's longest
//! length (1 s) and the grace between SIGTERM and SIGKILL (10 s) end on time, within 50 ms, woken by
//! the engine's own next deadline rather than by the next sample.

mod common;

use std::process::{Child, Command};

use common::{Daemon, Opts, eventually, proc_state};

fn gpu_state(temp: u32, pid: u32) -> String {
    format!(
        r#"{{"devices":[{{"name":"Fake","uuid":"GPU-x","memory_total":1000000000,"memory_used":100000000,
        "temperature":{temp},"threshold_slowdown":90,"threshold_shutdown":98,
        "processes":[{{"pid":{pid},"used_memory":100000000}}]}}]}}"#
    )
}

/// A job that ignores SIGTERM (the shell and its sleep both), so that only the SIGKILL ends it.
fn stubborn() -> Child {
    Command::new("sh")
        .args(["-c", "trap '' TERM; sleep 600"])
        .spawn()
        .unwrap()
}

fn event_ms(d: &Daemon, action: &str) -> Option<u64> {
    d.events()
        .iter()
        .find(|e| e["action"] == action && e["job"] == "slow")
        .and_then(|e| e["timestamp_ms"].as_u64())
}

#[test]
fn a_grace_ends_on_time_with_samples_ten_seconds_apart() {
    let mut job = stubborn();
    let pid = job.id();
    let hot = gpu_state(97, pid);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: Some(&hot),
        interval_ms: 10_000,
        extra_config: "[policy]\nmax_pause_seconds = 1\non_max_pause = \"terminate\"\n\
                       [policy.gpu_temperature]\naction = \"pause\"\nenter_hold_ms = 0\n",
        ..Opts::default()
    });
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "slow"]).0, 0);
    // Paused at the first sample that sees the job on the hot GPU (within one interval).
    assert!(
        eventually(25.0, || event_ms(&d, "pause").is_some()),
        "never paused: {:?}",
        d.events()
    );
    let paused = event_ms(&d, "pause").unwrap();
    assert!(eventually(5.0, || proc_state(pid) == Some('T')));
    assert!(
        eventually(15.0, || event_ms(&d, "terminate").is_some()),
        "never terminated: {:?}",
        d.events()
    );
    let terminated = event_ms(&d, "terminate").unwrap();
    assert!(
        eventually(25.0, || event_ms(&d, "kill").is_some()),
        "never killed: {:?}",
        d.events()
    );
    let killed = event_ms(&d, "kill").unwrap();
    let status = job.wait().unwrap();
    assert!(!status.success(), "{status:?}");
    let (longest, grace) = (terminated - paused, killed - terminated);
    eprintln!("longest pause: {longest} ms of 1000; grace: {grace} ms of 10000");
    assert!(
        (1000..=1050).contains(&longest),
        "the 1 s pause ended after {longest} ms (samples every 10 s)"
    );
    assert!(
        (10_000..=10_050).contains(&grace),
        "SIGKILL came {grace} ms after SIGTERM, not at the 10 s grace (samples every 10 s)"
    );
}
