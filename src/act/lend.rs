//! Lending memory: raising a job's own cgroup limit for a while, and putting it back. The loan is in the
//! state file before the limit is raised, so a daemon killed at any instant leaves a record that the
//! next one settles. The loan names the cgroup's owner (`CgroupOwner`): a cgroup nobody manages has
//! its limit file written; a systemd unit's limit is changed through its manager (`act::systemd`),
//! which would otherwise write the unit's own `MemoryMax` back over the loan on its next reload.

use super::cgroup_error::CgroupError;
use crate::job::held::CgroupOwner;
use crate::sample::cgroup::Version;
use std::path::{Path, PathBuf};

pub use crate::job::held::Loan;

/// A loan's work on its cgroup (`job::held::Loan`, plain data in memwatch-core): raising the limit,
/// reading the usage, putting the limit back.
pub trait Lending {
    /// Raises the limit, through the cgroup's owner. v1 also needs room under a memory+swap limit,
    /// which is raised first.
    fn raise(&self) -> Result<(), CgroupError>;

    /// The cgroup's usage now; `None` when it is gone.
    fn usage(&self) -> Option<u64>;

    /// Puts the limit back, through the cgroup's owner, only when usage fits under it with `margin`
    /// to spare: lowering a v2 limit below usage makes the kernel reclaim and then OOM-kill.
    /// `Ok(false)`: not yet. A cgroup that is gone counts as settled; but a unit's property outlives
    /// its cgroup (a stopped service keeps it until the next boot), so systemd is told even then,
    /// and only a unit systemd no longer has is settled without it.
    fn restore(&self, margin: u64) -> Result<bool, CgroupError>;
}

impl Lending for Loan {
    fn raise(&self) -> Result<(), CgroupError> {
        if let CgroupOwner::Systemd { bus, unit } = &self.owner {
            return Ok(super::systemd::set_memory_max(*bus, unit, self.raised)?);
        }
        if self.version == Version::V1 {
            let memsw = self.dir.join("memory.memsw.limit_in_bytes");
            if let Some(m) = read_u64(&memsw).filter(|m| *m < self.raised) {
                let extra = self.raised - self.original;
                write(&memsw, m.saturating_add(extra))?;
            }
        }
        write(&limit_file(self), self.raised)
    }

    fn usage(&self) -> Option<u64> {
        read_u64(&usage_file(self))
    }

    fn restore(&self, margin: u64) -> Result<bool, CgroupError> {
        let usage = self.usage();
        if usage.is_some_and(|u| u.saturating_add(margin) > self.original) {
            return Ok(false);
        }
        if let CgroupOwner::Systemd { bus, unit } = &self.owner {
            return match super::systemd::set_memory_max(*bus, unit, self.original) {
                Ok(()) | Err(super::systemd::CallError::NoUnit(_)) => Ok(true),
                Err(e) => Err(e.into()),
            };
        }
        if usage.is_none() {
            return Ok(true);
        }
        write(&limit_file(self), self.original)?;
        if self.version == Version::V1 {
            let memsw = self.dir.join("memory.memsw.limit_in_bytes");
            if let Some(m) = read_u64(&memsw).filter(|m| *m != u64::MAX && *m > self.original) {
                // Lowered by what was added, never below the memory limit.
                let extra = self.raised - self.original;
                let _ = write(&memsw, m.saturating_sub(extra).max(self.original));
            }
        }
        Ok(true)
    }
}

fn limit_file(loan: &Loan) -> PathBuf {
    loan.dir.join(if loan.version == Version::V1 {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    })
}

fn usage_file(loan: &Loan) -> PathBuf {
    loan.dir.join(if loan.version == Version::V1 {
        "memory.usage_in_bytes"
    } else {
        "memory.current"
    })
}

/// A job's own limit, if memwatch can lend to it: the directory's own limit file holds a number (not
/// "max", not inherited from a parent) and the file is writable.
pub fn own_limit(dir: &Path, version: Version) -> Option<u64> {
    let f = dir.join(if version == Version::V1 {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    });
    let v = read_u64(&f)?;
    // v1 reports "no limit" as a huge page-aligned number.
    (v < 1 << 60).then_some(v)
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn write(path: &Path, v: u64) -> Result<(), CgroupError> {
    std::fs::write(path, v.to_string()).map_err(|e| CgroupError::write(path.to_owned(), &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_goes_back_only_when_usage_fits() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("memory.max"), "1000\n").unwrap();
        std::fs::write(d.path().join("memory.current"), "900\n").unwrap();
        assert_eq!(own_limit(d.path(), Version::V2), Some(1000));
        let loan = Loan {
            job: "j".into(),
            dir: d.path().to_owned(),
            version: Version::V2,
            original: 1000,
            raised: 1500,
            owner: CgroupOwner::Cgroupfs,
        };
        loan.raise().unwrap();
        assert_eq!(read_u64(&d.path().join("memory.max")), Some(1500));
        assert_eq!(
            loan.restore(200),
            Ok(false),
            "900 + 200 does not fit in 1000"
        );
        assert_eq!(read_u64(&d.path().join("memory.max")), Some(1500));
        std::fs::write(d.path().join("memory.current"), "700\n").unwrap();
        assert_eq!(loan.restore(200), Ok(true));
        assert_eq!(read_u64(&d.path().join("memory.max")), Some(1000));
        std::fs::write(d.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(own_limit(d.path(), Version::V2), None);
        drop(d);
        assert_eq!(
            loan.restore(0),
            Ok(true),
            "a cgroup that is gone is settled"
        );
    }
}
