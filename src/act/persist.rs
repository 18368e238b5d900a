//! Atomic files: the attached jobs and what is paused, so that a daemon that crashed or restarted
//! resumes what its predecessor paused.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::By;
use crate::proc::ProcRef;

/// The state file's name inside `control.state_dir`.
pub const STATE_FILE: &str = "state.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedPause {
    pub since_ms: u64,
    pub by: By,
    pub reason: String,
    /// The processes memwatch stopped, root first.
    pub stopped: Vec<ProcRef>,
    /// The cgroup memwatch froze instead.
    #[serde(default)]
    pub frozen: Option<super::freeze::Frozen>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedJob {
    pub name: String,
    pub root: ProcRef,
    pub owner_uid: u32,
    pub attached_at_ms: u64,
    pub paused: Option<PersistedPause>,
    #[serde(default)]
    pub config: Option<crate::adapt::JobConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub version: u32,
    pub jobs: Vec<PersistedJob>,
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one: a temp file in the
/// same directory, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes the state file. The directory is private (0700): the file holds the jobs' tokens.
pub fn save(dir: &Path, state: &Persisted) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
    write_atomic(&dir.join(STATE_FILE), &bytes)
}

/// Reads the state file; `Ok(None)` when there is none.
pub fn load(dir: &Path) -> Result<Option<Persisted>, String> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let s = Persisted {
            version: 1,
            jobs: vec![PersistedJob {
                name: "t".into(),
                root: ProcRef {
                    pid: 5,
                    start_time: 9,
                },
                owner_uid: 1000,
                attached_at_ms: 1,
                paused: Some(PersistedPause {
                    since_ms: 2,
                    by: By::Policy,
                    reason: "r".into(),
                    stopped: vec![ProcRef {
                        pid: 5,
                        start_time: 9,
                    }],
                    frozen: None,
                }),
                config: None,
            }],
        };
        save(dir.path(), &s).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(s));
        std::fs::write(dir.path().join(STATE_FILE), "{garbage").unwrap();
        assert!(load(dir.path()).unwrap_err().contains("state.json"));
    }
}
