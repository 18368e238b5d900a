//! Effects: signals (and Slurm's, through scontrol), freezes, emergency swap, lent limits (through
//! systemd for a unit's cgroup, `systemd.rs`), the state file, the state lock, the audit log, and
//! recovery of a predecessor's pauses. The engine decides; this carries out.

pub mod audit;
pub mod cgroup_error;
pub mod driver;
pub mod freeze;
pub mod lend;
pub mod oomd;
pub mod pause;
pub mod pause_record;
pub mod persist;
pub mod recover;
pub mod signal;
pub mod slurm;
pub mod slurm_holds;
pub mod swap;
pub mod systemd;

pub use signal::signal_by_name;
