//! Policy settings: thresholds, hold times and actions per resource. Defaults and their reasons are
//! documented in `config::DOCS`, each resource's table in [`RESOURCE_DOCS`] here, and the example
//! file.

use serde::{Deserialize, Deserializer, Serialize};

use super::SignalName;

/// The longest pause allowed without `allow_long_pause`: 9 minutes, a minute under PyTorch's default
/// NCCL watchdog (10 minutes), which ends a distributed job whose ranks stop answering.
pub const MAX_PAUSE_CEILING_SECONDS: u64 = 540;

/// What memwatch does when a resource turns critical.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnCritical {
    /// Pause the jobs the resource concerns; resume when it has recovered.
    Pause,
    /// Record and report only.
    Warn,
}

/// What happens when a pause has lasted `max_pause_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMaxPause {
    /// Resume the job (the default).
    Resume,
    /// Keep it paused until a person resumes it.
    Stay,
    /// Stop it: SIGTERM to every process, SIGKILL after a grace.
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
    /// pause: pause the jobs the resource concerns; warn: record and report only.
    pub action: OnCritical,
    /// Enter warn at this ratio (0-1).
    pub warn: Ratio,
    /// Leave warn below this ratio.
    pub warn_leave: Ratio,
    /// Enter critical at this ratio.
    pub critical: Ratio,
    /// Leave critical below this ratio.
    pub critical_leave: Ratio,
    /// How long a value must stay past an enter threshold before the level rises.
    pub enter_hold_ms: u64,
    /// How long a value must stay under a leave threshold before the level falls.
    pub leave_hold_ms: u64,
}

/// Level thresholds on temperatures, relative to the device's own slowdown and shutdown points (NVML's
/// thresholds for GPUs; hwmon's max and crit for CPUs), with fallbacks where the device reports none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TempPolicy {
    /// pause: pause the jobs the resource concerns; warn: record and report only.
    pub action: OnCritical,
    /// Warn this many degrees below the slowdown point.
    pub warn_below_slowdown: f64,
    /// Critical this many degrees below the shutdown point.
    pub critical_below_shutdown: f64,
    /// Leave critical only this many degrees below the slowdown point.
    pub resume_below_slowdown: f64,
    /// Slowdown point when the device reports none.
    pub fallback_slowdown_celsius: f64,
    /// Shutdown point when the device reports none.
    pub fallback_shutdown_celsius: f64,
    /// How long a value must stay past an enter threshold before the level rises.
    pub enter_hold_ms: u64,
    /// How long a value must stay under a leave threshold before the level falls.
    pub leave_hold_ms: u64,
}

/// The whole policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Decide and record, but send no signal.
    pub dry_run: bool,
    /// Stop a job whose cgroup's unreclaimable memory reaches its critical line in the wake thread, with no
    /// hop to the engine: on cgroup v1 when the kernel's threshold notification comes, on v2 by the
    /// thread's own reads of memory.current (timed for 4 GiB/s of growth to be caught before it is
    /// halfway from the line to the limit: every few ms next to the line, less often the farther the
    /// job is from it). Armed ahead (recorded in the state file), fired at the crossing,
    /// then taken over by the engine as its own pause. Off: the engine decides on its probe, as for
    /// every other line.
    pub reflex: bool,
    /// The real-time priority (SCHED_FIFO, 1–99) of the wake thread, which reads the kernel's
    /// notifications and fires the reflexes, and of the firers (one pinned to each CPU, which fire a
    /// v1 job's reflex from the CPU it grows on), so that they run the moment the kernel wakes them
    /// even while the job they watch keeps every core busy; 0: the daemon's own priority. They sleep
    /// but for those moments. It needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least this (the unit's
    /// `LimitRTPRIO=1`); where the kernel refuses, the thread runs at the daemon's priority and the
    /// log says so once.
    pub reflex_priority: u8,
    /// Pause when a job's memory is projected to hit its tightest limit (the host's MemAvailable,
    /// its cgroup limit) sooner than this, whatever the levels say. It covers a probe interval plus
    /// the signalling, with room to spare.
    pub reaction_ms: u64,
    /// A job paused for fast growth is resumed only when the room left under the limit that was
    /// running out would last this long (at least twice `reaction_ms`) at the rate it was growing
    /// when paused, or faster where it is measured faster now. A paused job cannot grow: its growth
    /// while held resumes nothing; room does (a raised limit, memory freed elsewhere).
    pub resume_headroom_ms: u64,
    /// Longest pause. The default stays under PyTorch's 10-minute NCCL watchdog, which kills
    /// distributed jobs whose ranks stop answering.
    pub max_pause_seconds: u64,
    /// Allow max_pause_seconds above 540 (9 minutes). Off by default: a longer pause outlives
    /// PyTorch's NCCL watchdog (10 minutes) and ends distributed jobs.
    pub allow_long_pause: bool,
    /// What to do when a pause reaches max_pause_seconds: resume, stay or terminate (SIGTERM to
    /// every process of the job, continued to act on it; SIGKILL 10 s later for what is left). A
    /// memory pause the `[way_out]` ladder handled is never resumed into its shortfall: it is stopped
    /// (resume, terminate) or stays (stay).
    pub on_max_pause: OnMaxPause,
    /// Signal sent to a job's root process so that it saves a checkpoint (e.g. "SIGUSR1"): before a
    /// pause when there is time for it, and by the way out's checkpoint step. Empty: none.
    pub checkpoint_signal: String,
    /// Time the job gets to checkpoint before it is paused.
    pub checkpoint_grace_ms: u64,
    /// `[policy.host_memory]`: 1 - MemAvailable/MemTotal.
    #[serde(deserialize_with = "given::host_memory")]
    pub host_memory: RatioPolicy,
    /// `[policy.swap]`: swap used / total.
    #[serde(deserialize_with = "given::swap")]
    pub swap: RatioPolicy,
    /// `[policy.pressure]`: PSI memory full avg10.
    #[serde(deserialize_with = "given::pressure")]
    pub pressure: RatioPolicy,
    /// `[policy.job_cgroup]`: a job's cgroup's unreclaimable memory / its limit.
    #[serde(deserialize_with = "given::job_cgroup")]
    pub job_cgroup: RatioPolicy,
    /// `[policy.gpu_memory]`: each GPU's used / total memory.
    #[serde(deserialize_with = "given::gpu_memory")]
    pub gpu_memory: RatioPolicy,
    /// `[policy.gpu_temperature]`: relative to each GPU's slowdown and shutdown points.
    #[serde(deserialize_with = "given::gpu_temperature")]
    pub gpu_temperature: TempPolicy,
    /// `[policy.cpu_temperature]`: relative to the CPU sensor nearest its own critical point.
    #[serde(deserialize_with = "given::cpu_temperature")]
    pub cpu_temperature: TempPolicy,
    /// `[policy.sensors]`: which temperature sensors besides the CPU's count toward
    /// `cpu_temperature`.
    pub sensors: SensorPolicy,
}

/// `[policy.sensors]`: the temperature sensors that are not a CPU's (an NVMe drive, a Wi-Fi card,
/// `acpitz`) are sampled and shown, and pause nothing unless named here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SensorPolicy {
    /// hwmon device names (the `chip` label) or thermal-zone types whose sensors count toward the
    /// `cpu_temperature` level like a CPU's, each against its own max and crit points.
    pub count_as_cpu: Vec<String>,
}

impl SensorPolicy {
    /// Whether the sensors of `device` (a hwmon device's name or a zone's type) count as a CPU's.
    pub fn counts(&self, device: &str) -> bool {
        self.count_as_cpu.iter().any(|d| d == device)
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let key = || "policy.sensors.count_as_cpu".to_owned();
        if self.count_as_cpu.len() > 64 {
            return Err((
                key(),
                format!("at most 64 names, got {}", self.count_as_cpu.len()),
            ));
        }
        for d in &self.count_as_cpu {
            let fine = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
            if d.is_empty() || d.len() > 64 || !d.bytes().all(fine) {
                return Err((
                    key(),
                    format!(
                        "{d:?} is not a device name: give a hwmon device's name (`cat \
                         /sys/class/hwmon/*/name`, e.g. \"nvme\") or a thermal zone's type, 1 to 64 \
                         letters, digits, `_`, `-` or `.`"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What each resource's `[policy.KEY]` table is: the comment above it in the example file (its keys'
/// own comments are `config::DOCS`' `policy.*.KEY`).
pub const RESOURCE_DOCS: &[(&str, &str)] = &[
    (
        "policy.host_memory",
        "Host RAM in use: 1 - MemAvailable / MemTotal. Critical at 90 % used pauses the jobs well before\n\
         the kernel's OOM killer; it is earlyoom's default kill line (10 % available, swap also under\n\
         10 %), which earlyoom >= 1.8 counts out of less than MemTotal: beside earlyoom, set critical\n\
         5 points under its line (docs/decisions.md, \"Beside systemd-oomd and earlyoom\").\n\
         Warn at 80 %.",
    ),
    (
        "policy.swap",
        "Swap in use: (SwapTotal - SwapFree) / SwapTotal; absent without swap. Warn only by default:\n\
         swap is slow, not fatal, and host_memory covers the OOM risk.",
    ),
    (
        "policy.pressure",
        "PSI memory \"full\" over 10 s: the share of time every task waited for memory (thrashing).\n\
         Critical at 40 % for 2 s, before systemd-oomd's default kill at 60 % for 30 s.",
    ),
    (
        "policy.job_cgroup",
        "An attached job's memory cgroup: unreclaimable memory (usage less clean page cache) / limit, absent\n\
         when unlimited. Critical at 95 %: the cgroup's OOM killer fires at 100 %.",
    ),
    (
        "policy.gpu_memory",
        "GPU memory used / total. Warn only by default: pausing frees no GPU memory; memwatch advises and\n\
         rewrites the batch instead.",
    ),
    (
        "policy.gpu_temperature",
        "GPU core temperature against NVML's slowdown and shutdown points (fallbacks when NVML reports\n\
         none): pause 5 °C before shutdown, resume only 5 °C under slowdown after 10 s, so a GPU hovering\n\
         at a threshold does not flap.",
    ),
    (
        "policy.cpu_temperature",
        "The CPU sensor nearest its crit (shutdown) point, against its max (slowdown) and crit points:\n\
         hwmon devices named coretemp, k10temp, k8temp, zenpower or via_cputemp, thermal zones of type\n\
         x86_pkg_temp, and SoC CPU zones (cpu_thermal, cpu0-thermal, …). Other sensors pause nothing\n\
         unless [policy.sensors] names them. No CPU sensor: the level stays ok, with no value.",
    ),
    (
        "policy.sensors",
        "Temperature sensors that are not a CPU's (an NVMe drive, a Wi-Fi card, acpitz, amdgpu) are\n\
         sampled and shown (memwatch_temperature_celsius) and pause nothing by default.",
    ),
    (
        "policy.sensors.count_as_cpu",
        "hwmon device names (the `chip` label: `cat /sys/class/hwmon/*/name`) or thermal-zone types whose\n\
         sensors count toward cpu_temperature like a CPU's, each against its own max and crit points\n\
         and [policy.cpu_temperature]'s margins, e.g. [\"nvme\"] to pause jobs before a drive overheats.",
    ),
];

/// A `[policy.X]` table holds the keys it gives, each over that resource's own default: setting
/// `critical` alone keeps the rest of the resource's defaults. Each key is read where it is written,
/// so an error names its line.
mod given {
    use serde::{Deserialize, Deserializer};

    use super::{OnCritical, Policy, Ratio, RatioPolicy, TempPolicy};

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RatioGiven {
        action: Option<OnCritical>,
        warn: Option<Ratio>,
        warn_leave: Option<Ratio>,
        critical: Option<Ratio>,
        critical_leave: Option<Ratio>,
        enter_hold_ms: Option<u64>,
        leave_hold_ms: Option<u64>,
    }

    impl RatioGiven {
        fn over(self, d: RatioPolicy) -> RatioPolicy {
            RatioPolicy {
                action: self.action.unwrap_or(d.action),
                warn: self.warn.unwrap_or(d.warn),
                warn_leave: self.warn_leave.unwrap_or(d.warn_leave),
                critical: self.critical.unwrap_or(d.critical),
                critical_leave: self.critical_leave.unwrap_or(d.critical_leave),
                enter_hold_ms: self.enter_hold_ms.unwrap_or(d.enter_hold_ms),
                leave_hold_ms: self.leave_hold_ms.unwrap_or(d.leave_hold_ms),
            }
        }
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TempGiven {
        action: Option<OnCritical>,
        warn_below_slowdown: Option<f64>,
        critical_below_shutdown: Option<f64>,
        resume_below_slowdown: Option<f64>,
        fallback_slowdown_celsius: Option<f64>,
        fallback_shutdown_celsius: Option<f64>,
        enter_hold_ms: Option<u64>,
        leave_hold_ms: Option<u64>,
    }

    impl TempGiven {
        fn over(self, d: TempPolicy) -> TempPolicy {
            TempPolicy {
                action: self.action.unwrap_or(d.action),
                warn_below_slowdown: self.warn_below_slowdown.unwrap_or(d.warn_below_slowdown),
                critical_below_shutdown: self
                    .critical_below_shutdown
                    .unwrap_or(d.critical_below_shutdown),
                resume_below_slowdown: self
                    .resume_below_slowdown
                    .unwrap_or(d.resume_below_slowdown),
                fallback_slowdown_celsius: self
                    .fallback_slowdown_celsius
                    .unwrap_or(d.fallback_slowdown_celsius),
                fallback_shutdown_celsius: self
                    .fallback_shutdown_celsius
                    .unwrap_or(d.fallback_shutdown_celsius),
                enter_hold_ms: self.enter_hold_ms.unwrap_or(d.enter_hold_ms),
                leave_hold_ms: self.leave_hold_ms.unwrap_or(d.leave_hold_ms),
            }
        }
    }

    macro_rules! over_default {
        ($($field:ident: $given:ident -> $full:ident),* $(,)?) => {$(
            pub(super) fn $field<'de, D: Deserializer<'de>>(d: D) -> Result<$full, D::Error> {
                Ok($given::deserialize(d)?.over(Policy::default().$field))
            }
        )*};
    }

    over_default! {
        host_memory: RatioGiven -> RatioPolicy,
        swap: RatioGiven -> RatioPolicy,
        pressure: RatioGiven -> RatioPolicy,
        job_cgroup: RatioGiven -> RatioPolicy,
        gpu_memory: RatioGiven -> RatioPolicy,
        gpu_temperature: TempGiven -> TempPolicy,
        cpu_temperature: TempGiven -> TempPolicy,
    }
}

fn ratio(
    action: OnCritical,
    w: f64,
    wl: f64,
    c: f64,
    cl: f64,
    enter: u64,
    leave: u64,
) -> RatioPolicy {
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
            reflex: true,
            reflex_priority: 1,
            reaction_ms: 250,
            resume_headroom_ms: 1000,
            max_pause_seconds: 300,
            allow_long_pause: false,
            on_max_pause: OnMaxPause::Resume,
            checkpoint_signal: String::new(),
            checkpoint_grace_ms: 10_000,
            host_memory: ratio(OnCritical::Pause, 0.80, 0.75, 0.90, 0.85, 0, 5000),
            swap: ratio(OnCritical::Warn, 0.50, 0.40, 0.90, 0.80, 0, 10_000),
            pressure: ratio(OnCritical::Pause, 0.10, 0.05, 0.40, 0.10, 2000, 10_000),
            job_cgroup: ratio(OnCritical::Pause, 0.80, 0.70, 0.95, 0.85, 0, 2000),
            gpu_memory: ratio(OnCritical::Warn, 0.90, 0.85, 0.97, 0.93, 0, 5000),
            gpu_temperature: TempPolicy {
                action: OnCritical::Pause,
                warn_below_slowdown: 3.0,
                critical_below_shutdown: 5.0,
                resume_below_slowdown: 5.0,
                fallback_slowdown_celsius: 87.0,
                fallback_shutdown_celsius: 95.0,
                enter_hold_ms: 0,
                leave_hold_ms: 10_000,
            },
            cpu_temperature: TempPolicy {
                action: OnCritical::Pause,
                warn_below_slowdown: 0.0,
                critical_below_shutdown: 5.0,
                resume_below_slowdown: 5.0,
                fallback_slowdown_celsius: 90.0,
                fallback_shutdown_celsius: 100.0,
                enter_hold_ms: 0,
                leave_hold_ms: 10_000,
            },
            sensors: SensorPolicy::default(),
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
    /// Each resource's ratio settings, by the resource's key (`policy::Resource::kind`).
    pub fn ratios(&self) -> [(&'static str, &RatioPolicy); 5] {
        [
            ("host_memory", &self.host_memory),
            ("swap", &self.swap),
            ("pressure", &self.pressure),
            ("job_cgroup", &self.job_cgroup),
            ("gpu_memory", &self.gpu_memory),
        ]
    }

    /// The ratio settings of the resource whose key is `kind`; `None` for a temperature's or an
    /// unknown key.
    pub fn ratio(&self, kind: &str) -> Option<&RatioPolicy> {
        self.ratios()
            .into_iter()
            .find_map(|(k, r)| (k == kind).then_some(r))
    }

    /// Cross-field checks: returns the dotted key at fault and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (name, r) in self.ratios() {
            // Both values are said: one of them may be a default the file never wrote.
            for (key, v, other, w) in [
                ("warn_leave", r.warn_leave.0, "warn", r.warn.0),
                (
                    "critical_leave",
                    r.critical_leave.0,
                    "critical",
                    r.critical.0,
                ),
                ("warn", r.warn.0, "critical", r.critical.0),
            ] {
                if v > w {
                    return Err((
                        format!("policy.{name}.{key}"),
                        format!(
                            "{v} must not be above `{other}` ({w}); set both in [policy.{name}]"
                        ),
                    ));
                }
            }
        }
        if self.reflex_priority > 99 {
            return Err((
                "policy.reflex_priority".into(),
                format!(
                    "{} is not a real-time priority: give 1 to 99, or 0 for none",
                    self.reflex_priority
                ),
            ));
        }
        if !self.checkpoint_signal.is_empty() {
            match SignalName::parse(&self.checkpoint_signal) {
                None => {
                    return Err((
                        "policy.checkpoint_signal".into(),
                        format!(
                            "{:?} is not a signal name such as \"SIGUSR1\"",
                            self.checkpoint_signal
                        ),
                    ));
                }
                Some(s) if s.stops_continues_or_kills() => {
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
        for (name, r) in self.ratios() {
            holds_ok(name, r.enter_hold_ms, r.leave_hold_ms)?;
        }
        self.sensors.validate()?;
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
