//! What the benchmarks share: the release memhog, a process's state, and a release daemon on a private
//! socket and state directory, GPU off.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Real memory cgroups (and a v1 freezer beside), shared with the tests.
#[path = "../../tests/common/cgroup.rs"]
pub mod cgroup;

/// A process's state letter, under the name the shared cgroup helper uses.
pub fn proc_state(pid: u32) -> Option<char> {
    state(pid)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The memwatch binary the benchmarks launch (daemon and client): `MEMWATCH_BIN` from the environment
/// when set (e.g. to compare two builds side by side in one run), else the one cargo built.
pub fn memwatch_bin() -> PathBuf {
    std::env::var_os("MEMWATCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_memwatch")))
}

/// Builds memhog in release mode and returns its path.
pub fn memhog() -> PathBuf {
    let ok = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "memwatch-memhog"])
        .current_dir(repo())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "cannot build memhog");
    repo().join("target/release/memhog")
}

/// Whether cargo only lists or smoke-tests the benchmarks (`cargo test --benches`, `--list`): then a
/// benchmark does nothing.
pub fn listing() -> bool {
    std::env::args().any(|a| a == "--list" || a == "--test")
}

/// The run count: `RUNS` from the environment, else `default`.
/// The niceness `NICE` asks for (the unit's `Nice=-10` for one), if set: the daemon runs at it, and
/// so do the floors' and poller's threads, so each watcher gets the CPU on the same terms.
pub fn nice() -> Option<i32> {
    std::env::var("NICE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

/// Sets the calling thread's niceness to [`nice`]'s, if set.
pub fn nice_this_thread() {
    if let Some(n) = nice() {
        // SAFETY: setpriority(2) on the calling thread's own id.
        let r = unsafe {
            nix::libc::setpriority(nix::libc::PRIO_PROCESS, nix::libc::gettid() as u32, n)
        };
        assert_eq!(r, 0, "setpriority({n}) failed (run as root)");
    }
}

pub fn runs(default: usize) -> usize {
    std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` quantile (0–1) of `v`, nearest rank; NaN when empty. Sorts `v`.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// A process's state letter (R, S, T …), or None when it is gone.
pub fn state(pid: u32) -> Option<char> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    t[t.rfind(')')? + 1..].trim_start().chars().next()
}

/// The daemon under test; killed on drop.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    /// The binary it runs, and its client.
    bin: PathBuf,
    _dir: tempfile::TempDir,
}

/// `BASE_BIN` from the environment: an earlier build a benchmark runs beside this one, run by run
/// alternated, where it supports that.
pub fn base_bin() -> Option<PathBuf> {
    std::env::var_os("BASE_BIN").map(PathBuf::from)
}

impl Daemon {
    /// Starts `memwatch run` with `extra` appended to its config (e.g. a `[policy]` table).
    pub fn start(extra: &str) -> Daemon {
        Daemon::start_bin(&memwatch_bin(), extra)
    }

    /// The same with the memwatch binary `bin`.
    pub fn start_bin(bin: &Path, extra: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let config = dir.path().join("memwatch.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\n[gpu]\nenabled = false\n[control]\nsocket = {socket:?}\n\
                 state_dir = {:?}\nmax_jobs_per_uid = 1024\n{extra}",
                dir.path().join("state")
            ),
        )
        .unwrap();
        // `DAEMON_LOG=warn`: the daemon's warnings too (a slow turn of its owner task), on stderr.
        let level = std::env::var("DAEMON_LOG").unwrap_or_else(|_| "error".into());
        let mut command = Command::new(bin);
        command.args([
            "--config",
            config.to_str().unwrap(),
            "--log-level",
            &level,
            "run",
        ]);
        if let Some(n) = nice() {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: setpriority(2) only, between fork and exec: every thread the daemon starts
            // inherits it, as under the unit's Nice=.
            unsafe {
                command.pre_exec(move || {
                    if nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, n) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().unwrap();
        let start = Instant::now();
        while !socket.exists() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon {
            child,
            socket,
            bin: bin.to_owned(),
            _dir: dir,
        }
    }

    /// Runs `memwatch <args> --socket …`; whether it succeeded.
    pub fn ctl(&self, args: &[&str]) -> bool {
        Command::new(&self.bin)
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// How the state file records the reflex of `job` as armed (its hold's kind: `signals`,
    /// `cgroup_v1_freezer`), if it does.
    pub fn armed(&self, job: &str) -> Option<String> {
        std::fs::read_to_string(self._dir.path().join("state/state.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| {
                v["jobs"]
                    .as_array()?
                    .iter()
                    .find(|j| j["name"] == job && j["paused"]["phase"] == "armed")?["paused"]
                    ["hold"]["kind"]
                    .as_str()
                    .map(str::to_owned)
            })
    }

    /// How the kernel watches the job (the API's `watch`: `watched`, `registering`, `probed`).
    pub fn watch(&self, job: &str) -> Option<String> {
        let answer = self.request(r#"{"cmd":"jobs"}"#);
        let v: serde_json::Value = serde_json::from_str(&answer).ok()?;
        v["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["name"] == job)
            .and_then(|j| j["watch"].as_str().map(str::to_owned))
    }

    /// The daemon's events so far (`events.jsonl` in its state directory).
    pub fn events(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("state/events.jsonl")).unwrap_or_default()
    }

    /// One JSON request on the control socket; the answer line.
    pub fn request(&self, json: &str) -> String {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.write_all(json.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        line
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// After a run: room for the hog, its job detached, the hog thawed and continued (the caller then
/// kills and reaps it).
pub fn let_go(cg: &cgroup::MemCgroup, d: Option<&Daemon>, name: &str, pid: u32) {
    cg.set_limit(4096 << 20);
    if let Some(d) = d {
        d.ctl(&["detach", name]);
    }
    cg.thaw();
    let _ = Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status();
}

/// An eventfd the kernel signals when the v1 memory cgroup `mem`'s usage crosses `bytes`, and the
/// usage file it watches (kept open as long as the eventfd is waited on).
pub fn threshold(mem: &std::path::Path, bytes: u64) -> (std::os::fd::OwnedFd, std::fs::File) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain syscall; a non-negative return is a new descriptor we own.
    let efd = unsafe { OwnedFd::from_raw_fd(nix::libc::eventfd(0, nix::libc::EFD_CLOEXEC)) };
    let usage = std::fs::File::open(mem.join("memory.usage_in_bytes")).unwrap();
    std::fs::write(
        mem.join("cgroup.event_control"),
        format!("{} {} {bytes}", efd.as_raw_fd(), usage.as_raw_fd()),
    )
    .unwrap();
    (efd, usage)
}

/// Blocks until `efd` is signalled or `stop` is set; the instant it woke.
pub fn wait_eventfd(
    efd: &std::os::fd::OwnedFd,
    stop: &std::sync::atomic::AtomicBool,
) -> Option<Instant> {
    use std::os::fd::AsRawFd;
    let mut pfd = nix::libc::pollfd {
        fd: efd.as_raw_fd(),
        events: nix::libc::POLLIN,
        revents: 0,
    };
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        // SAFETY: one valid pollfd.
        if unsafe { nix::libc::poll(&mut pfd, 1, 50) } > 0 {
            return Some(Instant::now());
        }
    }
    None
}

/// Reads the v1 memory cgroup `mem`'s usage every `every` until it is at `bytes` (`true`) or `stop`
/// is set (`false`): a plain poller, the baseline the benchmarks set beside the kernel's eventfd.
pub fn poll_usage(
    mem: &std::path::Path,
    bytes: u64,
    every: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> bool {
    let path = mem.join("memory.usage_in_bytes");
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let u: u64 = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if u >= bytes {
            return true;
        }
        std::thread::sleep(every);
    }
    false
}
