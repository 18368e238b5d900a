//! Work the engine hands off the owner task (`engine::Effect`), carried out on the blocking pool by
//! the daemon's executor: config reads and rewrites (`adapt`), emergency swap (`way_out`).

pub mod adapt;
pub mod way_out;
