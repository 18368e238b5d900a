//! The simulator's host: a world of processes and cgroups in memory, seen through the engine's
//! `HostView` and changed through its `HostDriver` (a stopped process turns `T`, a frozen cgroup
//! says so), with the state file and the audit log kept in memory too. At the moment of each act it
//! checks what the simulator's invariants need: every freeze and every stop is preceded by its
//! persisted record, and nothing touches a process of a user other than the job's owner.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::adapt::{ConfigFileError, JobConfig};
use crate::audit::{Event, EventSink};
use crate::config::SignalName;
use crate::held::{CgroupOwner, Device, Fired, Frozen, Loan, OomdMark, Slurmctl};
use crate::host::{Errno, Pinned, ProcRef, Version};
use crate::job::origin::Origin;
use crate::proc::{Stat, Status, parse_stat, parse_status};
use crate::record::{Persisted, StateStore};
use crate::sample::cgroup::{CgroupDir, parse_membership};
use crate::sample::error::ReadError;
use crate::seam::{
    CgroupError, HostDriver, HostView, SignalError, SlurmAnswer, SlurmCall, SlurmError,
};
use crate::slurm::JobCgroup;

/// The daemon's own pid, as the view gives it.
pub const DAEMON_PID: u32 = 999_999;

/// One thing the host was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    Signal(u32, SignalName),
    StopTree(u32),
    Continue(Vec<u32>),
    Freeze(PathBuf),
    Thaw(PathBuf),
    Slurm(SlurmCall, String),
    /// A limit raised, and through whom (the loan's recorded owner).
    SetLimit(PathBuf, CgroupOwner),
    /// A limit put back, and through whom.
    RestoreLimit(PathBuf, CgroupOwner),
    OomdMark(PathBuf),
    OomdUnmark(PathBuf),
}

/// What the next acts do wrong.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Writing the freezer file fails.
    pub freeze_fails: bool,
    /// A freeze does not settle at once.
    pub freeze_slow: bool,
    /// Stopping a tree fails (its root is gone).
    pub stop_fails: bool,
    /// Setting a systemd-oomd mark fails (a filesystem without user attributes).
    pub mark_fails: bool,
    /// Writing the state file fails (its directory is gone).
    pub state_fails: bool,
}

/// A process of the world.
#[derive(Debug, Clone)]
struct Proc {
    ppid: u32,
    uid: u32,
    state: char,
    /// Its /proc/PID/cgroup text.
    membership: String,
}

/// A cgroup of the world.
#[derive(Debug, Clone)]
struct Group {
    version: Version,
    procs: Vec<u32>,
    frozen: bool,
    /// Its files, by name, as text.
    files: BTreeMap<String, String>,
}

/// The world and what was done to it.
pub struct FakeHost {
    /// Where its /sys would be: the cgroups' directories are named under it.
    pub root: PathBuf,
    procs: Mutex<BTreeMap<u32, Proc>>,
    groups: Mutex<BTreeMap<PathBuf, Group>>,
    /// Whether the v2 hierarchy accounts memory (`cgroup.controllers` names it).
    v2_memory: Mutex<bool>,
    pub acts: Mutex<Vec<Act>>,
    pub violations: Mutex<Vec<String>>,
    pub faults: Mutex<Faults>,
    /// The cgroups' `user.oomd_omit` values (none where absent).
    pub omit: Mutex<BTreeMap<PathBuf, String>>,
    /// The cgroups memwatch marked and has not yet unmarked.
    pub marks: Mutex<BTreeSet<PathBuf>>,
    /// What the wake thread's reflexes did that the daemon has not yet handed to the engine.
    pub fired: Mutex<Vec<Fired>>,
    /// The state file as last written (`null`: none).
    state: Arc<Mutex<serde_json::Value>>,
    /// The audit log's lines, oldest first.
    events: Arc<Mutex<Vec<Event>>>,
}

impl FakeHost {
    pub fn new(root: &Path) -> Arc<FakeHost> {
        Arc::new(FakeHost {
            root: root.to_owned(),
            procs: Mutex::new(BTreeMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            v2_memory: Mutex::new(false),
            acts: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            faults: Mutex::new(Faults::default()),
            omit: Mutex::new(BTreeMap::new()),
            marks: Mutex::new(BTreeSet::new()),
            fired: Mutex::new(Vec::new()),
            state: Arc::new(Mutex::new(serde_json::Value::Null)),
            events: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// A process `pid`, child of `ppid`, of user `uid`, in the cgroups `membership` names.
    pub fn add_process(&self, pid: u32, ppid: u32, uid: u32, membership: &str) {
        self.procs.lock().unwrap().insert(
            pid,
            Proc {
                ppid,
                uid,
                state: 'S',
                membership: membership.to_owned(),
            },
        );
    }

    /// The process exits (and is reaped).
    pub fn remove_process(&self, pid: u32) {
        self.procs.lock().unwrap().remove(&pid);
    }

    /// A cgroup at `dir` holding `procs`, with `files`.
    pub fn add_cgroup(&self, dir: &Path, version: Version, procs: &[u32], files: &[(&str, &str)]) {
        self.groups.lock().unwrap().insert(
            dir.to_owned(),
            Group {
                version,
                procs: procs.to_vec(),
                frozen: false,
                files: files
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            },
        );
    }

    /// The v2 hierarchy accounts memory (`memory` in its root's `cgroup.controllers`).
    pub fn account_v2_memory(&self) {
        *self.v2_memory.lock().unwrap() = true;
    }

    /// The cgroup at `dir` is frozen (or thawed) behind the engine's back.
    pub fn set_frozen(&self, dir: &Path, frozen: bool) {
        if let Some(g) = self.groups.lock().unwrap().get_mut(dir) {
            g.frozen = frozen;
        }
    }

    /// Whether the cgroup at `dir` is frozen now.
    pub fn frozen(&self, dir: &Path) -> bool {
        self.groups
            .lock()
            .unwrap()
            .get(dir)
            .is_some_and(|g| g.frozen)
    }

    fn act(&self, a: Act) {
        self.acts.lock().unwrap().push(a);
    }

    fn violate(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    pub fn acts(&self) -> Vec<Act> {
        self.acts.lock().unwrap().clone()
    }

    /// The cgroups that carry memwatch's systemd-oomd mark now.
    pub fn marked(&self) -> BTreeSet<PathBuf> {
        self.marks.lock().unwrap().clone()
    }

    /// The `user.oomd_omit` value of a cgroup.
    pub fn omit_of(&self, dir: &Path) -> Option<String> {
        self.omit.lock().unwrap().get(dir).cloned()
    }

    /// The state file as written now (`null`: none).
    pub fn state(&self) -> serde_json::Value {
        self.state.lock().unwrap().clone()
    }

    /// The state file is replaced (by hand, or by another daemon).
    pub fn set_state_file(&self, state: serde_json::Value) {
        *self.state.lock().unwrap() = state;
    }

    /// What a restarted daemon reads of the state file.
    pub fn load_state(&self) -> Option<Persisted> {
        let v = self.state();
        (!v.is_null()).then(|| serde_json::from_value(v).unwrap())
    }

    /// A store that writes this host's state file.
    pub fn store(self: &Arc<Self>) -> Box<dyn StateStore> {
        Box::new(Store {
            host: self.clone(),
            last: None,
        })
    }

    /// A sink that appends to this host's audit log.
    pub fn sink(&self) -> Box<dyn EventSink> {
        Box::new(Sink(self.events.clone()))
    }

    /// The audit log's lines, oldest first.
    pub fn logged(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// The recorded pause whose job has root `pid`, with its owner.
    fn recorded_pause_of_root(&self, pid: u32) -> Option<(serde_json::Value, u32)> {
        let s = self.state();
        s["jobs"].as_array()?.iter().find_map(|j| {
            (j["root"]["pid"] == pid && !j["paused"].is_null()).then(|| {
                (
                    j["paused"].clone(),
                    j["owner_uid"].as_u64().unwrap_or(0) as u32,
                )
            })
        })
    }

    /// The recorded pause that holds cgroup `dir`, with its job's owner.
    fn recorded_pause_of_cgroup(&self, dir: &Path) -> Option<(serde_json::Value, u32)> {
        let s = self.state();
        s["jobs"].as_array()?.iter().find_map(|j| {
            (j["paused"]["hold"]["dir"] == dir.to_str().unwrap_or("")).then(|| {
                (
                    j["paused"].clone(),
                    j["owner_uid"].as_u64().unwrap_or(0) as u32,
                )
            })
        })
    }

    pub fn uid_of(&self, pid: u32) -> Option<u32> {
        self.procs.lock().unwrap().get(&pid).map(|p| p.uid)
    }

    pub fn state_of(&self, pid: u32) -> Option<char> {
        self.procs.lock().unwrap().get(&pid).map(|p| p.state)
    }

    /// Sets a process's state letter.
    pub fn set_state(&self, pid: u32, state: char) {
        if let Some(p) = self.procs.lock().unwrap().get_mut(&pid) {
            p.state = state;
        }
    }

    fn exists(&self, pid: u32) -> bool {
        self.procs.lock().unwrap().contains_key(&pid)
    }

    fn owned_by(&self, pid: u32, owner: u32, what: &str) {
        if owner != 0 && self.uid_of(pid) != Some(owner) {
            self.violate(format!(
                "{what}: pid {pid} belongs to uid {:?}, the job's owner is {owner}",
                self.uid_of(pid)
            ));
        }
    }

    fn children(&self, pid: u32) -> Vec<u32> {
        self.procs
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| p.ppid == pid)
            .map(|(c, _)| *c)
            .collect()
    }

    fn gone(what: &str, pid: u32) -> ReadError {
        ReadError::Io {
            path: PathBuf::from(format!("/proc/{pid}/{what}")),
            source: std::io::ErrorKind::NotFound.into(),
        }
    }

    /// Whether `pid`, in a cgroup but not in the walk's `tree`, descends from one of the tree's
    /// processes (forked after the walk).
    fn forked_from(&self, pid: u32, tree: &[u32]) -> bool {
        let procs = self.procs.lock().unwrap();
        let mut p = pid;
        for _ in 0..32 {
            match procs.get(&p) {
                None => return true,
                Some(proc) if tree.contains(&proc.ppid) => return true,
                Some(proc) if proc.ppid <= 1 => return false,
                Some(proc) => p = proc.ppid,
            }
        }
        false
    }
}

/// The state file's writer: unchanged state is not written again.
struct Store {
    host: Arc<FakeHost>,
    last: Option<serde_json::Value>,
}

impl StateStore for Store {
    fn write(&mut self, state: &Persisted) -> std::io::Result<()> {
        let v = serde_json::to_value(state).map_err(std::io::Error::other)?;
        if self.last.as_ref() == Some(&v) {
            return Ok(());
        }
        if self.host.faults.lock().unwrap().state_fails {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        self.host.set_state_file(v.clone());
        self.last = Some(v);
        Ok(())
    }

    fn invalidate(&mut self) {
        self.last = None;
    }
}

/// The audit log's file.
struct Sink(Arc<Mutex<Vec<Event>>>);

impl EventSink for Sink {
    fn append(&mut self, e: &Event) {
        self.0.lock().unwrap().push(e.clone());
    }
}

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
        Err(SlurmError::Spawn {
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
    ) -> Result<JobConfig, ConfigFileError> {
        Err(ConfigFileError::NotAbsolute(file.to_owned()))
    }
}

impl HostDriver for FakeHost {
    fn pin(&self, target: ProcRef) -> Result<Option<Arc<OwnedFd>>, SignalError> {
        match self.stat(target.pid) {
            Ok(s) if s.start_time == target.start_time => Ok(None),
            _ => Err(SignalError::Gone(target.pid)),
        }
    }

    fn signal(
        &self,
        target: ProcRef,
        _pinned: Option<&OwnedFd>,
        sig: SignalName,
    ) -> Result<(), SignalError> {
        if !self.exists(target.pid) {
            return Err(SignalError::Gone(target.pid));
        }
        self.act(Act::Signal(target.pid, sig));
        match sig {
            SignalName::STOP => self.set_state(target.pid, 'T'),
            SignalName::CONT => self.set_state(target.pid, 'S'),
            _ => {}
        }
        Ok(())
    }

    fn stop_tree(
        &self,
        root: ProcRef,
        _pinned: Option<&OwnedFd>,
        owner: u32,
        _members: &[Pinned],
    ) -> Result<Vec<ProcRef>, SignalError> {
        match self.recorded_pause_of_root(root.pid) {
            None => self.violate(format!(
                "tree of pid {} stopped with no pause recorded",
                root.pid
            )),
            Some((p, _)) if p["hold"]["kind"] != "signals" && p["hold"]["kind"].is_string() => {
                // A fallback: the record names the mechanism that failed until the stop is saved.
            }
            Some(_) => {}
        }
        if self.faults.lock().unwrap().stop_fails {
            return Err(SignalError::Gone(root.pid));
        }
        self.act(Act::StopTree(root.pid));
        let mut out = Vec::new();
        let mut queue = vec![root.pid];
        while let Some(pid) = queue.pop() {
            if owner != 0 && self.uid_of(pid) != Some(owner) {
                // Out of the owner's reach: left running, as the real walk does.
                continue;
            }
            self.owned_by(pid, owner, "stop");
            if let Ok(s) = self.stat(pid) {
                self.set_state(pid, 'T');
                out.push(ProcRef {
                    pid,
                    start_time: s.start_time,
                });
            }
            queue.extend(self.children(pid));
        }
        Ok(out)
    }

    fn continue_tree(&self, stopped: &[ProcRef], _pinned: Option<&OwnedFd>) -> Vec<ProcRef> {
        self.act(Act::Continue(stopped.iter().map(|r| r.pid).collect()));
        let mut gone = Vec::new();
        for r in stopped.iter().rev() {
            if self.exists(r.pid) {
                self.set_state(r.pid, 'S');
            } else {
                gone.push(*r);
            }
        }
        gone
    }

    fn freeze(&self, cgroup: &Frozen) -> std::io::Result<bool> {
        match self.recorded_pause_of_cgroup(&cgroup.dir) {
            None => self.violate(format!(
                "{} frozen with no pause recorded for it",
                cgroup.dir.display()
            )),
            Some((_, owner)) => {
                let mut pids = Vec::new();
                self.pids_below(&cgroup.dir, &mut pids);
                for pid in pids {
                    self.owned_by(pid, owner, "freeze");
                }
            }
        }
        let faults = self.faults.lock().unwrap().clone();
        if faults.freeze_fails {
            return Err(std::io::Error::other(
                "injected: the freezer file cannot be written",
            ));
        }
        self.act(Act::Freeze(cgroup.dir.clone()));
        self.set_frozen(&cgroup.dir, true);
        Ok(!faults.freeze_slow)
    }

    fn thaw(&self, cgroup: &Frozen) -> std::io::Result<()> {
        self.act(Act::Thaw(cgroup.dir.clone()));
        self.set_frozen(&cgroup.dir, false);
        Ok(())
    }

    fn slurm(
        &self,
        _ctl: &Slurmctl,
        call: &SlurmCall,
        id: &str,
    ) -> Result<SlurmAnswer, SlurmError> {
        self.act(Act::Slurm(call.clone(), id.to_owned()));
        Ok(SlurmAnswer::Done)
    }

    fn set_limit(&self, loan: &Loan) -> Result<(), CgroupError> {
        self.act(Act::SetLimit(loan.dir.clone(), loan.owner.clone()));
        Ok(())
    }

    fn restore_limit(&self, loan: &Loan, _margin: u64) -> Result<bool, CgroupError> {
        self.act(Act::RestoreLimit(loan.dir.clone(), loan.owner.clone()));
        Ok(true)
    }

    fn oomd_candidates(&self, cg: &CgroupDir, _owner: u32) -> Vec<OomdMark> {
        vec![OomdMark {
            dir: cg.dir.clone(),
            previous: self.omit_of(&cg.dir),
        }]
    }

    fn oomd_mark(&self, mark: &OomdMark) -> Result<(), CgroupError> {
        // Write-ahead: the mark is in the recorded pause before it is set.
        let recorded = self.state()["jobs"].as_array().is_some_and(|jobs| {
            jobs.iter().any(|j| {
                j["paused"]["oomd_omit"].as_array().is_some_and(|m| {
                    m.iter()
                        .any(|m| m["dir"] == mark.dir.to_str().unwrap_or(""))
                })
            })
        });
        if !recorded {
            self.violate(format!(
                "{} marked for systemd-oomd with no pause recording it",
                mark.dir.display()
            ));
        }
        if self.faults.lock().unwrap().mark_fails {
            // A filesystem without user attributes (EOPNOTSUPP).
            return Err(CgroupError::Xattr {
                dir: mark.dir.clone(),
                attr: "user.oomd_omit=1",
                errno: Errno(95),
            });
        }
        self.act(Act::OomdMark(mark.dir.clone()));
        self.omit
            .lock()
            .unwrap()
            .insert(mark.dir.clone(), "1".into());
        self.marks.lock().unwrap().insert(mark.dir.clone());
        Ok(())
    }

    fn oomd_unmark(&self, mark: &OomdMark) -> Result<(), CgroupError> {
        self.act(Act::OomdUnmark(mark.dir.clone()));
        let mut omit = self.omit.lock().unwrap();
        match &mark.previous {
            Some(v) => omit.insert(mark.dir.clone(), v.clone()),
            None => omit.remove(&mark.dir),
        };
        self.marks.lock().unwrap().remove(&mark.dir);
        Ok(())
    }

    fn fired_reflex(&self, job: &str) -> Option<Fired> {
        let mut fired = self.fired.lock().unwrap();
        let at = fired.iter().position(|f| f.job == job)?;
        Some(fired.remove(at))
    }
}
