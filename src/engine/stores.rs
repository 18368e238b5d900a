//! What the engine writes to, opened before it is made: the state file's writer (with its fsync
//! thread), the audit log (its newest events loaded), and this node's name in Slurm's holds. The
//! composition root opens them ([`Stores::open`]); [`Engine::with_host`](super::Engine::with_host)
//! then does no I/O of its own.

use crate::act::audit::Audit;
use crate::act::persist::StateWriter;

use super::Settings;

/// The engine's state file writer, audit log and node name, opened by [`Stores::open`].
pub struct Stores {
    pub(super) state: StateWriter,
    pub(super) audit: Audit,
    pub(super) slurm_node: String,
}

impl Stores {
    /// Starts the writer of `state.json` and opens `events.jsonl` in `cfg.state_dir` (loading its
    /// newest events), and reads this node's name (`[slurm] node_name`, else the host name).
    pub fn open(cfg: &Settings) -> Stores {
        Stores {
            state: StateWriter::new(&cfg.state_dir),
            audit: Audit::open(&cfg.state_dir, cfg.audit_max_bytes),
            slurm_node: crate::act::slurm::node_name(&cfg.slurm),
        }
    }
}
