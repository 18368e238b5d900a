//! Reaction benchmark (needs root and a memory cgroup; reported in BENCHMARKS.md, not a test).
//!
//! A hog touches memory at 0.5, 1 and 2 GiB/s inside a memory cgroup limited to 512 MiB, with memwatch
//! attached. This harness polls the cgroup's usage and the hog's state every millisecond and records
//! when usage crossed the critical level (95 % of the limit) and when the SIGSTOP took effect.
//!  - `level` runs: prediction off (`reaction_ms = 0`), critical at 95 %: latency = stopped − crossed.
//!  - `default` runs: the shipped policy, which pauses on the projected time to exhaustion, before the
//!    critical level: reported as how far below the limit the hog was stopped.
//!
//! Then earlyoom (Debian's, default settings) watches the same hog in the same cgroup without memwatch.
//!
//! `cargo bench --bench reaction` (RUNS=50 by default).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 512 * MIB;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn memhog() -> PathBuf {
    let ok = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "memwatch-memhog"])
        .current_dir(repo())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "cannot build memhog");
    repo().join("target/release/memhog")
}

struct Cg(PathBuf);
impl Cg {
    fn new() -> Cg {
        let d = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/memwatch-bench-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&d).expect("create a v1 memory cgroup (run as root)");
        Cg(d)
    }
    fn set(&self, bytes: u64) {
        std::fs::write(self.0.join("memory.limit_in_bytes"), bytes.to_string()).unwrap();
    }
    fn usage(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.oom_control"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
    fn spawn(&self, hog: &Path, rate: u64, go: &Path) -> Child {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec {} --rate-mib {rate} --total-mib 768 --wait-file {} --hold-ms 200",
            self.0.display(),
            hog.display(),
            go.display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }
}
impl Drop for Cg {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn state(pid: u32) -> Option<char> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    t[t.rfind(')')? + 1..].trim_start().chars().next()
}

struct Daemon {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}
impl Daemon {
    fn start(policy: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let config = dir.path().join("memwatch.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\n[gpu]\nenabled = false\n[control]\nsocket = {socket:?}\nstate_dir = {:?}\n{policy}",
                dir.path()
            ),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_memwatch"))
            .args([
                "--config",
                config.to_str().unwrap(),
                "--log-level",
                "error",
                "run",
            ])
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !socket.exists() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon {
            child,
            socket,
            _dir: dir,
        }
    }
    fn ctl(&self, args: &[&str]) {
        let ok = Command::new(env!("CARGO_BIN_EXE_memwatch"))
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "memwatch {args:?} failed");
    }
}
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One run: returns (usage when stopped, ms from crossing 95 % to stopped (negative: stopped before),
/// oom killed, survived).
fn run(cg: &Cg, hog: &Path, rate: u64, d: Option<&Daemon>, i: usize) -> (u64, Option<f64>, bool) {
    cg.set(LIMIT);
    let go = std::env::temp_dir().join(format!("memwatch-bench-go-{}-{i}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let mut child = cg.spawn(hog, rate, &go);
    let pid = child.id();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    if let Some(d) = d {
        d.ctl(&["attach", &pid.to_string(), "--name", &format!("bench{i}")]);
    }
    let oom = cg.oom_kills();
    std::fs::write(&go, "").unwrap();
    let t0 = Instant::now();
    let critical = LIMIT * 95 / 100;
    let (mut crossed, mut stopped, mut usage_at_stop) = (None, None, 0);
    while t0.elapsed() < Duration::from_secs(5) {
        let u = cg.usage();
        let s = state(pid);
        let now = t0.elapsed().as_secs_f64() * 1000.0;
        if crossed.is_none() && u >= critical {
            crossed = Some(now);
        }
        if s == Some('T') {
            stopped = Some(now);
            usage_at_stop = u;
            break;
        }
        if s.is_none() || s == Some('Z') || cg.oom_kills() > oom {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let killed = cg.oom_kills() > oom;
    let latency = match (stopped, crossed) {
        (Some(s), Some(c)) => Some(s - c),
        (Some(_), None) => Some(f64::NEG_INFINITY),
        _ => None,
    };
    cg.set(4096 * MIB);
    if d.is_none() || killed {
        let _ = child.kill();
    }
    let _ = child.wait();
    let _ = std::fs::remove_file(&go);
    (usage_at_stop / MIB, latency, killed)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let hog = memhog();
    let cg = Cg::new();
    for (label, policy) in [("level", "[policy]\nreaction_ms = 0\n"), ("default", "")] {
        let d = Daemon::start(policy);
        for rate in [512u64, 1024, 2048] {
            let (mut lat, mut usage, mut killed, mut before) = (Vec::new(), Vec::new(), 0, 0);
            for i in 0..runs {
                let (u, l, k) = run(&cg, &hog, rate, Some(&d), i);
                if k {
                    killed += 1;
                }
                match l {
                    Some(x) if x.is_finite() => lat.push(x),
                    Some(_) => before += 1,
                    None => {}
                }
                if l.is_some() {
                    usage.push(u as f64);
                }
            }
            let survived = runs - killed;
            let lat_s = if lat.is_empty() {
                "-".to_owned()
            } else {
                format!(
                    "p50 {:.1} ms, p99 {:.1} ms",
                    pct(&mut lat.clone(), 0.5),
                    pct(&mut lat, 0.99)
                )
            };
            let use_s = if usage.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.0}", pct(&mut usage, 0.5))
            };
            println!(
                "memwatch {label:<8} {rate:>5} MiB/s: survived {survived}/{runs}, stopped before crossing 95 %: {before}, crossing→stop {lat_s}, median usage at stop {use_s} MiB of 512"
            );
        }
    }
    // earlyoom watches host MemAvailable and SwapFree only; in a cgroup the kernel's OOM killer decides.
    let earlyoom = Command::new("earlyoom")
        .args(["-r", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match earlyoom {
        Ok(mut e) => {
            for rate in [512u64, 1024, 2048] {
                let n = runs.min(10);
                let killed = (0..n).filter(|i| run(&cg, &hog, rate, None, *i).2).count();
                println!(
                    "earlyoom (defaults)    {rate:>5} MiB/s: OOM-killed {killed}/{n} (earlyoom does not see cgroup limits)"
                );
            }
            let _ = e.kill();
            let _ = e.wait();
        }
        Err(e) => println!("earlyoom not run: {e}"),
    }
}
