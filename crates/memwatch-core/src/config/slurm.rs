//! `[slurm]`: how memwatch pauses, resumes and stops the Slurm jobs it follows by job id.

use serde::{Deserialize, Serialize};

/// `[slurm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Slurm {
    /// Pause a Slurm job through Slurm (`scontrol suspend`, later `scontrol resume`), so that every
    /// rank on every node stops together; off: stop only this node's tasks with signals.
    pub job_wide_pause: bool,
    /// The way out's last step requeues the job (`scontrol requeue`) after its checkpoint instead of
    /// stopping it; off: `scancel`.
    pub requeue: bool,
    /// The `scontrol` program (a name looked up in PATH, or an absolute path).
    pub scontrol: String,
    /// The `scancel` program.
    pub scancel: String,
    /// How long one scontrol or scancel may take before memwatch gives up on it and falls back.
    pub command_timeout_ms: u64,
    /// How long `memwatch attach --slurm-job` waits for a job's first process on this node (a prolog
    /// attaches before the tasks start) before it forgets the job.
    pub adopt_within_seconds: u64,
    /// Keep each node's hold on a job's suspension in the job's AdminComment (a Slurm
    /// administrator's field), so that a node that has room again resumes the job only once no
    /// other node still needs it suspended. Off: a node's resume resumes the whole job.
    pub holds: bool,
    /// How long a node's hold counts unless its memwatch renews it (it does while it holds the job):
    /// a node that dies holding a job holds it at most this long.
    pub hold_seconds: u64,
    /// This node's Slurm node name, for its hold; empty: the host name up to its first dot (what
    /// slurmd uses unless started with -N or given a NodeHostname).
    pub node_name: String,
}

impl Default for Slurm {
    fn default() -> Self {
        Slurm {
            job_wide_pause: true,
            requeue: true,
            scontrol: "scontrol".into(),
            scancel: "scancel".into(),
            command_timeout_ms: 3000,
            adopt_within_seconds: 600,
            holds: true,
            hold_seconds: 120,
            node_name: String::new(),
        }
    }
}

impl Slurm {
    /// What is wrong with these settings, if anything.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, why: &str| Err((key.to_owned(), why.to_owned()));
        for (key, v) in [
            ("slurm.scontrol", &self.scontrol),
            ("slurm.scancel", &self.scancel),
        ] {
            if v.trim().is_empty() {
                return bad(key, "must name a program");
            }
        }
        if !(100..=60_000).contains(&self.command_timeout_ms) {
            return bad("slurm.command_timeout_ms", "must be between 100 and 60000");
        }
        if self.adopt_within_seconds == 0 {
            return bad("slurm.adopt_within_seconds", "must be at least 1");
        }
        if !(10..=86_400).contains(&self.hold_seconds) {
            return bad("slurm.hold_seconds", "must be between 10 and 86400");
        }
        if !self
            .node_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return bad(
                "slurm.node_name",
                "must be a Slurm node name (letters, digits, '-', '_', '.')",
            );
        }
        Ok(())
    }
}
