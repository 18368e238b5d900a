//! Effects: the only code that sends signals or writes memwatch's state files.

pub mod audit;
pub mod freeze;
pub mod lend;
pub mod pause;
pub mod persist;
pub mod recover;
pub mod signal;
pub mod swap;

pub use signal::signal_by_name;
