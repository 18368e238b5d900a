//! A process of a job pinned by a pidfd (`memwatch::act::pin::pin_members` pins them at each walk of
//! a job's tree), with the count of such descriptors open over every job. A handle and a counter:
//! the pinning and the signals are the host's.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ProcRef;

/// The pinned processes' descriptors open now, over every job (`memwatch::act::pin::pin_limit`
/// bounds them).
static PINNED_OPEN: AtomicUsize = AtomicUsize::new(0);

/// A pinned process's pidfd, counted in [`PINNED_OPEN`] while it is open.
#[derive(Debug)]
struct PinFd(OwnedFd);

impl PinFd {
    fn new(fd: OwnedFd) -> PinFd {
        PINNED_OPEN.fetch_add(1, Ordering::Relaxed);
        PinFd(fd)
    }
}

impl Drop for PinFd {
    fn drop(&mut self) {
        PINNED_OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A process of a job pinned at a walk of its tree: a pidfd opened before its stat was read, so the
/// stat (its parent, its start time) is that of the very process the descriptor holds. A pause
/// signals it through the descriptor at once, before any read.
#[derive(Debug, Clone)]
pub struct Pinned {
    /// The process.
    pub proc: ProcRef,
    /// Its parent at the walk.
    pub parent: u32,
    fd: Arc<PinFd>,
}

impl Pinned {
    /// `proc`, child of `parent`, held by `fd`: a pidfd opened before the read that showed it so.
    pub fn new(proc: ProcRef, parent: u32, fd: OwnedFd) -> Pinned {
        Pinned {
            proc,
            parent,
            fd: Arc::new(PinFd::new(fd)),
        }
    }

    /// Its pidfd.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd.0
    }
}

/// How many pinned processes' descriptors are open now, over every job.
pub fn pinned_open() -> usize {
    PINNED_OPEN.load(Ordering::Relaxed)
}
