//! Test helpers: run the real `memwatch` binary against fixture roots and the fake NVML.
#![allow(dead_code)]

pub mod cgroup;
pub mod netns;
pub mod prometheus;
pub mod python;
pub mod slurm;
pub mod slurm_nodes;
pub mod tmux;
pub mod users;
pub mod wait;

// Not every test binary acts as a user.
#[allow(unused_imports)]
pub use users::{command_as, ensure_user, gid_of, spawn_as};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_memwatch"))
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture_root() -> PathBuf {
    repo().join("tests/fixtures/root")
}

/// Builds the fake NVML once per test binary and returns the library's path.
pub fn fake_nvml() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "memwatch-fake-nvml"])
            .current_dir(repo())
            .status()
            .expect("run cargo build for the fake NVML");
        assert!(status.success(), "building the fake NVML failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("target"));
        let lib = target.join("debug/libmemwatch_fake_nvml.so");
        assert!(lib.is_file(), "no fake NVML at {}", lib.display());
        lib
    })
    .clone()
}

/// The pause record of `job` in the state file under `state_dir` (null or absent: `None`).
pub fn recorded_pause(state_dir: &Path, job: &str) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(state_dir.join("state.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["jobs"]
        .as_array()?
        .iter()
        .find(|j| j["name"] == job)
        .map(|j| j["paused"].clone())
        .filter(|p| !p.is_null())
}

/// xorshift: reproducible random delays without a dependency (print the seed).
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from the clock; the seed is printed, so that a failing run can be told apart.
    pub fn from_clock() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        eprintln!("seed {seed}");
        Rng(seed)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A running daemon; killed on drop.
pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub gpu_state: PathBuf,
    /// The control socket and state directory (kept across restarts when `Opts::state` is given).
    pub socket: PathBuf,
    pub state: PathBuf,
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
    /// Control socket and state live here; a fresh temp dir when `None`.
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
        cg.set_limit(512 << 20);
        let go = self.dir.path().join(format!("go-{name}"));
        let (hog, out) = cg.hog(
            &memhog(),
            &["--rate-mib", "1024", "--total-mib", "768"],
            &go,
        );
        let (code, _, err) = self.ctl(&["attach", &hog.id().to_string(), "--name", name]);
        assert_eq!(code, 0, "attach {name}: {err}");
        (hog, out, go)
    }

    /// Opens the daemon's directories (state and socket) to every user, so that tests acting as an
    /// unprivileged user can reach its control socket.
    pub fn open_to_everyone(&self) {
        use std::os::unix::fs::PermissionsExt;
        for dir in [self.dir.path(), self.socket.parent().unwrap()] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    pub fn start(o: Opts) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let gpu_state = dir.path().join("gpu.json");
        if let Some(s) = o.gpu_state {
            std::fs::write(&gpu_state, s).unwrap();
        }
        let state = o.state.clone().unwrap_or_else(|| dir.path().join("state"));
        // The state directory is private (it holds tokens); the socket lives beside it, as in /run.
        let socket = state.with_file_name("run").join("control.sock");
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

/// Sends raw bytes and reads the whole reply (the request asks the server to close).
pub fn http(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut s = match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(_) => return (0, String::new()),
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    if s.write_all(raw).is_err() {
        return (0, String::new());
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, dechunk(&body))
}

/// Undoes chunked transfer encoding when the body looks chunked.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return body.to_owned();
        };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_owned();
        };
        if n == 0 {
            return out;
        }
        if after.len() < n {
            return body.to_owned();
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
}

/// Runs `memwatch` with arguments; returns (exit code, stdout, stderr).
pub fn memwatch(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The memhog test program, built once per test binary.
pub fn memhog() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "memwatch-memhog"])
            .current_dir(repo())
            .status()
            .expect("run cargo build for memhog");
        assert!(status.success(), "building memhog failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("target"));
        target.join("debug/memhog")
    })
    .clone()
}

/// A process's state letter (R, S, T …) from /proc, or None when it is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].trim_start().chars().next()
}

/// Polls `cond` every 5 ms for up to `secs`; true if it held.
pub fn eventually(secs: f64, cond: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

/// Copies a fixture tree so a test can change it.
pub fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dst = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&entry.path(), &dst);
        } else {
            std::fs::copy(entry.path(), dst).unwrap();
        }
    }
}

/// `promtool check metrics` on `text`: returns its findings (empty when clean).
pub fn promtool_check_metrics(text: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool not found: install Debian's `prometheus` package (./scripts/test.sh does)",
        );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        findings
    } else {
        format!("exit {:?}: {findings}", out.status.code())
    }
}

/// A job tree: memhog with `workers` sleeping workers, moved into `cgroup` (its `cgroup.procs`) first
/// when given. Returns the child and its pids, root first.
pub fn memhog_tree(cgroup: Option<&Path>, workers: usize) -> (Child, Vec<u32>) {
    let enter = cgroup
        .map(|d| format!("echo $$ > {}/cgroup.procs && ", d.display()))
        .unwrap_or_default();
    let mut child = Command::new("sh")
        .args([
            "-c",
            &format!(
                "{enter}exec {} --workers {workers} --total-mib 1 --hold-ms 600000",
                memhog().display()
            ),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = child.id();
    let mut pids = vec![pid];
    pids.extend(
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse::<u32>().unwrap()),
    );
    assert_eq!(pids.len(), workers + 1, "memhog did not start its workers");
    (child, pids)
}

/// One `jobs` request on a control socket; returns how long the answer took.
pub fn jobs_round_trip(socket: &Path) -> Duration {
    let start = Instant::now();
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"{\"cmd\":\"jobs\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":true"), "{line}");
    start.elapsed()
}

/// Continues and kills `pids` (children first), then reaps `child`.
pub fn end_tree(child: &mut Child, pids: &[u32]) {
    for p in pids.iter().rev() {
        let _ = Command::new("kill")
            .args(["-CONT", &p.to_string()])
            .status();
        let _ = Command::new("kill")
            .args(["-KILL", &p.to_string()])
            .status();
    }
    let _ = child.wait();
}

/// How many file descriptors process `pid` holds.
pub fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A fresh cgroup for a job of its own: v2 (`unified`, or the v2 root) and the v1 freezer hierarchy.
pub fn own_cgroups() -> Vec<(std::path::PathBuf, &'static str)> {
    let mut out = Vec::new();
    let name = format!("memwatch-freeze-{}", std::process::id());
    for (base, probe) in [
        ("/sys/fs/cgroup/unified", "cgroup.freeze"),
        ("/sys/fs/cgroup", "cgroup.freeze"),
        ("/sys/fs/cgroup/freezer", "freezer.state"),
    ] {
        let dir = std::path::Path::new(base).join(&name);
        if std::fs::create_dir(&dir).is_ok() {
            if dir.join(probe).exists() {
                out.push((dir, probe));
            } else {
                let _ = std::fs::remove_dir(&dir);
            }
        }
    }
    out
}
