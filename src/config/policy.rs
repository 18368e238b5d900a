//! Policy settings: thresholds, hold times and actions per resource. Defaults and their reasons are
//! documented in `config::DOCS` and the example file.

use serde::{Deserialize, Deserializer, Serialize};

/// The longest pause allowed without `allow_long_pause`: 9 minutes, a minute under PyTorch's default
/// NCCL watchdog (10 minutes), which ends a distributed job whose ranks stop answering.
pub const MAX_PAUSE_CEILING_SECONDS: u64 = 540;

/// What memwatch does when a resource turns critical.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Pause the jobs the resource concerns; resume when it has recovered.
    Pause,
    /// Record and report only.
    Warn,
}

/// What happens when a pause has lasted `max_pause_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMaxPause {
    Resume,
    Stay,
    Terminate,
}

/// A ratio between 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
pub struct Ratio(pub f64);

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(serde::de::Error::custom(format!(
                "a ratio must be between 0 and 1, got {v}"
            )));
        }
        Ok(Ratio(v))
    }
}

/// Level thresholds on a ratio where higher is worse.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioPolicy {
    pub action: Action,
    pub warn: Ratio,
    pub warn_leave: Ratio,
    pub critical: Ratio,
    pub critical_leave: Ratio,
    pub enter_hold_ms: u64,
    pub leave_hold_ms: u64,
}

/// Level thresholds on temperatures, relative to the device's own slowdown and shutdown points (NVML's
/// thresholds for GPUs; hwmon's max and crit for CPUs), with fallbacks where the device reports none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TempPolicy {
    pub action: Action,
    /// Warn this many degrees below the slowdown point.
    pub warn_below_slowdown: f64,
    /// Critical this many degrees below the shutdown point.
    pub critical_below_shutdown: f64,
    /// Leave critical only this many degrees below the slowdown point.
    pub resume_below_slowdown: f64,
    pub fallback_slowdown_celsius: f64,
    pub fallback_shutdown_celsius: f64,
    pub enter_hold_ms: u64,
    pub leave_hold_ms: u64,
}

/// The whole policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub dry_run: bool,
    pub reaction_ms: u64,
    pub resume_headroom_ms: u64,
    pub max_pause_seconds: u64,
    pub allow_long_pause: bool,
    pub on_max_pause: OnMaxPause,
    pub checkpoint_signal: String,
    pub checkpoint_grace_ms: u64,
    pub host_memory: RatioPolicy,
    pub swap: RatioPolicy,
    pub pressure: RatioPolicy,
    pub job_cgroup: RatioPolicy,
    pub gpu_memory: RatioPolicy,
    pub gpu_temperature: TempPolicy,
    pub cpu_temperature: TempPolicy,
}

fn ratio(action: Action, w: f64, wl: f64, c: f64, cl: f64, enter: u64, leave: u64) -> RatioPolicy {
    RatioPolicy {
        action,
        warn: Ratio(w),
        warn_leave: Ratio(wl),
        critical: Ratio(c),
        critical_leave: Ratio(cl),
        enter_hold_ms: enter,
        leave_hold_ms: leave,
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            dry_run: false,
            reaction_ms: 250,
            resume_headroom_ms: 1000,
            max_pause_seconds: 300,
            allow_long_pause: false,
            on_max_pause: OnMaxPause::Resume,
            checkpoint_signal: String::new(),
            checkpoint_grace_ms: 10_000,
            host_memory: ratio(Action::Pause, 0.80, 0.75, 0.90, 0.85, 0, 5000),
            swap: ratio(Action::Warn, 0.50, 0.40, 0.90, 0.80, 0, 10_000),
            pressure: ratio(Action::Pause, 0.10, 0.05, 0.40, 0.10, 2000, 10_000),
            job_cgroup: ratio(Action::Pause, 0.80, 0.70, 0.95, 0.85, 0, 2000),
            gpu_memory: ratio(Action::Warn, 0.90, 0.85, 0.97, 0.93, 0, 5000),
            gpu_temperature: TempPolicy {
                action: Action::Pause,
                warn_below_slowdown: 3.0,
                critical_below_shutdown: 5.0,
                resume_below_slowdown: 5.0,
                fallback_slowdown_celsius: 87.0,
                fallback_shutdown_celsius: 95.0,
                enter_hold_ms: 0,
                leave_hold_ms: 10_000,
            },
            cpu_temperature: TempPolicy {
                action: Action::Pause,
                warn_below_slowdown: 0.0,
                critical_below_shutdown: 5.0,
                resume_below_slowdown: 5.0,
                fallback_slowdown_celsius: 90.0,
                fallback_shutdown_celsius: 100.0,
                enter_hold_ms: 0,
                leave_hold_ms: 10_000,
            },
        }
    }
}

/// Hold times are at most an hour.
fn holds_ok(name: &str, enter: u64, leave: u64) -> Result<(), (String, String)> {
    for (field, v) in [("enter_hold_ms", enter), ("leave_hold_ms", leave)] {
        if v > 3_600_000 {
            return Err((
                format!("policy.{name}.{field}"),
                format!("must be at most 3600000 (1 h), got {v}"),
            ));
        }
    }
    Ok(())
}

impl Policy {
    /// Cross-field checks: returns the dotted key at fault and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (name, r) in [
            ("host_memory", &self.host_memory),
            ("swap", &self.swap),
            ("pressure", &self.pressure),
            ("job_cgroup", &self.job_cgroup),
            ("gpu_memory", &self.gpu_memory),
        ] {
            if r.warn_leave.0 > r.warn.0 {
                return Err((
                    format!("policy.{name}.warn_leave"),
                    "must not be above `warn`".into(),
                ));
            }
            if r.critical_leave.0 > r.critical.0 {
                return Err((
                    format!("policy.{name}.critical_leave"),
                    "must not be above `critical`".into(),
                ));
            }
            if r.warn.0 > r.critical.0 {
                return Err((
                    format!("policy.{name}.warn"),
                    "must not be above `critical`".into(),
                ));
            }
        }
        if !self.checkpoint_signal.is_empty() {
            use nix::sys::signal::Signal;
            match signal_by_name(&self.checkpoint_signal) {
                None => {
                    return Err((
                        "policy.checkpoint_signal".into(),
                        format!(
                            "{:?} is not a signal name such as \"SIGUSR1\"",
                            self.checkpoint_signal
                        ),
                    ));
                }
                Some(
                    s @ (Signal::SIGSTOP
                    | Signal::SIGTSTP
                    | Signal::SIGTTIN
                    | Signal::SIGTTOU
                    | Signal::SIGCONT
                    | Signal::SIGKILL),
                ) => {
                    return Err((
                        "policy.checkpoint_signal".into(),
                        format!(
                            "{s} cannot ask for a checkpoint: it stops, continues or kills the job; use e.g. \"SIGUSR1\""
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        if self.max_pause_seconds == 0 {
            return Err((
                "policy.max_pause_seconds".into(),
                "must be at least 1".into(),
            ));
        }
        if self.max_pause_seconds > MAX_PAUSE_CEILING_SECONDS && !self.allow_long_pause {
            return Err((
                "policy.max_pause_seconds".into(),
                format!(
                    "{} s is above {MAX_PAUSE_CEILING_SECONDS} s: a distributed job's ranks would outlive PyTorch's \
                     10-minute NCCL watchdog and be killed; set policy.allow_long_pause = true to allow it",
                    self.max_pause_seconds
                ),
            ));
        }
        if self.max_pause_seconds > 7 * 86_400 {
            return Err((
                "policy.max_pause_seconds".into(),
                "must be at most 604800 (7 days)".into(),
            ));
        }
        for (key, v, max) in [
            ("policy.reaction_ms", self.reaction_ms, 60_000),
            (
                "policy.resume_headroom_ms",
                self.resume_headroom_ms,
                600_000,
            ),
            (
                "policy.checkpoint_grace_ms",
                self.checkpoint_grace_ms,
                600_000,
            ),
        ] {
            if v > max {
                return Err((key.into(), format!("must be at most {max}, got {v}")));
            }
        }
        for (name, r) in [
            ("host_memory", &self.host_memory),
            ("swap", &self.swap),
            ("pressure", &self.pressure),
            ("job_cgroup", &self.job_cgroup),
            ("gpu_memory", &self.gpu_memory),
        ] {
            holds_ok(name, r.enter_hold_ms, r.leave_hold_ms)?;
        }
        for (name, t) in [
            ("gpu_temperature", &self.gpu_temperature),
            ("cpu_temperature", &self.cpu_temperature),
        ] {
            for (field, v, max) in [
                ("warn_below_slowdown", t.warn_below_slowdown, 100.0),
                ("critical_below_shutdown", t.critical_below_shutdown, 100.0),
                ("resume_below_slowdown", t.resume_below_slowdown, 100.0),
                (
                    "fallback_slowdown_celsius",
                    t.fallback_slowdown_celsius,
                    200.0,
                ),
                (
                    "fallback_shutdown_celsius",
                    t.fallback_shutdown_celsius,
                    200.0,
                ),
            ] {
                if !v.is_finite() || !(0.0..=max).contains(&v) {
                    return Err((
                        format!("policy.{name}.{field}"),
                        format!("must be a number from 0 to {max}, got {v}"),
                    ));
                }
            }
            holds_ok(name, t.enter_hold_ms, t.leave_hold_ms)?;
        }
        Ok(())
    }
}

/// Parses "SIGUSR1", "USR1" or a number.
pub fn signal_by_name(name: &str) -> Option<nix::sys::signal::Signal> {
    if let Ok(n) = name.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n).ok();
    }
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse::<nix::sys::signal::Signal>().ok()
}
