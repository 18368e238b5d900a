//! The pause memwatch holds on a job: the one record of it, as the engine keeps it and the API shows
//! it.

use serde::{Deserialize, Serialize};

use crate::held;
use crate::host::ProcRef;
use crate::policy::By;

/// A pause memwatch is holding: the one record of it (the policy reads it through [`Pause::policy`]
/// and keeps no copy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    /// When the pause began (engine clock, ms).
    pub since_ms: u64,
    /// The policy or a user.
    pub by: By,
    /// Why, for people.
    pub reason: String,
    /// Where the pause stands: being made (a Slurm suspend under way, a freeze settling) or held.
    pub phase: PausePhase,
    /// What holds it: signals, the job's own cgroup frozen (v1 or v2), or the whole Slurm job
    /// suspended through Slurm (every rank on every node).
    pub mechanism: held::Mechanism,
    /// What was stopped with signals, root first: the whole pause when the mechanism is signals, the
    /// fallback when a freeze or Slurm failed (empty in dry-run mode).
    pub stopped: Vec<ProcRef>,
    /// Decided in dry-run mode: nothing was stopped.
    pub dry_run: bool,
    /// The cgroups marked `user.oomd_omit=1` for this pause, each with what it held before: a pause
    /// the policy holds on a cgroup v2 job keeps systemd-oomd off the job; the marks go with the
    /// pause (`act::oomd`).
    #[serde(default)]
    pub oomd_omit: Vec<held::OomdMark>,
    /// How fast the job's cgroup and the host were filling (bytes/s) when the pause began: the
    /// steeper slope (`Growth::rate_per_second`), for the room a way out makes. A paused job does
    /// not grow, so nothing measured later says it. Not kept across restarts.
    #[serde(skip)]
    pub growth_at_start: GrowthAtPause,
    /// What the policy decided the pause on (its causes, a projection's limit and rate, whether it
    /// is strict or has run past the longest pause). Not kept across restarts, which resume or
    /// re-decide every pause.
    #[serde(skip)]
    pub held: Held,
    /// Processes the OOM killer ended in the job's cgroups (its step and task cgroups too) since the
    /// pause began: room that came back this way is not the job's recovery. Not kept across
    /// restarts.
    #[serde(skip)]
    pub oom_killed: u64,
}

impl Pause {
    /// The freezer a held pause (not a dry run's) holds the job by, if a freezer holds it.
    pub fn held_freezer(&self) -> Option<&held::Frozen> {
        match (&self.mechanism, self.phase, self.dry_run) {
            (
                held::Mechanism::FreezeV1(f) | held::Mechanism::FreezeV2(f),
                PausePhase::Held,
                false,
            ) => Some(f),
            _ => None,
        }
    }
}

/// Where a pause stands: a pause is a state with steps, not one act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PausePhase {
    /// Recorded and under way: Slurm was asked to suspend the job, or a freeze is settling. A
    /// second pause of the job does nothing (the record is keyed by the job).
    Pausing,
    /// In effect.
    Held,
}

impl Pause {
    /// The cgroup memwatch froze for this pause, if its mechanism is a freezer.
    pub fn frozen(&self) -> Option<&held::Frozen> {
        self.mechanism.frozen()
    }

    /// The Slurm job memwatch suspended for this pause, if it went through Slurm.
    pub fn suspended(&self) -> Option<&held::Suspended> {
        self.mechanism.suspended()
    }
}

/// The policy's part of a pause record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    /// What caused it.
    pub reasons: Vec<crate::policy::Cause>,
    /// The limit and growth rate when a projection caused it.
    pub projected: Option<(crate::policy::LimitKind, f64)>,
    /// The maximum pause was reached and the job stays paused.
    pub expired: bool,
    /// Resuming needs room for the rate seen at the pause (every pause on a projection, and the way
    /// out's hold).
    pub strict: bool,
}

impl Pause {
    /// The pause as the policy sees it.
    pub fn policy(&self) -> crate::policy::PauseState {
        crate::policy::PauseState {
            since_ms: self.since_ms,
            by: self.by,
            reasons: self.held.reasons.clone(),
            projected: self.held.projected,
            expired: self.held.expired,
            strict: self.held.strict,
        }
    }
}

impl From<crate::policy::PauseState> for Held {
    fn from(p: crate::policy::PauseState) -> Held {
        Held {
            reasons: p.reasons,
            projected: p.projected,
            expired: p.expired,
            strict: p.strict,
        }
    }
}

/// Growth rates when a pause began, bytes/s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GrowthAtPause {
    /// The job's cgroup's unreclaimable memory.
    pub cgroup: f64,
    /// The host's used memory.
    pub host: f64,
}
