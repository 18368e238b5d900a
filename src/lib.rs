//! memwatch keeps training jobs alive on machines with too little RAM, swap, GPU memory or cooling.
//!
//! The library holds every part; `src/main.rs` is thin glue over [`cli`].

#![warn(missing_docs)]

pub mod act;
pub mod adapt;
pub mod cli;
pub mod client;
pub mod clock;
pub mod command;
pub mod control;
pub mod daemon;
pub mod delegated;
pub mod engine;
pub mod guardian;
pub mod history;
pub mod http;
pub mod human;
pub mod job;
pub mod logging;
pub mod notify;
pub mod proc;
pub mod reflex;
pub mod rewrite;
pub mod sample;
pub mod sd_notify;
pub mod shared;
pub mod slurm;
#[cfg(test)]
mod test_skip;
pub mod view;
pub mod wake;
pub mod work;

pub use memwatch_core::{advice, check, config, cuda_oom, policy, reason};
