//! A process of a job pinned by a pidfd (`act::pin::pin_members` pins them at each walk of a job's
//! tree), and the count of such descriptors open: the core's handle (`memwatch_core::host`).

pub use memwatch_core::seam::{Pinned, pinned_open as open_now};
