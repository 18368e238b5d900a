//! memwatch's hand-written readers of /proc against procfs-core's (the parsing half of the `procfs`
//! crate) on the same bytes, for every file both read: what a parse costs, and what each does with
//! damaged text.
//!
//! `cargo bench --bench parsers` (`RUNS=N`, default 31; `ITERS=N` parses per timed batch, default 2000).
//! Each run times a batch of one parser, then of the other (their order alternates), on text read once
//! from this machine's /proc; a row gives each parser's median, p10 and p90 ns per parse over the runs
//! and the ratio of the medians. Then each parser gets the same damaged inputs made from that text:
//! every prefix (a read cut short), every line left out, every line's first digit made an `x`, one
//! number made too big for 64 bits, and a key with a non-ASCII letter at its end. A row counts what
//! each parser returned: a value, an error, or a panic (caught). The figures go to BENCHMARKS.md
//! ("The readers of /proc").

use std::hint::black_box;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::Instant;

use procfs_core::{FromBufRead, FromRead};

/// One file both parse: its path, and a parse by each that says whether it gave a value.
struct Case {
    file: &'static str,
    ours: fn(&Path, &str) -> bool,
    theirs: fn(&[u8]) -> bool,
}

const CASES: [Case; 7] = [
    Case {
        file: "/proc/meminfo",
        ours: |p, t| memwatch::sample::meminfo::parse(p, t).is_ok(),
        theirs: |b| procfs_core::Meminfo::from_buf_read(b).is_ok(),
    },
    Case {
        file: "/proc/pressure/memory",
        ours: |p, t| memwatch::sample::psi::parse(p, t).is_ok(),
        theirs: |b| procfs_core::MemoryPressure::from_buf_read(b).is_ok(),
    },
    Case {
        file: "/proc/vmstat",
        ours: |p, t| memwatch::sample::vmstat::parse(p, t).is_ok(),
        theirs: |b| procfs_core::VmStat::from_buf_read(b).is_ok(),
    },
    Case {
        file: "/proc/self/stat",
        ours: |p, t| memwatch::proc::parse_stat(p, t).is_ok(),
        theirs: |b| procfs_core::process::Stat::from_read(b).is_ok(),
    },
    Case {
        file: "/proc/self/status",
        ours: |p, t| memwatch::proc::parse_status(p, t).is_ok(),
        theirs: |b| procfs_core::process::Status::from_buf_read(b).is_ok(),
    },
    Case {
        file: "/proc/self/smaps_rollup",
        ours: |p, t| memwatch::proc::parse_rollup(p, t).is_ok(),
        theirs: |b| procfs_core::process::SmapsRollup::from_buf_read(b).is_ok(),
    },
    Case {
        file: "/proc/self/cgroup",
        ours: |p, t| memwatch::sample::cgroup::parse_membership(p, t).is_ok(),
        theirs: |b| procfs_core::ProcessCGroups::from_buf_read(b).is_ok(),
    },
];

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// ns per call of `f` over a batch of `iters`.
fn batch(iters: usize, mut f: impl FnMut() -> bool) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        black_box(f());
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The damaged inputs made from `text`.
fn damaged(text: &str) -> Vec<String> {
    let mut out: Vec<String> = (0..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .map(|i| text[..i].to_owned())
        .collect();
    let lines: Vec<&str> = text.lines().collect();
    for skip in 0..lines.len() {
        let kept: Vec<&str> = (0..lines.len())
            .filter(|&i| i != skip)
            .map(|i| lines[i])
            .collect();
        out.push(kept.join("\n") + "\n");
    }
    for at in 0..lines.len() {
        if let Some(d) = lines[at].find(|c: char| c.is_ascii_digit()) {
            let mut all: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
            all[at].replace_range(d..d + 1, "x");
            out.push(all.join("\n") + "\n");
        }
    }
    if let Some(d) = text.find(|c: char| c.is_ascii_digit()) {
        let mut t = text.to_owned();
        t.insert_str(d, "99999999999999999999");
        out.push(t);
    }
    if let Some(colon) = text.find(':') {
        let mut t = text.to_owned();
        t.insert(colon, 'é');
        out.push(t);
    }
    out
}

/// (values, errors, panics) of `f` over `inputs`.
fn outcomes(inputs: &[String], f: impl Fn(&str) -> bool) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for i in inputs {
        match catch_unwind(AssertUnwindSafe(|| f(i))) {
            Ok(true) => counts.0 += 1,
            Ok(false) => counts.1 += 1,
            Err(_) => counts.2 += 1,
        }
    }
    counts
}

fn main() {
    let runs = env("RUNS", 31).max(3);
    let iters = env("ITERS", 2000).max(1);
    println!("parse cost, ns per parse over {runs} runs of {iters} (median [p10, p90]):");
    println!(
        "{:<26} {:>26} {:>26} {:>8}",
        "file", "memwatch", "procfs-core 0.18", "ratio"
    );
    let mut texts = Vec::new();
    for c in &CASES {
        let path = Path::new(c.file);
        let Ok(text) = std::fs::read_to_string(path) else {
            println!("{:<26} not readable here", c.file);
            continue;
        };
        let (ok_ours, ok_theirs) = ((c.ours)(path, &text), (c.theirs)(text.as_bytes()));
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for r in 0..runs {
            let o = || batch(iters, || (c.ours)(path, &text));
            let t = || batch(iters, || (c.theirs)(text.as_bytes()));
            if r % 2 == 0 {
                ours.push(o());
                theirs.push(t());
            } else {
                theirs.push(t());
                ours.push(o());
            }
        }
        ours.sort_by(f64::total_cmp);
        theirs.sort_by(f64::total_cmp);
        let show = |s: &[f64], ok: bool| {
            format!(
                "{:>7.0} [{:>6.0}, {:>6.0}]{}",
                quantile(s, 0.5),
                quantile(s, 0.1),
                quantile(s, 0.9),
                if ok { "" } else { " ERR" }
            )
        };
        println!(
            "{:<26} {:>26} {:>26} {:>7.2}×",
            c.file,
            show(&ours, ok_ours),
            show(&theirs, ok_theirs),
            quantile(&theirs, 0.5) / quantile(&ours, 0.5)
        );
        texts.push((c, text));
    }
    // A caught panic still prints its message; the counts say it.
    std::panic::set_hook(Box::new(|_| {}));
    println!("\ndamaged text: value / error / panic");
    println!(
        "{:<26} {:>7} {:>20} {:>20}",
        "file", "inputs", "memwatch", "procfs-core 0.18"
    );
    for (c, text) in &texts {
        let inputs = damaged(text);
        let path = Path::new(c.file);
        let ours = outcomes(&inputs, |t| (c.ours)(path, t));
        let theirs = outcomes(&inputs, |t| (c.theirs)(t.as_bytes()));
        let show = |(v, e, p): (usize, usize, usize)| format!("{v} / {e} / {p}");
        println!(
            "{:<26} {:>7} {:>20} {:>20}",
            c.file,
            inputs.len(),
            show(ours),
            show(theirs)
        );
    }
}
