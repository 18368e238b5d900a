//! What the policy gives a level to, why a job is paused and why a pause ends: typed, with the
//! string keys the API, the events and the state file have always used (`host_memory`,
//! `gpu_memory:0`, `job_cgroup:NAME`, `predicted` …) as their serialized form.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Reading;
use crate::sample::{Collector, Sample};

/// A resource with a level. Ordered by its key, as the string keys were (`gpu_memory:0` before
/// `host_memory`): the levels' lists and the pause reasons keep their order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    /// The host's RAM: 1 - MemAvailable / MemTotal.
    HostMemory,
    /// Swap used / total.
    Swap,
    /// PSI memory full avg10.
    Pressure,
    /// The hottest CPU sensor, against its own thresholds.
    CpuTemperature,
    /// One GPU's memory, by NVML index.
    GpuMemory(u32),
    /// One GPU's temperature, by NVML index.
    GpuTemperature(u32),
    /// One job's memory cgroup, by job name.
    JobCgroup(String),
}

impl Resource {
    /// The kind without its argument (`gpu_memory` for `gpu_memory:0`), as its key begins (an
    /// event's reason is `reason::Reason::from` it).
    pub fn kind(&self) -> &'static str {
        match self {
            Resource::HostMemory => "host_memory",
            Resource::Swap => "swap",
            Resource::Pressure => "pressure",
            Resource::CpuTemperature => "cpu_temperature",
            Resource::GpuMemory(_) => "gpu_memory",
            Resource::GpuTemperature(_) => "gpu_temperature",
            Resource::JobCgroup(_) => "job_cgroup",
        }
    }

    /// In plain words: "GPU 0 memory", "train's cgroup".
    pub fn words(&self) -> String {
        match self {
            Resource::HostMemory => "host memory".into(),
            Resource::Swap => "swap".into(),
            Resource::Pressure => "memory pressure".into(),
            Resource::CpuTemperature => "CPU temperature".into(),
            Resource::GpuMemory(i) => format!("GPU {i} memory"),
            Resource::GpuTemperature(i) => format!("GPU {i} temperature"),
            Resource::JobCgroup(name) => format!("{name}'s cgroup"),
        }
    }

    /// Measured in °C rather than as a share.
    pub fn is_temperature(&self) -> bool {
        matches!(self, Resource::CpuTemperature | Resource::GpuTemperature(_))
    }

    /// The GPU it belongs to, for a GPU's memory or temperature.
    pub fn gpu(&self) -> Option<u32> {
        match self {
            Resource::GpuMemory(i) | Resource::GpuTemperature(i) => Some(*i),
            _ => None,
        }
    }

    /// The host-wide resources whose level is a share of the host's own numbers, in the order the
    /// policy walks them. Each reads itself ([`Resource::read`]); its settings are `[policy.KEY]`,
    /// found by its key (`config::Policy::ratio`). The engine and the policy need nothing more of
    /// one: a new host-wide resource is its variant here, its settings, and its reason.
    pub const HOST: &'static [Resource] =
        &[Resource::HostMemory, Resource::Swap, Resource::Pressure];

    /// Its reading on the host, for one of [`Resource::HOST`]; `Unknown` for any other (a GPU's, a
    /// temperature's and a job's come from their own observations).
    pub fn read(&self, src: &HostSources<'_>) -> Reading {
        match self {
            // 1 - MemAvailable / MemTotal, from the latest probe (fresher than the sample).
            Resource::HostMemory => match src.memory {
                Some((available, total)) if total > 0 => {
                    Reading::Value(1.0 - available as f64 / total as f64)
                }
                _ => Reading::Unknown,
            },
            // Swap used / total; absent without swap.
            Resource::Swap => match src.sample.and_then(|s| s.host.memory.as_ref()) {
                Some(m) if m.swap_total_bytes == 0 => Reading::Absent,
                Some(m) => Reading::Value(m.swap_used_bytes() as f64 / m.swap_total_bytes as f64),
                None => Reading::Unknown,
            },
            // PSI memory full avg10; unknown when its collector failed, absent without PSI.
            Resource::Pressure => match src.sample {
                Some(s)
                    if s.collectors
                        .iter()
                        .any(|c| c.name == Collector::Pressure.name() && c.success) =>
                {
                    match s.host.pressure.memory.as_ref().and_then(|p| p.full) {
                        Some(full) => Reading::Value(full.avg10),
                        None => Reading::Absent,
                    }
                }
                _ => Reading::Unknown,
            },
            _ => Reading::Unknown,
        }
    }

    /// Its value for people, in its unit: " 92 °C", " 12.5 %" (pressure), " 98 %".
    pub fn value_words(&self, value: Option<f64>) -> String {
        match value {
            None => String::new(),
            Some(v) if self.is_temperature() => format!(" {v:.0} °C"),
            Some(v) if *self == Resource::Pressure => format!(" {:.1} %", v * 100.0),
            Some(v) => format!(" {:.0} %", v * 100.0),
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::GpuMemory(i) | Resource::GpuTemperature(i) => {
                write!(f, "{}:{i}", self.kind())
            }
            Resource::JobCgroup(name) => write!(f, "job_cgroup:{name}"),
            _ => f.write_str(self.kind()),
        }
    }
}

/// What the host-wide resources ([`Resource::HOST`]) are read from.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostSources<'a> {
    /// The latest full sample.
    pub sample: Option<&'a Sample>,
    /// The latest (MemAvailable, MemTotal), from a probe or the sample.
    pub memory: Option<(u64, u64)>,
}

/// A key that names no resource (or cause): the key as given, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not a key memwatch writes.
    #[error("{0:?} is not a resource")]
    Unknown(String),
    /// A GPU key whose index is not a number.
    #[error("{0:?}: a GPU index must be a number")]
    GpuIndex(String),
}

impl FromStr for Resource {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        let gpu = |arg: &str| {
            arg.parse::<u32>()
                .map_err(|_| KeyError::GpuIndex(s.to_owned()))
        };
        Ok(match s.split_once(':') {
            None => match s {
                "host_memory" => Resource::HostMemory,
                "swap" => Resource::Swap,
                "pressure" => Resource::Pressure,
                "cpu_temperature" => Resource::CpuTemperature,
                _ => return Err(KeyError::Unknown(s.to_owned())),
            },
            Some(("gpu_memory", i)) => Resource::GpuMemory(gpu(i)?),
            Some(("gpu_temperature", i)) => Resource::GpuTemperature(gpu(i)?),
            Some(("job_cgroup", name)) if !name.is_empty() => Resource::JobCgroup(name.to_owned()),
            _ => return Err(KeyError::Unknown(s.to_owned())),
        })
    }
}

/// Why the policy paused a job: a critical resource, a projection, or the engine's way out. Ordered
/// by its key, like `Resource`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cause {
    /// A resource the job depends on is critical.
    Resource(Resource),
    /// Its memory was projected to reach a limit within the reaction time.
    Predicted,
    /// The engine paused it again on its way out (its room ran out, or its fix did not come).
    WayOut,
    /// A person paused it.
    User,
}

/// What ends a pause the policy holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// What paused the job recovered (and, after a projection, there is room again).
    Recovered,
    /// The job was paused for the maximum pause and the configuration says to resume it.
    MaxPause,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Resource(r) => r.fmt(f),
            Cause::Predicted => f.write_str("predicted"),
            Cause::WayOut => f.write_str("way_out"),
            Cause::User => f.write_str("user"),
        }
    }
}

impl FromStr for Cause {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        Ok(match s {
            "predicted" => Cause::Predicted,
            "way_out" => Cause::WayOut,
            "user" => Cause::User,
            _ => Cause::Resource(s.parse()?),
        })
    }
}

/// Ordered by the string key (unequal values have unequal keys, so this agrees with `Eq`).
macro_rules! by_key {
    ($t:ty) => {
        impl Ord for $t {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.to_string().cmp(&other.to_string())
            }
        }

        impl PartialOrd for $t {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }
    };
}

by_key!(Resource);
by_key!(Cause);

/// Serialized as the string key, so the API, the events and state files keep their form.
macro_rules! as_string {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?
                    .parse()
                    .map_err(serde::de::Error::custom)
            }
        }
    };
}

as_string!(Resource);
as_string!(Cause);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_bad_ones_are_named() {
        for key in [
            "host_memory",
            "swap",
            "pressure",
            "cpu_temperature",
            "gpu_memory:0",
            "gpu_temperature:7",
            "job_cgroup:train:a",
        ] {
            let r: Resource = key.parse().unwrap();
            assert_eq!(r.to_string(), key);
            assert_eq!(serde_json::to_value(&r).unwrap(), key);
            let c: Cause = key.parse().unwrap();
            assert_eq!(c, Cause::Resource(r));
        }
        for key in ["predicted", "way_out", "user"] {
            assert_eq!(key.parse::<Cause>().unwrap().to_string(), key);
        }
        for bad in ["ram", "gpu_memory:x", "job_cgroup:", "gpu_memory"] {
            let e = bad.parse::<Resource>().unwrap_err();
            assert!(
                matches!(&e, KeyError::Unknown(k) | KeyError::GpuIndex(k) if k == bad),
                "{e}"
            );
            assert!(e.to_string().contains(bad), "{e}");
        }
        let map: std::collections::BTreeMap<Resource, u8> =
            serde_json::from_str(r#"{"gpu_memory:1": 2, "swap": 1}"#).unwrap();
        assert_eq!(map[&Resource::GpuMemory(1)], 2);
        // Ordered as the keys: what lists levels and joins pause reasons shows them as before.
        let mut v = [
            Resource::Swap,
            Resource::HostMemory,
            Resource::GpuTemperature(0),
            Resource::JobCgroup("a".into()),
            Resource::GpuMemory(10),
            Resource::GpuMemory(2),
        ];
        v.sort();
        let keys: Vec<String> = v.iter().map(Resource::to_string).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn words_and_values() {
        assert_eq!(Resource::GpuMemory(0).words(), "GPU 0 memory");
        assert_eq!(
            Resource::JobCgroup("train".into()).words(),
            "train's cgroup"
        );
        assert_eq!(
            Resource::GpuTemperature(0).value_words(Some(92.4)),
            " 92 °C"
        );
        assert_eq!(Resource::HostMemory.value_words(Some(0.981)), " 98 %");
        assert_eq!(Resource::Pressure.value_words(Some(0.125)), " 12.5 %");
    }

    /// Each host-wide resource reads itself: swap as used / total (absent without swap), pressure
    /// only from a PSI collector that succeeded, host memory from the probe's numbers.
    #[test]
    fn host_resources_read_their_own_numbers() {
        use crate::sample::meminfo::MemInfo;
        use crate::sample::psi::{Psi, PsiLine};
        use crate::sample::{CollectorStatus, Sample};
        let mut sample = Sample::default();
        sample.host.memory = Some(MemInfo {
            swap_total_bytes: 4 << 30,
            swap_free_bytes: 1 << 30,
            ..MemInfo::default()
        });
        sample.host.pressure.memory = Some(Psi {
            full: Some(PsiLine {
                avg10: 0.25,
                ..PsiLine::default()
            }),
            ..Psi::default()
        });
        let pressure_ok = |success| CollectorStatus {
            name: "pressure".into(),
            success,
            duration_seconds: 0.0,
            errors_total: 0,
        };
        sample.collectors = vec![pressure_ok(true)];
        let src = HostSources {
            sample: Some(&sample),
            memory: Some((1 << 30, 4 << 30)),
        };
        let read: Vec<Reading> = Resource::HOST.iter().map(|r| r.read(&src)).collect();
        assert_eq!(
            read,
            [
                Reading::Value(0.75),
                Reading::Value(0.75),
                Reading::Value(0.25)
            ]
        );
        // Every host-wide resource has settings of its own and a reason that is not `Other`.
        let cfg = crate::config::Policy::default();
        for r in Resource::HOST {
            assert!(cfg.ratio(r.kind()).is_some(), "no [policy.{}]", r.kind());
            assert!(
                !matches!(
                    crate::reason::Reason::from(r),
                    crate::reason::Reason::Other(_)
                ),
                "{r} has no reason"
            );
        }
        // Without swap, swap is absent; a failed PSI read is unknown, not zero.
        sample.host.memory.as_mut().unwrap().swap_total_bytes = 0;
        sample.collectors = vec![pressure_ok(false)];
        let src = HostSources {
            sample: Some(&sample),
            memory: None,
        };
        assert_eq!(Resource::Swap.read(&src), Reading::Absent);
        assert_eq!(Resource::Pressure.read(&src), Reading::Unknown);
        assert_eq!(Resource::HostMemory.read(&src), Reading::Unknown);
        assert_eq!(Resource::GpuMemory(0).read(&src), Reading::Unknown);
    }
}
