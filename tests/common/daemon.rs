//! A memwatch daemon a test starts on a fixture root (or `/`), with its own socket, state directory and
//! listen address; killed on drop.

use super::*;

/// A running daemon; killed on drop.
pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub gpu_state: PathBuf,
    /// The control socket and state directory (kept across restarts when `Opts::state` is given).
    pub socket: PathBuf,
    pub state: PathBuf,
    /// The runtime directory (`state.json`): the default, `state` beside the socket.
    pub runtime: PathBuf,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// Options for [`Daemon::start`].
pub struct Opts<'a> {
    pub root: PathBuf,
    pub gpu_state: Option<&'a str>,
    pub extra_config: &'a str,
    pub interval_ms: u64,
    /// `sampling.calm_interval_ms`; `None`: `interval_ms` (full samples never stretched, so that a
    /// test's cadence is the one it names; tests/calm.rs tests the stretching).
    pub calm_interval_ms: Option<u64>,
    /// More keys of `[sampling]` (the harness writes the section).
    pub sampling: &'a str,
    /// The state directory; the control socket and the runtime directory lie beside it, in `run`. A
    /// fresh temp dir when `None` (`super::tempdir`).
    pub state: Option<PathBuf>,
    /// Set in the daemon's environment (what systemd would set, say); nothing else of the test's
    /// environment is changed.
    pub env: &'a [(&'a str, &'a str)],
    /// More keys of `[control]` (the section the harness writes last).
    pub control: &'a str,
    /// Where the daemon listens (`listen`; port 0: any free one).
    pub listen: &'a str,
    /// A command the daemon is started through (`nsenter …` into a node's namespaces), which execs
    /// its arguments; none when empty.
    pub through: &'a [&'a str],
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            root: fixture_root(),
            gpu_state: Some(include_str!("../fixtures/nvml/two-gpus.json")),
            extra_config: "",
            interval_ms: 100,
            calm_interval_ms: None,
            sampling: "",
            state: None,
            env: &[],
            control: "",
            listen: "127.0.0.1:0",
            through: &[],
        }
    }
}

impl Daemon {
    /// A hog touching 768 MiB at 1 GiB/s in `cg` (limited to 512 MiB first), ready and attached as
    /// `name`: the child, its stdout (it says `done 768` at the end) and the file whose creation
    /// starts it.
    pub fn fast_hog(
        &self,
        cg: &cgroup::MemCgroup,
        name: &str,
    ) -> (Child, BufReader<std::process::ChildStdout>, PathBuf) {
        self.fast_hog_of(cg, name, None)
    }

    /// `fast_hog`, the hog run and attached by local user `user` when given (the daemon's
    /// directories opened to it first, `open_to_everyone`).
    pub fn fast_hog_of(
        &self,
        cg: &cgroup::MemCgroup,
        name: &str,
        user: Option<&str>,
    ) -> (Child, BufReader<std::process::ChildStdout>, PathBuf) {
        cg.set_limit(512 << 20);
        let go = self.dir.path().join(format!("go-{name}"));
        let uid = user.map(super::ensure_user);
        if uid.is_some() {
            self.open_to_everyone();
        }
        let (hog, out) = cg.hog_as(
            &memhog(),
            &["--rate-mib", "1024", "--total-mib", "768"],
            &go,
            cg.freezer.is_some(),
            uid,
        );
        let pid = hog.id().to_string();
        let attach = ["attach", pid.as_str(), "--name", name];
        let (code, err) = match user {
            Some(user) => self.ctl_as(user, &attach),
            None => {
                let (code, _, err) = self.ctl(&attach);
                (code, err)
            }
        };
        assert_eq!(code, 0, "attach {name}: {err}");
        (hog, out, go)
    }

    /// `memwatch ARGS --socket <this daemon's>` run as local user `user` (`runuser`): its exit code
    /// and stderr.
    pub fn ctl_as(&self, user: &str, args: &[&str]) -> (i32, String) {
        let out = Command::new("runuser")
            .args(["-u", user, "--"])
            .arg(super::bin())
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("runuser");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Opens the daemon's directories (state and socket) to every user, so that tests acting as an
    /// unprivileged user can reach its control socket.
    pub fn open_to_everyone(&self) {
        use std::os::unix::fs::PermissionsExt;
        for dir in [self.dir.path(), self.socket.parent().unwrap()] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    /// A daemon on this machine (root `/`, no GPU) that samples and probes once a second and
    /// predicts nothing (`reaction_ms = 0`): only the lines decide. The engine's own probe, every
    /// 10 ms once a crossing woke it, would otherwise read a cgroup as often as the kernel's
    /// notification comes and stop a job itself in some runs (a stop as good, but not the
    /// reflex's): here it probes on a crossing only after the wake thread handled it.
    pub fn level_only() -> Daemon {
        Daemon::start(Opts {
            root: "/".into(),
            gpu_state: None,
            interval_ms: 1000,
            extra_config: "[policy]\nreaction_ms = 0\n",
            sampling: "probe_interval_ms = 1000\nfast_interval_ms = 1000",
            ..Opts::default()
        })
    }

    pub fn start(o: Opts) -> Daemon {
        let dir = super::tempdir();
        let gpu_state = dir.path().join("gpu.json");
        if let Some(s) = o.gpu_state {
            std::fs::write(&gpu_state, s).unwrap();
        }
        let state = o.state.clone().unwrap_or_else(|| dir.path().join("state"));
        // The state directory is private (it holds tokens); the socket lives beside it, as in /run.
        let socket = state.with_file_name("run").join("control.sock");
        let runtime = socket.with_file_name("state");
        let config = dir.path().join("memwatch.toml");
        std::fs::write(
            &config,
            format!(
                "listen = {:?}\n{}\n[sampling]\ninterval_ms = {}\ncalm_interval_ms = {}\n{}\n[host]\nroot = {:?}\n[gpu]\nlibrary = {:?}\n\
                 [control]\nsocket = {:?}\nstate_dir = {:?}\n{}\n",
                o.listen,
                o.extra_config,
                o.interval_ms,
                o.calm_interval_ms.unwrap_or(o.interval_ms),
                o.sampling,
                o.root,
                fake_nvml(),
                socket,
                state,
                o.control
            ),
        )
        .unwrap();
        let mut command = match o.through.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        let mut child = command
            .args(["--config"])
            .arg(&config)
            .args(["--log-format", "json", "--log-level", "debug", "run"])
            .env("MEMWATCH_FAKE_NVML_STATE", &gpu_state)
            .envs(o.env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memwatch");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["fields"]["message"] == "listening" {
                        let _ =
                            tx.send(v["fields"]["addr"].as_str().unwrap_or_default().to_owned());
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr: SocketAddr = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| {
                panic!(
                    "daemon did not say where it listens ({e}); log:\n{}",
                    log.lock().unwrap().join("\n")
                )
            })
            .parse()
            .unwrap();
        let d = Daemon {
            child,
            addr,
            dir,
            gpu_state,
            socket,
            state,
            runtime,
            log,
        };
        d.wait_until(
            |d| d.get("/-/ready").0 == 200,
            "the daemon never became ready",
        );
        d
    }

    /// Runs `memwatch <args> --socket <this daemon's socket>`.
    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let mut all: Vec<&str> = args.to_vec();
        let socket = self.socket.to_str().unwrap().to_owned();
        all.push("--socket");
        all.push(&socket);
        memwatch(&all)
    }

    /// The attached jobs, from the control socket.
    pub fn jobs(&self) -> Vec<serde_json::Value> {
        let (code, out, err) = self.ctl(&["jobs", "--json"]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<Vec<serde_json::Value>>(&out).unwrap()
    }

    /// The job's state ("running" / "paused"), or None when it is not attached.
    pub fn job_state(&self, name: &str) -> Option<String> {
        self.jobs()
            .iter()
            .find(|j| j["name"] == name)
            .map(|j| j["state"].as_str().unwrap_or_default().to_owned())
    }

    /// Events from /api/v1/events.
    pub fn events(&self) -> Vec<serde_json::Value> {
        let (status, body) = self.get("/api/v1/events?limit=500");
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["events"].as_array().cloned().unwrap_or_default()
    }

    /// Full samples taken so far (`memwatch_samples_total`).
    pub fn samples(&self) -> u64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix("memwatch_samples_total ")?.parse().ok())
            .unwrap_or(0)
    }

    /// Waits until `n` more full samples were taken: each one a chance for the engine to act, so a
    /// check that something did not happen waits on these rather than on a sleep.
    pub fn wait_samples(&self, n: u64) {
        let from = self.samples();
        self.wait_until(|d| d.samples() >= from + n, "the daemon stopped sampling");
    }

    /// Sends SIGTERM and waits for the daemon to exit; returns its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        self.child.wait().ok().and_then(|s| s.code())
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A plain HTTP/1.1 GET; returns (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        self.request(&format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ))
    }

    pub fn request(&self, raw: &str) -> (u16, String) {
        http(self.addr, raw.as_bytes())
    }

    pub fn metrics(&self) -> String {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200);
        body
    }

    pub fn set_gpu_state(&self, json: &str) {
        let tmp = self.gpu_state.with_extension("tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, &self.gpu_state).unwrap();
    }

    /// Polls `cond` for up to 10 s.
    pub fn wait_until(&self, cond: impl Fn(&Daemon) -> bool, what: &str) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if cond(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{what}; log:\n{}", self.log.lock().unwrap().join("\n"));
    }

    /// The current guardian's pid, from the daemon's log.
    pub fn guardian_pid(&self) -> Option<u32> {
        self.log.lock().unwrap().iter().rev().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["fields"]["message"] == "guardian started")
                .then(|| v["fields"]["pid"].as_u64())
                .flatten()
                .map(|p| p as u32)
        })
    }

    /// Kills the daemon with SIGKILL, as a crash would; with `guardian_too`, its guardian first, so
    /// that nothing resumes the jobs until a new daemon starts.
    pub fn crash(&mut self, guardian_too: bool) {
        if guardian_too {
            let g = self.wait_guardian_pid();
            let _ = Command::new("kill")
                .args(["-KILL", &g.to_string()])
                .status();
            assert!(
                eventually(5.0, || proc_state(g).is_none_or(|s| s == 'Z')),
                "the guardian {g} did not die"
            );
        }
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Kills the guardian and the daemon with SIGKILL in the same instant (nothing resumes the
    /// jobs until a new daemon starts).
    pub fn kill_both(&mut self) {
        let g = self.wait_guardian_pid();
        // SAFETY: plain kill(2) calls on pids this test started (the guardian is the daemon's child).
        unsafe {
            nix::libc::kill(g as i32, nix::libc::SIGKILL);
            nix::libc::kill(self.child.id() as i32, nix::libc::SIGKILL);
        }
        self.child.wait().unwrap();
        assert!(eventually(5.0, || proc_state(g).is_none_or(|s| s == 'Z')));
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
