//! What `memwatch top` shows: the daemon's snapshot, jobs, levels and recent history over the JSON
//! API, and for each process NVML reports on a GPU, its user, command, host memory and CPU from this
//! machine's /proc.

use std::collections::HashMap;
use std::path::Path;

use crate::cli::status::Overview;
use crate::client::Client;
use crate::history::Point;
use crate::sample::Sample;

/// A process using a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProcess {
    pub gpu: u32,
    pub pid: u32,
    pub user: String,
    pub command: String,
    pub gpu_bytes: Option<u64>,
    pub host_bytes: Option<u64>,
    /// Percent of one CPU since the last refresh; `None` on the first.
    pub cpu_percent: Option<f64>,
}

/// One refresh.
pub struct Model {
    pub sample: Sample,
    pub overview: Overview,
    pub history: Vec<Point>,
    pub processes: Vec<GpuProcess>,
}

#[derive(serde::Deserialize)]
struct History {
    points: Vec<Point>,
}

/// Fetches and enriches; `cpu` keeps each pid's CPU ticks and when they were read, for rates.
pub struct Source {
    client: Client,
    cpu: HashMap<u32, (u64, std::time::Instant)>,
    page: u64,
    ticks: f64,
}

impl Source {
    pub fn new(url: &str) -> Source {
        let sys = |v| {
            nix::unistd::sysconf(v)
                .ok()
                .flatten()
                .and_then(|n| u64::try_from(n).ok())
        };
        Source {
            client: Client::new(url),
            cpu: HashMap::new(),
            page: sys(nix::unistd::SysconfVar::PAGE_SIZE).unwrap_or(4096),
            ticks: sys(nix::unistd::SysconfVar::CLK_TCK).unwrap_or(100) as f64,
        }
    }

    pub fn fetch(&mut self, history_seconds: u64) -> anyhow::Result<Model> {
        let sample: Sample = self.client.sample()?;
        let overview: Overview = self.client.get("/api/v1/jobs")?;
        let history: History = self
            .client
            .get(&format!("/api/v1/history?seconds={history_seconds}"))?;
        let mut processes = Vec::new();
        let now = std::time::Instant::now();
        let mut seen = Vec::new();
        for g in &sample.gpus {
            for p in g.processes.iter().flatten() {
                let stat = crate::proc::read_stat(Path::new("/"), p.pid).ok();
                let cpu_percent = stat.as_ref().and_then(|s| {
                    let before = self.cpu.insert(p.pid, (s.cpu_ticks, now));
                    let (t0, at) = before?;
                    let dt = now.duration_since(at).as_secs_f64();
                    (dt > 0.0)
                        .then(|| s.cpu_ticks.saturating_sub(t0) as f64 / self.ticks / dt * 100.0)
                });
                seen.push(p.pid);
                processes.push(GpuProcess {
                    gpu: g.index,
                    pid: p.pid,
                    user: user_of(p.pid),
                    command: command_of(p.pid, stat.as_ref().map(|s| s.comm.as_str())),
                    gpu_bytes: p.used_bytes,
                    host_bytes: stat.map(|s| s.rss_pages * self.page),
                    cpu_percent,
                });
            }
        }
        self.cpu.retain(|pid, _| seen.contains(pid));
        Ok(Model {
            sample,
            overview,
            history: history.points,
            processes,
        })
    }
}

/// The process's user name, else its uid, else "-" (gone, or in another pid namespace).
fn user_of(pid: u32) -> String {
    let Ok(s) = crate::proc::read_status(Path::new("/"), pid) else {
        return "-".into();
    };
    let uid = s.uids[0];
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// The command line, else the name from stat, else "-".
fn command_of(pid: u32, comm: Option<&str>) -> String {
    let line = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|l| !l.is_empty());
    line.or_else(|| comm.map(str::to_owned))
        .unwrap_or_else(|| "-".into())
}
