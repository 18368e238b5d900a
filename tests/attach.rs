//! `memwatch attach` and friends against real processes: trees, restarts, PID reuse, authorisation,
//! thermal pauses through the fake NVML, and hostile input on the control socket.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Daemon, Opts, eventually, memhog, proc_state};

/// A daemon watching the real host (so host memory is not a fixture's 95 %), without GPUs.
fn daemon(extra: &'static str) -> Daemon {
    Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: extra,
        ..Opts::default()
    })
}

fn sleeper() -> Child {
    Command::new("sleep").arg("120").spawn().unwrap()
}

/// memhog with 4 workers, holding still; returns it once all workers exist.
fn tree() -> (Child, Vec<u32>) {
    let mut hog = Command::new(memhog())
        .args(["--workers", "4", "--total-mib", "1", "--hold-ms", "120000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = hog.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let mut pids = vec![pid];
    pids.extend(
        children
            .split_whitespace()
            .map(|p| p.parse::<u32>().unwrap()),
    );
    assert_eq!(pids.len(), 5);
    (hog, pids)
}

/// Kills a memhog tree: its workers, then the parent.
fn kill_tree(mut c: Child, pids: &[u32]) {
    common::end_tree(&mut c, pids);
}

fn kill(mut c: Child) {
    let _ = Command::new("kill")
        .args(["-CONT", &c.id().to_string()])
        .status();
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn a_tree_is_paused_and_resumed_together() {
    let d = daemon("");
    let (hog, pids) = tree();
    let (code, out, err) = d.ctl(&["attach", &pids[0].to_string(), "--name", "tree"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("attached tree"));
    assert!(eventually(5.0, || d.jobs()[0]["sample"]["processes"]
        .as_array()
        .is_some_and(|p| p.len() == 5)));
    let (code, _, err) = d.ctl(&["pause", "tree"]);
    assert_eq!(code, 0, "{err}");
    // SIGSTOP is delivered as each process next leaves the kernel: states show T a moment later.
    for p in &pids {
        assert!(
            eventually(1.0, || proc_state(*p) == Some('T')),
            "pid {p} not stopped"
        );
    }
    assert_eq!(d.job_state("tree").as_deref(), Some("paused"));
    let (code, table, _) = d.ctl(&["jobs"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("paused") && table.contains("tree"),
        "{table}"
    );
    let (code, _, err) = d.ctl(&["resume", &pids[0].to_string()]);
    assert_eq!(code, 0, "{err}");
    for p in &pids {
        assert_ne!(proc_state(*p), Some('T'), "pid {p} still stopped");
    }
    // The metrics show the job (the view is published after the command is answered).
    d.wait_metrics("the job's processes and the hand pause in /metrics", |m| {
        m.contains("memwatch_job_processes{job_name=\"tree\"} 5\n")
            && m.contains("memwatch_interventions_total{action=\"pause\",reason=\"user\"} 1\n")
    });
    kill_tree(hog, &pids);
}

#[test]
fn a_crashed_daemon_is_followed_by_one_that_resumes_the_job() {
    crashed_and_followed(false);
}

/// An earlier build kept `state.json` in the state directory: a daemon of this build started after
/// it moves the file to its runtime directory and resumes what it records as paused.
#[test]
fn a_pause_an_earlier_build_recorded_in_the_state_directory_is_resumed() {
    crashed_and_followed(true);
}

/// Pauses a job by hand, kills the daemon and its guardian, optionally moves the state file where
/// an earlier build kept it, and checks a new daemon resumes and re-adopts the job.
fn crashed_and_followed(legacy: bool) {
    let mut d = daemon("");
    let s = sleeper();
    let pid = s.id().to_string();
    assert_eq!(d.ctl(&["attach", &pid, "--name", "crashy"]).0, 0);
    assert_eq!(d.ctl(&["pause", "crashy"]).0, 0);
    // SIGSTOP is delivered as the process next leaves the kernel: its state shows T a moment later.
    assert!(eventually(1.0, || proc_state(s.id()) == Some('T')));
    let state = d.state.clone();
    // The daemon and its guardian both die: only a new daemon can resume the job.
    d.wait_guardian_pid();
    d.crash(true);
    assert_eq!(
        proc_state(s.id()),
        Some('T'),
        "SIGKILL cannot resume anything"
    );
    let legacy_file = state.join("state.json");
    if legacy {
        std::fs::rename(d.runtime.join("state.json"), &legacy_file).unwrap();
    }
    let started = std::time::Instant::now();
    let d2 = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        state: Some(state),
        ..Opts::default()
    });
    assert!(
        eventually(2.0, || proc_state(s.id()) == Some('S')),
        "not resumed"
    );
    eprintln!("resumed {:?} after the restart began", started.elapsed());
    // Re-adopted: still attached, now running.
    assert_eq!(d2.job_state("crashy").as_deref(), Some("running"));
    assert!(
        !legacy_file.exists(),
        "the state file left in the state directory"
    );
    assert!(d2.runtime.join("state.json").is_file());
    // The API shows the restart's resume once a view with it is published.
    d2.wait_event("the restart's resume among the events", |e| {
        e["action"] == "resume" && e["reason"] == "restart"
    });
    kill(s);
}

#[test]
fn sigterm_resumes_before_the_daemon_exits() {
    let mut d = daemon("");
    let (hog, pids) = tree();
    assert_eq!(d.ctl(&["attach", &pids[0].to_string(), "--name", "t"]).0, 0);
    assert_eq!(d.ctl(&["pause", "t"]).0, 0);
    // SIGSTOP is delivered as each process next leaves the kernel: states show T a moment later.
    assert!(eventually(1.0, || pids
        .iter()
        .all(|p| proc_state(*p) == Some('T'))));
    assert_eq!(d.terminate(), Some(0));
    for p in &pids {
        assert_ne!(
            proc_state(*p),
            Some('T'),
            "pid {p} left stopped by a stopping daemon"
        );
    }
    kill_tree(hog, &pids);
}

#[test]
fn a_reused_pid_is_never_signalled() {
    let d = daemon("");
    let mut first = Command::new("sleep").arg("120").spawn().unwrap();
    let pid = first.id();
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "old"]).0, 0);
    first.kill().unwrap();
    first.wait().unwrap();
    // Make the kernel hand the same pid to a new process.
    let mut reused = None;
    for _ in 0..50 {
        let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string());
        let c = Command::new("sleep").arg("120").spawn().unwrap();
        if c.id() == pid {
            reused = Some(c);
            break;
        }
        kill(c);
    }
    let Some(reused) = reused else {
        panic!(
            "could not make the kernel reuse pid {pid} (needs root and /proc/sys/kernel/ns_last_pid)"
        );
    };
    let (code, _, err) = d.ctl(&["pause", "old"]);
    assert_ne!(code, 0, "pausing a job whose process is gone must fail");
    assert!(
        err.contains("gone") || err.contains("no attached job"),
        "{err}"
    );
    d.wait_samples(5);
    assert_eq!(
        proc_state(pid),
        Some('S'),
        "the new process that reuses the pid was signalled"
    );
    assert_eq!(d.job_state("old"), None, "the gone job stays attached");
    kill(reused);
}

#[test]
fn attach_refuses_what_it_must() {
    let d = daemon("");
    let me = d.child.id().to_string();
    let cases = [
        ("999999999", "no process with pid"),
        ("2", "kernel thread"),
        ("1", "pid 1"),
        (me.as_str(), "memwatch daemon itself"),
    ];
    for (pid, want) in cases {
        let (code, _, err) = d.ctl(&["attach", pid]);
        assert_eq!(code, 1, "{pid}");
        assert!(err.contains(want), "{pid}: {err}");
    }
    let s = sleeper();
    let pid = s.id().to_string();
    assert_eq!(d.ctl(&["attach", &pid, "--name", "a"]).0, 0);
    assert!(d.ctl(&["attach", &pid]).2.contains("already attached"));
    assert!(d.ctl(&["pause", "nope"]).2.contains("no attached job"));
    assert!(d.ctl(&["resume", "a"]).2.contains("not paused"));
    kill(s);
}

#[test]
fn hostile_socket_input_gets_an_error_and_the_daemon_runs_on() {
    let d = daemon("");
    let ask = |bytes: &[u8]| -> String {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(bytes);
        let mut out = String::new();
        let _ = BufReader::new(&s).read_line(&mut out);
        out
    };
    assert!(ask(b"garbage\n").contains("bad request"));
    assert!(ask(b"{\"cmd\":\"format_disk\"}\n").contains("bad request"));
    assert!(ask(b"{\"cmd\":\"attach\",\"pid\":\"x\"}\n").contains("bad request"));
    assert!(
        ask(b"{\"cmd\":\"jobs\",\"uid\":0}\n").contains("bad request"),
        "a client must not claim a uid"
    );
    let huge = vec![b'a'; 200 * 1024];
    assert!(ask(&huge).contains("longer than"));
    // A client that connects and says nothing does not block others.
    let mut idle = UnixStream::connect(&d.socket).unwrap();
    assert!(ask(b"{\"cmd\":\"jobs\"}\n").contains("\"ok\":true"));
    let mut buf = [0u8; 1];
    idle.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert!(idle.read(&mut buf).is_err());
    assert_eq!(d.get("/-/healthy").0, 200);
}

fn gpu_state(temp: u32, pid: u32) -> String {
    format!(
        r#"{{"devices":[{{"name":"Fake","uuid":"GPU-x","memory_total":1000000000,"memory_used":100000000,
        "temperature":{temp},"threshold_slowdown":90,"threshold_shutdown":98,
        "processes":[{{"pid":{pid},"used_memory":100000000}}]}}]}}"#
    )
}

#[test]
fn a_hot_gpu_pauses_its_job_and_cooling_resumes_it_without_flapping() {
    let s = sleeper();
    let pid = s.id();
    let gpu_json = gpu_state(60, pid);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: Some(&gpu_json),
        extra_config: "[policy.gpu_temperature]\naction = \"pause\"\nwarn_below_slowdown = 3.0\ncritical_below_shutdown = 5.0\n\
                       resume_below_slowdown = 5.0\nfallback_slowdown_celsius = 87.0\nfallback_shutdown_celsius = 95.0\n\
                       enter_hold_ms = 0\nleave_hold_ms = 1000\n",
        ..Opts::default()
    });
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "hot"]).0, 0);
    assert!(eventually(5.0, || d.jobs()[0]["sample"]["gpu_bytes"] == 100000000));
    d.set_gpu_state(&gpu_state(94, pid));
    assert!(
        eventually(5.0, || proc_state(pid) == Some('T')),
        "not paused at 94 °C (critical from 93)"
    );
    // Hovering under the critical line (93) but above the resume line (85), each for longer than the
    // 1 s leave hold (14 samples of 100 ms), keeps it paused: the hysteresis, not the hold, holds it.
    // A dip under the resume line shorter than the hold (one sample) keeps it paused too: the hold.
    for (t, samples) in [
        (92, 14),
        (93, 14),
        (84, 1),
        (91, 14),
        (94, 14),
        (88, 14),
        (92, 14),
    ] {
        d.set_gpu_state(&gpu_state(t, pid));
        d.wait_samples(samples);
        assert_eq!(proc_state(pid), Some('T'), "resumed at {t} °C");
    }
    d.set_gpu_state(&gpu_state(70, pid));
    assert!(
        eventually(6.0, || proc_state(pid) == Some('S')),
        "not resumed after cooling"
    );
    // The resume is recorded with the signal; the API shows it once the next snapshot is published.
    let count = |events: &[serde_json::Value], a: &str| {
        events
            .iter()
            .filter(|e| e["action"] == a && e["job"] == "hot")
            .count()
    };
    assert!(eventually(5.0, || count(&d.events(), "resume") >= 1));
    let events = d.events();
    assert_eq!(
        (count(&events, "pause"), count(&events, "resume")),
        (1, 1),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["action"] == "pause" && e["reason"] == "gpu_temperature")
    );
    kill(s);
}

#[test]
fn dry_run_decides_but_signals_nothing() {
    let s = sleeper();
    let pid = s.id();
    let gpu_json = gpu_state(97, pid);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: Some(&gpu_json),
        extra_config: "[policy]\ndry_run = true\n",
        ..Opts::default()
    });
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "dry"]).0, 0);
    assert!(eventually(5.0, || d
        .events()
        .iter()
        .any(|e| e["action"] == "pause" && e["dry_run"] == true)));
    d.wait_samples(3);
    assert_eq!(proc_state(pid), Some('S'));
    assert!(d.metrics().contains("memwatch_dry_run 1\n"));
    // A hand pause says that it paused nothing.
    d.ctl(&["resume", "dry"]);
    let (code, out, err) = d.ctl(&["pause", "dry"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("dry run") && out.contains("was not paused"),
        "{out}"
    );
    assert_eq!(proc_state(pid), Some('S'));
    kill(s);
}

#[test]
fn a_job_that_owns_its_cgroup_is_frozen_not_signalled() {
    let cgroups = common::own_cgroups();
    assert!(
        !cgroups.is_empty(),
        "no freezable cgroup could be made (needs root and a cgroup2 or v1 freezer hierarchy)"
    );
    for (dir, probe) in cgroups {
        let mut d = daemon("");
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec {} --workers 4 --total-mib 1 --hold-ms 120000",
            dir.display(),
            memhog().display()
        );
        let mut hog = Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(hog.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid = hog.id();
        let workers: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "owner"]).0, 0);
        assert_eq!(d.ctl(&["pause", "owner"]).0, 0);
        // The kernel freezes the tasks after the write: the cgroup says so once every one is frozen.
        let (state_file, frozen_text) = match probe {
            "freezer.state" => (dir.join("freezer.state"), "FROZEN"),
            _ => (dir.join("cgroup.events"), "frozen 1"),
        };
        let is_frozen = |t: &str| t.lines().any(|l| l.trim() == frozen_text);
        let frozen = || is_frozen(&std::fs::read_to_string(&state_file).unwrap());
        let wait_frozen = || {
            common::wait::file(
                &format!("{}: frozen", dir.display()),
                &state_file,
                is_frozen,
            )
        };
        wait_frozen();
        // Frozen, not stopped: no process shows the T state, and the job records the cgroup.
        assert!(
            std::iter::once(pid)
                .chain(workers.iter().copied())
                .all(|p| proc_state(p) != Some('T'))
        );
        assert_eq!(
            d.jobs()[0]["pause"]["mechanism"]["dir"],
            dir.to_str().unwrap()
        );
        // A restart thaws it (the daemon and its guardian are killed, as in a crash).
        d.wait_guardian_pid();
        d.crash(true);
        assert!(frozen(), "killing the daemon cannot thaw anything");
        let d2 = Daemon::start(Opts {
            root: "/".into(),
            gpu_state: None,
            state: Some(d.state.clone()),
            ..Opts::default()
        });
        assert!(
            eventually(2.0, || !frozen()),
            "{}: not thawed after the restart",
            dir.display()
        );
        assert_eq!(d2.ctl(&["pause", "owner"]).0, 0);
        wait_frozen();
        assert_eq!(d2.ctl(&["resume", "owner"]).0, 0);
        assert!(!frozen(), "{}: not thawed by resume", dir.display());
        let mut pids = workers.clone();
        pids.insert(0, pid);
        kill_tree(hog, &pids);
        drop(d2);
        for _ in 0..100 {
            if std::fs::remove_dir(&dir).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A process with only private memory, growing at 120 MiB/s in a real memory cgroup: every sample's
/// PSS is within a tenth of its RSS (a PSS carried over from an older reading lagged 58 against
/// 378 MB), says when it was read, and the cgroup's charged memory (anon + file) is beside it.
#[test]
fn pss_keeps_up_with_a_growing_job_and_says_how_old_it_is() {
    let cg = common::cgroup::MemCgroup::new(2 << 30).expect("a memory cgroup (needs root)");
    let d = daemon("");
    let hog = cg.spawn(
        &memhog(),
        &[
            "--rate-mib",
            "120",
            "--total-mib",
            "700",
            "--hold-ms",
            "60000",
        ],
    );
    let pid = hog.id();
    assert_eq!(
        d.ctl(&["attach", &pid.to_string(), "--name", "grower"]).0,
        0
    );
    let mib = |v: &serde_json::Value| v.as_u64().unwrap_or(0) as f64 / 1048576.0;
    let mut seen = std::collections::BTreeSet::new();
    let mut checked = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while checked < 4 && std::time::Instant::now() < deadline {
        let jobs = d.jobs();
        let s = &jobs[0]["sample"];
        let at = s["timestamp_ms"].as_u64().unwrap_or(0);
        let (rss, pss) = (mib(&s["rss_bytes"]), mib(&s["pss_bytes"]));
        if (100.0..=650.0).contains(&rss) && seen.insert(at) {
            assert!(
                (pss - rss).abs() <= rss * 0.1,
                "PSS {pss:.0} MiB against RSS {rss:.0} MiB at {at}"
            );
            let read = s["pss_read_ms"].as_u64().expect("pss_read_ms");
            assert!(read <= at, "read {read} after the sample {at}");
            let cgroup = &s["cgroup"];
            let charged = mib(&cgroup["anon_bytes"]) + mib(&cgroup["file_bytes"]);
            assert!(
                charged >= rss * 0.9 && charged <= mib(&cgroup["usage_bytes"]) + 1.0,
                "charged {charged:.0} MiB, RSS {rss:.0} MiB, usage {:.0} MiB",
                mib(&cgroup["usage_bytes"])
            );
            checked += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        checked >= 4,
        "saw only {checked} samples while the job grew"
    );
    d.wait_metrics(
        "the job's PSS age and charged memory in /metrics",
        |metrics| {
            [
                "memwatch_job_pss_age_seconds{job_name=\"grower\"}",
                "memwatch_job_cgroup_memory_charged_bytes{job_name=\"grower\"}",
            ]
            .iter()
            .all(|m| metrics.contains(m))
        },
    );
    kill(hog);
}

/// A process in a cgroup laid out as Docker's (cgroupfs driver: /docker/<id> under the memory
/// controller) is named after its container when attached without a name; its limit is the
/// container's, and the API and metrics carry the container id.
#[test]
fn a_container_job_is_named_from_its_cgroup_path() {
    let id = "3f2a1b9c0d1e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c";
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
    let (dir, procs) = if v1.join("memory.limit_in_bytes").exists() {
        (v1.join("docker").join(id), "cgroup.procs")
    } else {
        (
            std::path::Path::new("/sys/fs/cgroup/system.slice").join(format!("docker-{id}.scope")),
            "cgroup.procs",
        )
    };
    std::fs::create_dir_all(&dir).expect("make the container's cgroup (needs root)");
    let limit_file = if dir.join("memory.limit_in_bytes").exists() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    std::fs::write(dir.join(limit_file), "805306368").unwrap();
    let script = format!("echo $$ > {}/{procs} && exec sleep 60", dir.display());
    let c = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let pid = c.id();
    assert!(eventually(2.0, || std::fs::read_to_string(format!(
        "/proc/{pid}/cgroup"
    ))
    .is_ok_and(|t| t.contains(id))));
    let d = daemon("");
    let (code, out, err) = d.ctl(&["attach", &pid.to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("docker-3f2a1b9c0d1e"), "{out}");
    d.wait_until(|d| !d.jobs()[0]["sample"].is_null(), "the job measured");
    let j = &d.jobs()[0];
    assert_eq!(
        (j["origin"]["kind"].as_str(), j["origin"]["id"].as_str()),
        (Some("docker"), Some(id))
    );
    assert_eq!(j["sample"]["cgroup"]["limit_bytes"], 805306368u64, "{j}");
    d.wait_metrics("the container id in /metrics", |m| {
        m.contains("container=\"3f2a1b9c0d1e\"")
    });
    kill(c);
    assert!(c_wait_removed(&dir));
    if let Some(parent) = dir.parent().filter(|p| p.ends_with("docker")) {
        let _ = std::fs::remove_dir(parent);
    }
}

/// Removes a test cgroup once its processes are gone.
fn c_wait_removed(dir: &std::path::Path) -> bool {
    eventually(5.0, || std::fs::remove_dir(dir).is_ok() || !dir.exists())
}
