//! Reflex benchmark (needs root and the v1 memory and freezer controllers; reported in BENCHMARKS.md,
//! not a test): how soon after the kernel's crossing of 95 % a job is stopped.
//!
//! A hog touches memory at 1 and 4 GiB/s (1 MiB chunks) inside a v1 memory cgroup limited to
//! 512 MiB. Side by side in one run, run by run alternated, each row gets the same hog:
//!  - memwatch, level only (`reaction_ms = 0`), with the reflex (`policy.reflex`, the default) and
//!    without it (the engine's probe decides), each by signals and by the freezer (the hog owns a v1
//!    freezer cgroup);
//!  - the floors: a thread blocked on the kernel's threshold eventfd at 95 % that sends SIGSTOP, or
//!    writes FROZEN to an already open freezer.state, once as the kernel's first freeze (no
//!    daemon's held cgroup left, nothing else frozen) and once with the freezer kept active (an
//!    empty freezer cgroup held frozen for the run, as the daemon holds one while a v1 freezer
//!    reflex is armed: `memwatch::reflex::active`);
//!  - a 1 ms poller of the cgroup's usage that sends SIGSTOP at 95 %.
//!
//! The crossing is timed by an observer of its own: a thread blocked on a second eventfd at the
//! same 95 % threshold (the kernel signals both in the same check). The stop is timed by
//! `waitid(WSTOPPED)` on the hog, which is this process's child (signals), or by reading the
//! freezer's state every 20 µs until it says FROZEN (freezer; that resolution is part of every
//! freezer row alike). Latency = stop − crossing. Survival: the cgroup's OOM killer did not fire.
//! Past the line: the cgroup's peak usage (memory.max_usage_in_bytes, reset at the go) less the line,
//! what the job took after the crossing before it stopped.
//!
//! A memwatch row lets the hog go once its reflex is armed and its thresholds are all registered
//! (the API's `watch`, `watched`): each registration waits for an RCU grace period, and the run
//! before's thresholds on the same cgroup are removed first, one grace period each too, so a hog let
//! go at once races them and is caught by the engine's probe instead (`RACE=1` lets it go at once).
//! With `FRESH=1` each run has a memory cgroup of its own, as a job started in a new unit has: no
//! thresholds of the run before to remove first.
//! The hog's binary is read into the page cache by the bench first, so that its text is not charged
//! to the hog's cgroup: the reflex goes by usage less clean cache, and that cache would put its line
//! past the floors'. The cache charged at the go is reported with each row.
//!
//! With `WORKERS=N` each hog first starts N sleeping workers (a job of N + 1 processes, as a trainer
//! with DataLoader workers), the limit is 512 MiB above what they hold, and a stop is timed to the
//! last process stopped: for signals, once the root is stopped, a pass every 200 µs over the
//! processes not stopped yet reads each one's /proc/PID/stat until none is left (the resolution is
//! one such pass and the pause), and the floor by signals
//! sends SIGSTOP to every pid of the cgroup's `cgroup.procs` once woken. Only the reflex's rows and
//! the two floors run then.
//!
//! With `NICE=N` (the unit's `Nice=-10`, say) the daemon runs at that niceness, as systemd starts it,
//! and so do the floors' and the poller's threads; the hog and the observers stay at 0.
//!
//! With `BASE_BIN=<an earlier memwatch>` that build's reflex rows run too, alternated run by run with
//! this build's: a before and after in one run.
//!
//! With `BUSY=N`, N threads spin for the whole bench (the normal policy, as a job's busy threads),
//! and the threads that time the crossing and the stop run at real-time priority so that the spin
//! delays neither stamp; the floors' and the poller's threads stay at the normal policy. With
//! `RT0=1` this build also runs with its wake thread at the daemon's priority (`reflex_priority =
//! 0`): the real-time priority's share of the figures.
//!
//! With `HOG_UID=N` the hog runs as user N (root attaches it): a job not root's, whose reflex acts with
//! its owner's checks (the kernel's at a signal, sent with the owner's uids; at a freeze, the same
//! asked of every member first). The floors make no such check.
//!
//! With `SLOW_US=N` each run slower than N µs is told on stderr, with the daemon's pause event (what
//! stopped the job: the reflex, with its own time, or the engine's probe). With `ROWS=w1,w2` only the
//! rows whose label holds one of the words run (`ROWS=freez`: the freezer's rows and its floor;
//! `ROWS=reflex,floor`: the reflexes and the floors). With `DAEMON_LOG=warn` the daemons' warnings
//! (a slow turn of the owner task, with what it handled) come on stderr too.
//!
//! `cargo bench --bench reflex` (RUNS=30 by default; RATES=1024,4096 in MiB/s; WORKERS=0; NICE unset).

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::cgroup::MemCgroup;
use common::{Daemon, memhog, pct};

const MIB: u64 = 1 << 20;
/// The room the hog has above what its workers hold.
const LIMIT: u64 = 512 * MIB;

/// 95 % of `limit`: the critical line.
fn critical(limit: u64) -> u64 {
    limit * 95 / 100
}

#[derive(Clone, Copy, PartialEq)]
enum Row {
    /// memwatch: with the reflex or not, by the freezer or not.
    Memwatch { reflex: bool, freezer: bool },
    /// eventfd → SIGSTOP.
    FloorStop,
    /// eventfd → FROZEN, the kernel's freezer inactive until then: the freeze is its first.
    FloorFreeze,
    /// eventfd → FROZEN, with an empty freezer cgroup held frozen for the run, as the daemon holds
    /// one while a v1 freezer reflex is armed (`memwatch::reflex::active`).
    FloorFreezeActive,
    /// 1 ms poller → SIGSTOP.
    Poller,
    /// `BASE_BIN`'s memwatch with the reflex, by the freezer or not.
    Base { freezer: bool },
    /// This build with the reflex and its wake thread at the daemon's priority
    /// (`reflex_priority = 0`), by the freezer or not (`RT0=1`).
    Priority0 { freezer: bool },
}

impl Row {
    fn freezer(self) -> bool {
        matches!(
            self,
            Row::Memwatch { freezer: true, .. }
                | Row::Base { freezer: true }
                | Row::Priority0 { freezer: true }
                | Row::FloorFreeze
                | Row::FloorFreezeActive
        )
    }

    fn label(self) -> &'static str {
        match self {
            Row::Memwatch {
                reflex: true,
                freezer: false,
            } => "memwatch reflex, SIGSTOP",
            Row::Memwatch {
                reflex: true,
                freezer: true,
            } => "memwatch reflex, freezer",
            Row::Memwatch {
                reflex: false,
                freezer: false,
            } => "memwatch probe, SIGSTOP",
            Row::Memwatch {
                reflex: false,
                freezer: true,
            } => "memwatch probe, freezer",
            Row::FloorStop => "eventfd → SIGSTOP (floor)",
            Row::FloorFreeze => "eventfd → freeze (floor)",
            Row::FloorFreezeActive => "eventfd → freeze, active (floor)",
            Row::Poller => "1 ms poller → SIGSTOP",
            Row::Base { freezer: false } => "base reflex, SIGSTOP",
            Row::Base { freezer: true } => "base reflex, freezer",
            Row::Priority0 { freezer: false } => "priority 0 reflex, SIGSTOP",
            Row::Priority0 { freezer: true } => "priority 0 reflex, freezer",
        }
    }
}

/// The floor or poller watcher for `row`, running beside the hog.
fn watcher(
    row: Row,
    cg: &MemCgroup,
    pid: u32,
    line: u64,
    tree: bool,
    stop: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    let mem = cg.dir.clone();
    let sigstop = move || {
        // The hog, or with workers every process of its cgroup.
        let pids = if tree { pids(&mem) } else { vec![pid] };
        for p in pids {
            // SAFETY: kill(2) on a pid of the hog's cgroup.
            unsafe { nix::libc::kill(p as i32, nix::libc::SIGSTOP) };
        }
    };
    let mem = cg.dir.clone();
    match row {
        Row::FloorStop => {
            let (efd, usage) = common::threshold(&mem, line);
            Some(std::thread::spawn(move || {
                let _usage = usage;
                common::nice_this_thread();
                if common::wait_eventfd(&efd, &stop).is_some() {
                    sigstop();
                }
            }))
        }
        Row::FloorFreeze | Row::FloorFreezeActive => {
            let (efd, usage) = common::threshold(&mem, line);
            let mut state = std::fs::OpenOptions::new()
                .write(true)
                .open(cg.freezer.as_ref().unwrap().join("freezer.state"))
                .unwrap();
            Some(std::thread::spawn(move || {
                let _usage = usage;
                common::nice_this_thread();
                if common::wait_eventfd(&efd, &stop).is_some() {
                    let _ = state.write_all(b"FROZEN");
                }
            }))
        }
        Row::Poller => Some(std::thread::spawn(move || {
            common::nice_this_thread();
            if common::poll_usage(&mem, line, Duration::from_millis(1), &stop) {
                sigstop();
            }
        })),
        Row::Memwatch { .. } | Row::Base { .. } | Row::Priority0 { .. } => None,
    }
}

/// When the hog was stopped: `waitid(WSTOPPED)` (signals; with workers, the last of `tree` seen
/// stopped) or the freezer's state read every 20 µs; `None` when it exited or `stop` was set first.
fn stopped_at(
    row: Row,
    freezer: Option<&Path>,
    pid: u32,
    tree: Vec<std::fs::File>,
    stop: Arc<AtomicBool>,
) -> Option<Instant> {
    if let Some(f) = freezer.filter(|_| row.freezer()) {
        let state = f.join("freezer.state");
        while !stop.load(Ordering::Relaxed) {
            if std::fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FROZEN") {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        return None;
    }
    // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
    let mut info: nix::libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on our own child; WNOWAIT leaves its status for the final wait.
    let r = unsafe {
        nix::libc::waitid(
            nix::libc::P_PID,
            pid,
            &mut info,
            nix::libc::WSTOPPED | nix::libc::WEXITED | nix::libc::WNOWAIT,
        )
    };
    let at = Instant::now();
    if r != 0 || info.si_code != nix::libc::CLD_STOPPED {
        return None;
    }
    if tree.is_empty() {
        return Some(at);
    }
    // The root is stopped (stopped first, by every row): then the rest, a pass over those not yet
    // stopped every 200 µs (a pass costs CPU that stopping them needs too), each one's stat file
    // opened before the go and re-read with pread.
    let mut left = tree;
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        left.retain(|f| {
            use std::os::unix::fs::FileExt as _;
            let Ok(n) = f.read_at(&mut buf, 0) else {
                return false;
            };
            let text = String::from_utf8_lossy(&buf[..n]);
            let state = text
                .rfind(')')
                .and_then(|i| text[i + 1..].trim_start().chars().next());
            !matches!(state, Some('T' | 't' | 'Z' | 'X') | None)
        });
        if left.is_empty() {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

struct Outcome {
    killed: bool,
    /// How far past the line the cgroup's usage went before the stop (MiB; v1's
    /// memory.max_usage_in_bytes, reset at the go): what a late stop costs in memory.
    past_mib: Option<f64>,
    /// The page cache charged to the cgroup at the go (MiB; memory.stat's `total_cache`): the
    /// reflex goes by usage less clean cache, so it stops this much past the floors' line.
    cache_mib: Option<f64>,
    /// µs from the crossing to the stop; `None`: not stopped (or no crossing seen).
    latency_us: Option<f64>,
}

/// The pids in `cgroup.procs` of the cgroup directory `dir`.
fn pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// With `workers`, waits until all `workers + 1` processes are in the cgroup and its usage holds
/// still; the usage then.
fn settled(cg: &MemCgroup, workers: u32) -> u64 {
    if workers == 0 {
        return 0;
    }
    let t = Instant::now();
    let mut last = 0;
    while t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        let u = cg.usage();
        if pids(&cg.dir).len() > workers as usize && u.abs_diff(last) < MIB {
            return u;
        }
        last = u;
    }
    panic!("the hog's {workers} workers did not settle in 60 s");
}

fn run(
    cg: &MemCgroup,
    hog: &Path,
    rate: u64,
    workers: u32,
    row: Row,
    d: Option<&Daemon>,
    i: usize,
) -> Outcome {
    cg.set_limit(if workers > 0 { 4096 * MIB } else { LIMIT });
    cg.thaw();
    let go = std::env::temp_dir().join(format!("memwatch-reflex-go-{}-{i}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let args = format!(
        "--rate-mib {rate} --total-mib 768 --chunk-mib 1 --hold-ms 200 --workers {workers} --worker-mib 0"
    );
    let all: Vec<&str> = args.split_whitespace().collect();
    let (mut child, _) = cg.hog_as(hog, &all, &go, row.freezer(), hog_uid());
    let pid = child.id();
    let limit = settled(cg, workers) + LIMIT;
    cg.set_limit(limit);
    let line = critical(limit);
    // The workers' stat files, opened ahead (the root is timed by waitid).
    let tree: Vec<std::fs::File> = if workers > 0 && !row.freezer() {
        pids(&cg.dir)
            .into_iter()
            .filter(|&p| p != pid)
            .filter_map(|p| std::fs::File::open(format!("/proc/{p}/stat")).ok())
            .collect()
    } else {
        Vec::new()
    };
    let name = format!("reflex{i}");
    if let Some(d) = d {
        assert!(
            d.ctl(&["attach", &pid.to_string(), "--name", &name]),
            "attach failed"
        );
        // Ready as a user's job would be: measured (its limit known), and armed where it may be.
        let reflex = matches!(
            row,
            Row::Memwatch { reflex: true, .. } | Row::Base { .. } | Row::Priority0 { .. }
        );
        let kind = if row.freezer() {
            "cgroup_v1_freezer"
        } else {
            "signals"
        };
        let t = Instant::now();
        while reflex
            && d.armed(&name).as_deref() != Some(kind)
            && t.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        // And its thresholds all registered: each registration waits for an RCU grace period, and
        // those of the run before (the same cgroup) are unregistered first, one grace period each
        // too, so a job let go at once races them (`RACE=1` does: a job growing from its attach).
        while std::env::var("RACE").as_deref() != Ok("1")
            && d.watch(&name).as_deref() != Some("watched")
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !reflex {
            std::thread::sleep(Duration::from_millis(1200));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (observer, usage) = common::threshold(&cg.dir, line);
    let crossed = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _usage = usage;
            timer_thread();
            common::wait_eventfd(&observer, &stop)
        })
    };
    let stopped = {
        let stop = stop.clone();
        let freezer = cg.freezer.clone();
        std::thread::spawn(move || {
            timer_thread();
            stopped_at(row, freezer.as_deref(), pid, tree, stop)
        })
    };
    // The freezer kept active for the run, or not active at all: no daemon's held cgroup is left
    // from the row before (it lets go once the job is detached).
    let active = match row {
        Row::FloorFreezeActive => Some(
            memwatch::reflex::active::Held::hold(Path::new("/"))
                .expect("hold an empty v1 freezer cgroup frozen"),
        ),
        Row::FloorFreeze => {
            freezer_let_go();
            None
        }
        _ => None,
    };
    let w = watcher(row, cg, pid, line, workers > 0, stop.clone());
    let oom = cg.oom_kills();
    let peak = cg.dir.join("memory.max_usage_in_bytes");
    let _ = std::fs::write(&peak, "0");
    let cache_mib = cache_bytes(&cg.dir).map(|b| b as f64 / MIB as f64);
    std::fs::write(&go, "").unwrap();
    let t0 = Instant::now();
    while !stopped.is_finished() && t0.elapsed() < Duration::from_secs(5) {
        if cg.oom_kills() > oom {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let killed = cg.oom_kills() > oom;
    let past_mib = std::fs::read_to_string(&peak)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .map(|p| (p as f64 - line as f64) / MIB as f64);
    common::let_go(cg, d, &name, pid);
    let _ = child.kill();
    let stop_at = stopped.join().ok().flatten();
    let _ = child.wait();
    if workers > 0 {
        // The workers too, and wait till the cgroup is empty.
        while !pids(&cg.dir).is_empty() {
            for p in pids(&cg.dir) {
                // SAFETY: kill(2) on a pid of the hog's cgroup.
                unsafe { nix::libc::kill(p as i32, nix::libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let cross_at = crossed.join().ok().flatten();
    if let Some(h) = w {
        let _ = h.join();
    }
    let _ = std::fs::remove_file(&go);
    drop(active);
    let latency_us = match (cross_at, stop_at) {
        (Some(c), Some(s)) if !killed => Some(if s >= c {
            s.duration_since(c).as_secs_f64() * 1e6
        } else {
            -(c.duration_since(s).as_secs_f64() * 1e6)
        }),
        _ => None,
    };
    if let (Some(slow), Some(l)) = (slow_us(), latency_us)
        && l > slow
    {
        // What stopped the job: its pause event, recorded before the detach.
        let events = d.map(|d| d.events()).unwrap_or_default();
        let pause = events
            .lines()
            .rev()
            .find(|e| {
                e.contains(&format!("\"job\":\"{name}\"")) && e.contains("\"action\":\"pause\"")
            })
            .unwrap_or("(no pause event)");
        eprintln!(
            "{} run {i}: {l:.0} µs, cache at the go {:.2} MiB; {pause}",
            row.label(),
            cache_mib.unwrap_or(f64::NAN)
        );
    }
    Outcome {
        killed,
        past_mib,
        cache_mib,
        latency_us,
    }
}

/// The page cache charged to the v1 memory cgroup `dir` (memory.stat's `total_cache`).
fn cache_bytes(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("total_cache "))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits (5 s at most) until no daemon holds an empty freezer cgroup frozen, so that the next freeze
/// is the kernel's first (where nothing else on the machine is frozen).
fn freezer_let_go() {
    let held = || {
        std::fs::read_dir("/sys/fs/cgroup/freezer")
            .map(|d| {
                d.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(memwatch::reflex::active::PREFIX)
                })
            })
            .unwrap_or(false)
    };
    let t = Instant::now();
    while held() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// With `BUSY=N`, N threads that spin for the whole bench at the normal policy, as a job's busy
/// threads would.
fn busy() -> usize {
    std::env::var("BUSY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Under `BUSY`, the threads that time the crossing and the stop run at real-time priority 50, so
/// that the spinning threads delay neither stamp.
fn timer_thread() {
    if busy() > 0 {
        memwatch::wake::realtime(50).expect("SCHED_FIFO for the timing threads (run as root)");
    }
}

/// With `SLOW_US=N`, each run slower than N µs is told on stderr with the daemon's pause event.
/// `HOG_UID=N`: the hog runs as that user (root attaches it), so the reflex acts with the owner's
/// checks: the kernel's at the signal, and each member's at a freeze.
fn hog_uid() -> Option<u32> {
    std::env::var("HOG_UID").ok().and_then(|v| v.parse().ok())
}

fn slow_us() -> Option<f64> {
    std::env::var("SLOW_US").ok().and_then(|v| v.parse().ok())
}

fn main() {
    if common::listing() {
        return;
    }
    let runs = common::runs(30);
    let hog = memhog();
    // The hog's binary in the page cache, charged to this process's cgroup rather than the hog's:
    // read there first (by the hog's first exec after it was built or evicted), its text would stay
    // charged to the hog's cgroup as clean cache for the whole bench. The reflex goes by usage less
    // clean cache, so it would fire that much past the floors' line (half a MiB: the next of its
    // thresholds, 0.1 % apart), in some benches and not others. The cache at the go is reported.
    let _ = std::fs::read(&hog);
    // A stat file kept open per worker: as many descriptors as the hard limit allows.
    let mut nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    nofile.current = nofile.maximum;
    let _ = rustix::process::setrlimit(rustix::process::Resource::Nofile, nofile);
    let workers: u32 = std::env::var("WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let new_cgroup = || {
        let mut cg = MemCgroup::new(LIMIT).expect("create a v1 memory cgroup (run as root)");
        assert!(
            cg.version == 1 && cg.with_freezer(),
            "needs the v1 memory and freezer controllers"
        );
        cg
    };
    let fresh = std::env::var("FRESH").as_deref() == Ok("1");
    let mut cg = new_cgroup();
    let rates: Vec<u64> = std::env::var("RATES")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1024, 4096]);
    let with = Daemon::start("[policy]\nreaction_ms = 0\n");
    let without = Daemon::start("[policy]\nreaction_ms = 0\nreflex = false\n");
    let base = common::base_bin().map(|b| Daemon::start_bin(&b, "[policy]\nreaction_ms = 0\n"));
    let rt0 = (std::env::var("RT0").as_deref() == Ok("1"))
        .then(|| Daemon::start("[policy]\nreaction_ms = 0\nreflex_priority = 0\n"));
    let spin = Arc::new(AtomicBool::new(true));
    let spinners: Vec<_> = (0..busy())
        .map(|_| {
            let spin = spin.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while spin.load(Ordering::Relaxed) {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            })
        })
        .collect();
    let rows = [
        Row::Memwatch {
            reflex: true,
            freezer: false,
        },
        Row::Memwatch {
            reflex: true,
            freezer: true,
        },
        Row::Memwatch {
            reflex: false,
            freezer: false,
        },
        Row::Memwatch {
            reflex: false,
            freezer: true,
        },
        Row::FloorStop,
        Row::FloorFreeze,
        Row::FloorFreezeActive,
        Row::Poller,
        Row::Base { freezer: false },
        Row::Base { freezer: true },
        Row::Priority0 { freezer: false },
        Row::Priority0 { freezer: true },
    ];
    // With workers, the reflex's rows and the floors.
    let rows: Vec<Row> = rows
        .into_iter()
        .filter(|r| base.is_some() || !matches!(r, Row::Base { .. }))
        .filter(|r| rt0.is_some() || !matches!(r, Row::Priority0 { .. }))
        .filter(|r| {
            // `ROWS=reflex,floor`: only the rows whose label holds one of the words.
            std::env::var("ROWS").map_or(true, |w| w.split(',').any(|w| r.label().contains(w)))
        })
        .filter(|r| {
            workers == 0
                || matches!(
                    r,
                    Row::Memwatch { reflex: true, .. }
                        | Row::Base { .. }
                        | Row::Priority0 { .. }
                        | Row::FloorStop
                        | Row::FloorFreeze
                        | Row::FloorFreezeActive
                )
        })
        .collect();
    for &rate in &rates {
        let mut outs: Vec<Vec<Outcome>> = rows.iter().map(|_| Vec::new()).collect();
        for i in 0..runs {
            for (k, row) in rows.iter().enumerate() {
                let d = match row {
                    Row::Memwatch { reflex: true, .. } => Some(&with),
                    Row::Memwatch { reflex: false, .. } => Some(&without),
                    Row::Base { .. } => base.as_ref(),
                    Row::Priority0 { .. } => rt0.as_ref(),
                    _ => None,
                };
                if fresh {
                    cg = new_cgroup();
                }
                outs[k].push(run(&cg, &hog, rate, workers, *row, d, i * rows.len() + k));
            }
        }
        for (row, o) in rows.iter().zip(&outs) {
            let killed = o.iter().filter(|o| o.killed).count();
            let mut lat: Vec<f64> = o.iter().filter_map(|o| o.latency_us).collect();
            let n = lat.len();
            let mut past: Vec<f64> = o.iter().filter_map(|o| o.past_mib).collect();
            let mut cache: Vec<f64> = o.iter().filter_map(|o| o.cache_mib).collect();
            println!(
                "{:<27} {rate:>5} MiB/s, {:>4} processes: OOM-killed {killed}/{runs}, timed {n}, crossing→stop p50 {:>6.0} µs, \
                 p90 {:>6.0} µs, max {:>6.0} µs; past the line p50 {:.2} MiB, max {:.2} MiB; cache at the go max {:.2} MiB",
                row.label(),
                workers + 1,
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.9),
                pct(&mut lat, 1.0),
                pct(&mut past, 0.5),
                pct(&mut past, 1.0),
                pct(&mut cache, 1.0),
            );
        }
    }
    spin.store(false, Ordering::Relaxed);
    for s in spinners {
        let _ = s.join();
    }
}
