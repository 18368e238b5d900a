//! The daemon's TOML configuration: defaults, validation and the documented example file.
//!
//! Every setting has a default, so a missing default file means "all defaults". Unknown keys, wrong types
//! and out-of-range values are rejected while parsing, so the error carries the key, the line and the
//! column (toml attaches the span of the offending value to every serde error, ours included).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

mod docs;
mod policy;

pub use docs::DOCS;

pub use policy::{Action, OnMaxPause, Policy, Ratio, RatioPolicy, TempPolicy};

/// Where the daemon looks when no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/memwatch/memwatch.toml";

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the HTTP server (metrics, JSON API, dashboard).
    pub listen: SocketAddr,
    pub sampling: Sampling,
    pub host: Host,
    pub gpu: Gpu,
    pub http: Http,
    pub log: Log,
    pub control: Control,
    pub policy: Policy,
    pub adapt: Adapt,
}

/// Training-config rewrites.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Adapt {
    pub grow: bool,
    pub grow_after_seconds: u64,
    pub min_micro_batch: u64,
    pub max_micro_batch: u64,
    pub max_accumulation: u64,
    pub min_workers: u64,
    pub settle_seconds: u64,
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
        }
    }
}

/// The control socket and the daemon's persistent state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub audit_max_bytes: Positive,
    pub max_connections: Positive,
    pub max_connections_per_uid: Positive,
    pub max_jobs_per_uid: Positive,
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
    pub interval_ms: IntervalMs,
    pub history_seconds: HistorySeconds,
    pub probe_interval_ms: IntervalMs,
    pub fast_interval_ms: IntervalMs,
    pub growth_window_ms: IntervalMs,
}

/// Where host data is read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Host {
    pub root: PathBuf,
    pub process_root: PathBuf,
}

/// GPU sampling through NVML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Gpu {
    pub enabled: bool,
    pub library: PathBuf,
}

/// Limits of the HTTP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http {
    pub max_connections: Positive,
    pub max_body_bytes: Positive,
}

/// Logging defaults (the command line and `RUST_LOG` override them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    pub level: LogLevel,
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl LogLevel {
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

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The largest config file read (a real one is a few kB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Loads the configuration. `explicit` is the `--config` argument: a missing explicit file is an error,
/// a missing default file means defaults.
pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
    use std::io::Read as _;
    let path = explicit.unwrap_or(Path::new(DEFAULT_CONFIG_PATH));
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_owned(),
        message,
    };
    let read = std::fs::File::open(path).and_then(|f| {
        let mut bytes = Vec::new();
        f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
        Ok(bytes)
    });
    match read {
        Ok(bytes) if bytes.len() as u64 > MAX_CONFIG_BYTES => Err(invalid(format!(
            "larger than {MAX_CONFIG_BYTES} bytes; is this the right file?"
        ))),
        Ok(bytes) => parse(&utf8(&bytes).map_err(invalid)?).map_err(invalid),
        Err(e) if explicit.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(Config::default())
        }
        Err(source) => Err(ConfigError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The text of a config file, or where its first invalid UTF-8 byte is.
fn utf8(bytes: &[u8]) -> Result<String, String> {
    std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| {
        let before = &bytes[..e.valid_up_to()];
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let column = before.len()
            - before
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1)
            + 1;
        format!(
            "line {line}, column {column}: not valid UTF-8 (byte 0x{:02x})",
            bytes[e.valid_up_to()]
        )
    })
}

/// Upper bounds on counts and sizes: beyond them a value is a typo, or would exhaust the daemon.
fn bounds(c: &Config) -> Result<(), (String, String)> {
    let checks: [(&str, u64, u64); 8] = [
        ("http.max_connections", c.http.max_connections.0, 65_536),
        ("http.max_body_bytes", c.http.max_body_bytes.0, 64 << 20),
        (
            "control.audit_max_bytes",
            c.control.audit_max_bytes.0,
            1 << 30,
        ),
        ("control.max_connections", c.control.max_connections.0, 4096),
        (
            "control.max_connections_per_uid",
            c.control.max_connections_per_uid.0,
            c.control.max_connections.0,
        ),
        (
            "control.max_jobs_per_uid",
            c.control.max_jobs_per_uid.0,
            1024,
        ),
        (
            "control.max_directives_per_job",
            c.control.max_directives_per_job.0,
            4096,
        ),
        ("adapt.max_micro_batch", c.adapt.max_micro_batch, 1 << 20),
    ];
    for (key, value, max) in checks {
        if value > max {
            return Err((
                key.to_owned(),
                format!("must be at most {max}, got {value}"),
            ));
        }
    }
    Ok(())
}

/// Parses configuration text; the error names the key and line.
pub fn parse(text: &str) -> Result<Config, String> {
    let config: Config = toml::from_str(text).map_err(|e| describe(text, &e))?;
    let checks = [
        bounds(&config),
        config.policy.validate(),
        (config.sampling.fast_interval_ms.0 > config.sampling.probe_interval_ms.0)
            .then(|| {
                (
                    "sampling.fast_interval_ms".to_owned(),
                    "must not be above `probe_interval_ms`".to_owned(),
                )
            })
            .map_or(Ok(()), Err),
    ];
    for check in checks {
        if let Err((key, why)) = check {
            return Err(match line_of(text, &key) {
                Some(line) => format!("line {line}, key `{key}`: {why}"),
                None => format!("key `{key}`: {why}"),
            });
        }
    }
    Ok(config)
}

/// The line (1-based) where dotted `key` is set, if it is set in `text`.
fn line_of(text: &str, key: &str) -> Option<usize> {
    (1..=text.lines().count()).find(|&l| key_at(text, l).as_deref() == Some(key))
}

/// Turns a toml error into one line: "line L, column C, key `a.b`: message".
fn describe(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().to_owned();
    let Some(span) = e.span() else {
        return message;
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    match key_at(text, line) {
        Some(key) => format!("line {line}, column {column}, key `{key}`: {message}"),
        None => format!("line {line}, column {column}: {message}"),
    }
}

/// The dotted key defined on `line` (1-based), using the last `[table]` header above it.
fn key_at(text: &str, line: usize) -> Option<String> {
    let mut table = String::new();
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if t.starts_with('[') {
            table = t.trim_matches(|c| c == '[' || c == ']').trim().to_owned();
        }
        if i + 1 == line {
            let (key, _) = t.split_once('=')?;
            let key = key.trim();
            return Some(if table.is_empty() {
                key.to_owned()
            } else {
                format!("{table}.{key}")
            });
        }
    }
    None
}

fn doc(key: &str) -> Result<&'static str, String> {
    let generic = match key.split('.').collect::<Vec<_>>().as_slice() {
        ["policy", _, field] => format!("policy.*.{field}"),
        _ => String::new(),
    };
    DOCS.iter()
        .find(|(k, _)| *k == key)
        .or_else(|| DOCS.iter().find(|(k, _)| *k == generic))
        .map(|(_, d)| *d)
        .ok_or_else(|| format!("setting `{key}` has no documentation in config::DOCS"))
}

fn comment(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "# {line}");
    }
}

/// Renders the example configuration from the defaults and [`DOCS`]. Fails if a setting is undocumented
/// or a documented key no longer exists.
pub fn example_toml() -> Result<String, String> {
    let table = toml::Table::try_from(Config::default()).map_err(|e| e.to_string())?;
    let mut out = String::from(
        "# memwatch configuration. Every setting is shown with its default value.\n\
         # Default location: /etc/memwatch/memwatch.toml (or pass --config PATH).\n\
         # This file is generated from the defaults by `memwatch config example`.\n",
    );
    let mut seen = Vec::new();
    emit(&mut out, "", &table, &mut seen)?;
    let used = |k: &str| {
        seen.iter()
            .any(|s| s == k || (k.starts_with("policy.*.") && s.ends_with(&k[8..])))
    };
    if let Some((stale, _)) = DOCS.iter().find(|(k, _)| !used(k)) {
        return Err(format!(
            "config::DOCS documents `{stale}`, which is not a setting"
        ));
    }
    Ok(out)
}

/// Writes `table`'s plain keys, then each sub-table under its `[header]`, recursively.
fn emit(
    out: &mut String,
    prefix: &str,
    table: &toml::Table,
    seen: &mut Vec<String>,
) -> Result<(), String> {
    let dotted = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (key, value) in table.iter().filter(|(_, v)| !v.is_table()) {
        let name = dotted(key);
        if prefix.is_empty() {
            out.push('\n');
        }
        comment(out, doc(&name)?);
        let _ = writeln!(out, "{key} = {value}");
        seen.push(name);
    }
    for (key, value) in table.iter() {
        let Some(inner) = value.as_table() else {
            continue;
        };
        let name = dotted(key);
        out.push('\n');
        comment(out, doc(&name)?);
        let _ = writeln!(out, "[{name}]");
        seen.push(name.clone());
        emit(out, &name, inner, seen)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
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
