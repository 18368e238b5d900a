//! What runs in a container under memwatch beside the container itself (tests/containers.rs):
//! `memwatch launch` of an engine's `run`, followed to its container, and a trainer in a container
//! whose config file's path is its own mount namespace's. Each test runs for docker and for podman
//! (`docker::…`, `podman::…`); an engine that does not run here fails its tests with what to
//! install, unless `MEMWATCH_ALLOW_SKIP` names it.

mod common;

use common::containers::{Engine, container_name, daemon, for_each_engine, job};
use common::{Daemon, Opts, wait};

/// The program `memwatch launch` runs in a container: the Python client, launched, says what it
/// sees in /out/said-RESUME; the first run then waits to be killed, a relaunch exits 0.
const LAUNCHED: &str = r#"
import json, os, sys, time
import memwatch
c = memwatch.Client()
ok = c.attach()
resume = os.environ.get("MEMWATCH_RESUME")
with open("/out/.said", "w") as f:
    json.dump({"ok": ok, "launched": c.launched, "name": c.name, "resume": resume,
               "argv": sys.argv[1:]}, f)
os.replace("/out/.said", "/out/said-" + resume)
while resume == "0":
    time.sleep(0.2)
"#;

/// A trainer in a container with its config at /cfg/train.json (its own mount namespace's path):
/// attaches itself with it, then reports progress every 50 ms, writing the config's text to
/// /out/seen whenever it changes.
const CONFIGURED: &str = r#"
import os, sys, time
import memwatch
c = memwatch.Client(name=sys.argv[1], socket_path="/run/memwatch.sock", config_file="/cfg/train.json",
                    keys=["batch=train.micro_batch", "accumulation=train.accumulation"])
c.attach()
seen, step = None, 0
while True:
    step += 1
    c.progress(epoch=0, step=step)
    with open("/cfg/train.json") as f:
        text = f.read()
    if text != seen:
        seen = text
        with open("/out/.seen", "w") as f:
            f.write(text)
        os.replace("/out/.seen", "/out/seen")
    time.sleep(0.05)
"#;

/// A fake GPU whose only process is `pid`, using `used` bytes of 20 GB.
fn gpu(used: u64, pid: u32) -> String {
    format!(
        r#"{{"devices":[{{"name":"Fake","uuid":"GPU-c","memory_total":20000000000,"memory_used":{used},
        "temperature":50,"threshold_slowdown":90,"threshold_shutdown":98,
        "processes":[{{"pid":{pid},"used_memory":{used}}}]}}]}}"#
    )
}

/// `memwatch launch -- ENGINE run …` follows the container, not the engine's client: the job is the
/// container's process by its host pid, named by `--name`, its client inside taking the job as
/// launched; a container killed from outside is relaunched (its predecessor of the same container
/// name removed first) with `{resume}` 1, and launch exits with the relaunch's 0.
fn launch_follows_its_container(e: &Engine) {
    let d = daemon();
    let out = common::tempdir();
    let jobname = format!("launched-{}", e.name);
    let container = container_name(e, "launched");
    let _ = e.cmd(&["rm", "-f", &container]);
    let volumes = [
        format!("{}:/run/memwatch.sock", d.socket.display()),
        format!("{}:/mw:ro", common::repo().join("python/src").display()),
        format!("{}:/out", out.path().display()),
    ];
    let socket = d.socket.display().to_string();
    let mut args: Vec<&str> = vec![
        "launch", "--socket", &socket, "--name", &jobname, "--", e.name,
    ];
    args.extend(e.global);
    args.extend(["run", "--name", &container, "--network", "none"]);
    args.extend(e.run);
    for v in &volumes {
        args.extend(["-v", v.as_str()]);
    }
    args.extend([
        "-e",
        "PYTHONPATH=/mw",
        "-e",
        "MEMWATCH_SOCKET=/run/memwatch.sock",
        &e.image,
        "python3",
        "-c",
        LAUNCHED,
        "{resume}",
    ]);
    let launch = std::process::Command::new(common::bin())
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("memwatch launch starts");
    let said = wait::file(
        &format!("the first run's client ({})", e.logs(&container)),
        &out.path().join("said-0"),
        |t| !t.is_empty(),
    );
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(said["ok"], true, "{said}");
    assert_eq!(
        said["launched"], true,
        "MEMWATCH_LAUNCHED=container: {said}"
    );
    assert_eq!(said["name"], jobname.as_str(), "MEMWATCH_JOB: {said}");
    assert_eq!(
        said["argv"],
        serde_json::json!(["0"]),
        "{{resume}} is 0: {said}"
    );
    let pid: u32 = e
        .inspect(&container, "{{.State.Pid}}")
        .parse()
        .expect("the container's pid");
    let j = d.wait_for("the launched job", || job(&d, &jobname), |j| !j.is_null());
    assert_eq!(
        j["pid"], pid,
        "the job is the container's process on the host: {j:#}"
    );
    assert_eq!(j["origin"]["kind"], e.name, "{j:#}");
    assert_eq!(j["launch"]["run"], 1, "{j:#}");
    // Killed from outside (as the OOM killer would): the engine says 137, launch relaunches.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let said = wait::file(
        &format!("the relaunch's client ({})", e.logs(&container)),
        &out.path().join("said-1"),
        |t| !t.is_empty(),
    );
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(said["ok"], true, "{said}");
    assert_eq!(
        said["argv"],
        serde_json::json!(["1"]),
        "{{resume}} is 1: {said}"
    );
    let o = launch.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    eprintln!("{}: launch said: {stderr}", e.name);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("run 1: stopped, ended by signal SIGKILL; run 2: finished"),
        "{stderr}"
    );
    let _ = e.cmd(&["rm", "-f", &container]);
}

/// A job in a container that attaches itself with its config file's path in its own mount
/// namespace (/cfg/train.json, which the host does not have): the daemon reads the file in the
/// container's root, and its rewrite (a full GPU halves the micro-batch, keeping the effective
/// batch) lands there: in the host directory bind-mounted at /cfg, with its backup beside it.
fn its_config_is_read_and_rewritten_in_its_root(e: &Engine) {
    assert!(
        !std::path::Path::new("/cfg/train.json").exists(),
        "the host must not have the container's path"
    );
    let gpu_json = gpu(8_000_000_000, 1);
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: Some(&gpu_json),
        ..Opts::default()
    });
    let out = common::tempdir();
    let cfg = common::tempdir();
    let original = "{\n  \"train\": {\"micro_batch\": 32, \"accumulation\": 2}\n}\n";
    std::fs::write(cfg.path().join("train.json"), original).unwrap();
    let volumes = [
        format!("{}:/run/memwatch.sock", d.socket.display()),
        format!("{}:/mw:ro", common::repo().join("python/src").display()),
        format!("{}:/out", out.path().display()),
        format!("{}:/cfg", cfg.path().display()),
    ];
    let jobname = format!("configured-{}", e.name);
    let mut opts = vec!["-e", "PYTHONPATH=/mw"];
    for v in &volumes {
        opts.extend(["-v", v.as_str()]);
    }
    let c = e.run(
        &container_name(e, "configured"),
        &opts,
        &["python3", "-c", CONFIGURED, &jobname],
    );
    let j = d.wait_for(
        &format!("the job with its knobs ({})", e.logs(&c.name)),
        || job(&d, &jobname),
        |j| j["config"]["knobs"]["micro_batch"] == 32,
    );
    assert_eq!(j["pid"], c.pid, "{j:#}");
    assert_eq!(j["config"]["file"], "/cfg/train.json", "{j:#}");
    wait::file("the trainer's first look", &out.path().join("seen"), |t| {
        t == original
    });
    d.set_gpu_state(&gpu(19_000_000_000, c.pid));
    let seen = wait::file(
        &format!("the rewrite, seen inside ({})", e.logs(&c.name)),
        &out.path().join("seen"),
        |t| t != original,
    );
    assert_eq!(
        seen, "{\n  \"train\": {\"micro_batch\": 16, \"accumulation\": 4}\n}\n",
        "the effective batch kept"
    );
    assert_eq!(
        std::fs::read_to_string(cfg.path().join("train.json.memwatch-orig")).unwrap(),
        original,
        "the backup beside it, in the container's directory"
    );
    assert!(
        !std::path::Path::new("/cfg").exists(),
        "nothing written on the host's path"
    );
}

for_each_engine! {
    launch_follows_its_container;
    its_config_is_read_and_rewritten_in_its_root;
}
