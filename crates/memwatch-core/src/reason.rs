//! An event's `reason`: one closed enum, serialized as the short labels the API, the events, the
//! counts, the notices and the metrics use (`host_memory`, `predicted`, `max_pause`, `way_out` …).
//! Every label is derived from a typed value (a `Resource`, a `Cause`, a way-out `Step`, a
//! `Collector`), never read back from a sentence for people; docs/api.md lists each one (a test
//! checks it).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::collector::Collector;
use crate::config::Step;
use crate::policy::{Cause, Resource, Resumed};

/// Declares `Reason` with its labels and `Reason::ALL` from one list, so that a new reason is in
/// `ALL` (and so in the test that docs/api.md lists it) by construction.
macro_rules! reasons {
    ($($(#[doc = $doc:literal])* $variant:ident = $label:literal,)*) => {
        /// Why an event happened, in a word. Serialized as its label; ordered by it (the counts per
        /// action and reason list as they did when reasons were strings).
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[doc = $doc])* $variant,)*
            /// A label this version does not know, kept as written: only read (an `events.jsonl`
            /// line written by an older daemon, or a newer daemon's answer), never recorded.
            Other(String),
        }

        impl Reason {
            /// Every reason the daemon records, in the order docs/api.md lists them.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The label the API, the events, the counts and the metrics use (as serialized).
            pub fn as_str(&self) -> &str {
                match self {
                    $(Reason::$variant => $label,)*
                    Reason::Other(s) => s,
                }
            }

            /// The reason with that label; a label this version does not know is kept as `Other`.
            pub fn parse(label: &str) -> Reason {
                match label {
                    $($label => Reason::$variant,)*
                    other => Reason::Other(other.to_owned()),
                }
            }
        }
    };
}

reasons! {
    /// The host's RAM (`host_memory` level; the host's limit of `near_exhaustion`).
    HostMemory = "host_memory",
    /// Swap used; on `way_out`, the emergency swap step (made, failed, cleared).
    Swap = "swap",
    /// Memory pressure (PSI); on `collector_down`/`collector_up`, the pressure collector.
    Pressure = "pressure",
    /// The hottest CPU sensor.
    CpuTemperature = "cpu_temperature",
    /// A GPU's memory (any index).
    GpuMemory = "gpu_memory",
    /// A GPU's temperature (any index).
    GpuTemperature = "gpu_temperature",
    /// The job's own memory cgroup.
    JobCgroup = "job_cgroup",
    /// Memory projected to reach a limit within the reaction time.
    Predicted = "predicted",
    /// A person (`memwatch attach|detach|pause|resume`).
    User = "user",
    /// What paused the job recovered.
    Recovered = "recovered",
    /// The job was paused for `policy.max_pause_seconds`.
    MaxPause = "max_pause",
    /// A restarted daemon: a pause undone, a job re-adopted, a journaled rewrite that never landed.
    Restart = "restart",
    /// `memwatch launch` attached its second or later run.
    Relaunch = "relaunch",
    /// The daemon is stopping.
    Shutdown = "shutdown",
    /// The job's root process exited.
    Gone = "gone",
    /// The kernel's OOM killer ended processes of the job: its root exited after kills in its
    /// cgroup since the attach (memory.events `oom_kill`), or the room that ended its pause came
    /// from kills (a rank or a worker lost), which is no recovery.
    OomKill = "oom_kill",
    /// A Slurm job attached by id (`memwatch attach|detach --slurm-job`).
    Slurm = "slurm",
    /// The trainer, over the protocol: a checkpoint saved, changes applied or declined, verified.
    Trainer = "trainer",
    /// The job's training config: a change staged, or config work that failed.
    Adapt = "adapt",
    /// The job's cgroup did not freeze and stopping it with signals failed too.
    Freeze = "freeze",
    /// The job's way out of its memory pause (a pause, resume, checkpoint or stop it made).
    WayOut = "way_out",
    /// `way_out`: the room did not come back within `way_out.decide_seconds`; the ladder starts.
    NoRoom = "no_room",
    /// `way_out`: the lend step (the job's cgroup limit raised, or given back).
    Lend = "lend",
    /// `way_out`: the checkpoint step.
    Checkpoint = "checkpoint",
    /// `way_out`: the urgent fix did not make the job fit (paused again, declined, late).
    Fix = "fix",
    /// `way_out`: the urgent fix was applied and the job fits; the room is given back.
    Fixed = "fixed",
    /// `way_out`: the room came back by itself; the job runs on.
    Room = "room",
    /// `way_out`: no step of the ladder applies.
    NoWayOut = "no_way_out",
    /// `collector_down`/`collector_up`: /proc/meminfo.
    Meminfo = "meminfo",
    /// `collector_down`/`collector_up`: /proc/vmstat.
    Vmstat = "vmstat",
    /// `collector_down`/`collector_up`: the daemon's own cgroup.
    Cgroup = "cgroup",
    /// `collector_down`/`collector_up`: hwmon and thermal zones.
    Thermal = "thermal",
    /// `collector_down`/`collector_up`: NVML.
    Gpu = "gpu",
}

impl From<&Resource> for Reason {
    /// A resource's kind, without its scope: `gpu_temperature`, not `gpu_temperature:0`.
    fn from(r: &Resource) -> Reason {
        match r {
            Resource::HostMemory => Reason::HostMemory,
            Resource::Swap => Reason::Swap,
            Resource::Pressure => Reason::Pressure,
            Resource::CpuTemperature => Reason::CpuTemperature,
            Resource::GpuMemory(_) => Reason::GpuMemory,
            Resource::GpuTemperature(_) => Reason::GpuTemperature,
            Resource::JobCgroup(_) => Reason::JobCgroup,
        }
    }
}

impl From<&Cause> for Reason {
    /// A pause's cause, without its scope: `job_cgroup`, `predicted`, `way_out` or `user`.
    fn from(c: &Cause) -> Reason {
        match c {
            Cause::Resource(r) => r.into(),
            Cause::Predicted => Reason::Predicted,
            Cause::WayOut => Reason::WayOut,
            Cause::User => Reason::User,
        }
    }
}

impl From<Resumed> for Reason {
    /// What ended a pause: `recovered` or `max_pause`.
    fn from(r: Resumed) -> Reason {
        match r {
            Resumed::Recovered => Reason::Recovered,
            Resumed::MaxPause => Reason::MaxPause,
        }
    }
}

impl From<Step> for Reason {
    /// A step of the way out, named as in `way_out.steps`.
    fn from(s: Step) -> Reason {
        match s {
            Step::Swap => Reason::Swap,
            Step::Lend => Reason::Lend,
            Step::Checkpoint => Reason::Checkpoint,
        }
    }
}

impl From<Collector> for Reason {
    /// A collector, named as in `memwatch_collector_*{collector}`.
    fn from(c: Collector) -> Reason {
        match c {
            Collector::Meminfo => Reason::Meminfo,
            Collector::Vmstat => Reason::Vmstat,
            Collector::Pressure => Reason::Pressure,
            Collector::Cgroup => Reason::Cgroup,
            Collector::Thermal => Reason::Thermal,
            Collector::Gpu => Reason::Gpu,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Ord for Reason {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // By label; an `Other` that spells a known label (never parsed so) after the known one.
        self.as_str()
            .cmp(other.as_str())
            .then_with(|| matches!(self, Reason::Other(_)).cmp(&matches!(other, Reason::Other(_))))
    }
}

impl PartialOrd for Reason {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Reason::parse(&String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels docs/api.md's `/api/v1/events` section lists in its table of reasons (the one
    /// whose header begins "| `reason` |"): the first cell of each row, a single `label`.
    fn documented() -> Vec<String> {
        let doc = include_str!("../../../docs/api.md");
        let start = doc
            .find("\n## `/api/v1/events`")
            .expect("docs/api.md has a /api/v1/events section");
        let section = &doc[start + 1..];
        let section = &section[..section[1..].find("\n## ").map_or(section.len(), |e| e + 1)];
        let mut lines = section
            .lines()
            .skip_while(|l| !l.starts_with("| `reason` |"))
            .skip(1);
        assert!(
            lines.next().is_some_and(|l| l.starts_with("|---")),
            "the /api/v1/events section has a table of reasons"
        );
        lines
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cell = l.split('|').nth(1).unwrap_or_default().trim();
                cell.strip_prefix('`')
                    .and_then(|c| c.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("{l:?}: the first cell is no `label`"))
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn every_reason_is_documented_and_every_documented_reason_exists() {
        let documented = documented();
        for r in Reason::ALL {
            assert!(
                documented.iter().any(|d| d == r.as_str()),
                "docs/api.md's /api/v1/events section does not list the reason `{r}`"
            );
        }
        for d in &documented {
            assert!(
                !matches!(Reason::parse(d), Reason::Other(_)),
                "docs/api.md lists the reason `{d}`, which the daemon never records"
            );
        }
        assert_eq!(documented.len(), Reason::ALL.len(), "{documented:?}");
    }

    #[test]
    fn labels_are_unique_serialized_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "`{r}` twice");
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
            assert_eq!(&Reason::parse(r.as_str()), r);
            let label = r.as_str();
            assert!(
                !label.is_empty() && label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{label:?} is no label"
            );
        }
    }

    #[test]
    fn typed_values_give_their_kind_without_scope() {
        for (r, label) in [
            (Resource::HostMemory, "host_memory"),
            (Resource::Swap, "swap"),
            (Resource::Pressure, "pressure"),
            (Resource::CpuTemperature, "cpu_temperature"),
            (Resource::GpuMemory(3), "gpu_memory"),
            (Resource::GpuTemperature(0), "gpu_temperature"),
            (Resource::JobCgroup("qa".into()), "job_cgroup"),
        ] {
            assert_eq!(Reason::from(&r).as_str(), label);
            // The resource's own kind, as its key begins.
            assert_eq!(r.kind(), label);
            assert_eq!(Reason::from(&Cause::Resource(r)).as_str(), label);
        }
        assert_eq!(Reason::from(&Cause::Predicted), Reason::Predicted);
        assert_eq!(Reason::from(&Cause::WayOut), Reason::WayOut);
        assert_eq!(Reason::from(&Cause::User), Reason::User);
        for s in [Step::Swap, Step::Lend, Step::Checkpoint] {
            assert_eq!(Reason::from(s).as_str(), s.as_str());
        }
        for c in Collector::ALL {
            assert_eq!(Reason::from(c).as_str(), c.name());
        }
    }

    #[test]
    fn an_unknown_label_is_kept_as_written() {
        for old in ["qa's", "GPU", "host", "", "gpu 0", "none"] {
            let r: Reason = serde_json::from_value(serde_json::json!(old)).unwrap();
            assert_eq!(r, Reason::Other(old.to_owned()));
            assert_eq!(serde_json::to_value(&r).unwrap(), old);
        }
        let mut v = [
            Reason::Other("zzz".into()),
            Reason::User,
            Reason::HostMemory,
        ];
        v.sort();
        let labels: Vec<&str> = v.iter().map(Reason::as_str).collect();
        assert_eq!(labels, ["host_memory", "user", "zzz"]);
    }
}
