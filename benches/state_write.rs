//! State-file benchmark (reported in BENCHMARKS.md, not a test): how long the owner task's write of
//! `state.json` (the write ahead of a pause, `StateWriter`: a temp file, write, rename; the fsync
//! is another thread's) takes on a disk and on a tmpfs, with the disk idle and busy.
//!
//! Two writers, one in a directory on the disk that holds the build (ext4 here) and one on /dev/shm,
//! write a state of 8 attached jobs (about 3 KB, changed before every write so none is skipped),
//! alternated write by write, 5 ms apart. The idle phase runs first; in the busy phase `dd` writes
//! 2 GB with `conv=fsync` to the same disk again and again, as a checkpoint's flush would. The figure
//! is each write's time, from the call to its return.
//!
//! With `BASE_BIN=<an earlier memwatch>` (one that kept `state.json` in its state directory) it then
//! measures the same from outside: each build's daemon, its state directory on the disk and (this
//! build) its runtime directory on /dev/shm, as under systemd (/var/lib and /run), answers `pause`
//! and `resume` of an attached `sleep` in turn, each a write ahead on its owner task, while `dd`
//! keeps the disk busy; the builds alternate every 20 requests. The figure is each request's time,
//! from its write on the control socket to its answer line.
//!
//! `cargo bench --bench state_write` (PHASE_SECONDS=30 per phase by default).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::pct;
use memwatch::act::persist::{Persisted, PersistedJob, StateWriter, VERSION};
use memwatch::proc::ProcRef;

/// A state of `jobs` attached jobs; `n` makes it differ from the last one written.
fn state(n: u64) -> Persisted {
    Persisted {
        version: VERSION,
        jobs: (0..8)
            .map(|j| PersistedJob {
                name: format!("train-{j}-with-a-name-as-long-as-a-run's"),
                root: ProcRef {
                    pid: 100_000 + j,
                    start_time: 123_456_789 + u64::from(j),
                },
                owner_uid: 1000,
                attached_at_ms: n * 10 + u64::from(j),
                paused: None,
                config: None,
                launch: None,
                way_out: None,
                slurm: Some(format!("{}", 4_000_000 + j)),
            })
            .collect(),
        clock: None,
        loans: Vec::new(),
    }
}

/// `dd` writing 2 GB to `dir` with an fsync at its end, started again whenever it ends.
struct DiskLoad {
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl DiskLoad {
    fn new(dir: &Path) -> DiskLoad {
        DiskLoad {
            dir: dir.to_owned(),
            child: None,
        }
    }

    fn keep_going(&mut self) {
        if let Some(c) = &mut self.child {
            if c.try_wait().ok().flatten().is_none() {
                return;
            }
        }
        self.child = Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", self.dir.join("load").display()))
            .args(["bs=1M", "count=2000", "conv=fsync", "status=none"])
            .stdout(Stdio::null())
            .spawn()
            .ok();
    }
}

impl Drop for DiskLoad {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(self.dir.join("load"));
    }
}

/// Writes alternately with each writer for `seconds`, keeping `load` going if given; each writer's
/// write times in ms.
fn phase(
    writers: &mut [StateWriter],
    seconds: u64,
    mut load: Option<&mut DiskLoad>,
) -> Vec<Vec<f64>> {
    let mut times = vec![Vec::new(); writers.len()];
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut n = 0u64;
    while Instant::now() < end {
        if let Some(l) = load.as_deref_mut() {
            l.keep_going();
        }
        let k = (n as usize) % writers.len();
        let s = state(n);
        let t = Instant::now();
        writers[k].write(&s).expect("write the state file");
        times[k].push(t.elapsed().as_secs_f64() * 1000.0);
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    times
}

/// Pause and resume requests to each daemon in turn, 20 at a time, for `seconds` with the disk
/// kept busy; each daemon's request times in ms.
fn requests(
    daemons: &[(String, common::Daemon)],
    seconds: u64,
    load: &mut DiskLoad,
) -> Vec<Vec<f64>> {
    let mut sleepers = Vec::new();
    for (_, d) in daemons {
        let s = Command::new("sleep").arg("1000").spawn().expect("sleep");
        let r = d.request(&format!(
            r#"{{"cmd":"attach","pid":{},"name":"s"}}"#,
            s.id()
        ));
        assert!(r.contains("\"ok\":true"), "{r}");
        sleepers.push(s);
    }
    let mut times = vec![Vec::new(); daemons.len()];
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut n = 0usize;
    while Instant::now() < end {
        let k = (n / 20) % daemons.len();
        let cmd = if n % 2 == 0 { "pause" } else { "resume" };
        load.keep_going();
        let t = Instant::now();
        let r = daemons[k]
            .1
            .request(&format!(r#"{{"cmd":"{cmd}","target":"s"}}"#));
        times[k].push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(r.contains("\"ok\":true"), "{cmd}: {r}");
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    for (_, d) in daemons {
        let _ = d.request(r#"{"cmd":"resume","target":"s"}"#);
    }
    for mut s in sleepers {
        let _ = s.kill();
        let _ = s.wait();
    }
    times
}

fn main() {
    if common::listing() {
        return;
    }
    let seconds: u64 = std::env::var("PHASE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let disk = tempfile::tempdir_in(&target).expect("a directory beside the build");
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("state_write: no /dev/shm; skipped");
        return;
    };
    let fs = |p: &Path| {
        Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(p)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let names = [
        format!("disk ({})", fs(disk.path())),
        format!("/dev/shm ({})", fs(shm.path())),
    ];
    let mut writers = [StateWriter::new(disk.path()), StateWriter::new(shm.path())];
    let idle = phase(&mut writers, seconds, None);
    let mut load = DiskLoad::new(disk.path());
    let busy = phase(&mut writers, seconds, Some(&mut load));
    drop(load);
    println!("| disk | directory | writes | p50 | p99 | max | over 50 ms |");
    println!("|---|---|---|---|---|---|---|");
    for (phase, times) in [("idle", idle), ("busy (dd, conv=fsync)", busy)] {
        for (name, mut t) in names.iter().zip(times) {
            let over = t.iter().filter(|&&x| x > 50.0).count();
            println!(
                "| {phase} | {name} | {} | {:.2} ms | {:.2} ms | {:.1} ms | {over} |",
                t.len(),
                pct(&mut t, 0.5),
                pct(&mut t, 0.99),
                pct(&mut t, 1.0),
            );
        }
    }
    let Some(base) = common::base_bin() else {
        return;
    };
    let runtime = shm.path().join("runtime");
    let daemons = vec![
        (
            "this build (runtime directory on /dev/shm)".to_owned(),
            common::Daemon::start_bin(
                &common::memwatch_bin(),
                &format!("runtime_dir = {runtime:?}\n"),
            ),
        ),
        (
            format!("base, {} (state.json on the disk)", base.display()),
            common::Daemon::start_bin(&base, ""),
        ),
    ];
    let mut load = DiskLoad::new(disk.path());
    let mut times = requests(&daemons, seconds, &mut load);
    drop(load);
    println!();
    println!("| daemon | pause and resume requests, disk busy | p50 | p99 | max | over 50 ms |");
    println!("|---|---|---|---|---|---|");
    for ((name, _), t) in daemons.iter().zip(times.iter_mut()) {
        let over = t.iter().filter(|&&x| x > 50.0).count();
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.1} ms | {over} |",
            t.len(),
            pct(t, 0.5),
            pct(t, 0.99),
            pct(t, 1.0),
        );
    }
}
