//! The engine on this machine. The engine itself is memwatch-core's (`memwatch_core::engine`: the
//! owner task's state machine, with no I/O of its own), re-exported here; this opens what it needs
//! of the machine: its host seam ([`RootView`], [`Host`]) and its stores ([`open_stores`]).

use std::sync::Arc;

pub use memwatch_core::engine::*;

use crate::act::driver::Host;
use crate::view::RootView;

/// Opens the engine's stores: starts the writer of `state.json` in `cfg.runtime_dir`; opens
/// `events.jsonl` in `cfg.state_dir` (loading its newest events) and reads there the emergency swap
/// records and the journal of rewrites; reads this node's Slurm name (`[slurm] node_name`, else the
/// host name).
pub fn open_stores(cfg: &Settings) -> Stores {
    Stores::new(
        Box::new(crate::act::persist::StateWriter::new(&cfg.runtime_dir)),
        crate::act::audit::open(&cfg.state_dir, cfg.audit_max_bytes),
        crate::act::slurm::node_name(&cfg.slurm),
        LeftBehind {
            swaps: crate::act::swap::recorded(&cfg.state_dir),
            intents: crate::work::adapt::read_intents(&cfg.state_dir),
        },
    )
}

/// An engine with no jobs on this machine: it reads and acts under `cfg.process_root`, and its
/// stores are opened in `cfg.runtime_dir` and `cfg.state_dir`; `clock_anchor` continues the clock of a daemon that ran
/// before on this boot.
pub fn open(cfg: Settings, clock_anchor: Option<crate::act::persist::ClockAnchor>) -> Engine {
    let host = Arc::new(Host::new(&cfg.process_root));
    let view = Arc::new(RootView::new(&cfg.process_root));
    let stores = open_stores(&cfg);
    Engine::with_host(cfg, clock_anchor, host, view, stores)
}
