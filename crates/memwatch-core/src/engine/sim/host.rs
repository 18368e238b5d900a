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
use crate::held::{CgroupOwner, Device, Fired, Frozen, Loan, OomdMark, ReflexPlan, Slurmctl};
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

mod driver;
mod view;

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
    /// A job's reflex handed to the wake thread by the engine itself (a resume).
    ArmReflex(String),
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
    /// Processes in a mount namespace of their own (a container's), by pid; every other one is in
    /// namespace 1, the daemon's.
    pub mount_ns: Mutex<BTreeMap<u32, u64>>,
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
    /// What `scontrol listpids` prints for the Slurm job, as pids (`None`: no scontrol).
    pub listpids: Mutex<Option<Vec<u32>>>,
    /// The state file as it was at each tree's stop, by the tree's top: what a daemon killed right
    /// after that stop leaves.
    pub state_at_stop: Mutex<Vec<(u32, serde_json::Value)>>,
    /// A process born as the state file is next written: a task started between a write and what
    /// follows it.
    pub born_at_state_write: Mutex<Option<Birth>>,
}

/// A process to be born: its pid, its parent, its uid, its /proc/PID/cgroup text, the cgroup it
/// joins.
pub struct Birth {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    pub membership: String,
    pub cgroup: PathBuf,
}

impl FakeHost {
    pub fn new(root: &Path) -> Arc<FakeHost> {
        Arc::new(FakeHost {
            root: root.to_owned(),
            procs: Mutex::new(BTreeMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            v2_memory: Mutex::new(false),
            mount_ns: Mutex::new(BTreeMap::new()),
            acts: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            faults: Mutex::new(Faults::default()),
            omit: Mutex::new(BTreeMap::new()),
            marks: Mutex::new(BTreeSet::new()),
            fired: Mutex::new(Vec::new()),
            state: Arc::new(Mutex::new(serde_json::Value::Null)),
            events: Arc::new(Mutex::new(Vec::new())),
            listpids: Mutex::new(None),
            state_at_stop: Mutex::new(Vec::new()),
            born_at_state_write: Mutex::new(None),
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

    /// The cgroup at `dir`'s file `name` says `text` now.
    pub fn set_cgroup_file(&self, dir: &Path, name: &str, text: &str) {
        if let Some(g) = self.groups.lock().unwrap().get_mut(dir) {
            g.files.insert(name.to_owned(), text.to_owned());
        }
    }

    /// Process `pid` joins the cgroup at `dir`.
    pub fn join_cgroup(&self, dir: &Path, pid: u32) {
        if let Some(g) = self.groups.lock().unwrap().get_mut(dir) {
            g.procs.push(pid);
        }
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

    /// A recorded pause that names `pid` among what it stopped (or is about to: recorded ahead).
    fn recorded_pause_naming(&self, pid: u32) -> Option<serde_json::Value> {
        let s = self.state();
        s["jobs"].as_array()?.iter().find_map(|j| {
            let named = j["paused"]["stopped"]
                .as_array()
                .is_some_and(|st| st.iter().any(|r| r["pid"] == pid));
            named.then(|| j["paused"].clone())
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
        let born = self.host.born_at_state_write.lock().unwrap().take();
        if let Some(b) = born {
            self.host.add_process(b.pid, b.ppid, b.uid, &b.membership);
            self.host.join_cgroup(&b.cgroup, b.pid);
        }
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
