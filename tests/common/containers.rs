//! Real containers for the tests: a container engine (docker, podman) that runs here, the test image
//! (`scripts/container-image.sh`: Debian bookworm minbase with python3, built locally, never pulled),
//! and a running container that is removed on drop, thawed first whatever froze it.
//!
//! An engine that is missing or does not answer fails the test with what to install or start, unless
//! `MEMWATCH_ALLOW_SKIP` names it (`docker`, `podman`: `super::skip`); then the test says it is
//! skipped and returns.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::command::{CommandError, output};

/// A container engine that answers here, and the test image imported into it.
#[derive(Clone, Debug)]
pub struct Engine {
    /// "docker" or "podman".
    pub name: &'static str,
    /// Options before the subcommand.
    pub global: &'static [&'static str],
    /// Options of every `run`.
    pub run: &'static [&'static str],
    /// `memwatch-test:KEY`.
    pub image: String,
}

/// Podman here: no systemd (the cgroupfs manager; events to a file, not the journal), runc (crun
/// 1.8 refuses a cgroup v1 host whose cgroup2 mount offers a controller, "cgroups in hybrid mode
/// not supported"), and limits on open files and processes within the hard ones (root here lacks
/// CAP_SYS_RESOURCE, and podman's defaults, 1048576, are refused: "setrlimit `RLIMIT_NOFILE`:
/// Operation not permitted").
const PODMAN_GLOBAL: &[&str] = &["--cgroup-manager=cgroupfs", "--events-backend=file"];
const PODMAN_RUN: &[&str] = &[
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// What to install and run for `engine`, for a failure's message.
fn how_to_get(engine: &str) -> &'static str {
    match engine {
        "docker" => {
            "install Debian's docker.io (apt-get install docker.io containerd runc) and start its \
             engine: dockerd --iptables=false --ip6tables=false --bridge=none \
             --storage-driver=overlay2 >/var/log/dockerd.log 2>&1 &"
        }
        _ => "install Debian's podman (apt-get install podman runc conmon)",
    }
}

impl Engine {
    /// The engine `name` ("docker" or "podman") with the test image in it: fails the test with what
    /// to install or start when it cannot run a container here, unless `MEMWATCH_ALLOW_SKIP` names it
    /// (`None`, said on stderr: `super::skip::cannot_run`). The image is built (or found cached) once per test binary.
    pub fn get(name: &'static str) -> Option<Engine> {
        static DOCKER: OnceLock<Result<Engine, String>> = OnceLock::new();
        static PODMAN: OnceLock<Result<Engine, String>> = OnceLock::new();
        let cell = match name {
            "docker" => &DOCKER,
            "podman" => &PODMAN,
            _ => panic!("no engine {name}"),
        };
        match cell.get_or_init(|| Engine::probe(name)) {
            Ok(e) => Some(e.clone()),
            Err(why) => {
                super::skip::cannot_run(name, why);
                None
            }
        }
    }

    fn probe(name: &'static str) -> Result<Engine, String> {
        let (global, run): (&[&str], &[&str]) = match name {
            "docker" => (&[], &[]),
            _ => (PODMAN_GLOBAL, PODMAN_RUN),
        };
        let mut e = Engine {
            name,
            global,
            run,
            image: String::new(),
        };
        match e.cmd(&["info"]) {
            Err(CommandError::Spawn { .. }) => {
                return Err(format!("no `{name}` here: {}", how_to_get(name)));
            }
            Err(CommandError::Failed { stderr, .. }) => {
                return Err(format!(
                    "`{name} info` failed ({}): {}",
                    stderr.trim(),
                    how_to_get(name)
                ));
            }
            Ok(_) => {}
        }
        let script = super::repo().join("scripts/container-image.sh");
        let out = output(script.to_str().unwrap(), &[name], |_| {}).map_err(|why| {
            format!("building the test image failed ({why}): run scripts/container-image.sh {name}")
        })?;
        e.image = out
            .lines()
            .last()
            .filter(|l| l.starts_with("memwatch-test:"))
            .ok_or_else(|| format!("scripts/container-image.sh named no image: {out:?}"))?
            .to_owned();
        Ok(e)
    }

    /// `ENGINE ARGS` (with this engine's global options): its stdout, trimmed, or what went wrong.
    pub fn cmd(&self, args: &[&str]) -> Result<String, CommandError> {
        let all: Vec<&str> = self.global.iter().chain(args).copied().collect();
        output(self.name, &all, |_| {}).map(|s| s.trim().to_owned())
    }

    /// As [`Engine::cmd`]; fails the test when the command fails.
    pub fn must(&self, args: &[&str]) -> String {
        self.cmd(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `inspect -f FORMAT` of `container`.
    pub fn inspect(&self, container: &str, format: &str) -> String {
        self.must(&["inspect", "-f", format, container])
    }

    /// Runs `argv` detached in a fresh container named `name` (one of an earlier run removed first),
    /// without a network, with the extra `run` options `opts`: the container, removed on drop.
    pub fn run(&self, name: &str, opts: &[&str], argv: &[&str]) -> Container {
        let mut all = vec!["--network", "none"];
        all.extend(opts);
        self.run_image(name, &self.image.clone(), &all, argv)
    }

    /// As [`Engine::run`], of `image`, with no network option of its own.
    pub fn run_image(&self, name: &str, image: &str, opts: &[&str], argv: &[&str]) -> Container {
        self.remove(name);
        let mut args = vec!["run", "-d", "--name", name];
        args.extend(self.run);
        args.extend(opts);
        args.push(image);
        args.extend(argv);
        let id = self.must(&args);
        let pid: u32 = self
            .inspect(name, "{{.State.Pid}}")
            .parse()
            .expect("the container's pid");
        assert!(pid > 0, "{name} is not running: {}", self.logs(name));
        Container {
            engine: self.clone(),
            name: name.to_owned(),
            id,
            pid,
        }
    }

    /// What the container printed (stdout and stderr), for a failure's message.
    pub fn logs(&self, name: &str) -> String {
        let all: Vec<&str> = self.global.iter().chain(&["logs", name]).copied().collect();
        Command::new(self.name)
            .args(&all)
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default()
    }

    /// Removes the container `name` if there is one, killing it at once.
    fn remove(&self, name: &str) {
        let _ = match self.name {
            "podman" => self.cmd(&["rm", "-f", "-t", "0", name]),
            _ => self.cmd(&["rm", "-f", name]),
        };
    }
}

/// A running container; thawed and removed on drop.
pub struct Container {
    pub engine: Engine,
    pub name: String,
    /// The full id (64 hex digits).
    pub id: String,
    /// Its init process's pid on the host.
    pub pid: u32,
}

impl Container {
    /// The container's cgroup path in `controller`'s v1 hierarchy ("memory", "freezer"), or in the
    /// v2 hierarchy for "" (from /proc/PID/cgroup of its init process).
    pub fn cgroup(&self, controller: &str) -> String {
        let text = std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid))
            .unwrap_or_else(|e| panic!("{} (pid {}) is gone: {e}", self.name, self.pid));
        text.lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
                let hit = if controller.is_empty() {
                    controllers.is_empty()
                } else {
                    controllers.split(',').any(|c| c == controller)
                };
                hit.then(|| path.to_owned())
            })
            .unwrap_or_else(|| panic!("no {controller:?} cgroup in {text}"))
    }

    /// The v1 freezer's state of the container's cgroup (FROZEN, FREEZING, THAWED).
    pub fn v1_freezer(&self) -> String {
        read(&v1_freezer_dir(&self.cgroup("freezer")).join("freezer.state"))
    }

    /// The engine's view: `{{.State.Status}}` ("running", "paused" …).
    pub fn status(&self) -> String {
        self.engine.inspect(&self.name, "{{.State.Status}}")
    }

    /// Whether the engine says the OOM killer ended the container (`{{.State.OOMKilled}}`).
    pub fn oom_killed(&self) -> bool {
        self.engine.inspect(&self.name, "{{.State.OOMKilled}}") == "true"
    }

    /// `ENGINE pause` / `ENGINE unpause` of this container: its output, or what went wrong.
    pub fn pause(&self, pause: bool) -> Result<String, CommandError> {
        self.engine
            .cmd(&[if pause { "pause" } else { "unpause" }, &self.name])
    }

    /// The OOM kills in the container's v1 memory cgroup (`memory.oom_control`'s `oom_kill`).
    pub fn oom_kills(&self) -> u64 {
        let text = read(
            &Path::new("/sys/fs/cgroup/memory")
                .join(self.cgroup("memory").trim_start_matches('/'))
                .join("memory.oom_control"),
        );
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The container's memory cgroup usage (`memory.usage_in_bytes`).
    pub fn usage(&self) -> u64 {
        read(
            &Path::new("/sys/fs/cgroup/memory")
                .join(self.cgroup("memory").trim_start_matches('/'))
                .join("memory.usage_in_bytes"),
        )
        .parse()
        .unwrap_or(0)
    }
}

/// The v1 freezer cgroup directory of a path in that hierarchy.
pub fn v1_freezer_dir(path: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/freezer").join(path.trim_start_matches('/'))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

impl Drop for Container {
    fn drop(&mut self) {
        // A container its engine paused is unpaused by it first: podman will not remove one it holds
        // paused whose freezer is thawed (its `rm -f` runs `runc resume`, "container not paused"),
        // so its freezer is frozen again for the engine's unpause to thaw.
        let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).ok();
        if self
            .engine
            .cmd(&["inspect", "-f", "{{.State.Status}}", &self.name])
            .is_ok_and(|s| s == "paused")
        {
            if cgroups.is_some() {
                let _ = std::fs::write(
                    v1_freezer_dir(&self.cgroup("freezer")).join("freezer.state"),
                    "FROZEN",
                );
            }
            let _ = self.pause(false);
        }
        // Whatever else froze it (memwatch's v2 or v1 freeze left by a failed test), a frozen
        // container does not die: thaw it, then remove it.
        for l in cgroups.as_deref().unwrap_or_default().lines() {
            let mut f = l.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            if rel.is_empty() {
                continue;
            }
            if controllers.is_empty() {
                let _ = std::fs::write(
                    Path::new("/sys/fs/cgroup/unified")
                        .join(rel)
                        .join("cgroup.freeze"),
                    "0",
                );
            } else if controllers.split(',').any(|c| c == "freezer") {
                let _ = std::fs::write(v1_freezer_dir(path).join("freezer.state"), "THAWED");
            }
        }
        self.engine.remove(&self.name);
    }
}

/// A daemon on this machine (root `/`, no GPU).
pub fn daemon() -> super::Daemon {
    super::Daemon::start(super::Opts {
        root: "/".into(),
        gpu_state: None,
        ..super::Opts::default()
    })
}

/// A container name unique to this test process.
pub fn container_name(e: &Engine, tag: &str) -> String {
    format!("mw-test-{}-{tag}-{}", e.name, std::process::id())
}

/// The job `name` in `memwatch jobs --json` (Null when not attached).
pub fn job(d: &super::Daemon, name: &str) -> serde_json::Value {
    d.jobs()
        .into_iter()
        .find(|j| j["name"] == name)
        .unwrap_or(serde_json::Value::Null)
}

/// Each test for each engine, as `docker::NAME` and `podman::NAME` (`Engine` in scope where it is
/// used).
#[allow(unused_macros)]
macro_rules! for_each_engine {
    ($($(#[$meta:meta])* $test:ident;)*) => {
        mod docker {
            $(
                #[test]
                $(#[$meta])*
                fn $test() {
                    if let Some(e) = super::Engine::get("docker") {
                        super::$test(&e);
                    }
                }
            )*
        }
        mod podman {
            $(
                #[test]
                $(#[$meta])*
                fn $test() {
                    if let Some(e) = super::Engine::get("podman") {
                        super::$test(&e);
                    }
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use for_each_engine;
