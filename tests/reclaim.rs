//! A pause that makes room: a plain job, attached without a config file, needs 1.4 GiB in a 1 GiB
//! memory cgroup (v1 memory + freezer here; cgroup v2 in the VM's `way-out-v2`), under the shipped
//! defaults with zram available. memwatch holds it at its line; no fix can be applied, so the swap
//! step makes emergency swap and pushes the held job's memory out to it while it is frozen (its
//! cgroup's usage falls while frozen), then resumes it into that room. The job finishes with every
//! byte it wrote intact (each 16 MiB chunk checked against the same bytes made again), and nothing
//! was OOM-killed; the emergency swap is taken off once the job has ended.
//!
//! With `MEMWATCH_BENCH=1` (`scripts/bench-reclaim.sh`), the sizes come from `MEMWATCH_RECLAIM_LIMIT_MIB`
//! and `MEMWATCH_RECLAIM_TOTAL_MIB`, and the run prints one `bench:` JSON line: what moved and how
//! fast, the cgroup's usage and the host's MemAvailable before and after, the time from the pause to
//! the resume, the refaults of the first 10 s after it, and the job's digest of all it wrote.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, Opts, eventually};

/// The plain job: says `ready`; once file `argv[2]` exists, writes `argv[1]` MiB in 16 MiB chunks
/// of anonymous memory of their own (`mmap`, so that a chunk let go goes back to the kernel; chunk i
/// is SHAKE-256 of "i", so any run makes the same bytes), then checks each chunk against the same
/// bytes made again and lets it go; prints how much was intact and the SHA-256 of it all.
const PLAIN: &str = r#"
import hashlib, mmap, os, sys, time
mib = int(sys.argv[1])
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
make = lambda i: hashlib.shake_256(b"%d" % i).digest(16 << 20)
chunks = []
for i in range(mib // 16):
    m = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.write(make(i))
    chunks.append(m)
    time.sleep(0.01)
ok, whole = 0, hashlib.sha256()
for i in range(len(chunks)):
    b = chunks[i][:]
    whole.update(b)
    ok += b == make(i)
    chunks[i].close()
    chunks[i] = b = None
print("intact", ok * 16, "of", mib, "MiB", whole.hexdigest(), flush=True)
sys.exit(0 if ok == len(chunks) else 3)
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

/// The host's MemAvailable (MiB).
fn mem_available_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

fn env_mib(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn a_plain_job_is_pushed_out_while_held_and_finishes() {
    let bench = std::env::var_os("MEMWATCH_BENCH").is_some();
    let limit = env_mib("MEMWATCH_RECLAIM_LIMIT_MIB", 1024);
    let total = env_mib("MEMWATCH_RECLAIM_TOTAL_MIB", 1400);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let mut cg = common::cgroup::MemCgroup::new(limit << 20).expect("a memory cgroup (needs root)");
    if cg.version == 1 {
        assert!(cg.with_freezer(), "no v1 freezer here");
    }
    let go = d.dir.path().join("go");
    let go_arg = go.display().to_string();
    let total_arg = total.to_string();
    let mut job = cg.spawn(
        Path::new("/usr/bin/python3"),
        &["-c", PLAIN, &total_arg, &go_arg],
    );
    let pid = job.id();
    // In its cgroups (the shell moved itself in before the exec) before it is attached.
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
    // Watched as it goes: the host's MemAvailable at the pause and at the push's end, the cgroup's
    // refaults 10 s after the resume.
    let started = Instant::now();
    let (mut avail_paused, mut avail_pushed, mut resumed_at) = (None, None, None);
    let (mut refaults_10s, mut refaults_at) = (None, None);
    let status = loop {
        if let Some(s) = job.try_wait().unwrap() {
            break s;
        }
        let ev = events(&d);
        if avail_paused.is_none() && ev.contains("\"action\":\"pause\"") {
            avail_paused = Some(mem_available_mib());
        }
        if avail_pushed.is_none() && ev.contains("pushed out to swap while held") {
            avail_pushed = Some(mem_available_mib());
            resumed_at = Some(Instant::now());
            refaults_at = d
                .jobs()
                .iter()
                .find(|j| j["name"] == "plain")
                .and_then(|j| j["way_out"]["reclaimed"]["refaults_at"].as_u64());
        }
        if refaults_10s.is_none()
            && resumed_at.is_some_and(|t| t.elapsed() >= Duration::from_secs(10))
        {
            refaults_10s = cgroup_stat(&cg.dir, "workingset_refault_anon");
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the job did not finish: {ev}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    stdout.read_to_string(&mut out).unwrap();
    let events = events(&d);
    eprintln!("{out}\n{events}");
    assert!(status.success(), "{status}: {out}\n{events}");
    let whole = total / 16 * 16;
    assert!(
        out.contains(&format!("intact {whole} of {total} MiB")),
        "{out}"
    );
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
        before >= limit * 85 / 100 && after + limit / 2 <= before,
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
    if bench {
        let at = |needle: &str| {
            events.lines().find(|l| l.contains(needle)).and_then(|l| {
                serde_json::from_str::<serde_json::Value>(l).ok()?["timestamp_ms"].as_u64()
            })
        };
        let line = serde_json::json!({
            "limit_mib": limit,
            "total_mib": total,
            "moved_mib": before - after,
            "mib_per_s": number_after(pushed, "ms, ").unwrap_or(0),
            "push_ms": number_after(pushed, "memory.force_empty,")
                .or_else(|| number_after(pushed, "memory.reclaim,")),
            "usage_before_mib": before,
            "usage_after_mib": after,
            "available_at_pause_mib": avail_paused,
            "available_after_push_mib": avail_pushed,
            "pause_to_resume_ms": at("\"action\":\"pause\"")
                .zip(at("pushed out to swap while held"))
                .map(|(p, r)| r.saturating_sub(p)),
            "refaults_first_10s_mib": refaults_10s
                .zip(refaults_at)
                .map(|(now, at)| (now.saturating_sub(at) * 4096) >> 20),
            "oom_kills": cg.oom_kills(),
            "digest": out.split_whitespace().last(),
        });
        println!("bench: {line}");
    }
}

/// A key of the cgroup's memory.stat.
fn cgroup_stat(dir: &Path, key: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join("memory.stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The events of the daemon's state directory (the API redacts their details).
fn events(d: &Daemon) -> String {
    std::fs::read_to_string(d.dir.path().join("state/events.jsonl")).unwrap_or_default()
}
