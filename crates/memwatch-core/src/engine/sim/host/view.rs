//! What the simulator's host answers the engine's reads: its processes, cgroups and files in memory.

use super::*;

impl HostView for FakeHost {
    fn stat(&self, pid: u32) -> Result<Stat, ReadError> {
        let p = self
            .procs
            .lock()
            .unwrap()
            .get(&pid)
            .cloned()
            .ok_or_else(|| Self::gone("stat", pid))?;
        // As the kernel writes it: the state, the parent, the start time (field 22), RSS.
        let mut fields = vec!["0".to_owned(); 49];
        fields[0] = p.state.to_string();
        fields[1] = p.ppid.to_string();
        fields[19] = (1000 + pid).to_string();
        fields[21] = "2000".into();
        let text = format!("{pid} (sim) {}\n", fields.join(" "));
        parse_stat(Path::new(&format!("/proc/{pid}/stat")), &text)
    }

    fn status(&self, pid: u32) -> Result<Status, ReadError> {
        let uid = self.uid_of(pid).ok_or_else(|| Self::gone("status", pid))?;
        let text = format!("Name:\tsim\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{pid}\n");
        parse_status(Path::new(&format!("/proc/{pid}/status")), &text)
    }

    fn tree(&self, pid: u32) -> Option<Vec<Stat>> {
        let mut out = vec![self.stat(pid).ok()?];
        let mut at = 0;
        while at < out.len() {
            let parent = out[at].pid;
            out.extend(
                self.children(parent)
                    .into_iter()
                    .filter_map(|c| self.stat(c).ok()),
            );
            at += 1;
        }
        Some(out)
    }

    fn cgroup_of(&self, pid: u32) -> (Option<CgroupDir>, Option<Origin>) {
        let Some(text) = self
            .procs
            .lock()
            .unwrap()
            .get(&pid)
            .map(|p| p.membership.clone())
        else {
            return (None, None);
        };
        let Ok(m) = parse_membership(Path::new("/proc/PID/cgroup"), &text) else {
            return (None, None);
        };
        let origin = crate::job::origin::of_membership(&m);
        let v2 = m.v2.as_deref().filter(|p| *p != "/").and_then(|path| {
            let mount = self.root.join("sys/fs/cgroup");
            let dir = mount.join(path.trim_start_matches('/'));
            (*self.v2_memory.lock().unwrap() && self.groups.lock().unwrap().contains_key(&dir))
                .then(|| CgroupDir {
                    version: Version::V2,
                    path: path.to_owned(),
                    mount,
                    dir,
                })
        });
        (v2, origin)
    }

    fn cgroup_owner(&self, dir: Option<&CgroupDir>) -> CgroupOwner {
        match dir {
            Some(d) => crate::job::owner::of_path(&d.path, false),
            None => CgroupOwner::Cgroupfs,
        }
    }

    fn freezer_of(&self, tree: &[u32], owner: u32) -> Option<Frozen> {
        let first = *tree.first()?;
        let text = self.procs.lock().unwrap().get(&first)?.membership.clone();
        let m = parse_membership(Path::new("/proc/PID/cgroup"), &text).ok()?;
        let own = |cg: &Option<String>| {
            cg.as_deref()
                .filter(|cg| *cg != "/")
                .map(|cg| cg.trim_start_matches('/').to_owned())
        };
        let groups = self.groups.lock().unwrap().clone();
        let mut candidates = Vec::new();
        if let Some(rel) = own(&m.v2) {
            let dir = self.root.join("sys/fs/cgroup").join(rel);
            if groups.get(&dir).is_some_and(|g| g.version == Version::V2) {
                candidates.push(Frozen {
                    version: Version::V2,
                    dir,
                });
            }
        }
        if let Some(rel) = own(&m.v1_freezer) {
            let dir = self.root.join("sys/fs/cgroup/freezer").join(rel);
            if groups.get(&dir).is_some_and(|g| g.version == Version::V1) {
                candidates.push(Frozen {
                    version: Version::V1,
                    dir,
                });
            }
        }
        candidates.into_iter().find(|f| {
            let mut pids = Vec::new();
            self.pids_below(&f.dir, &mut pids)
                && !pids.is_empty()
                && pids
                    .iter()
                    .all(|p| tree.contains(p) || self.forked_from(*p, tree))
                && pids.iter().all(|p| self.owner_may_freeze(*p, owner))
        })
    }

    fn pids_below(&self, dir: &Path, out: &mut Vec<u32>) -> bool {
        let groups = self.groups.lock().unwrap();
        if !groups.contains_key(dir) {
            return false;
        }
        for (d, g) in groups.iter() {
            if d.starts_with(dir) {
                out.extend(&g.procs);
            }
        }
        true
    }

    fn has_child_cgroups(&self, dir: &Path) -> bool {
        self.groups
            .lock()
            .unwrap()
            .keys()
            .any(|d| d != dir && d.starts_with(dir))
    }

    fn slurm_job(&self, _id: &str, _node: &str) -> Option<JobCgroup> {
        None
    }

    fn oom_kills(&self, _dir: &CgroupDir) -> Option<u64> {
        None
    }

    fn cgroup_file(&self, dir: &CgroupDir, name: &str) -> Option<String> {
        self.groups
            .lock()
            .unwrap()
            .get(&dir.dir)?
            .files
            .get(name)
            .cloned()
    }

    fn swap_used(&self, _device: &Device) -> Option<u64> {
        None
    }

    fn zram_control(&self) -> bool {
        false
    }

    fn own_pid(&self) -> u32 {
        DAEMON_PID
    }

    fn own_limit(&self, dir: &CgroupDir) -> Option<u64> {
        let file = match dir.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        self.cgroup_file(dir, file)?.trim().parse().ok()
    }

    fn alive(&self, _pidfd: &OwnedFd, pid: u32) -> bool {
        self.exists(pid)
    }

    fn slurm_listpids(&self, _ctl: &Slurmctl, id: &str) -> Result<Vec<u32>, SlurmError> {
        self.listpids
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| SlurmError::Spawn {
                command: format!("scontrol listpids {id}"),
                reason: "no scontrol in the simulator".into(),
            })
    }

    fn open_config(
        &self,
        file: &Path,
        _profile: &str,
        _keys: &[String],
        _owner: u32,
        _within: Option<u32>,
    ) -> Result<JobConfig, ConfigFileError> {
        Err(ConfigFileError::NotAbsolute(file.to_owned()))
    }

    /// Namespace 1 (the daemon's) unless the case put the process in another.
    fn mount_namespace(&self, pid: u32) -> Option<u64> {
        Some(
            self.mount_ns
                .lock()
                .unwrap()
                .get(&pid)
                .copied()
                .unwrap_or(1),
        )
    }
}
