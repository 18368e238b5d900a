//! The host seam: what the engine reads of the host ([`HostView`]) and what it does to it
//! ([`HostDriver`]), with their errors, and [`release`], which undoes a pause from its record alone
//! through any driver. The `memwatch` crate implements both on the machine
//! (`view::RootView`, `act::driver::Host`); the engine's simulator (`engine::sim`, a host in
//! memory) answers and records instead.

mod driver;
mod error;
mod view;

pub use crate::host::Errno;
pub use crate::host::{Pinned, pinned_open};
pub use driver::{HostDriver, Released, SlurmAnswer, SlurmCall, release, undo_pause, unmark};
pub use error::{CallError, CgroupError, HOLD_TRIES, SignalError, SlurmError};
pub use view::{HostView, may_signal};
