//! What the engine writes to, opened before it is made: the state file's store, the audit log (its
//! newest events loaded), and this node's name in Slurm's holds; and what a daemon before it left in
//! the state directory besides the state file: the emergency swap it recorded and the journal of
//! config rewrites it was about to make. The `memwatch` crate opens them on the machine
//! (`engine::open_stores`); [`Engine::with_host`](super::Engine::with_host) then does no I/O of its
//! own.

use crate::audit::Audit;
use crate::record::StateStore;

use super::adapt::Intents;

/// The engine's state file store, audit log and node name.
pub struct Stores {
    pub(super) state: Box<dyn StateStore>,
    pub(super) audit: Audit,
    pub(super) slurm_node: String,
    pub(super) left: LeftBehind,
}

/// What an earlier daemon left in the state directory beside its state file, read for
/// [`Engine::recover`](super::Engine::recover).
pub struct LeftBehind {
    /// The emergency swap areas on record.
    pub swaps: Vec<crate::held::Record>,
    /// The config rewrites the journal shows were about to be made.
    pub intents: Intents,
}

impl Stores {
    /// The state file's store, the audit log, this node's Slurm name (`[slurm] node_name`, else the
    /// host name), and what the daemon before left.
    pub fn new(
        state: Box<dyn StateStore>,
        audit: Audit,
        slurm_node: String,
        left: LeftBehind,
    ) -> Stores {
        Stores {
            state,
            audit,
            slurm_node,
            left,
        }
    }
}
