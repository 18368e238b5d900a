//! Swap work run off the owner task: emergency swap made or removed (mkswap, swapon, swapoff:
//! blocking), a held job's memory pushed out to it. The tasks and their outcomes are the engine's data (`engine::WayOutTask`,
//! `engine::WayOutDone`).

use crate::act::swap;
use memwatch_core::engine::{WayOutDone, WayOutTask};

/// Runs a swap task (mkswap, swapon, swapoff: blocking).
pub fn run_way_out_task(t: WayOutTask) -> WayOutDone {
    match t {
        WayOutTask::Make { job, bytes, plan } => {
            let result = swap::make(&plan, &job, bytes);
            WayOutDone::Made { job, result }
        }
        WayOutTask::Reclaim { job, dir, bytes } => {
            let result = crate::act::reclaim::run(&dir, bytes);
            WayOutDone::Reclaimed { job, result }
        }
        WayOutTask::Clear { job, record, plan } => {
            let result = swap::remove(&plan, &record);
            WayOutDone::Cleared {
                job,
                record,
                result,
            }
        }
    }
}
