//! Quiet when calm, on the real host (its PSI trigger is what lets memwatch stretch): no job, nothing
//! near a line, and nobody reading, the daemon takes no full sample for its calm interval; a read of
//! the data asks for one and gets it.

mod common;

use common::{Daemon, Opts};

/// Lines far from anything a busy test machine reaches, so that only calm is tested here.
const LINES: &str = "[policy.host_memory]\nwarn = 0.96\ncritical = 0.98\n\
                     [policy.swap]\nwarn = 0.96\ncritical = 0.98\n\
                     [policy.pressure]\nwarn = 0.96\ncritical = 0.98\n";

fn points(d: &Daemon) -> Vec<u64> {
    let (status, body) = d.get("/api/v1/history?seconds=600");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["timestamp_ms"].as_u64().unwrap())
        .collect()
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn a_calm_daemon_samples_when_read_and_not_in_between() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 200,
        calm_interval_ms: Some(60_000),
        extra_config: LINES,
        ..Default::default()
    });
    let first = points(&d);
    let newest = *first.last().expect("a read gets a sample");
    // Three seconds unread: at 200 ms a daemon that is not calm takes 15 samples.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let asked = wall_ms();
    let second = points(&d);
    let taken: Vec<u64> = second.iter().copied().filter(|t| *t > newest).collect();
    assert!(
        taken.len() <= 2,
        "{} full samples in 3 s unread, calm: {taken:?}\n{}",
        taken.len(),
        d.log_text()
    );
    // The read asked for a sample and got it: the newest is the read's own, not 3 s old.
    let fresh = *taken.last().expect("the read took a fresh sample");
    assert!(
        fresh + 1000 >= asked,
        "the newest sample is {} ms older than the read",
        asked.saturating_sub(fresh)
    );
}
