//! The control socket: each refusal says its kind, so that callers act on it without reading the
//! words; a pause by hand lasts until someone resumes it.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::time::Duration;

use common::{Daemon, Opts, proc_state};

fn daemon() -> Daemon {
    Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    })
}

fn sleeper() -> Child {
    Command::new("sleep").arg("60").spawn().unwrap()
}

fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// Every refusal says its kind, so that callers act on it without reading the words: a bad request
/// is `invalid`, a missing job `not_found`, a pid or state already taken `conflict`.
#[test]
fn refusals_say_their_kind() {
    let d = daemon();
    let ask = |request: serde_json::Value| -> serde_json::Value {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("{request}\n").as_bytes()).unwrap();
        let mut out = String::new();
        BufReader::new(&s).read_line(&mut out).unwrap();
        serde_json::from_str(&out).unwrap()
    };
    let kind = |request: serde_json::Value| ask(request)["kind"].clone();
    assert_eq!(kind(serde_json::json!({"cmd": "garbage"})), "invalid");
    assert_eq!(
        kind(serde_json::json!({"cmd": "attach", "pid": 0})),
        "invalid"
    );
    assert_eq!(
        kind(serde_json::json!({"cmd": "pause", "target": "nope"})),
        "not_found"
    );
    assert_eq!(
        kind(serde_json::json!({"cmd": "attach_slurm", "job_id": "4x"})),
        "invalid"
    );
    let s = sleeper();
    let pid = s.id();
    let attached = ask(serde_json::json!({"cmd": "attach", "pid": pid, "name": "kinds"}));
    assert_eq!(attached["ok"], true, "{attached}");
    assert!(attached.get("kind").is_none(), "{attached}");
    assert_eq!(
        kind(serde_json::json!({"cmd": "attach", "pid": pid})),
        "conflict"
    );
    assert_eq!(
        kind(serde_json::json!({"cmd": "resume", "target": "kinds"})),
        "conflict"
    );
    assert_eq!(
        ask(serde_json::json!({"cmd": "pause", "target": "kinds"}))["ok"],
        true
    );
    assert_eq!(
        kind(serde_json::json!({"cmd": "pause", "target": "kinds"})),
        "conflict"
    );
    assert_eq!(
        ask(serde_json::json!({"cmd": "resume", "target": "kinds"}))["ok"],
        true
    );
    // Continued, it runs until it is back asleep in its nanosleep.
    common::wait::proc_state("the resumed sleeper asleep again", pid, |s| s == Some('S'));
    kill(s);
}

/// A pause by hand lasts until someone resumes it, as `memwatch pause --help` says: the longest
/// pause (1 s here) does not end it, and neither the API nor `memwatch status` shows a deadline.
#[test]
fn a_pause_by_hand_has_no_deadline_and_outlasts_the_longest_pause() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: "[policy]\nmax_pause_seconds = 1\n",
        ..Opts::default()
    });
    let s = sleeper();
    let pid = s.id();
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "hand"]).0, 0);
    assert_eq!(d.ctl(&["pause", "hand"]).0, 0);
    let job = || -> serde_json::Value {
        let (status, body) = d.get("/api/v1/jobs");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["jobs"]
            .as_array()
            .and_then(|j| j.iter().find(|j| j["name"] == "hand").cloned())
            .unwrap_or_else(|| panic!("job hand not in {v}"))
    };
    let j = job();
    assert_eq!(j["pause"]["by"], "user", "{j}");
    assert!(j["pause_deadline"].is_null(), "{j}");
    // Three times the longest pause, counted in samples (each one a chance for the policy to act).
    let since = std::time::Instant::now();
    while since.elapsed() < Duration::from_secs(3) {
        d.wait_samples(5);
    }
    let j = job();
    assert!(j["pause"].is_object(), "resumed by itself: {j}");
    assert!(j["pause_deadline"].is_null(), "{j}");
    assert_eq!(proc_state(pid), Some('T'));
    let (code, out, err) = common::memwatch(&["status", "--url", &d.url()]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("hand"))
        .unwrap_or_else(|| panic!("no line for the job in:\n{out}"));
    assert!(
        line.contains("by hand") && line.contains("until resumed") && !line.contains(" in "),
        "status says the pause ends: {line}"
    );
    assert_eq!(d.ctl(&["resume", "hand"]).0, 0);
    assert!(common::eventually(10.0, || proc_state(pid) != Some('T')));
    kill(s);
}
