//! Users act on their own processes only: attach, pause, resume and detach as another user are
//! refused, a user sees other users' jobs only as the summary HTTP shows everyone, cannot probe private paths, and a root child in a
//! user's job is never signalled or frozen on the user's behalf.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Daemon, Opts, eventually, proc_state};

/// A daemon watching the real host, without GPUs, whose socket every user can reach.
fn daemon() -> Daemon {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    d.open_to_everyone();
    d
}

fn kill(mut c: std::process::Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// Runs memwatch as `user`.
fn as_user(user: &str, d: &Daemon, args: &[&str]) -> (i32, String) {
    d.ctl_as(user, args)
}

#[test]
fn users_act_on_their_own_processes_only() {
    let uid = common::ensure_user("memwatch-test");
    let d = daemon();
    use std::os::unix::fs::PermissionsExt;
    let root_proc = Command::new("sleep").arg("120").spawn().unwrap();
    let user_proc = common::spawn_as(uid, &["sleep", "120"]);
    assert!(eventually(2.0, || std::fs::read_to_string(format!(
        "/proc/{}/status",
        user_proc.id()
    ))
    .is_ok_and(|s| s.contains(&format!("Uid:\t{uid}")))));
    let rp = root_proc.id().to_string();
    let up = user_proc.id().to_string();

    let (code, err) = as_user("memwatch-test", &d, &["attach", &rp]);
    assert_ne!(code, 0);
    assert!(err.contains("permission denied"), "{err}");
    assert!(d.jobs().is_empty(), "a refused attach changed something");

    assert_eq!(d.ctl(&["attach", &rp, "--name", "roots"]).0, 0);
    for cmd in ["pause", "resume", "detach"] {
        let (code, err) = as_user("memwatch-test", &d, &[cmd, "roots"]);
        assert_ne!(code, 0, "{cmd}");
        assert!(err.contains("permission denied"), "{cmd}: {err}");
    }
    assert_eq!(proc_state(root_proc.id()), Some('S'));

    // A config path in a directory the user cannot read: the same answer whether the file exists or
    // not (the daemon opens it with the user's rights), so no oracle for other users' files.
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        private.path().join("secret.json"),
        "{\"train_micro_batch_size_per_gpu\": 4}",
    )
    .unwrap();
    let answers: Vec<String> = ["secret.json", "missing.json"]
        .iter()
        .map(|f| {
            let path = private.path().join(f);
            let (code, err) = as_user(
                "memwatch-test",
                &d,
                &[
                    "attach",
                    &up,
                    "--config-file",
                    path.to_str().unwrap(),
                    "--profile",
                    "deepspeed",
                ],
            );
            assert_ne!(code, 0, "{f}: {err}");
            err.replace(f, "FILE")
        })
        .collect();
    assert_eq!(
        answers[0], answers[1],
        "the answers tell an existing file from a missing one"
    );
    assert!(answers[0].contains("ermission denied"), "{}", answers[0]);
    assert!(d.jobs().iter().all(|j| j["name"] != "mine"));

    let (code, err) = as_user("memwatch-test", &d, &["attach", &up, "--name", "mine"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(as_user("memwatch-test", &d, &["pause", "mine"]).0, 0);
    assert!(eventually(1.0, || proc_state(user_proc.id()) == Some('T')));
    assert_eq!(as_user("memwatch-test", &d, &["resume", "mine"]).0, 0);
    // Continued, it runs until it is back asleep in its nanosleep.
    common::wait::proc_state("the resumed job asleep again", user_proc.id(), |s| {
        s == Some('S')
    });
    // One rule with HTTP: the user sees every job, their own in full, root's as a summary (state,
    // numbers, process count), without its processes or config.
    let user_jobs = || -> Vec<serde_json::Value> {
        let out = Command::new("runuser")
            .args(["-u", "memwatch-test", "--"])
            .arg(common::bin())
            .args(["jobs", "--json", "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Once both jobs have been measured.
    assert!(eventually(5.0, || {
        let j = user_jobs();
        j.len() == 2 && j.iter().all(|j| !j["sample"].is_null())
    }));
    let jobs = user_jobs();
    let job = |name: &str| jobs.iter().find(|j| j["name"] == name).cloned().unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let (mine, roots) = (job("mine"), job("roots"));
    assert_eq!(
        (mine["details"].as_bool(), roots["details"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(
        mine["sample"]["processes"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(
        roots["sample"]["processes"].as_array().map(Vec::len),
        Some(0)
    );
    assert_eq!(roots["sample"]["process_count"], 1);
    assert_eq!(roots["state"], "running");
    // The same as the unauthenticated HTTP API shows (once it publishes both).
    let names = |v: &[serde_json::Value]| {
        let mut n: Vec<String> = v.iter().map(|j| j["name"].to_string()).collect();
        n.sort();
        n
    };
    d.wait_api("/api/v1/jobs", "the same jobs over HTTP", |http| {
        http["jobs"]
            .as_array()
            .is_some_and(|h| names(h) == names(&jobs))
    });
    let (code, text) = {
        let out = Command::new("runuser")
            .args(["-u", "memwatch-test", "--"])
            .arg(common::bin())
            .args(["jobs", "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(code, Some(0));
    assert!(
        text.contains("uid 0's job: its processes and config are shown to its owner and root"),
        "{text}"
    );
    assert_eq!(as_user("memwatch-test", &d, &["detach", "mine"]).0, 0);
    kill(root_proc);
    kill(user_proc);
}

/// A user's job whose root forked a child that stayed root before dropping to the user (as a process
/// that ran sudo or su looks from outside), then a child of the user's own. Prints
/// "ROOT ROOTCHILD USERCHILD" once all three run; the root is put in `cgroup` first when given.
const MIXED_TREE: &str = r#"
import os, sys, time
uid, cgroup = int(sys.argv[1]), sys.argv[2]
if cgroup:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
root_child = os.fork()
if root_child == 0:
    os.execvp("sleep", ["sleep", "120"])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
user_child = os.fork()
if user_child == 0:
    os.execvp("sleep", ["sleep", "120"])
print(os.getpid(), root_child, user_child, flush=True)
time.sleep(120)
"#;

#[test]
fn a_root_child_in_a_users_job_is_never_signalled_or_frozen() {
    let uid = common::ensure_user("memwatch-test");
    // Once with signals, then once in each freezable cgroup the job would otherwise own.
    let mut places: Vec<Option<std::path::PathBuf>> = vec![None];
    places.extend(common::own_cgroups().into_iter().map(|(dir, _)| Some(dir)));
    for cgroup in places {
        let d = daemon();
        // Debian's python: a venv's interpreter may live where the user cannot read.
        let mut job = Command::new("/usr/bin/python3")
            .args(["-c", MIXED_TREE, &uid.to_string()])
            .arg(cgroup.as_deref().unwrap_or(std::path::Path::new("")))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(job.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pids: Vec<u32> = line
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        let [root, root_child, user_child] = pids[..] else {
            panic!("{line}")
        };
        let place = format!("{cgroup:?}");
        let (code, err) = as_user(
            "memwatch-test",
            &d,
            &["attach", &root.to_string(), "--name", "mixed"],
        );
        assert_eq!(code, 0, "{place}: {err}");
        let (code, err) = as_user("memwatch-test", &d, &["pause", "mixed"]);
        assert_eq!(code, 0, "{place}: {err}");
        assert!(
            eventually(10.0, || proc_state(root) == Some('T')
                && proc_state(user_child) == Some('T')),
            "{place}: the user's own processes were not paused"
        );
        assert_eq!(
            d.jobs()[0]["pause"]["mechanism"]["kind"],
            "signals",
            "{place}: held by another mechanism than signals"
        );
        assert_eq!(
            proc_state(root_child),
            Some('S'),
            "{place}: the root child was stopped"
        );
        let (code, err) = as_user("memwatch-test", &d, &["resume", "mixed"]);
        assert_eq!(code, 0, "{place}: {err}");
        // Continued, it runs until it is back asleep in its nanosleep.
        common::wait::proc_state(&format!("{place}: resumed"), user_child, |s| s == Some('S'));
        let _ = Command::new("kill")
            .args([
                "-KILL",
                &root.to_string(),
                &root_child.to_string(),
                &user_child.to_string(),
            ])
            .status();
        let _ = job.wait();
        if let Some(dir) = cgroup {
            for _ in 0..100 {
                if std::fs::remove_dir(&dir).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
