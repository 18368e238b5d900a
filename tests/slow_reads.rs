//! The reads a control request needs that can take long (a Slurm job's `scontrol listpids`, a
//! job's config file on a slow disk) are made before the request reaches the task that pauses jobs:
//! while `scontrol listpids` hangs, every other request is answered, and the attach that asked for
//! it completes once scontrol answers. Here scontrol is a script that announces itself, then waits
//! on a FIFO the test writes to.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use common::{Daemon, Opts, eventually};

#[test]
fn a_hanging_scontrol_holds_up_its_caller_alone() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let release = dir.path().join("release");
    assert!(
        Command::new("mkfifo")
            .arg(&release)
            .status()
            .unwrap()
            .success()
    );
    // The Slurm job's one task on this node.
    let mut task = Command::new("sleep").arg("120").spawn().unwrap();
    let scontrol = dir.path().join("scontrol");
    std::fs::write(
        &scontrol,
        format!(
            "#!/bin/sh\n[ \"$1\" = listpids ] || exit 1\n: > '{started}'\nread go < '{release}'\n\
             echo 'PID      JOBID    STEPID   LOCALID GLOBALID'\necho '{pid} 4242 0 0 0'\n",
            started = started.display(),
            release = release.display(),
            pid = task.id()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = format!("[slurm]\nscontrol = {scontrol:?}\ncommand_timeout_ms = 60000\n");
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: &config,
        ..Opts::default()
    });

    let mut attach = Command::new(common::bin())
        .args(["attach", "--slurm-job", "4242", "--socket"])
        .arg(&d.socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(30.0, || started.exists()),
        "scontrol listpids was never run"
    );
    // scontrol hangs: the daemon answers others meanwhile.
    let (code, out, err) = d.ctl(&["jobs", "--json"]);
    assert_eq!(code, 0, "jobs: {err}");
    assert_eq!(out.trim(), "[]", "{out}");
    let (code, _, err) = d.ctl(&["pause", "nothing-here"]);
    assert_eq!(code, 1, "a pause of no job: {err}");
    assert_eq!(
        attach.try_wait().unwrap(),
        None,
        "the attach ended before scontrol answered: the requests above waited for it"
    );
    // scontrol answers: the attach completes, with the task it listed.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&release)
        .unwrap()
        .write_all(b"go\n")
        .unwrap();
    let status = attach.wait().unwrap();
    let mut why = String::new();
    use std::io::Read as _;
    attach
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut why)
        .unwrap();
    assert!(status.success(), "attach --slurm-job: {why}");
    let jobs = d.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["pid"], task.id(), "{:?}", jobs[0]);
    let name = jobs[0]["name"].as_str().unwrap_or_default().to_owned();
    let attached = d
        .events()
        .into_iter()
        .find(|e| e["action"] == "attach" && e["job"] == name.as_str());
    assert!(
        attached
            .as_ref()
            .is_some_and(|e| e["slurm_job_id"] == "4242"
                && e["detail"]
                    .as_str()
                    .is_some_and(|t| t.contains(&format!("pid {}", task.id())))),
        "{attached:?}"
    );
    let (code, _, err) = d.ctl(&["detach", &name]);
    assert_eq!(code, 0, "detach: {err}");
    task.kill().unwrap();
    task.wait().unwrap();
}
