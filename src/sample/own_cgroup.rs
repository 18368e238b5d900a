//! The daemon's own memory cgroup, for the sampler, which reads it on every sample: located once a
//! minute, read each time.

use std::path::{Path, PathBuf};

use super::cgroup::{CgroupDir, CgroupMemory, locate, parse_membership, read_dir};
use super::error::{ReadError, read_text};

/// How long the daemon's own cgroup, once located, is read without locating it again (a daemon is
/// seldom moved; a read that fails locates it again at once).
pub const RELOCATE: std::time::Duration = std::time::Duration::from_secs(60);

/// The memory cgroup of the process that `<root>/proc/self` names, for a sampler that reads it on
/// every sample: located (`/proc/self/cgroup` read and parsed, the mounts looked at) once per
/// [`RELOCATE`] or after a failed read, and read each time.
pub struct Own {
    root: PathBuf,
    /// Where it was found (`Some(None)`: no memory controller), and when.
    located: Option<(Option<CgroupDir>, std::time::Instant)>,
}

impl Own {
    /// Nothing located before the first read.
    pub fn new(root: &Path) -> Self {
        Own {
            root: root.to_owned(),
            located: None,
        }
    }

    /// As [`super::cgroup::read_self`]: `Ok(None)` when there is no memory cgroup.
    pub fn read(&mut self) -> Result<Option<CgroupMemory>, ReadError> {
        let dir = match &self.located {
            Some((dir, at)) if at.elapsed() < RELOCATE => dir,
            _ => {
                let path = self.root.join("proc/self/cgroup");
                let membership = parse_membership(&path, &read_text(&path)?)?;
                let dir = locate(&self.root, &membership);
                &self.located.insert((dir, std::time::Instant::now())).0
            }
        };
        let Some(d) = dir else {
            return Ok(None);
        };
        read_dir(d).map(Some).inspect_err(|_| self.located = None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// The daemon's own cgroup is located once and read each time; a read that fails locates it
    /// again (the daemon was moved), as does the end of [`RELOCATE`].
    #[test]
    fn the_own_cgroup_is_located_once_and_again_after_a_failed_read() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let v2 = "sys/fs/cgroup";
        write(r, &format!("{v2}/cgroup.controllers"), "memory\n");
        write(r, "proc/self/cgroup", "0::/a.service\n");
        write(r, &format!("{v2}/a.service/memory.current"), "4096\n");
        let mut own = Own::new(r);
        let usage = |own: &mut Own| own.read().map(|c| c.map(|c| (c.path, c.usage_bytes)));
        assert_eq!(usage(&mut own).unwrap(), Some(("/a.service".into(), 4096)));
        // Moved: the old place still reads (located once); then it is gone, the read fails and
        // the next read finds the new place.
        write(r, "proc/self/cgroup", "0::/b.service\n");
        write(r, &format!("{v2}/b.service/memory.current"), "8192\n");
        write(r, &format!("{v2}/a.service/memory.current"), "5000\n");
        assert_eq!(usage(&mut own).unwrap(), Some(("/a.service".into(), 5000)));
        std::fs::remove_dir_all(r.join(format!("{v2}/a.service"))).unwrap();
        assert!(usage(&mut own).is_err());
        assert_eq!(usage(&mut own).unwrap(), Some(("/b.service".into(), 8192)));
        // Moved again, found again once RELOCATE has passed.
        write(r, "proc/self/cgroup", "0::/c.service\n");
        write(r, &format!("{v2}/c.service/memory.current"), "1\n");
        if let Some((_, at)) = own.located.as_mut() {
            *at -= RELOCATE;
        }
        assert_eq!(usage(&mut own).unwrap(), Some(("/c.service".into(), 1)));
    }
}
