//! What the engine writes to, opened before it is made: the state file's writer (with its fsync
//! thread), the audit log (its newest events loaded), and this node's name in Slurm's holds; and
//! what a daemon before it left in the state directory besides the state file: the emergency swap
//! it recorded and the journal of config rewrites it was about to make. The composition root opens
//! them ([`Stores::open`]); [`Engine::with_host`](super::Engine::with_host) then does no I/O of its
//! own.

use crate::act::audit::Audit;
use crate::act::persist::StateWriter;

use super::Settings;
use super::adapt::Intents;

/// The engine's state file writer, audit log and node name, opened by [`Stores::open`].
pub struct Stores {
    pub(super) state: StateWriter,
    pub(super) audit: Audit,
    pub(super) slurm_node: String,
    pub(super) left: LeftBehind,
}

/// What an earlier daemon left in the state directory beside its state file, read for
/// [`Engine::recover`](super::Engine::recover).
pub(super) struct LeftBehind {
    /// The emergency swap areas on record.
    pub(super) swaps: Vec<crate::act::swap::Record>,
    /// The config rewrites the journal shows were about to be made.
    pub(super) intents: Intents,
}

impl Stores {
    /// Starts the writer of `state.json` and opens `events.jsonl` in `cfg.state_dir` (loading its
    /// newest events), reads this node's name (`[slurm] node_name`, else the host name), the swap
    /// records and the journal of rewrites.
    pub fn open(cfg: &Settings) -> Stores {
        Stores {
            state: StateWriter::new(&cfg.state_dir),
            audit: crate::act::audit::open(&cfg.state_dir, cfg.audit_max_bytes),
            slurm_node: crate::act::slurm::node_name(&cfg.slurm),
            left: LeftBehind {
                swaps: crate::act::swap::recorded(&cfg.state_dir),
                intents: Intents::read(&cfg.state_dir.join(super::adapt::JOURNAL)),
            },
        }
    }
}
