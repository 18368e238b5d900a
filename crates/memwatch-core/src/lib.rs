//! memwatch's pure core: the configuration (types, defaults, validation, the documented example), the
//! policy (a pure function from a previous state and an observation to a new state and decisions),
//! the engine (the daemon's owner task as a state machine: inputs in through `handle_*`, effects out
//! through `poll_*`, the host read and acted on through the [`seam`]), the records it keeps (the
//! state file's, the audit log's), growth rates, the typed reasons of events, training-config rewrites
//! planned on text (the file's write is the `memwatch` crate's), and `memwatch check`'s estimates
//! and notes (what it reads of the machine is the `memwatch` crate's).
//!
//! The compiler keeps it pure: this crate depends on no I/O crate (no tokio, nix, rustix, libc,
//! nvml-wrapper or hyper; `tests/imports.rs` in the workspace root checks `cargo tree`), so nothing in
//! it can signal, freeze, spawn or serve. The one file it reads is the configuration file, with `std`,
//! in [`config::load`]. The `memwatch` crate re-exports them where its code names them:
//! `memwatch::check`, `memwatch::config`, `memwatch::engine`, `memwatch::policy`, `memwatch::reason`,
//! `memwatch::rewrite`, `memwatch::job::Growth` and `memwatch::sample::Collector`.

#![warn(missing_docs)]

pub mod adapt;
pub mod advice;
pub mod audit;
pub mod check;
pub mod config;
pub mod control;
pub mod cuda_oom;
pub mod engine;
pub mod expo;
pub mod growth;
pub mod held;
pub mod host;
pub mod human;
pub mod job;
pub mod policy;
pub mod proc;
pub mod reason;
pub mod record;
pub mod rewrite;
pub mod sample;
pub mod seam;
pub mod slurm;
pub mod way_out;
