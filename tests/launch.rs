//! `memwatch launch`: a job that knows nothing of memwatch runs in a memory cgroup of its own, attached
//! from its first instruction; when memwatch stops it (`on_max_pause = "terminate"` after a pause
//! before its cgroup's OOM killer), it is relaunched with `{resume}` = 1 and finishes. A user without
//! the rights to make a cgroup is told so.

mod common;

use std::process::Command;

use common::{Daemon, Opts, memhog};

#[test]
fn a_stopped_job_is_relaunched_to_resume_and_finishes() {
    let config = "[policy]\nmax_pause_seconds = 2\non_max_pause = \"terminate\"\n";
    let mut first = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: config,
        ..Opts::default()
    });
    let d = &first;
    // The relaunched run says so, then waits for the test to have seen it in `memwatch jobs`.
    let seen = d.dir.path().join("seen");
    let script = format!(
        "if [ \"{{resume}}\" = 1 ]; then echo \"resumed after restart $MEMWATCH_RESTART\"; \
         echo \"launched by $MEMWATCH_LAUNCHED as $MEMWATCH_JOB\"; \
         while [ ! -e {seen} ]; do sleep 0.05; done; exit 0; fi; \
         exec {} --rate-mib 1024 --total-mib 768",
        memhog().display(),
        seen = seen.display()
    );
    let launch = Command::new(common::bin())
        .args([
            "launch",
            "--name",
            "l",
            "--memory-max",
            "512M",
            "--max-restarts",
            "2",
        ])
        .arg("--socket")
        .arg(&d.socket)
        .args(["--", "sh", "-c", &script])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let launch_pid = launch.id();
    // `memwatch jobs` shows the relaunched run and how the first ended.
    assert!(
        common::eventually(20.0, || d
            .jobs()
            .iter()
            .any(|j| j["name"] == "l" && j["launch"]["run"] == 2)),
        "{:?}",
        d.jobs()
    );
    let (_, text, _) = d.ctl(&["jobs"]);
    assert!(
        text.contains("launched: run 2 of at most 3") && text.contains("run 1: stopped"),
        "{text}"
    );
    // A restarted daemon still knows (the state file holds it).
    let state = d.state.clone();
    first.wait_guardian_pid();
    first.crash(true);
    let d = &Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: config,
        state: Some(state),
        ..Opts::default()
    });
    let (_, text, _) = d.ctl(&["jobs"]);
    assert!(text.contains("launched: run 2 of at most 3"), "{text}");
    std::fs::write(&seen, "").unwrap();
    let out = launch.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{stderr}\n{:?}\n{:?}",
        d.jobs(),
        d.events()
    );
    assert!(stdout.contains("resumed after restart 1"), "{stdout}");
    // Launch's marker is its own pid (the job's ancestor), not something a user sets by hand.
    assert!(
        stdout.contains(&format!("launched by {} as l", launch_pid)),
        "{stdout}"
    );
    assert!(
        stderr.contains("run 1 stopped") && stderr.contains("relaunching"),
        "{stderr}"
    );
    assert!(stderr.contains("run 2: finished"), "{stderr}");
    let events = d.events();
    assert!(
        events
            .iter()
            .any(|e| e["action"] == "pause" && e["job"] == "l"),
        "not paused before the OOM killer: {events:?}"
    );
    // Run 1 ended by memwatch's terminate at the longest pause, or (where the freezer did not settle
    // before a charge in flight) by its cgroup's OOM killer: either way launch says which.
    let terminated = events
        .iter()
        .any(|e| e["action"] == "terminate" && e["job"] == "l");
    assert!(
        terminated && stderr.contains("stopped by memwatch: paused for the maximum of 2 s")
            || stderr.contains("OOM killer fired"),
        "{stderr}\n{events:?}"
    );
    // Its cgroups are gone.
    for base in [
        "/sys/fs/cgroup/memory/memwatch",
        "/sys/fs/cgroup/unified/memwatch",
    ] {
        let left: Vec<_> = std::fs::read_dir(base)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name())
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            !left.iter().any(|n| n.to_string_lossy().starts_with("l-")),
            "{base}: {left:?}"
        );
    }
}

/// A trainer that reports a CUDA OOM at its floor micro-batch with a checkpoint saved, then exits
/// with a failure: the run counts as stopped, and it is relaunched with `{resume}` = 1 and
/// `MEMWATCH_RESUME` set. Without the report, its exit status (3) would end the launch as a job
/// that failed on its own, not relaunched.
#[test]
fn a_run_stopped_by_a_cuda_oom_at_its_floor_is_relaunched_from_its_checkpoint() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let report = r#"import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["MEMWATCH_SOCKET"])
s.sendall(json.dumps({"cmd": "oom", "target": os.environ["MEMWATCH_JOB"], "oom": {
    "epoch": 4, "step": 9, "phase": "forward", "micro_batch_before": 1, "recovered": False,
    "min_micro_batch": 1, "checkpointed": True}}).encode() + b"\n")
reply = json.loads(s.makefile().readline())
assert reply["ok"], reply
print("reported")
"#;
    let script = "if [ \"{resume}\" = 1 ]; then echo \"resumed with MEMWATCH_RESUME=$MEMWATCH_RESUME\"; exit 0; fi; \
         /usr/bin/python3 -c \"$REPORT\" || exit 9; exit 3";
    let out = Command::new(common::bin())
        .args([
            "launch",
            "--name",
            "oomed",
            "--memory-max",
            "512M",
            "--max-restarts",
            "1",
        ])
        .arg("--socket")
        .arg(&d.socket)
        .args(["--", "sh", "-c", script])
        .env("REPORT", report)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("reported"), "{stdout}\n{stderr}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{stderr}\n{:?}",
        d.events()
    );
    assert!(
        stdout.contains("resumed with MEMWATCH_RESUME=1"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains(
            "run 1 stopped (CUDA OOM at its floor micro-batch 1; checkpoint saved); relaunching"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("run 2: finished"), "{stderr}");
    let events = d.events();
    assert!(
        events.iter().any(|e| e["action"] == "cuda_oom"
            && e["job"] == "oomed"
            && e["detail"]
                .as_str()
                .is_some_and(|t| t.contains("memwatch launch relaunches it"))),
        "{events:?}"
    );
}

#[test]
fn a_user_without_cgroup_rights_is_told_so() {
    common::ensure_user("memwatch-test");
    let out = Command::new("runuser")
        .args(["-u", "memwatch-test", "--"])
        .arg(common::bin())
        .args(["launch", "--socket", "/nonexistent.sock", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot create the job's cgroup"),
        "{stderr}"
    );
}

/// A launch killed before it removed its private directory leaves it behind, and its pid comes round
/// again: a later launch still starts. Here the directories a launch by pid would have made are there
/// for the next 400 pids, and the launch's own pid (`MEMWATCH_LAUNCHED`) is among them.
#[test]
fn leftovers_of_a_killed_launch_never_stop_a_new_one() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let taken = (last + 1)..(last + 400);
    for pid in taken.clone() {
        std::fs::create_dir(tmp.path().join(format!("memwatch-launch-{pid}"))).unwrap();
    }
    let out = Command::new(common::bin())
        .args(["launch", "--name", "again", "--memory-max", "256M"])
        .arg("--socket")
        .arg(&d.socket)
        .args(["--", "sh", "-c", "echo \"launched by $MEMWATCH_LAUNCHED\""])
        .env("TMPDIR", tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let by: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("launched by ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("the job did not run: {text}"));
    assert!(
        taken.contains(&by),
        "launch's pid {by} fell outside the leftovers made for {taken:?}: nothing was tested"
    );
    // Its own directory is gone again; the leftovers are as they were.
    let left = std::fs::read_dir(tmp.path()).unwrap().count();
    assert_eq!(left, taken.len(), "launch left its directory behind");
}

/// `memwatch launch -- docker run …` follows the container (tests/containers.rs); what launch would
/// otherwise do itself is refused before anything starts, saying what to give instead: launch's
/// `--memory-max` (the engine's `--memory` is the container's limit) and a `--cidfile` of the user's
/// (launch gives its own).
#[test]
fn a_container_run_refuses_what_launch_gives_it_itself() {
    let cases: [(&[&str], &[&str], &str); 3] = [
        (
            &["--memory-max", "1G"],
            &["docker", "run", "--rm", "img", "python", "train.py"],
            "give `docker run` --memory instead of launch's --memory-max",
        ),
        (
            &["--memory-max", "1G"],
            &["/usr/bin/podman", "--cgroup-manager=cgroupfs", "run", "img"],
            "give `podman run` --memory",
        ),
        (
            &[],
            &["docker", "container", "run", "--cidfile=/tmp/x", "img"],
            "launch gives `docker run` its own --cidfile: leave it out",
        ),
    ];
    for (opts, cmd, says) in cases {
        let out = Command::new(common::bin())
            .args(["launch", "--socket", "/nonexistent.sock"])
            .args(opts)
            .arg("--")
            .args(cmd)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {stderr}");
        assert!(stderr.contains(says), "{cmd:?}: {stderr}");
    }
}
