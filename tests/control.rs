//! The control socket's refusals: each says its kind, so that callers act on it without reading
//! the words.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::time::Duration;

use common::{Daemon, Opts};

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
