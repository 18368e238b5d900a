//! memhog: allocates and touches memory at a set rate, for memwatch's tests and benchmarks.
//!
//! `memhog --rate-mib 1024 --total-mib 1536 [--chunk-mib 4] [--workers N] [--hold-ms MS] [--ready-file F]
//!  [--wait-file F] [--cycles N --cycle-ms MS] [--stamps F] [--drop-file F]` (with `--wait-file`,
//!  allocation starts once file F exists; with `--cycles`, the memory is touched, freed and touched
//!  again every MS, N times; with `--drop-file`, whenever file F appears holding a number N, it is
//!  removed and N workers are ended and reaped, as a trainer that takes fewer DataLoader workers
//!  mid-epoch; a file that does not hold a number yet is read again 20 ms later)
//!
//! `--stamps F` appends one line to F as allocation starts and one after each chunk is touched:
//! `CLOCK_BOOTTIME in µs` and the MiB touched so far, in one write each, so whoever reads F sees the
//! job's progress up to the instant it was stopped or frozen (the clock the kernel's and the journal's
//! monotonic stamps and memwatch's own pause stamps use).
//!
//! It prints `ready` once workers are started and `done <MiB>` when it has touched `--total-mib`, then
//! holds the memory for `--hold-ms` and exits 0. `--workers N` starts N child processes (sleeping,
//! `--worker-mib`, default 8, each) before allocating, like DataLoader workers. Pages are touched one
//! byte per 4 KiB so they are really resident.

use std::io::Write;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

struct Args {
    rate_mib: f64,
    total_mib: u64,
    chunk_mib: u64,
    workers: u32,
    hold_ms: u64,
    worker: bool,
    ready_file: Option<String>,
    wait_file: Option<String>,
    drop_file: Option<String>,
    cycles: u32,
    cycle_ms: u64,
    worker_mib: u64,
    stamps: Option<String>,
}

/// Why memhog will not start: a bad argument or an unwritable `--stamps` file.
#[derive(Debug, thiserror::Error)]
enum HogError {
    #[error("{0} needs a value")]
    NeedsValue(String),
    #[error("{flag}: {value:?} is not a number of the kind it takes")]
    NotANumber { flag: String, value: String },
    #[error("unknown argument {0}")]
    Unknown(String),
    #[error("--rate-mib and --chunk-mib must be positive")]
    NotPositive,
    #[error("--stamps {path}: {source}")]
    Stamps {
        path: String,
        source: std::io::Error,
    },
}

/// `value` as the number `flag` takes.
fn number<T: std::str::FromStr>(flag: &str, value: String) -> Result<T, HogError> {
    value.parse().map_err(|_| HogError::NotANumber {
        flag: flag.to_owned(),
        value,
    })
}

fn parse() -> Result<Args, HogError> {
    let mut a = Args {
        rate_mib: 256.0,
        total_mib: 256,
        chunk_mib: 4,
        workers: 0,
        hold_ms: 0,
        worker: false,
        ready_file: None,
        wait_file: None,
        drop_file: None,
        cycles: 1,
        cycle_ms: 0,
        worker_mib: 8,
        stamps: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| HogError::NeedsValue(flag.clone()));
        match flag.as_str() {
            "--rate-mib" => a.rate_mib = number("--rate-mib", value()?)?,
            "--total-mib" => a.total_mib = number("--total-mib", value()?)?,
            "--chunk-mib" => a.chunk_mib = number("--chunk-mib", value()?)?,
            "--workers" => a.workers = number("--workers", value()?)?,
            "--hold-ms" => a.hold_ms = number("--hold-ms", value()?)?,
            "--ready-file" => a.ready_file = Some(value()?),
            "--worker-mib" => a.worker_mib = number("--worker-mib", value()?)?,
            "--cycles" => a.cycles = number("--cycles", value()?)?,
            "--cycle-ms" => a.cycle_ms = number("--cycle-ms", value()?)?,
            "--wait-file" => a.wait_file = Some(value()?),
            "--stamps" => a.stamps = Some(value()?),
            "--drop-file" => a.drop_file = Some(value()?),
            "--worker" => a.worker = true,
            other => return Err(HogError::Unknown(other.to_owned())),
        }
    }
    if a.rate_mib <= 0.0 || a.chunk_mib == 0 {
        return Err(HogError::NotPositive);
    }
    Ok(a)
}

fn touch(mib: u64) -> Vec<u8> {
    let len = (mib as usize) << 20;
    // Zeroed large allocations come straight from mmap and stay unbacked until each page is written.
    let mut v = vec![0u8; len];
    for i in (0..len).step_by(4096) {
        v[i] = 1;
    }
    v
}

/// CLOCK_BOOTTIME in microseconds.
fn boottime_us() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u128 * 1_000_000 + ts.tv_nsec as u128 / 1_000
}

/// `--stamps`: the file the progress lines go to, each written whole with one `write`.
struct Stamps(Option<std::fs::File>);

impl Stamps {
    fn open(path: Option<&str>) -> Result<Stamps, HogError> {
        path.map(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|source| HogError::Stamps {
                    path: p.to_owned(),
                    source,
                })
        })
        .transpose()
        .map(Stamps)
    }

    fn mark(&mut self, mib: u64) {
        if let Some(f) = &mut self.0 {
            let _ = f.write_all(format!("{} {mib}\n", boottime_us()).as_bytes());
        }
    }
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("memhog: {e}");
            return ExitCode::from(2);
        }
    };
    if a.worker {
        let _keep = touch(a.worker_mib);
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let me = std::env::current_exe().expect("own path");
    let mut workers: Vec<Child> = Vec::new();
    for _ in 0..a.workers {
        match Command::new(&me)
            .args(["--worker", "--worker-mib", &a.worker_mib.to_string()])
            .spawn()
        {
            Ok(c) => workers.push(c),
            Err(e) => {
                eprintln!("memhog: cannot start a worker: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let workers = std::sync::Arc::new(std::sync::Mutex::new(workers));
    if let Some(f) = a.drop_file.clone() {
        let workers = workers.clone();
        std::thread::spawn(move || {
            loop {
                // A file caught between its creation and the write of its number reads empty: it
                // is left for the next look, not taken as 0 and removed (which lost the number).
                let number = std::fs::read_to_string(&f)
                    .ok()
                    .and_then(|text| text.trim().parse::<usize>().ok());
                if let Some(n) = number {
                    let _ = std::fs::remove_file(&f);
                    let mut w = workers.lock().unwrap_or_else(|e| e.into_inner());
                    for _ in 0..n {
                        if let Some(mut c) = w.pop() {
                            let _ = c.kill();
                            let _ = c.wait();
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    if let Some(f) = &a.ready_file {
        let _ = std::fs::write(f, "ready\n");
    }
    if let Some(f) = &a.wait_file {
        while !std::path::Path::new(f).exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let mut stamps = match Stamps::open(a.stamps.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("memhog: {e}");
            return ExitCode::from(2);
        }
    };
    stamps.mark(0);
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut done = 0u64;
    // With --cycles N, a training step's buffers: touch --total-mib, free it, and start again every
    // --cycle-ms, N times; the last cycle's memory is held.
    for cycle in 0..a.cycles.max(1) {
        let start = Instant::now();
        held.clear();
        done = 0;
        while done < a.total_mib {
            let n = a.chunk_mib.min(a.total_mib - done);
            held.push(touch(n));
            done += n;
            stamps.mark(done);
            let due = Duration::from_secs_f64(done as f64 / a.rate_mib);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let wait = Duration::from_millis(a.cycle_ms).checked_sub(start.elapsed());
        if let (true, Some(wait)) = (cycle + 1 < a.cycles, wait) {
            std::thread::sleep(wait);
        }
    }
    let _ = writeln!(out, "done {done}");
    let _ = out.flush();
    std::thread::sleep(Duration::from_millis(a.hold_ms));
    let mut workers = workers.lock().unwrap_or_else(|e| e.into_inner());
    for w in workers.iter_mut() {
        let _ = w.kill();
        let _ = w.wait();
    }
    drop(held);
    ExitCode::SUCCESS
}
