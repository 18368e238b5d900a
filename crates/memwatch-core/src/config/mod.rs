//! The daemon's TOML configuration: defaults, validation and the documented example file.
//!
//! Every setting has a default, so a missing default file means "all defaults". Unknown keys, wrong types
//! and out-of-range values are rejected while parsing, so the error carries the key, the line and the
//! column (toml attaches the span of the offending value to every serde error, ours included).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

mod docs;
mod example;
mod load;
mod notify;
mod policy;
mod signal;
mod slurm;
mod way_out;

pub use docs::DOCS;
pub use example::{ExampleError, example_toml};
pub use load::{ConfigError, ParseError, load, parse};

pub use notify::{Channel, ChannelKind, NoticeKind, Notify, Secret};
pub use policy::{OnCritical, OnMaxPause, Policy, Ratio, RatioPolicy, TempPolicy};
pub use signal::SignalName;
pub use slurm::Slurm;
pub use way_out::{Step, WayOut};

/// Where the daemon looks when no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/memwatch/memwatch.toml";

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the HTTP server (metrics, JSON API, dashboard).
    pub listen: SocketAddr,
    /// `[sampling]`: how often the host and the jobs are read.
    pub sampling: Sampling,
    /// `[host]`: where /proc and /sys are read.
    pub host: Host,
    /// `[gpu]`: NVML.
    pub gpu: Gpu,
    /// `[http]`: the HTTP server's limits.
    pub http: Http,
    /// `[log]`.
    pub log: Log,
    /// `[control]`: the control socket, the state directory and per-user limits.
    pub control: Control,
    /// `[policy]`: levels, thresholds and what each does.
    pub policy: Policy,
    /// `[adapt]`: the rules that rewrite a trainer's config.
    pub adapt: Adapt,
    /// `[way_out]`: the ladder out of a memory pause that does not end by itself.
    pub way_out: WayOut,
    /// `[notify]`: who is told when memwatch acts.
    pub notify: Notify,
    /// `[slurm]`: Slurm jobs.
    pub slurm: Slurm,
}

/// Training-config rewrites.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Adapt {
    /// Also make the reverse change (micro-batch up, accumulation down) after a long time with lots
    /// of room. Off by default: growing is the user's choice.
    pub grow: bool,
    /// How long every resource must have had lots of room before growing.
    pub grow_after_seconds: u64,
    /// Never rewrite the micro-batch below this.
    pub min_micro_batch: u64,
    /// Never rewrite the micro-batch above this.
    pub max_micro_batch: u64,
    /// Never rewrite gradient accumulation above this.
    pub max_accumulation: u64,
    /// Never rewrite DataLoader workers below this.
    pub min_workers: u64,
    /// After the trainer applied a change, wait this long before the next one, so memory can settle
    /// (PyTorch's caching allocator keeps what it reserved).
    pub settle_seconds: u64,
    /// After the trainer acknowledged fewer DataLoader workers, the job's process count must fall
    /// (and hold for a second with the new workers running) within this long; a micro-batch or
    /// accumulation change must show in the trainer's `running` report within this long once it
    /// reports one. Else the change is marked unverified (the trainer said so, the job does not
    /// show it).
    pub verify_seconds: u64,
}

impl Default for Adapt {
    fn default() -> Self {
        Adapt {
            grow: false,
            grow_after_seconds: 1800,
            min_micro_batch: 1,
            max_micro_batch: 4096,
            max_accumulation: 1024,
            min_workers: 0,
            settle_seconds: 120,
            verify_seconds: 30,
        }
    }
}

/// The control socket and the daemon's persistent state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    /// Unix socket for memwatch's commands. Any user may connect; the daemon checks the caller's
    /// uid (SO_PEERCRED): root may act on any process, others only on their own.
    pub socket: PathBuf,
    /// Where what outlives a reboot is kept: the audit log (events.jsonl), the journal of config
    /// changes and the records of emergency swap files.
    pub state_dir: PathBuf,
    /// Where the live state is kept: `state.json` (the attached jobs and the paused set, so that a
    /// restarted daemon or the guardian resumes what was paused) and the daemon's lock. It describes
    /// live processes only, so it belongs on a tmpfs: a pause's record written ahead of the pause
    /// never waits there for a busy disk (a write of 10 ms or more is logged as a warning). Unset:
    /// `state` beside the control socket (/run/memwatch/state), so one daemon per socket is one per
    /// runtime directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_dir: Option<PathBuf>,
    /// The audit log is trimmed to its newer half when it grows past this size.
    pub audit_max_bytes: Positive,
    /// Most control-socket connections other users than root may have open at once (at most 4096).
    /// Beyond it new ones are closed at once. Root has max_connections_per_uid of its own on top,
    /// so no flood of other users' connections can lock root out.
    pub max_connections: Positive,
    /// Most control-socket connections one user (uid) may hold open at once.
    pub max_connections_per_uid: Positive,
    /// Most jobs one non-root user may have attached at once.
    pub max_jobs_per_uid: Positive,
    /// Config changes remembered per job; the oldest applied ones are dropped beyond this.
    pub max_directives_per_job: Positive,
    /// When the daemon dies, how long its guardian waits for a successor (a daemon restarted by
    /// systemd, RestartSec=1) to take over the paused jobs before it resumes them itself (ms, at
    /// most 60 000).
    pub successor_grace_ms: u64,
}

impl Control {
    /// The runtime directory: `runtime_dir`, else `state` beside the control socket.
    pub fn runtime_dir(&self) -> PathBuf {
        match &self.runtime_dir {
            Some(dir) => dir.clone(),
            None => self
                .socket
                .parent()
                .unwrap_or(std::path::Path::new("/run/memwatch"))
                .join("state"),
        }
    }
}

impl Default for Control {
    fn default() -> Self {
        Control {
            socket: PathBuf::from("/run/memwatch/control.sock"),
            state_dir: PathBuf::from("/var/lib/memwatch"),
            runtime_dir: None,
            audit_max_bytes: Positive(4 * 1024 * 1024),
            max_connections: Positive(256),
            max_connections_per_uid: Positive(16),
            max_jobs_per_uid: Positive(32),
            max_directives_per_job: Positive(64),
            successor_grace_ms: 5000,
        }
    }
}

/// How often and how much is sampled and kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    /// Sampling interval in milliseconds (10 to 3600000). 1000 costs well under 1 % of a core.
    pub interval_ms: IntervalMs,
    /// Full-sample interval while all is calm and the kernel watches for change (10 to 3600000): every
    /// level ok and none within 5 points of warn, nothing paused, every job's cgroup under kernel
    /// memory thresholds (cgroup v1) or read by the daemon's wake thread in their stead (cgroup v2) and
    /// using no GPU, the host's pressure under a PSI trigger. The host's MemAvailable is still read
    /// between full samples as often as 4 GiB/s of growth could use the room above its critical line
    /// (at most every probe_interval_ms), and a read of the data (/metrics, the JSON API, the
    /// dashboard, the CLI) takes a fresh sample when the last is older than interval_ms. At or below
    /// interval_ms: never stretched.
    pub calm_interval_ms: IntervalMs,
    /// Seconds of history kept in memory for /api/v1/history and the dashboard (60 to 604800).
    pub history_seconds: HistorySeconds,
    /// While a job is attached and its memory cgroup is not watched (no cgroup v1 thresholds, no cgroup
    /// v2 reads by the daemon's wake thread), or a level is raised, the job's cgroup and the host's
    /// MemAvailable are probed this often (cheap reads) between full samples, so fast growth is seen
    /// within this time (the host once it is half used, or once the room above its critical line is
    /// less than 4 GiB/s of growth would take in one interval_ms). While every job's cgroup is watched
    /// and every level is ok, only the host's MemAvailable is read, as often as 4 GiB/s of growth could
    /// use the room above its critical line and never more often than this.
    pub probe_interval_ms: IntervalMs,
    /// Probe interval while any level is warn or worse, or a job is projected to run out of memory
    /// within a few seconds. Must not be above probe_interval_ms.
    pub fast_interval_ms: IntervalMs,
    /// Growth rates (and so the time to exhaustion) are fitted over this window of recent probes
    /// (the host's over at least 5 s: MemAvailable moves in steps).
    pub growth_window_ms: IntervalMs,
}

/// Where host data is read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Host {
    /// Root under which /proc and /sys are read. "/" on a real machine; a fixture tree in tests.
    pub root: PathBuf,
    /// Root under which attached jobs' /proc/PID and their cgroups are read. "/" outside tests.
    pub process_root: PathBuf,
}

/// GPU sampling through NVML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Gpu {
    /// Sample GPUs. Without a driver or a GPU the GPU section stays empty and the daemon runs on.
    pub enabled: bool,
    /// The NVML library to load: a file name searched on the library path, or an absolute path.
    pub library: PathBuf,
}

/// Limits of the HTTP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http {
    /// Most connections open at once. When all are open, a new one takes the place of the one idle
    /// longest (never one with a request in flight); only when every one is busy does it wait.
    pub max_connections: Positive,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: Positive,
    /// Most time a client gets to send a request (headers and body) and to read each part of the
    /// answer; an idle keep-alive connection is closed after it too. 10 ms to 1 h.
    pub request_timeout_ms: IntervalMs,
}

/// Logging defaults (the command line and `RUST_LOG` override them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// One of error, warn, info, debug, trace.
    pub level: LogLevel,
    /// text (for people) or json (one object per line, for log shippers).
    pub format: LogFormat,
}

/// `log.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// What memwatch does (the default).
    Info,
    /// What it sees, too.
    Debug,
    /// Everything.
    Trace,
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

impl LogLevel {
    /// The name `RUST_LOG` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// A sampling interval in milliseconds, 10 ms to 1 h.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IntervalMs(pub u64);

/// How many seconds of history to keep in memory, 60 s to 7 days.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HistorySeconds(pub u64);

/// A count that must be at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Positive(pub u64);

impl Positive {
    /// As a `usize`, saturating.
    pub fn get(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

fn ranged<'de, D: Deserializer<'de>>(
    d: D,
    min: u64,
    max: u64,
    what: &str,
) -> Result<u64, D::Error> {
    let v = i64::deserialize(d)?;
    if v < min as i64 || v > max as i64 {
        return Err(serde::de::Error::custom(format!(
            "{what} must be between {min} and {max}, got {v}"
        )));
    }
    Ok(v as u64)
}

impl<'de> Deserialize<'de> for IntervalMs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ranged(d, 10, 3_600_000, "the sampling interval (ms)").map(IntervalMs)
    }
}

impl<'de> Deserialize<'de> for HistorySeconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ranged(d, 60, 7 * 86_400, "the history length (s)").map(HistorySeconds)
    }
}

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ranged(d, 1, i64::MAX as u64, "this value").map(Positive)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 9300)),
            sampling: Sampling::default(),
            host: Host::default(),
            gpu: Gpu::default(),
            http: Http::default(),
            log: Log::default(),
            control: Control::default(),
            policy: Policy::default(),
            adapt: Adapt::default(),
            way_out: WayOut::default(),
            notify: Notify::default(),
            slurm: Slurm::default(),
        }
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            interval_ms: IntervalMs(1000),
            calm_interval_ms: IntervalMs(10_000),
            history_seconds: HistorySeconds(3600),
            probe_interval_ms: IntervalMs(100),
            fast_interval_ms: IntervalMs(10),
            growth_window_ms: IntervalMs(1000),
        }
    }
}

impl Default for Host {
    fn default() -> Self {
        Host {
            root: PathBuf::from("/"),
            process_root: PathBuf::from("/"),
        }
    }
}

impl Default for Gpu {
    fn default() -> Self {
        Gpu {
            enabled: true,
            library: PathBuf::from("libnvidia-ml.so.1"),
        }
    }
}

impl Default for Http {
    fn default() -> Self {
        Http {
            max_connections: Positive(256),
            max_body_bytes: Positive(64 * 1024),
            request_timeout_ms: IntervalMs(10_000),
        }
    }
}

impl Default for Log {
    fn default() -> Self {
        Log {
            level: LogLevel::Info,
            format: LogFormat::Text,
        }
    }
}

impl Sampling {
    /// How many samples the history holds.
    pub fn history_len(&self) -> usize {
        let n = self.history_seconds.0.saturating_mul(1000) / self.interval_ms.0.max(1);
        usize::try_from(n).unwrap_or(usize::MAX).max(1)
    }
}

#[cfg(test)]
mod tests;
