//! What the engine reads of the configuration, resolved once from it when the engine is made
//! (ripgrep's low-level flags resolved into high-level arguments): the policy, the way out, Slurm,
//! the rewrites and the sampling cadence as their sections, and the few values it takes from the
//! others. Never the HTTP server's, the log's, the GPU's or the notification channels' settings:
//! those go to their own parts (`daemon::run` hands each its section).

use std::path::PathBuf;

use crate::config::{Adapt, Config, Policy, Sampling, Slurm, WayOut};

/// The engine's settings; see the module's doc.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `[policy]`: levels, thresholds, what each does, the dry run and a pause's limits.
    pub policy: Policy,
    /// `[way_out]`: the ladder out of a memory pause.
    pub way_out: WayOut,
    /// `[slurm]`: Slurm jobs.
    pub slurm: Slurm,
    /// `[adapt]`: the rules that rewrite a trainer's config.
    pub adapt: Adapt,
    /// `[sampling]`: how often, and how calm stretches it.
    pub sampling: Sampling,
    /// `[control] state_dir`: the audit log, the rewrite journal, the swap records.
    pub state_dir: PathBuf,
    /// `[control] runtime_dir`, resolved (`Control::runtime_dir`): the state file.
    pub runtime_dir: PathBuf,
    /// `[control] audit_max_bytes`.
    pub audit_max_bytes: u64,
    /// `[control] max_jobs_per_uid`.
    pub max_jobs_per_uid: usize,
    /// `[control] max_directives_per_job`.
    pub max_directives_per_job: usize,
    /// `[notify] near_exhaustion_seconds`: how soon exhaustion must be to be told.
    pub near_exhaustion_seconds: u64,
    /// `[host] process_root`: where /proc lies.
    pub process_root: PathBuf,
}

impl From<&Config> for Settings {
    fn from(c: &Config) -> Settings {
        Settings {
            policy: c.policy.clone(),
            way_out: c.way_out.clone(),
            slurm: c.slurm.clone(),
            adapt: c.adapt.clone(),
            sampling: c.sampling.clone(),
            state_dir: c.control.state_dir.clone(),
            runtime_dir: c.control.runtime_dir(),
            audit_max_bytes: c.control.audit_max_bytes.0,
            max_jobs_per_uid: c.control.max_jobs_per_uid.get(),
            max_directives_per_job: c.control.max_directives_per_job.get(),
            near_exhaustion_seconds: c.notify.near_exhaustion_seconds,
            process_root: c.host.process_root.clone(),
        }
    }
}
