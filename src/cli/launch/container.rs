//! `memwatch launch -- docker run …` (or podman's, or nerdctl's): the container's processes are not
//! the launched client's descendants (they run under the engine's daemon, or conmon), so launch
//! follows the container, not the client. Each run:
//!
//! 1. runs the engine's client with `--cidfile` and the job's environment (`-e MEMWATCH_…`) put
//!    after `run`, so the container's id is known as soon as it is created;
//! 2. asks the engine for the container's init pid on the host (`inspect`) once it runs, and attaches
//!    that pid, named by `--name`, else the container's `--name`, else what its runtime calls it;
//! 3. waits for the client (or, after `run -d`, for `ENGINE wait`): the container's exit code, with
//!    the engine's `OOMKilled`, says how the run ended; a container memwatch stopped is relaunched
//!    as any launched job is, its predecessor removed first (only the container this launch made).
//!
//! Unlike a plain launch, the container runs its first instructions before it is attached (the
//! engine starts it; launch cannot hold it at a gate): a few hundred milliseconds on an idle host.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use super::{Daemon, Ended, LaunchArgs, account_for, attach, gave_up, wait_detached};
use crate::cli::Failure;
use crate::command::RunError;

/// How long one question to the engine (`inspect`, `rm`) may take.
const ASK: Duration = Duration::from_secs(20);

/// Global options of docker, podman and nerdctl that take a value as the next word (`--opt=value`
/// needs no list).
const GLOBAL_WITH_VALUE: [&str; 22] = [
    "-c",
    "--context",
    "--config",
    "-H",
    "--host",
    "-l",
    "--log-level",
    "--tlscacert",
    "--tlscert",
    "--tlskey",
    "--cgroup-manager",
    "--events-backend",
    "--runtime",
    "--root",
    "--runroot",
    "--storage-driver",
    "--url",
    "--connection",
    "--network-cmd-path",
    "--tmpdir",
    "--namespace",
    "--address",
];

/// A container engine's `run` (or `container run`) command, as given to launch.
pub(super) struct ContainerRun {
    /// docker, podman or nerdctl (as named: a path is kept).
    program: String,
    /// The engine's global options, before its subcommand.
    global: Vec<String>,
    /// Everything after `run`: its options, the image, the container's command.
    after: Vec<String>,
    /// What it says `run` is (`run` or `container run`), for messages.
    engine: String,
}

impl ContainerRun {
    /// `command` as a container engine's `run`, if it is one.
    pub(super) fn parse(command: &[String]) -> Option<ContainerRun> {
        let program = command.first()?;
        let engine = Path::new(program).file_name()?.to_str()?.to_owned();
        if !matches!(engine.as_str(), "docker" | "podman" | "nerdctl") {
            return None;
        }
        let mut i = 1;
        while let Some(a) = command.get(i) {
            if !a.starts_with('-') {
                break;
            }
            i += if GLOBAL_WITH_VALUE.contains(&a.as_str()) {
                2
            } else {
                1
            };
        }
        let global = command.get(1..i)?.to_vec();
        let run_at = match (
            command.get(i).map(String::as_str),
            command.get(i + 1).map(String::as_str),
        ) {
            (Some("run"), _) => i,
            (Some("container"), Some("run")) => i + 1,
            _ => return None,
        };
        Some(ContainerRun {
            program: program.clone(),
            global,
            after: command[run_at + 1..].to_vec(),
            engine,
        })
    }

    /// The engine's name (docker, podman, nerdctl).
    pub(super) fn engine(&self) -> &str {
        &self.engine
    }

    /// The value of `run`'s `--name`, if given before the image.
    fn container_name(&self) -> Option<String> {
        let mut it = self.after.iter();
        while let Some(a) = it.next() {
            if a == "--name" {
                return it.next().cloned();
            }
            if let Some(v) = a.strip_prefix("--name=") {
                return Some(v.to_owned());
            }
        }
        None
    }

    /// Whether `run`'s own options include one launch puts there itself.
    fn conflict(&self) -> Option<&'static str> {
        self.after.iter().find_map(|a| {
            ["--cidfile"]
                .into_iter()
                .find(|o| a == o || a.starts_with(&format!("{o}=")))
        })
    }

    /// The engine's client for one run: `ENGINE GLOBAL… run --cidfile CID -e K=V… AFTER…`, with
    /// `{resume}` replaced.
    fn client(&self, cidfile: &Path, env: &[(String, String)], resume: &str) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.global)
            .arg("run")
            .arg("--cidfile")
            .arg(cidfile);
        for (k, v) in env {
            c.arg("-e").arg(format!("{k}={v}"));
        }
        c.args(self.after.iter().map(|a| a.replace("{resume}", resume)));
        c
    }

    /// `ENGINE GLOBAL… ARGS…` within [`ASK`]: its stdout, trimmed.
    fn ask(&self, args: &[&str]) -> Result<String, RunError> {
        let all: Vec<&str> = self
            .global
            .iter()
            .map(String::as_str)
            .chain(args.iter().copied())
            .collect();
        crate::command::run(&self.program, &all, ASK).map(|s| s.trim().to_owned())
    }

    fn inspect(&self, id: &str, format: &str) -> Result<String, RunError> {
        self.ask(&["inspect", "--format", format, id])
    }
}

/// The container's id from its cidfile, once the engine has written it whole.
fn read_cid(cidfile: &Path) -> Option<String> {
    let id = std::fs::read_to_string(cidfile).ok()?;
    let id = id.trim();
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// What one run's container did, as far as launch waits for it.
enum Started {
    /// It runs, with this id and this init pid on the host.
    Running { id: String, pid: u32 },
    /// The client ended before a container ran (a bad image, a refused option …), with this status.
    Ended(ExitStatus),
}

/// Waits until the client's container runs, or the client ends first.
fn started(run: &ContainerRun, client: &mut Child, cidfile: &Path) -> Result<Started, Failure> {
    let mut id = None;
    loop {
        if let Some(status) = client
            .try_wait()
            .map_err(|e| anyhow::anyhow!("waiting for `{} run`: {e}", run.engine))?
        {
            return Ok(Started::Ended(status));
        }
        if id.is_none() {
            id = read_cid(cidfile);
        }
        if let Some(id) = &id {
            // Created: its pid is 0 until it is started.
            if let Some(pid) = run
                .inspect(id, "{{.State.Pid}}")
                .ok()
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|p| *p > 0)
            {
                return Ok(Started::Running {
                    id: id.clone(),
                    pid,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The container's exit code: the client's, unless the client left it running (`run -d`), then
/// `ENGINE wait`'s.
fn exit_code(run: &ContainerRun, id: &str, client: ExitStatus) -> Option<i32> {
    let running = run.inspect(id, "{{.State.Running}}").ok();
    if running.as_deref() != Some("true") {
        return client.code();
    }
    let all: Vec<&str> = run
        .global
        .iter()
        .map(String::as_str)
        .chain(["wait", id])
        .collect();
    let out = Command::new(&run.program).args(&all).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// How a run ended from its container's exit code: the engines give 128 + N for a process ended by
/// signal N.
fn describe(code: Option<i32>, oom_killed: bool) -> Ended {
    if oom_killed {
        return Ended::Stopped("its container's OOM killer fired".into());
    }
    match code {
        Some(0) => Ended::Finished,
        Some(c) if (129..=128 + 64).contains(&c) => Ended::Stopped(format!(
            "ended by signal {}",
            nix::sys::signal::Signal::try_from(c - 128)
                .map_or_else(|_| (c - 128).to_string(), |s| s.to_string())
        )),
        Some(c) => Ended::Failed(c),
        None => Ended::Failed(1),
    }
}

/// Runs the container `run` and relaunches it as launch does any job.
pub(super) fn runs(
    run: &ContainerRun,
    a: &LaunchArgs,
    config_file: Option<PathBuf>,
    runtime: &Path,
    daemon: &Daemon,
) -> Result<u8, Failure> {
    if let Some(o) = run.conflict() {
        return Err(super::usage(anyhow::anyhow!(
            "launch gives `{} run` its own {o}: leave it out",
            run.engine
        )));
    }
    let name = a.name.clone().or_else(|| run.container_name());
    let token_file = runtime.join("token");
    let mut account: Vec<String> = Vec::new();
    let mut previous: Option<String> = None;
    for n in 0..=a.max_restarts {
        let resume = if n == 0 { "0" } else { "1" };
        // The container memwatch stopped, which a relaunch under the same name would clash with.
        if let Some(id) = previous.take() {
            let _ = run.ask(&["rm", id.as_str()]);
        }
        let cidfile = runtime.join(format!("cid-{n}"));
        let mut env: Vec<(String, String)> = vec![
            ("MEMWATCH_RESUME".into(), resume.into()),
            ("MEMWATCH_RESTART".into(), n.to_string()),
            // Across the container's pid namespace a client cannot see launch as its ancestor.
            ("MEMWATCH_LAUNCHED".into(), "container".into()),
        ];
        if let Some(name) = &name {
            env.push(("MEMWATCH_JOB".into(), name.clone()));
        }
        let mut client = run
            .client(&cidfile, &env, resume)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", run.program))?;
        let (id, pid) = match started(run, &mut client, &cidfile)? {
            Started::Running { id, pid } => (id, pid),
            Started::Ended(status) => {
                let code = status.code().unwrap_or(1);
                account.push(format!(
                    "run {}: `{} run` ended ({status}) before its container ran",
                    n + 1,
                    run.engine
                ));
                eprintln!("memwatch launch: {}", account.join("; "));
                return Ok(u8::try_from(code).unwrap_or(1).max(1));
            }
        };
        let launched = crate::job::Launched {
            run: n + 1,
            max_restarts: a.max_restarts,
            previous: account.clone(),
            lend: a.lend,
        };
        let attached = attach(
            &daemon.socket,
            a,
            name.as_deref(),
            pid,
            config_file.clone(),
            &token_file,
            &launched,
        );
        let job = match attached {
            Ok(job) => job,
            Err(e) => {
                let _ = run.ask(&["kill", id.as_str()]);
                let _ = client.wait();
                return Err(e);
            }
        };
        let status = client
            .wait()
            .map_err(|e| anyhow::anyhow!("waiting for `{} run`: {e}", run.engine))?;
        let code = exit_code(run, &id, status);
        let oom = run
            .inspect(&id, "{{.State.OOMKilled}}")
            .is_ok_and(|o| o == "true");
        let stopped = wait_detached(&daemon.socket, &job)
            .into_iter()
            .find(|e| e.pid == pid && (e.stopped_by_memwatch || e.cuda_oom_stop));
        let ended = match stopped {
            Some(e) => Ended::Stopped(e.how),
            None => describe(code, oom),
        };
        if let Some(code) = account_for(ended, n, a.max_restarts, &mut account, " its container") {
            return Ok(code);
        }
        previous = Some(id);
    }
    Ok(gave_up(&account, a.max_restarts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Option<ContainerRun> {
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        ContainerRun::parse(&words)
    }

    #[test]
    fn runs_of_each_engine_are_found_behind_their_global_options() {
        let r = parse("docker run --rm img python3 t.py").unwrap();
        assert_eq!(r.engine(), "docker");
        assert!(r.global.is_empty());
        assert_eq!(r.after.join(" "), "--rm img python3 t.py");
        let r = parse("/usr/bin/podman --runtime runc --cgroup-manager=cgroupfs run img").unwrap();
        assert_eq!(r.engine(), "podman");
        assert_eq!(
            r.global.join(" "),
            "--runtime runc --cgroup-manager=cgroupfs"
        );
        assert_eq!(r.after.join(" "), "img");
        let r = parse("nerdctl --namespace k8s.io container run --name t img").unwrap();
        assert_eq!(r.container_name().as_deref(), Some("t"));
        assert_eq!(
            parse("docker run --name=x img").unwrap().container_name(),
            Some("x".into())
        );
    }

    #[test]
    fn other_commands_are_not_container_runs() {
        for line in [
            "python3 run",
            "docker exec c run",
            "docker ps",
            "podman --runtime run",
            "docker",
        ] {
            assert!(parse(line).is_none(), "{line}");
        }
    }

    #[test]
    fn the_client_gets_the_cidfile_and_the_environment_after_run() {
        let r = parse("podman --root /x run --rm img train {resume}").unwrap();
        let c = r.client(
            Path::new("/tmp/c/cid-0"),
            &[("MEMWATCH_RESUME".into(), "1".into())],
            "1",
        );
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args.join(" "),
            "--root /x run --cidfile /tmp/c/cid-0 -e MEMWATCH_RESUME=1 --rm img train 1"
        );
        assert!(
            parse("docker run --cidfile=/x img")
                .unwrap()
                .conflict()
                .is_some()
        );
    }

    #[test]
    fn an_exit_code_says_how_the_container_ended() {
        assert!(matches!(describe(Some(0), false), Ended::Finished));
        assert!(matches!(describe(Some(3), false), Ended::Failed(3)));
        match describe(Some(143), false) {
            Ended::Stopped(why) => assert_eq!(why, "ended by signal SIGTERM"),
            _ => panic!("143 is SIGTERM's"),
        }
        assert!(matches!(describe(Some(137), true), Ended::Stopped(w) if w.contains("OOM")));
        assert!(matches!(describe(Some(125), false), Ended::Failed(125)));
    }
}
