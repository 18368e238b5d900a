//! Host growth as the daemon reports it, against a real job growing steadily at 20 and 120 MiB/s and
//! in bursts: after a few seconds the rate is within 10 % of the host's true growth, which the job's
//! dominates. Alone in its test binary, so no other test's memory moves the host's.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Daemon, Opts, memhog};

/// (the job's RSS in bytes, the host limit's growth in bytes/s) at a sample's time (ms).
fn reading(d: &Daemon) -> Option<(u64, f64, f64)> {
    let jobs = d.jobs();
    let j = jobs.first()?;
    let at = j["sample"]["timestamp_ms"].as_u64()?;
    let rss = j["sample"]["rss_bytes"].as_f64()?;
    let host = j["limits"]
        .as_array()?
        .iter()
        .find(|l| l["limit"] == "host")?;
    Some((at, rss, host["growth_bytes_per_second"].as_f64()?))
}

/// Host memory in use now (MemTotal − MemAvailable), in bytes, as the test reads it.
fn host_used() -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("read /proc/meminfo");
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .expect("a meminfo line")
    };
    (kib("MemTotal:") - kib("MemAvailable:")) * 1024.0
}

/// Wall-clock milliseconds, the scale of the daemon's sample times.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Least-squares slope, in MiB/s, of (ms, bytes) points.
fn slope(points: &[(u64, f64)]) -> f64 {
    let n = points.len() as f64;
    let t0 = points[0].0;
    let xs: Vec<f64> = points
        .iter()
        .map(|(t, _)| (t - t0) as f64 / 1000.0)
        .collect();
    let (mx, my) = (
        xs.iter().sum::<f64>() / n,
        points.iter().map(|(_, v)| v).sum::<f64>() / n,
    );
    let cov: f64 = xs
        .iter()
        .zip(points)
        .map(|(x, (_, v))| (x - mx) * (v - my))
        .sum();
    let var: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    cov / var / 1048576.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn host_growth_follows_steady_and_bursty_growth_within_ten_percent() {
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        ..Opts::default()
    });
    // The truth: host memory in use, read by the test every 100 ms, to fit over the same 5 s as each
    // of memwatch's readings. (The host's growth, not only the job's: this machine runs other things.)
    let truth: Arc<Mutex<Vec<(u64, f64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = {
        let (truth, stop) = (truth.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let point = (wall_ms(), host_used());
                truth.lock().expect("the truth").push(point);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // (rate MiB/s, chunk MiB): 4 MiB chunks are steady; 45 MiB at 60 MiB/s is a burst every 0.75 s.
    for (rate, chunk, what) in [(20, 4, "steady"), (120, 4, "steady"), (60, 45, "bursty")] {
        let mut hog = Command::new(memhog())
            .args([
                "--rate-mib",
                &rate.to_string(),
                "--chunk-mib",
                &chunk.to_string(),
                "--total-mib",
                &(rate * 16).to_string(),
                "--hold-ms",
                "30000",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start memhog");
        let mut line = String::new();
        BufReader::new(hog.stdout.take().expect("memhog's stdout"))
            .read_line(&mut line)
            .expect("memhog's ready line");
        let name = format!("grow{rate}");
        assert_eq!(
            d.ctl(&["attach", &hog.id().to_string(), "--name", &name]).0,
            0
        );
        // A few seconds of growth first: the host window is 5 s, and MemAvailable trails a new
        // process's first second or two of growth (pages come from the per-CPU free lists).
        d.wait_until(
            |d| reading(d).is_some_and(|(_, rss, _)| rss >= rate as f64 * 8.0 * 1048576.0),
            "eight seconds of growth",
        );
        let (mut job, mut seen) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some((at, rss, growth)) = reading(&d) {
                if seen.last().is_none_or(|(t, _)| *t != at) {
                    job.push((at, rss));
                    seen.push((at, growth / 1048576.0));
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        // Let the recorder pass the last reading.
        std::thread::sleep(Duration::from_millis(200));
        let points = truth.lock().expect("the truth").clone();
        let pairs: Vec<(f64, f64)> = seen
            .iter()
            .map(|(at, got)| {
                let window: Vec<(u64, f64)> = points
                    .iter()
                    .copied()
                    .filter(|(t, _)| *t + 5000 >= *at && *t <= *at)
                    .collect();
                (*got, slope(&window))
            })
            .collect();
        let job_rate = slope(&job);
        // Relative to the host's rate, or to a quarter of the job's where the host's is near 0 (other
        // processes freeing memory as fast as the job takes it).
        let off: Vec<f64> = pairs
            .iter()
            .map(|(got, truth)| (got - truth).abs() / truth.abs().max(job_rate * 0.25))
            .collect();
        eprintln!(
            "{what} {rate} MiB/s: the job grew {job_rate:.1} MiB/s; (memwatch, the host's own fit): {pairs:.1?}"
        );
        assert!(pairs.len() >= 8, "{what}: only {} readings", pairs.len());
        assert!(
            median(off.clone()) <= 0.1,
            "{what} {rate} MiB/s: memwatch against the host's growth, median {:.0} % off: {pairs:.1?}",
            median(off) * 100.0
        );
        // Detached before it ends: a job whose root is gone is dropped at the next sample, and a
        // detach after that would find nothing.
        assert_eq!(d.ctl(&["detach", &name]).0, 0);
        let _ = hog.kill();
        let _ = hog.wait();
    }
    stop.store(true, Ordering::Relaxed);
    let _ = recorder.join();
}
