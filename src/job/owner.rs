//! Who owns a job's cgroup, on this machine: the reading of its cgroup path is memwatch-core's
//! (`memwatch_core::job::owner`); whether systemd runs here is read from the root.

use super::held::CgroupOwner;
use crate::sample::cgroup::CgroupDir;

pub use memwatch_core::job::owner::of_path;

/// The owner of a job's memory cgroup on the machine under `root`: systemd runs it when
/// `run/systemd/system` is a directory there (`sd_booted`'s test).
pub fn of(root: &std::path::Path, dir: Option<&CgroupDir>) -> CgroupOwner {
    match dir {
        Some(d) => of_path(&d.path, root.join("run/systemd/system").is_dir()),
        None => CgroupOwner::Cgroupfs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::held::Bus;

    /// Where systemd does not run (no `run/systemd/system` under the root), nothing is a unit.
    #[test]
    fn systemd_is_asked_only_where_it_runs() {
        let root = tempfile::tempdir().unwrap();
        let dir = CgroupDir {
            version: crate::sample::cgroup::Version::V2,
            path: "/system.slice/train.service".into(),
            mount: root.path().join("sys/fs/cgroup"),
            dir: root.path().join("sys/fs/cgroup/system.slice/train.service"),
        };
        assert_eq!(of(root.path(), Some(&dir)), CgroupOwner::Cgroupfs);
        std::fs::create_dir_all(root.path().join("run/systemd/system")).unwrap();
        assert_eq!(
            of(root.path(), Some(&dir)),
            CgroupOwner::Systemd {
                bus: Bus::System,
                unit: "train.service".into()
            }
        );
        assert_eq!(of(root.path(), None), CgroupOwner::Cgroupfs);
    }
}
