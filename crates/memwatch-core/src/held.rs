//! What memwatch holds for a job, as records: the mechanism that holds its pause, a cgroup it froze,
//! an emergency swap device, a limit it lent, a mark for systemd-oomd, a Slurm job it suspended.
//! Plain data, kept in the job, the state file and the API. The work on them is `memwatch::act`'s,
//! through traits whose names say they act (`Freezing` for a [`Frozen`], `Lending` for a [`Loan`],
//! `Marking` for an [`OomdMark`], `Scontrol` for a [`Slurmctl`]); what is here only computes (a
//! device's path and record name, a `Slurmctl` from `[slurm]`).

use crate::host::Version;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A cgroup memwatch froze, remembered so it can be thawed (also by a restarted daemon).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frozen {
    /// cgroup v1 (the freezer hierarchy) or v2 (cgroup.freeze).
    pub version: Version,
    /// The frozen cgroup's directory.
    pub dir: PathBuf,
}

/// The fastest growth a v2 reflex's reads keep up with (bytes/s), and the engine's probing: one
/// process touching fresh pages on one core reaches about 2.7 GiB/s on the development machine.
pub const FASTEST_GROWTH: f64 = 4.0 * 1024.0 * 1024.0 * 1024.0;

/// How an armed reflex stops a job (`crate::reflex`, `engine::reflex`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReflexHow {
    /// Freeze the job's own cgroup: its v1 freezer's `freezer.state`, or v2's `cgroup.freeze`.
    Freeze(Frozen),
    /// SIGSTOP the root through its pidfd; the engine stops the rest of the tree once told.
    Stop(crate::host::ProcRef),
}

/// What the engine would arm for a job now (`engine::reflex`), and what the host driver hands to
/// the wake thread (`HostDriver::arm_reflex`).
#[derive(Debug, Clone)]
pub struct ReflexPlan {
    /// The cgroup's unreclaimable memory at which it fires (bytes).
    pub critical_bytes: u64,
    /// What it acts on.
    pub how: ReflexHow,
    /// The job's owner.
    pub owner: u32,
    /// The root's pidfd (a `Stop` needs it).
    pub pidfd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

impl PartialEq for ReflexPlan {
    /// The same reflex (its pidfd aside: the job's, kept since attach).
    fn eq(&self, other: &Self) -> bool {
        self.critical_bytes == other.critical_bytes
            && self.how == other.how
            && self.owner == other.owner
    }
}

impl ReflexPlan {
    /// Whether the reflex armed as `armed` is this one.
    pub fn is(&self, armed: Option<&Armed>) -> bool {
        armed.is_some_and(|a| a.critical_bytes == self.critical_bytes && a.how == self.how)
    }
}

/// What a pause being ended still holds while its job's reflex is armed ahead of the thaw
/// (`Engine::resume_job`): the armed record covers it too, so that a daemon that dies between the
/// record and the thaw leaves nothing held that recovery would not undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resuming {
    /// The cgroup the pause froze.
    pub frozen: Option<Frozen>,
    /// The processes the pause stopped.
    pub stopped: Vec<crate::host::ProcRef>,
}

/// What a fired reflex did (`crate::reflex`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// Froze this cgroup (v1 freezer or v2).
    Froze(Frozen),
    /// Stopped the job's root (SIGSTOP through its pidfd).
    Stopped(crate::host::ProcRef),
}

/// A reflex that fired, for the engine to take over.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    /// The job.
    pub job: String,
    /// What it did.
    pub done: Done,
    /// The cgroup's usage it read (bytes).
    pub usage: u64,
    /// The cgroup's page cache it went by.
    pub cache: crate::sample::cgroup::PageCache,
    /// From the notification's read to the act done, µs.
    pub took_us: u64,
    /// What woke it.
    pub woken: Woken,
}

/// What woke a reflex that fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// A crossing of one of the job's v1 memory thresholds (the kernel's eventfd).
    Threshold,
    /// The wake thread's own read of the job's usage: a v2 job's, or a v1 job's while its
    /// thresholds register or while it is over its line by its page cache.
    Read,
}

impl Fired {
    /// The cgroup's unreclaimable memory it found (usage less clean page cache).
    pub fn unreclaimable(&self) -> u64 {
        self.usage.saturating_sub(self.cache.clean())
    }
}

/// A job's reflex as armed, kept in the job and written to the state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Armed {
    /// The cgroup's unreclaimable memory at which it fires (bytes).
    pub critical_bytes: u64,
    /// What it acts on.
    pub how: ReflexHow,
    /// When it was armed (engine clock, ms).
    pub since_ms: u64,
    /// The pause it was armed ahead of the end of, until that pause is undone.
    pub resuming: Option<Resuming>,
}

impl Armed {
    /// What the API shows of it.
    pub fn view(&self) -> ArmedView {
        let (how, dir) = match &self.how {
            ReflexHow::Freeze(f) => ("freezer", Some(f.dir.clone())),
            ReflexHow::Stop(_) => ("signals", None),
        };
        ArmedView {
            how: how.into(),
            freezer_dir: dir,
            critical_bytes: self.critical_bytes,
            since_ms: self.since_ms,
        }
    }
}

/// A job's armed reflex as the API shows it (`reflex` of a job).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmedView {
    /// "freezer" (the job's own cgroup, v1 freezer or v2 `cgroup.freeze`) or "signals" (SIGSTOP to
    /// the root's pidfd).
    pub how: String,
    /// The freezer cgroup it freezes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freezer_dir: Option<PathBuf>,
    /// The cgroup's unreclaimable memory at which it fires (bytes).
    pub critical_bytes: u64,
    /// Since when it is armed (ms since the epoch).
    pub since_ms: u64,
}

/// One emergency swap device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// /dev/zramN, made through /sys/class/zram-control.
    Zram(u32),
    /// A swapfile memwatch created.
    File(PathBuf),
}

impl Device {
    /// The name /proc/swaps gives it (relative to the process root for zram).
    pub fn path(&self, root: &Path) -> PathBuf {
        match self {
            Device::Zram(n) => root.join(format!("dev/zram{n}")),
            Device::File(p) => p.clone(),
        }
    }

    /// The name of its record in the swap directory (`zram0.json`, `file-_swap_memwatch.json`).
    pub fn record_name(&self) -> String {
        match self {
            Device::Zram(n) => format!("zram{n}.json"),
            Device::File(p) => format!(
                "file-{}.json",
                p.to_string_lossy()
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect::<String>()
            ),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Zram(n) => write!(f, "/dev/zram{n}"),
            Device::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A recorded emergency swap device: for which job, and how big.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The device.
    pub device: Device,
    /// The job it was made for.
    pub job: String,
    /// Its size.
    pub bytes: u64,
}

/// Who a job's cgroup belongs to, and so how memwatch changes its limits: decided once per job from
/// its cgroup path (`crate::job::owner`), carried by the job and by every loan made for it, so that
/// whoever gives a loan back (a restarted daemon too) does it the way it was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CgroupOwner {
    /// No manager memwatch knows of: the cgroup's files are written directly.
    #[default]
    Cgroupfs,
    /// A systemd unit's own cgroup: systemd writes its limits from the unit's properties (again on
    /// every `daemon-reload`), so memwatch changes them through the unit's manager, for this boot
    /// only (`SetUnitProperties`, runtime).
    Systemd {
        /// The manager that owns the unit.
        bus: Bus,
        /// The unit's name, as its cgroup directory spells it (`train.service`, `run-u7.scope`).
        unit: String,
    },
}

/// A systemd manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bus {
    /// The system manager (PID 1), on the system bus.
    System,
    /// User `uid`'s own manager (`user@UID.service`), on that user's bus.
    User(u32),
}

impl std::fmt::Display for CgroupOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CgroupOwner::Cgroupfs => f.write_str("cgroupfs"),
            CgroupOwner::Systemd {
                bus: Bus::System,
                unit,
            } => write!(f, "systemd unit {unit}"),
            CgroupOwner::Systemd {
                bus: Bus::User(uid),
                unit,
            } => write!(f, "systemd unit {unit} of user {uid}'s manager"),
        }
    }
}

/// A raised limit and what it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loan {
    /// The job the limit was raised for.
    pub job: String,
    /// The cgroup directory whose limit file was raised.
    pub dir: PathBuf,
    /// 1 or 2.
    pub version: Version,
    /// The limit before the loan (bytes).
    pub original: u64,
    /// The limit during the loan.
    pub raised: u64,
    /// How the limit was raised, and so how it goes back. A record without one (state file
    /// version 2 or older) was raised through cgroupfs.
    #[serde(default)]
    pub owner: CgroupOwner,
}

/// A cgroup memwatch marked `user.oomd_omit=1` so that systemd-oomd leaves it out of its choice
/// while the policy holds the job paused, and what the attribute held before (`None`: nothing), to be
/// put back when the pause ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomdMark {
    /// The cgroup's directory.
    pub dir: PathBuf,
    /// The attribute's value before the mark.
    pub previous: Option<String>,
}

/// A job memwatch suspended through Slurm: what resumes it, also for a restarted daemon or the
/// guardian.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspended {
    /// The Slurm job's id.
    pub job_id: String,
    /// The commands that resume or requeue it.
    pub ctl: Slurmctl,
}

/// The scontrol and scancel calls memwatch makes, with their settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slurmctl {
    /// The scontrol program.
    pub scontrol: String,
    /// The scancel program.
    pub scancel: String,
    /// How long one call may run.
    pub timeout_ms: u64,
    /// This node's name in the job's holds (`slurm::holds`); empty: no holds are kept, and a
    /// resume resumes the job whoever else needs it suspended (records older than the holds).
    #[serde(default)]
    pub holder: String,
    /// How long this node's hold counts without being renewed, in seconds.
    #[serde(default)]
    pub hold_seconds: u64,
}

impl Slurmctl {
    /// The commands, timeout and holds from `[slurm]`; `node` is this node's name
    /// (`memwatch::act::slurm::node_name`, which the engine's `Stores` read once), its name in the
    /// holds when they are kept.
    pub fn new(cfg: &crate::config::Slurm, node: &str) -> Self {
        Slurmctl {
            scontrol: cfg.scontrol.clone(),
            scancel: cfg.scancel.clone(),
            timeout_ms: cfg.command_timeout_ms,
            holder: if cfg.holds {
                node.to_owned()
            } else {
                String::new()
            },
            hold_seconds: cfg.hold_seconds,
        }
    }
}

/// What holds one job's pause: a closed set, chosen per job by [`Mechanism::choose`]. Signals are
/// also the fallback of the other two (the pause record's `stopped` list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mechanism {
    /// SIGSTOP to the job's tree, root first.
    Signals,
    /// The job's own cgroup, frozen through cgroup v2's `cgroup.freeze`.
    #[serde(rename = "cgroup_v2_freeze")]
    FreezeV2(Frozen),
    /// The job's own cgroup, frozen through the v1 freezer's `freezer.state`.
    #[serde(rename = "cgroup_v1_freezer")]
    FreezeV1(Frozen),
    /// The whole Slurm job, suspended through Slurm on every node.
    #[serde(rename = "slurm_suspend")]
    Slurm(Suspended),
}

impl Mechanism {
    /// The one place a job's mechanism is chosen: a Slurm job attached by id is suspended through
    /// Slurm (its cgroup holds Slurm's own processes and is never frozen); a job that owns a cgroup
    /// every process of which its user could signal is frozen (v2 where there is one); anything
    /// else is stopped with signals.
    pub fn choose(slurm: Option<Suspended>, owned_cgroup: Option<Frozen>) -> Mechanism {
        match (slurm, owned_cgroup) {
            (Some(s), _) => Mechanism::Slurm(s),
            (None, Some(f)) if f.version == Version::V2 => Mechanism::FreezeV2(f),
            (None, Some(f)) => Mechanism::FreezeV1(f),
            (None, None) => Mechanism::Signals,
        }
    }

    /// The cgroup it freezes, if it is a freezer.
    pub fn frozen(&self) -> Option<&Frozen> {
        match self {
            Mechanism::FreezeV1(f) | Mechanism::FreezeV2(f) => Some(f),
            _ => None,
        }
    }

    /// The Slurm job it suspends, if it goes through Slurm.
    pub fn suspended(&self) -> Option<&Suspended> {
        match self {
            Mechanism::Slurm(s) => Some(s),
            _ => None,
        }
    }

    /// Its name in the state file and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Mechanism::Signals => "signals",
            Mechanism::FreezeV2(_) => "cgroup_v2_freeze",
            Mechanism::FreezeV1(_) => "cgroup_v1_freezer",
            Mechanism::Slurm(_) => "slurm_suspend",
        }
    }
}
