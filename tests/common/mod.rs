//! Test helpers: run the real `memwatch` binary against fixture roots and the fake NVML.
#![allow(dead_code)]

pub mod cache;
pub mod cgroup;
pub mod command;
pub mod containers;
mod daemon;
pub mod manifest;
pub mod netns;
pub mod prometheus;
pub mod python;
pub mod skip;
pub mod slurm;
pub mod slurm_nodes;
pub mod tmux;
pub mod users;
pub mod wait;

pub use daemon::{Daemon, Opts};

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

/// A fresh directory for a daemon's files, on a tmpfs (/dev/shm) where there is one: its runtime
/// directory (`state.json`) then lies on a tmpfs as /run does on the machines memwatch runs on, and a
/// busy disk (a test build's writes) does not hold the daemon's writes ahead of a pause.
pub fn tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("memwatch-test.")
            .tempdir_in(shm)
        {
            return dir;
        }
    }
    tempfile::tempdir().unwrap()
}

/// The pause record of `job` in the state file in `runtime_dir` (null or absent: `None`).
pub fn recorded_pause(runtime_dir: &Path, job: &str) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(runtime_dir.join("state.json")).ok()?;
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

/// Runs the repository's script `script` with `args` from the repository's root and returns the last
/// line it printed (what the build scripts name: the .deb, the image); fails the test with its stderr.
pub fn script_output(script: &str, args: &[&str]) -> String {
    let out = Command::new(repo().join(script))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_else(|| panic!("{script} named nothing"))
        .trim()
        .to_owned()
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
