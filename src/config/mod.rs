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
mod slurm;
mod way_out;

pub use docs::DOCS;
pub use example::example_toml;
pub use load::{ConfigError, load, parse};

pub use notify::{Channel, ChannelKind, NoticeKind, Notify, Secret};
pub use policy::{Action, OnMaxPause, Policy, Ratio, RatioPolicy, TempPolicy, signal_by_name};
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
    /// Where the attached jobs, the paused set (so a restarted daemon resumes what it paused) and
    /// the audit log (events.jsonl) are kept.
    pub state_dir: PathBuf,
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
}

impl Default for Control {
    fn default() -> Self {
        Control {
            socket: PathBuf::from("/run/memwatch/control.sock"),
            state_dir: PathBuf::from("/var/lib/memwatch"),
            audit_max_bytes: Positive(4 * 1024 * 1024),
            max_connections: Positive(256),
            max_connections_per_uid: Positive(16),
            max_jobs_per_uid: Positive(32),
            max_directives_per_job: Positive(64),
        }
    }
}

/// How often and how much is sampled and kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    /// Sampling interval in milliseconds (10 to 3600000). 1000 costs well under 1 % of a core.
    pub interval_ms: IntervalMs,
    /// Seconds of history kept in memory for /api/v1/history and the dashboard (60 to 604800).
    pub history_seconds: HistorySeconds,
    /// While a job is attached, its memory cgroup and the host's MemAvailable are probed this often
    /// (cheap reads) between full samples, so fast growth is seen within this time. The host is
    /// probed once it is half used, or once the room above its critical line is less than 4 GiB/s of
    /// growth would take in one interval_ms; a kernel-watched cgroup is probed only near trouble.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
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
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn empty_file_is_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    /// A `[policy.X]` table that gives some keys keeps that resource's defaults for the others (not
    /// another resource's); a default that no longer fits a given key is said with both values.
    #[test]
    fn a_policy_table_keeps_the_defaults_of_the_keys_it_does_not_give() {
        let c = parse(
            "[policy.host_memory]\ncritical = 0.92\n[policy.gpu_temperature]\naction = \"warn\"\n",
        )
        .unwrap();
        let d = Policy::default();
        assert_eq!(
            c.policy.host_memory,
            RatioPolicy {
                critical: Ratio(0.92),
                ..d.host_memory.clone()
            }
        );
        assert_eq!(c.policy.swap, d.swap);
        assert_eq!(c.policy.gpu_temperature.action, Action::Warn);
        assert_eq!(
            c.policy.gpu_temperature.leave_hold_ms,
            d.gpu_temperature.leave_hold_ms
        );
        assert_eq!(c.policy.cpu_temperature, d.cpu_temperature);
        let e = parse("[policy.host_memory]\ncritical = 0.7\n").unwrap_err();
        assert!(
            e.contains("policy.host_memory.critical_leave")
                && e.contains("0.85")
                && e.contains("0.7"),
            "{e}"
        );
        let e = parse("[policy.swap]\ncriticl = 0.9\n").unwrap_err();
        assert!(
            e.contains("line 2") && e.contains("policy.swap.criticl"),
            "{e}"
        );
    }

    /// Errors name the line, column and dotted key however the key was written: under a `[table]`
    /// header, as a dotted key, in an inline table, in an array of tables; and a check made after
    /// parsing finds its key's line the same ways.
    #[test]
    fn errors_name_the_key_however_it_is_written() {
        for (text, want) in [
            (
                "listen = \"127.0.0.1:9300\"\n[policy.job_cgroup]\nwarn = \"x\"\n",
                "line 3, column 8, key `policy.job_cgroup.warn`",
            ),
            (
                "policy = { job_cgroup = { warn = \"x\" } }\n",
                "line 1, column 34, key `policy.job_cgroup.warn`",
            ),
            (
                "[sampling]\ninterval_ms = 1000\n\n[[notify.channels]]\nkind = \"x\"\n",
                "line 5, column 8, key `notify.channels[0].kind`",
            ),
            (
                "[sampling]\nprobe_interval_ms = 50\nfast_interval_ms = 60\n",
                "line 3, key `sampling.fast_interval_ms`",
            ),
            // An error on a table (here a missing field) names the table, not the key above it.
            (
                "[notify]\nnear_exhaustion_seconds = 5\n[[notify.channels]]\nname = \"x\"\n",
                "line 3, column 1, key `notify.channels[0]`",
            ),
            (
                "sampling.probe_interval_ms = 50\nsampling.fast_interval_ms = 60\n",
                "line 2, key `sampling.fast_interval_ms`",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn example_file_matches_defaults() {
        let example = example_toml().unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("memwatch.example.toml");
        if std::env::var_os("MEMWATCH_BLESS").is_some() {
            std::fs::write(&path, &example).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            on_disk, example,
            "memwatch.example.toml drifted from the defaults: run `MEMWATCH_BLESS=1 cargo test -p memwatch example_file`"
        );
        assert_eq!(parse(&on_disk).unwrap(), Config::default());
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err()
    }

    #[test]
    fn bad_configs_name_key_and_line() {
        let cases = [
            (
                "\n[sampling]\nintervall_ms = 5\n",
                "line 3",
                "unknown field `intervall_ms`",
            ),
            (
                "[sampling]\ninterval_ms = -1\n",
                "key `sampling.interval_ms`",
                "between 10 and",
            ),
            (
                "[sampling]\ninterval_ms = \"fast\"\n",
                "line 2",
                "sampling.interval_ms",
            ),
            ("listen = \"127.0.0.1:70000\"\n", "key `listen`", "line 1"),
            (
                "[http]\nmax_connections = 0\n",
                "key `http.max_connections`",
                "between 1",
            ),
            (
                "[log]\nlevel = \"loud\"\n",
                "key `log.level`",
                "unknown variant",
            ),
            ("[gpu]\nenabled = 1\n", "key `gpu.enabled`", "line 2"),
            ("nonsense", "line 1", ""),
            // Found by mutating configs: these once made `memwatch run` panic or pass.
            (
                "[http]\nmax_connections = 9223372036854775807\n",
                "line 2, key `http.max_connections`",
                "at most 65536",
            ),
            (
                "[http]\nmax_connections = 2305843009213693952\n",
                "line 2, key `http.max_connections`",
                "at most 65536",
            ),
            (
                "[policy]\ncheckpoint_signal = \"SIGSTOP\"\n",
                "line 2, key `policy.checkpoint_signal`",
                "cannot ask for a checkpoint",
            ),
            (
                "[policy]\ncheckpoint_signal = \"kill\"\n",
                "key `policy.checkpoint_signal`",
                "SIGKILL cannot",
            ),
            (
                "[policy]\ncheckpoint_signal = \"SIGCONT\"\n",
                "key `policy.checkpoint_signal`",
                "SIGCONT cannot",
            ),
            (
                "[policy]\nmax_pause_seconds = 900\n",
                "line 2, key `policy.max_pause_seconds`",
                "NCCL watchdog",
            ),
            (
                "[policy]\nmax_pause_seconds = 0\n",
                "key `policy.max_pause_seconds`",
                "at least 1",
            ),
            (
                "[policy.gpu_temperature]\naction = \"pause\"\nwarn_below_slowdown = 3.0\n\
                 critical_below_shutdown = +inf\nresume_below_slowdown = 5.0\nfallback_slowdown_celsius = 87.0\n\
                 fallback_shutdown_celsius = 95.0\nenter_hold_ms = 0\nleave_hold_ms = 1\n",
                "line 4, key `policy.gpu_temperature.critical_below_shutdown`",
                "got inf",
            ),
            (
                "[control]\nmax_connections_per_uid = 300\n",
                "key `control.max_connections_per_uid`",
                "at most 256",
            ),
        ];
        for (text, a, b) in cases {
            let e = error(text);
            assert!(e.contains(a) && e.contains(b), "for {text:?} got {e:?}");
        }
    }

    #[test]
    fn long_pauses_need_the_override_and_still_have_a_ceiling() {
        let ok = parse("[policy]\nmax_pause_seconds = 900\nallow_long_pause = true\n").unwrap();
        assert_eq!(ok.policy.max_pause_seconds, 900);
        let e = error("[policy]\nmax_pause_seconds = 9999999\nallow_long_pause = true\n");
        assert!(e.contains("7 days"), "{e}");
    }

    #[test]
    fn invalid_utf8_names_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, b"[sampling]\ninterval_ms = 100\n# caf\xe9\n").unwrap();
        let e = load(Some(&path)).unwrap_err().to_string();
        assert!(
            e.contains("bad.toml") && e.contains("line 3, column 6") && e.contains("0xe9"),
            "{e}"
        );
        std::fs::write(&path, vec![b'#'; 2 << 20]).unwrap();
        let e = load(Some(&path)).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }

    #[test]
    fn missing_explicit_file_is_an_error_but_missing_default_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        assert!(matches!(
            load(Some(&missing)),
            Err(ConfigError::Read { .. })
        ));
    }

    #[test]
    fn history_len_follows_interval() {
        let s = Sampling {
            interval_ms: IntervalMs(100),
            history_seconds: HistorySeconds(3600),
            ..Sampling::default()
        };
        assert_eq!(s.history_len(), 36_000);
    }
}
