//! The cgroup a launched job runs in: one of its own (v2, or v1 memory + freezer), or inside a Slurm
//! allocation, the Slurm job's own.

use super::error::LaunchError;
use crate::sample::cgroup::Version;
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The job's cgroup: one directory on v2, or a memory and a freezer directory on v1. Removed on drop
/// (once empty).
pub(super) struct JobCgroup {
    dirs: Vec<PathBuf>,
    /// Where the OOM kills are counted.
    events: PathBuf,
    v2: bool,
    /// Made by memwatch (removed on drop, with its `memwatch` parent once that is empty), not by
    /// systemd or Slurm.
    owned: bool,
}

impl JobCgroup {
    /// Inside a Slurm allocation the job stays in Slurm's cgroup, under the limit Slurm set (`--mem`):
    /// a cgroup of its own would take it out of Slurm's accounting. memwatch knows it as part of the
    /// Slurm job (its origin), so a pause suspends the whole job through Slurm and the way out
    /// requeues it.
    pub(super) fn in_slurm_job(id: &str, memory_max: bool) -> Result<JobCgroup, LaunchError> {
        if memory_max {
            return Err(LaunchError::MemoryMaxInSlurm(id.to_owned()));
        }
        let job = crate::slurm::find_job(Path::new("/"), id)
            .ok_or_else(|| LaunchError::NoSlurmCgroup(id.to_owned()))?;
        Ok(JobCgroup {
            events: job.memory.dir.join(if job.memory.version == Version::V1 {
                "memory.oom_control"
            } else {
                "memory.events"
            }),
            dirs: Vec::new(),
            v2: job.memory.version == Version::V2,
            owned: false,
        })
    }

    /// A systemd scope's cgroup: systemd removes it when the job ends.
    pub(super) fn of_scope(dir: PathBuf) -> JobCgroup {
        JobCgroup {
            events: dir.join("memory.events"),
            dirs: vec![dir],
            v2: true,
            owned: false,
        }
    }

    pub(super) fn create(name: &str, memory_max: Option<u64>) -> Result<JobCgroup, LaunchError> {
        let leaf = format!("{name}-{}", std::process::id());
        let fs = Path::new("/sys/fs/cgroup");
        let v2_root = [fs.join("unified"), fs.to_owned()].into_iter().find(|d| {
            std::fs::read_to_string(d.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        });
        let make = |dir: &Path| {
            std::fs::create_dir_all(dir).map_err(|source| LaunchError::CreateCgroup {
                dir: dir.to_owned(),
                source,
            })
        };
        let cg = if let Some(root) = v2_root {
            let parent = root.join("memwatch");
            make(&parent)?;
            // Children of memwatch/ may use the memory controller.
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
            let dir = parent.join(&leaf);
            make(&dir)?;
            JobCgroup {
                events: dir.join("memory.events"),
                dirs: vec![dir],
                v2: true,
                owned: true,
            }
        } else if fs.join("memory/memory.limit_in_bytes").exists() {
            let memory = fs.join("memory/memwatch").join(&leaf);
            make(&memory)?;
            let mut dirs = vec![memory.clone()];
            let freezer = fs.join("freezer/memwatch").join(&leaf);
            if fs.join("freezer").is_dir() && make(&freezer).is_ok() {
                dirs.push(freezer);
            }
            JobCgroup {
                events: memory.join("memory.oom_control"),
                dirs,
                v2: false,
                owned: true,
            }
        } else {
            return Err(LaunchError::NoMemoryController);
        };
        if let Some(bytes) = memory_max {
            let (file, dir) = if cg.v2 {
                ("memory.max", &cg.dirs[0])
            } else {
                ("memory.limit_in_bytes", &cg.dirs[0])
            };
            std::fs::write(dir.join(file), bytes.to_string()).map_err(|source| {
                LaunchError::SetLimit {
                    file: dir.join(file),
                    source,
                }
            })?;
        }
        Ok(cg)
    }

    pub(super) fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills whatever is left in the cgroup (workers a stopped job left behind).
    pub(super) fn kill_all(&self) {
        for _ in 0..50 {
            let pids: Vec<i32> = self
                .dirs
                .iter()
                .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
                .flat_map(|t| {
                    t.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect::<Vec<i32>>()
                })
                .collect();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The `cgroup.procs` files the child writes itself into.
    pub(super) fn procs_files(&self) -> Result<Vec<CString>, LaunchError> {
        self.dirs
            .iter()
            .map(|d| {
                CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes())
                    .map_err(|_| LaunchError::NulByte(d.display().to_string()))
            })
            .collect()
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        self.kill_all();
        if !self.owned {
            return;
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
            // The `memwatch` directory above it, once no other launch uses it.
            if let Some(parent) = d.parent().filter(|p| p.ends_with("memwatch")) {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}
