//! The freezer's first freeze (needs root; reported in BENCHMARKS.md, not a test): what one write of
//! the freeze costs when it is the kernel's first, against one made while another cgroup is frozen.
//!
//! cgroup v1's freezer turns the kernel's `freezer_active` static key on when a cgroup starts
//! freezing while none is, and off at the last thaw; each turn patches the kernel's text on every
//! CPU. The daemon holds an empty v1 freezer cgroup frozen while a v1 freezer reflex is armed
//! (`memwatch::reflex::active`) so that the reflex's freeze is never that first one. Here a cgroup
//! holding one sleeping process is frozen and thawed `RUNS` times per case, 10 ms apart, cases
//! alternated round by round (`ROUNDS`): v1 cold (nothing else frozen), v1 with the daemon's held
//! cgroup, and v2's `cgroup.freeze` both ways where a cgroup2 tree with the freezer is mounted. The
//! figure is the write's own time (its `pwrite`), and the thaw's; the freeze settling (the process
//! entering the refrigerator) is waited for between them but not timed.
//!
//! With `HOG=1` a process touching 256 MiB over and over runs beside it (the other core busy in page
//! faults, as beside a job growing to its line).
//!
//! `cargo bench --bench freeze_first` (RUNS=50, ROUNDS=3 by default).

use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::pct;

/// One case: the cgroup's state file, the words that freeze and thaw it, and how it says frozen.
struct Case {
    label: &'static str,
    dir: PathBuf,
    state: &'static str,
    freeze: &'static [u8],
    thaw: &'static [u8],
    held: bool,
}

impl Case {
    fn frozen(&self) -> bool {
        if self.state == "freezer.state" {
            std::fs::read_to_string(self.dir.join("freezer.state"))
                .is_ok_and(|s| s.trim() == "FROZEN")
        } else {
            std::fs::read_to_string(self.dir.join("cgroup.events"))
                .is_ok_and(|s| s.lines().any(|l| l == "frozen 1"))
        }
    }

    /// `runs` freezes and thaws: the writes' µs, freeze and thaw.
    fn run(&self, runs: usize, freeze_us: &mut Vec<f64>, thaw_us: &mut Vec<f64>) {
        let held = self.held.then(|| {
            memwatch::reflex::active::Held::hold(Path::new("/"))
                .expect("hold an empty v1 freezer cgroup frozen")
        });
        let mut sleeper = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        std::fs::write(self.dir.join("cgroup.procs"), sleeper.id().to_string())
            .expect("move the sleeper into the cgroup");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join(self.state))
            .expect("open the state file");
        for _ in 0..runs {
            let t = Instant::now();
            file.write_at(self.freeze, 0).expect("freeze");
            freeze_us.push(t.elapsed().as_secs_f64() * 1e6);
            let settle = Instant::now();
            while !self.frozen() && settle.elapsed() < Duration::from_secs(1) {
                std::hint::spin_loop();
            }
            let t = Instant::now();
            file.write_at(self.thaw, 0).expect("thaw");
            thaw_us.push(t.elapsed().as_secs_f64() * 1e6);
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        drop(held);
    }
}

fn main() {
    if common::listing() {
        return;
    }
    let runs = common::runs(50);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let v1 = Path::new("/sys/fs/cgroup/freezer");
    assert!(
        v1.join("cgroup.procs").exists(),
        "needs the v1 freezer (run as root)"
    );
    let name = format!("memwatch-bench-freeze-{}", std::process::id());
    let v1_dir = v1.join(&name);
    std::fs::create_dir_all(&v1_dir).expect("make a v1 freezer cgroup");
    let v2_dir = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|m| Path::new(m).join(&name))
        .find(|d| {
            d.parent()
                .is_some_and(|p| p.join("cgroup.subtree_control").exists())
                && std::fs::create_dir_all(d).is_ok()
                && d.join("cgroup.freeze").exists()
        });
    let mut cases = vec![
        Case {
            label: "v1 freezer.state, the first freeze",
            dir: v1_dir.clone(),
            state: "freezer.state",
            freeze: b"FROZEN",
            thaw: b"THAWED",
            held: false,
        },
        Case {
            label: "v1 freezer.state, freezer held active",
            dir: v1_dir.clone(),
            state: "freezer.state",
            freeze: b"FROZEN",
            thaw: b"THAWED",
            held: true,
        },
    ];
    if let Some(d) = &v2_dir {
        cases.push(Case {
            label: "v2 cgroup.freeze",
            dir: d.clone(),
            state: "cgroup.freeze",
            freeze: b"1",
            thaw: b"0",
            held: false,
        });
        cases.push(Case {
            label: "v2 cgroup.freeze, v1 freezer held",
            dir: d.clone(),
            state: "cgroup.freeze",
            freeze: b"1",
            thaw: b"0",
            held: true,
        });
    }
    let hog = (std::env::var("HOG").as_deref() == Ok("1")).then(|| {
        std::thread::spawn(|| {
            loop {
                let mut v = vec![0u8; 256 << 20];
                for i in (0..v.len()).step_by(4096) {
                    v[i] = 1;
                }
                std::hint::black_box(&v);
            }
        })
    });
    let mut freeze: Vec<Vec<f64>> = cases.iter().map(|_| Vec::new()).collect();
    let mut thaw: Vec<Vec<f64>> = cases.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (k, case) in cases.iter().enumerate() {
            case.run(runs, &mut freeze[k], &mut thaw[k]);
        }
    }
    for (k, case) in cases.iter().enumerate() {
        println!(
            "{:<40} {} writes: freeze p50 {:>6.1} µs, p90 {:>6.1} µs, max {:>7.1} µs; thaw p50 {:>6.1} µs, max {:>7.1} µs",
            case.label,
            freeze[k].len(),
            pct(&mut freeze[k], 0.5),
            pct(&mut freeze[k], 0.9),
            pct(&mut freeze[k], 1.0),
            pct(&mut thaw[k], 0.5),
            pct(&mut thaw[k], 1.0),
        );
    }
    drop(hog);
    let _ = std::fs::remove_dir(&v1_dir);
    if let Some(d) = v2_dir {
        let _ = std::fs::remove_dir(d);
    }
}
