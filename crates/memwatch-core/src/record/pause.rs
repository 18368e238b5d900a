//! A pause as the state file keeps it: data transfer types of their own, apart from the engine's
//! in-memory ones, so that a guardian or a daemon of another version reads what this one wrote.
//!
//! Versions of the state file (`Persisted::version`):
//! - 1: a pause kept `stopped`, and beside it `frozen` (a cgroup) or `slurm` (a Slurm job).
//! - 2: a pause names the mechanism that holds it (`hold`, tagged by `kind`) and its `phase`.
//! - 3: a lent limit (a job's `way_out.loan`, an ended job's in `loans`) names how it was set
//!   (`owner`: `cgroupfs`, or `systemd` with its `bus` and `unit`), so it goes back the same way; a
//!   pause lists the cgroups it marked `user.oomd_omit` for systemd-oomd (`oomd_omit`: each `dir`
//!   and the `previous` value), so whoever undoes it takes the marks off. A `slurm_suspend` hold
//!   may name this node's `holder` and `hold_seconds` in the job's shared holds
//!   (`act::slurm_holds`); without them a resume resumes the job whoever else holds it.
//! - 4: a pause record may be in phase `armed`: a reflex the wake thread holds ready (`crate::reflex`)
//!   and may have fired, written before it was handed over. Whoever undoes records undoes it as a
//!   pause being made (it thaws a cgroup that may not be frozen, continues a root that may not be
//!   stopped); a build of version 3 reads the phase as unknown and does the same.
//! - 5: an armed reflex's record names its `line` (the memory cgroup it watches, the cgroup's
//!   version, the unreclaimable bytes it fires at and the limit), so that the guardian holds the job
//!   at that line while no daemon runs (`crate::guardian`'s gap, in the `memwatch` crate). A pause
//!   the guardian made there is recorded `held`, its reason saying so. A build of version 4 ignores
//!   the line.
//!
//! All are read; a loan without an `owner` was set through cgroupfs, and a pause of version 1 or 2
//! marked nothing. A `kind` this build does not know (a later mechanism: a systemd unit over the bus,
//! an armed reflex) loads as [`HoldRecord::Unknown`]; undoing it still continues every recorded and
//! every stopped process of the job's tree.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::held::{Frozen, Mechanism, OomdMark, Slurmctl, Suspended};
use crate::host::ProcRef;
use crate::host::Version;
use crate::policy::By;

/// The state file version this build writes.
pub const VERSION: u32 = 5;

/// A pause as the state file keeps it: enough to undo it after a crash, with no config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "PauseWire")]
pub struct PersistedPause {
    /// When the pause began (engine clock, ms).
    pub since_ms: u64,
    /// Who paused the job.
    pub by: By,
    /// Why, for people.
    pub reason: String,
    /// Being made, or held. Recovery undoes both: a pause being made may have taken effect.
    pub phase: PhaseRecord,
    /// What holds it.
    pub hold: HoldRecord,
    /// The processes memwatch stopped with signals, root first (the whole pause, or the fallback
    /// when the mechanism failed).
    pub stopped: Vec<ProcRef>,
    /// What the policy paused the job for, by key (`host_memory`, `job_cgroup:train`, `predicted`,
    /// `way_out` …): a restarted daemon holds the pause until these recover. Keys this build does
    /// not know are dropped on reading.
    pub causes: Vec<String>,
    /// The limit and growth rate (bytes/s) when a projection caused it.
    pub projected: Option<(String, f64)>,
    /// Resuming needs room for the rate seen at the pause: set for every pause on a projection and
    /// the way out's hold (builds before it set it only on a pause repeated within 5 s of the last
    /// one's end, and read it so).
    pub strict: bool,
    /// The longest pause was reached and the job stays paused.
    pub expired: bool,
    /// The cgroups marked `user.oomd_omit=1` for systemd-oomd, with what each held before
    /// (version 3; empty before).
    pub oomd_omit: Vec<OomdMark>,
    /// An armed reflex's line, for the guardian to hold while no daemon runs (version 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<LineRecord>,
}

/// The line an armed reflex watches, as recorded (version 5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineRecord {
    /// The job's memory cgroup.
    pub memory: PathBuf,
    /// Its hierarchy's version.
    pub version: Version,
    /// The unreclaimable memory (usage less clean page cache) at which it fires, in bytes.
    pub critical_bytes: u64,
    /// The cgroup's limit, in bytes.
    pub limit_bytes: u64,
}

/// Where a pause stood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseRecord {
    /// Recorded, not yet confirmed in effect.
    Pausing,
    /// In effect.
    Held,
    /// A reflex armed ahead of a crossing (version 4): it may have fired.
    Armed,
    /// Written by a later version.
    #[serde(other)]
    Unknown,
}

/// The mechanism that holds a pause, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HoldRecord {
    /// Signals only: `stopped` is the whole pause.
    Signals,
    /// A cgroup v2 directory whose `cgroup.freeze` was set.
    CgroupV2Freeze {
        /// The cgroup's directory.
        dir: PathBuf,
    },
    /// A cgroup v1 freezer directory whose `freezer.state` was set.
    CgroupV1Freezer {
        /// The cgroup's directory.
        dir: PathBuf,
    },
    /// A Slurm job suspended through Slurm.
    SlurmSuspend {
        /// The Slurm job's id.
        job_id: String,
        /// The scontrol program that resumes it.
        scontrol: String,
        /// The scancel program.
        scancel: String,
        /// How long one call may run.
        timeout_ms: u64,
        /// This node's name in the job's holds; absent before they were kept.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        holder: String,
        /// How long the hold counts without being renewed, in seconds.
        #[serde(default, skip_serializing_if = "is_zero")]
        hold_seconds: u64,
    },
    /// A kind this build does not know.
    #[serde(other)]
    Unknown,
}

impl From<&Mechanism> for HoldRecord {
    fn from(m: &Mechanism) -> HoldRecord {
        match m {
            Mechanism::Signals => HoldRecord::Signals,
            Mechanism::FreezeV2(f) => HoldRecord::CgroupV2Freeze { dir: f.dir.clone() },
            Mechanism::FreezeV1(f) => HoldRecord::CgroupV1Freezer { dir: f.dir.clone() },
            Mechanism::Slurm(s) => HoldRecord::SlurmSuspend {
                job_id: s.job_id.clone(),
                scontrol: s.ctl.scontrol.clone(),
                scancel: s.ctl.scancel.clone(),
                timeout_ms: s.ctl.timeout_ms,
                holder: s.ctl.holder.clone(),
                hold_seconds: s.ctl.hold_seconds,
            },
        }
    }
}

impl HoldRecord {
    /// The mechanism to undo; `None` for one this build does not know.
    pub fn mechanism(&self) -> Option<Mechanism> {
        Some(match self {
            HoldRecord::Signals => Mechanism::Signals,
            HoldRecord::CgroupV2Freeze { dir } => Mechanism::FreezeV2(Frozen {
                version: Version::V2,
                dir: dir.clone(),
            }),
            HoldRecord::CgroupV1Freezer { dir } => Mechanism::FreezeV1(Frozen {
                version: Version::V1,
                dir: dir.clone(),
            }),
            HoldRecord::SlurmSuspend {
                job_id,
                scontrol,
                scancel,
                timeout_ms,
                holder,
                hold_seconds,
            } => Mechanism::Slurm(Suspended {
                job_id: job_id.clone(),
                ctl: Slurmctl {
                    scontrol: scontrol.clone(),
                    scancel: scancel.clone(),
                    timeout_ms: *timeout_ms,
                    holder: holder.clone(),
                    hold_seconds: *hold_seconds,
                },
            }),
            HoldRecord::Unknown => return None,
        })
    }
}

impl PersistedPause {
    /// The record of an engine's pause.
    pub fn of(p: &crate::job::Pause) -> PersistedPause {
        PersistedPause {
            since_ms: p.since_ms,
            by: p.by,
            reason: p.reason.clone(),
            phase: match p.phase {
                crate::job::PausePhase::Pausing => PhaseRecord::Pausing,
                crate::job::PausePhase::Held => PhaseRecord::Held,
            },
            hold: HoldRecord::from(&p.mechanism),
            stopped: p.stopped.clone(),
            causes: p.held.reasons.iter().map(ToString::to_string).collect(),
            projected: p.held.projected.map(|(l, r)| (l.to_string(), r)),
            strict: p.held.strict,
            expired: p.held.expired,
            oomd_omit: p.oomd_omit.clone(),
            line: None,
        }
    }

    /// The pause a restarted daemon goes on holding: `None` when it was still being made (it may
    /// not have taken effect whole) or its mechanism is one this build does not know; both are
    /// undone instead.
    pub fn resumable_hold(&self) -> Option<crate::job::Pause> {
        if self.phase != PhaseRecord::Held {
            return None;
        }
        Some(crate::job::Pause {
            since_ms: self.since_ms,
            by: self.by,
            reason: self.reason.clone(),
            phase: crate::job::PausePhase::Held,
            mechanism: self.hold.mechanism()?,
            stopped: self.stopped.clone(),
            dry_run: false,
            oomd_omit: self.oomd_omit.clone(),
            growth_at_start: Default::default(),
            oom_killed: 0,
            held: crate::job::Held {
                reasons: self.causes.iter().filter_map(|c| c.parse().ok()).collect(),
                projected: self
                    .projected
                    .as_ref()
                    .and_then(|(l, r)| l.parse().ok().map(|l| (l, *r))),
                expired: self.expired,
                strict: self.strict,
            },
        })
    }
}

/// Every version's fields, as read.
#[derive(Deserialize)]
struct PauseWire {
    since_ms: u64,
    by: By,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    stopped: Vec<ProcRef>,
    #[serde(default)]
    phase: Option<PhaseRecord>,
    #[serde(default)]
    hold: Option<HoldRecord>,
    #[serde(default)]
    causes: Vec<String>,
    #[serde(default)]
    projected: Option<(String, f64)>,
    #[serde(default)]
    strict: bool,
    #[serde(default)]
    expired: bool,
    /// Version 3.
    #[serde(default)]
    oomd_omit: Vec<OomdMark>,
    /// Version 5.
    #[serde(default)]
    line: Option<LineRecord>,
    /// Version 1.
    #[serde(default)]
    frozen: Option<FrozenV1>,
    /// Version 1.
    #[serde(default)]
    slurm: Option<SuspendedV1>,
}

/// Version 1's frozen cgroup.
#[derive(Deserialize)]
struct FrozenV1 {
    version: Version,
    dir: PathBuf,
}

/// Version 1's Slurm suspension.
#[derive(Deserialize)]
struct SuspendedV1 {
    job_id: String,
    ctl: CtlV1,
}

/// Version 1's Slurm commands.
#[derive(Deserialize)]
struct CtlV1 {
    scontrol: String,
    scancel: String,
    timeout_ms: u64,
}

impl From<PauseWire> for PersistedPause {
    fn from(w: PauseWire) -> PersistedPause {
        let hold = w.hold.unwrap_or_else(|| match (w.slurm, w.frozen) {
            (Some(s), _) => HoldRecord::SlurmSuspend {
                job_id: s.job_id,
                scontrol: s.ctl.scontrol,
                scancel: s.ctl.scancel,
                timeout_ms: s.ctl.timeout_ms,
                holder: String::new(),
                hold_seconds: 0,
            },
            (None, Some(f)) if f.version == Version::V2 => {
                HoldRecord::CgroupV2Freeze { dir: f.dir }
            }
            (None, Some(f)) => HoldRecord::CgroupV1Freezer { dir: f.dir },
            (None, None) => HoldRecord::Signals,
        });
        PersistedPause {
            since_ms: w.since_ms,
            by: w.by,
            reason: w.reason,
            // Version 1 wrote a pause once it held, and ahead of it: either may be so.
            phase: w.phase.unwrap_or(PhaseRecord::Pausing),
            hold,
            stopped: w.stopped,
            causes: w.causes,
            projected: w.projected,
            strict: w.strict,
            expired: w.expired,
            oomd_omit: w.oomd_omit,
            line: w.line,
        }
    }
}

/// For `skip_serializing_if`.
fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 2 pause (before marks) reads with none; a version 3 one keeps its marks and what
    /// each cgroup held before.
    #[test]
    fn version_2_reads_without_marks_and_version_3_keeps_them() {
        let v2 = r#"{"since_ms": 5, "by": "policy", "reason": "r", "phase": "held",
            "hold": {"kind": "cgroup_v2_freeze", "dir": "/sys/fs/cgroup/job"}, "stopped": []}"#;
        let p: PersistedPause = serde_json::from_str(v2).unwrap();
        assert!(p.oomd_omit.is_empty());
        assert_eq!(
            p.hold,
            HoldRecord::CgroupV2Freeze {
                dir: "/sys/fs/cgroup/job".into()
            }
        );
        let v3 = r#"{"since_ms": 5, "by": "policy", "reason": "r", "phase": "held",
            "hold": {"kind": "signals"}, "stopped": [],
            "oomd_omit": [{"dir": "/sys/fs/cgroup/a.slice/job.service", "previous": null},
                          {"dir": "/sys/fs/cgroup/a.slice", "previous": "0"}]}"#;
        let p: PersistedPause = serde_json::from_str(v3).unwrap();
        assert_eq!(p.oomd_omit.len(), 2);
        assert_eq!(p.oomd_omit[1].previous.as_deref(), Some("0"));
        let back: PersistedPause =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
        assert_eq!(p.resumable_hold().map(|h| h.oomd_omit), Some(p.oomd_omit));
    }
}
