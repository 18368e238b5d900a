//! An event's `reason`: one closed enum, serialized as the short labels the API, the events, the
//! counts, the notices and the metrics use (`host_memory`, `predicted`, `max_pause`, `way_out` …).
//! Every label is derived from a typed value (a `Resource`, a `Cause`, a way-out `Step`, a
//! `Collector`), never read back from a sentence for people; docs/api.md lists each one (a test
//! checks it).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::Step;
use crate::policy::{Cause, Resource, Resumed};
use crate::sample::Collector;

/// A doc comment's lines as one paragraph: how the `reasons!` and `actions!` lists give their
/// entries' meanings to docs/api.md's tables.
pub(crate) fn paragraph(lines: &[&str]) -> String {
    lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ")
}

/// Declares `Reason` with its labels, the actions it goes with and its meaning (its doc comment),
/// and `Reason::ALL`, from one list: docs/api.md's table of reasons is generated from it
/// ([`Reason::table`]), so a new reason is documented by construction.
macro_rules! reasons {
    ($($(#[doc = $doc:literal])* $variant:ident = $label:literal for $actions:literal,)*) => {
        /// Why an event happened, in a word. Serialized as its label; ordered by it (the counts per
        /// action and reason list as they did when reasons were strings).
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[doc = $doc])* $variant,)*
            /// `collector_down`, `collector_up`: a collector, by its name (the pressure collector's
            /// is `Pressure`'s label).
            Collector(Collector),
            /// A label this version does not know, kept as written: only read (an `events.jsonl`
            /// line written by an older daemon, or a newer daemon's answer), never recorded.
            Other(String),
        }

        impl Reason {
            /// Every reason the daemon records but a collector's, in the order docs/api.md lists
            /// them (the collectors' follow).
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The label the API, the events, the counts and the metrics use (as serialized).
            pub fn as_str(&self) -> &str {
                match self {
                    $(Reason::$variant => $label,)*
                    Reason::Collector(c) => c.name(),
                    Reason::Other(s) => s,
                }
            }

            /// The reason with that label; a label this version does not know is kept as `Other`.
            pub fn parse(label: &str) -> Reason {
                match label {
                    $($label => Reason::$variant,)*
                    other => Collector::by_name(other)
                        .map_or_else(|| Reason::Other(other.to_owned()), Reason::Collector),
                }
            }

            /// The actions it goes with and what it means, as docs/api.md's table has them.
            fn doc(&self) -> (&'static str, String) {
                match self {
                    $(Reason::$variant => ($actions, paragraph(&[$($doc),*])),)*
                    Reason::Collector(c) => ("collector_down, collector_up", c.what().to_owned()),
                    Reason::Other(_) => ("", String::new()),
                }
            }
        }
    };
}

reasons! {
    /// the host's RAM
    HostMemory = "host_memory" for "pause, checkpoint, error, level, near_exhaustion",
    /// swap used; on `way_out`, the emergency swap step (made, failed, cleared)
    Swap = "swap" for "pause, checkpoint, error, level; way_out",
    /// memory pressure (PSI); on `collector_*`, the pressure collector
    Pressure = "pressure" for "pause, checkpoint, error, level; collector_down, collector_up",
    /// the hottest CPU sensor
    CpuTemperature = "cpu_temperature" for "pause, checkpoint, error, level",
    /// a GPU's memory
    GpuMemory = "gpu_memory" for "pause, checkpoint, error, level, near_exhaustion",
    /// a GPU's temperature
    GpuTemperature = "gpu_temperature" for "pause, checkpoint, error, level",
    /// the job's own memory cgroup
    JobCgroup = "job_cgroup" for "pause, checkpoint, error, level, near_exhaustion, oom_kill",
    /// projected exhaustion: a limit reached within the reaction time
    Predicted = "predicted" for "pause, error",
    /// a person (`memwatch attach`, `detach`, `pause`, `resume`)
    User = "user" for "attach, detach, pause, resume",
    /// what paused the job recovered
    Recovered = "recovered" for "resume",
    /// the job was paused for `policy.max_pause_seconds`
    MaxPause = "max_pause" for "resume, terminate, stay_paused, kill",
    /// a restarted daemon: a job re-adopted, a pause undone, a journaled change that never reached
    /// the file; a daemon stopping for a restart: a pause kept for the next daemon
    Restart = "restart" for "attach, resume, rewrite, stay_paused",
    /// `memwatch launch` attached its second or later run
    Relaunch = "relaunch" for "attach",
    /// the daemon is stopping
    Shutdown = "shutdown" for "resume",
    /// the job's root process exited
    Gone = "gone" for "detach",
    /// on `detach`, the job's root process exited and the kernel's OOM killer had killed processes of
    /// its cgroup since the attach (its `memory.events` `oom_kill`, read once more as the job ends);
    /// on `resume`, the room that ended the pause came from the OOM killer ending processes of the
    /// job (it may have lost a rank or a worker): not a recovery
    OomKill = "oom_kill" for "detach, resume",
    /// a Slurm job attached by id: its attach (the prolog's, before its first task ran here, and the
    /// adoption of that task), its detach (the epilog's), a Slurm call that failed; on `pause`, a job
    /// this node holds suspended was found running (resumed behind its back) and suspended again; on
    /// `resume`, a job Slurm held suspended whose every hold had run out (its holders died holding
    /// it) resumed by a node that did not hold it
    Slurm = "slurm" for "attach, detach, pause, resume, error",
    /// the trainer, over the protocol (its checkpoint saved, changes acknowledged and seen to take
    /// effect or not)
    Trainer = "trainer" for "checkpoint, applied, declined, verified, unverified",
    /// the job's training config: a change staged, or config work that failed
    Adapt = "adapt" for "rewrite, error",
    /// a CUDA out-of-memory error inside a training step, as the trainer reported it; on `rewrite`,
    /// the micro-batch it recovered at, staged in its config file for the next start (already
    /// applied)
    CudaOom = "cuda_oom" for "cuda_oom, rewrite",
    /// the job's cgroup did not freeze and stopping it with signals failed too; on `pause`, the freeze
    /// memwatch held the job by was found undone by another (a container engine's unpause) and made
    /// again
    Freeze = "freeze" for "pause, error",
    /// the job's way out of its memory pause
    WayOut = "way_out" for "pause, resume, checkpoint, terminate, kill",
    /// the room did not come back within `way_out.decide_seconds`: the ladder starts
    NoRoom = "no_room" for "way_out",
    /// the lend step: the job's cgroup limit raised, or given back
    Lend = "lend" for "way_out",
    /// the checkpoint step
    Checkpoint = "checkpoint" for "way_out",
    /// the swap step for a job no fix can help now: its frozen memory pushed out to swap (how much,
    /// how fast, its cgroup's usage before and after), or why not
    Reclaim = "reclaim" for "way_out",
    /// the urgent fix did not make the job fit (paused again, declined, too late)
    Fix = "fix" for "way_out",
    /// the urgent fix was applied and the job fits: the room is given back
    Fixed = "fixed" for "way_out",
    /// the room came back by itself: the job runs on
    Room = "room" for "way_out",
    /// no step of the ladder applies; on `resume`, the job was paused on a projection alone, below
    /// its critical line: resumed once, and until its level is back to ok or it has run for
    /// `policy.max_pause_seconds`, only its critical line pauses it again
    NoWayOut = "no_way_out" for "way_out, resume",
}

impl From<&Resource> for Reason {
    /// A resource's kind, without its scope: `gpu_temperature`, not `gpu_temperature:0`.
    fn from(r: &Resource) -> Reason {
        Reason::parse(r.kind())
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
    /// A collector, named as in `memwatch_collector_*{collector}`: `Pressure` for the pressure
    /// collector, whose name is that label, and `Collector` for every other.
    fn from(c: Collector) -> Reason {
        Reason::parse(c.name())
    }
}

impl Reason {
    /// Every reason the daemon records, collectors included: `ALL`, then each collector whose name
    /// is no other reason's label.
    pub fn every() -> impl Iterator<Item = Reason> {
        Reason::ALL.iter().cloned().chain(
            Collector::ALL
                .into_iter()
                .map(Reason::from)
                .filter(|r| matches!(r, Reason::Collector(_))),
        )
    }

    /// docs/api.md's table of reasons: label, the actions it goes with, meaning.
    pub fn table() -> String {
        let code = |list: &str| {
            let mut out = String::new();
            let mut word = String::new();
            for ch in list.chars().chain(std::iter::once(' ')) {
                if ch.is_ascii_lowercase() || ch == '_' {
                    word.push(ch);
                    continue;
                }
                if !word.is_empty() {
                    out.push('`');
                    out.push_str(&std::mem::take(&mut word));
                    out.push('`');
                }
                out.push(ch);
            }
            out.trim_end().to_owned()
        };
        let mut t = String::from("| `reason` | with `action` | meaning |\n|---|---|---|\n");
        for r in Reason::every() {
            let (actions, meaning) = r.doc();
            t.push_str(&format!("| `{r}` | {} | {meaning} |\n", code(actions)));
        }
        t
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

    #[test]
    fn labels_are_unique_serialized_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::every() {
            assert!(seen.insert(r.as_str().to_owned()), "`{r}` twice");
            assert_eq!(serde_json::to_value(&r).unwrap(), r.as_str());
            assert_eq!(Reason::parse(r.as_str()), r);
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
        assert_eq!(Reason::from(Collector::Pressure), Reason::Pressure);
        assert_eq!(
            Reason::from(Collector::Vmstat),
            Reason::Collector(Collector::Vmstat)
        );
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
