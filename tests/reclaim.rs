//! A pause that makes room (issue 69's first case): a plain job, attached without a config file,
//! needs 1.4 GiB in a 1 GiB memory cgroup (v1 memory + freezer here, cgroup v2 in the VM), under
//! the shipped defaults with zram available. memwatch holds it at its line; no fix can be applied,
//! so the swap step makes emergency swap and pushes the held job's memory out to it while it is
//! frozen (its cgroup's usage falls while frozen), then resumes it into that room. The job finishes
//! with every byte it wrote intact (each 16 MiB chunk's SHA-256 checked), and nothing was OOM-killed;
//! the emergency swap is taken off once the job has ended.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, Opts, eventually};

/// The plain job: says `ready`; once file `argv[2]` exists, writes `argv[1]` MiB of random bytes in 16 MiB chunks (keeping each chunk's
/// SHA-256), then reads each chunk back against its sum and lets it go; prints what was intact.
const PLAIN: &str = r#"
import hashlib, os, sys, time
mib = int(sys.argv[1])
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
chunks, sums = [], []
for i in range(mib // 16):
    b = os.urandom(16 << 20)
    chunks.append(b)
    sums.append(hashlib.sha256(b).digest())
    time.sleep(0.01)
ok = 0
for i in range(len(chunks)):
    ok += hashlib.sha256(chunks[i]).digest() == sums[i]
    chunks[i] = None
print("intact", ok * 16, "of", mib, "MiB", flush=True)
sys.exit(0 if ok == len(sums) else 3)
"#;

/// The number after `before` in `text` (as "its cgroup 973 → 2 MiB").
fn number_after(text: &str, before: &str) -> Option<u64> {
    let at = text.find(before)? + before.len();
    text[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn a_plain_job_is_pushed_out_while_held_and_finishes() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let mut cg = common::cgroup::MemCgroup::new(1 << 30).expect("a memory cgroup (needs root)");
    if cg.version == 1 {
        assert!(cg.with_freezer(), "no v1 freezer here");
    }
    let go = d.dir.path().join("go");
    let go_arg = go.display().to_string();
    let mut job = cg.spawn(
        Path::new("/usr/bin/python3"),
        &["-c", PLAIN, "1400", &go_arg],
    );
    let pid = job.id();
    // In its cgroups (the shell before it moved itself in) before it is attached.
    let mut stdout = BufReader::new(job.stdout.take().expect("its stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let (code, text, err) = d.ctl(&["attach", &pid.to_string(), "--name", "plain"]);
    assert_eq!(code, 0, "{text}{err}");
    // It grows once memwatch watches its line (its reflex armed, as for any job with a limit).
    d.wait_until(
        |d| {
            d.jobs()
                .iter()
                .any(|j| j["name"] == "plain" && !j["reflex"].is_null())
        },
        "the reflex armed",
    );
    std::fs::write(&go, "").unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = job.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the job did not finish: {}",
            events(&d)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    stdout.read_to_string(&mut out).unwrap();
    let events = events(&d);
    eprintln!("{out}\n{events}");
    assert!(status.success(), "{status}: {out}\n{events}");
    assert!(out.contains("intact 1392 of 1400 MiB"), "{out}");
    assert_eq!(cg.oom_kills(), 0, "{events}");
    // Held, then pushed out while held: its usage fell while it was frozen.
    let pushed = events
        .lines()
        .find(|l| l.contains("pushed out to swap while held"))
        .unwrap_or_else(|| panic!("no reclaim: {events}"));
    let (before, after) = (
        number_after(pushed, "its cgroup").expect("usage before"),
        number_after(pushed, "→").expect("usage after"),
    );
    assert!(
        before >= 900 && after + 512 <= before,
        "usage {before} → {after} MiB: {pushed}"
    );
    // Resumed by the way out into that room, or by its level as the push brought it down.
    assert!(
        events.contains("resumed into the room its memory pushed out to swap made")
            || pushed.contains("the job was resumed as its room came back"),
        "{events}"
    );
    assert!(!events.contains("\"action\":\"terminate\""), "{events}");
    // The emergency swap goes once the job has ended.
    assert!(
        eventually(60.0, || !std::fs::read_to_string("/proc/swaps")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(
                |l| events.contains(l.split_whitespace().next().unwrap_or("-"))
            )),
        "emergency swap left on: {}",
        std::fs::read_to_string("/proc/swaps").unwrap_or_default()
    );
}

/// The events of the daemon's state directory (the API redacts their details).
fn events(d: &Daemon) -> String {
    std::fs::read_to_string(d.dir.path().join("state/events.jsonl")).unwrap_or_default()
}
