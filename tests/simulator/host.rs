//! The simulator's host: a fixture `/proc` and cgroup tree in a temporary directory, and a
//! `HostDriver` that acts on the fixture alone (a stopped process's stat turns `T`, a frozen cgroup's
//! state file says so) and checks, at the moment of each act, what the simulator's invariants need:
//! every freeze and every stop is preceded by its persisted record, and nothing touches a process
//! of a user other than the job's owner. It never signals a real process.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use memwatch::act::cgroup_error::CgroupError;
use memwatch::act::driver::{HostDriver, SlurmAnswer, SlurmCall};
use memwatch::act::signal::SignalError;
use memwatch::config::SignalName;
use memwatch::job::held::{CgroupOwner, Frozen, Loan, OomdMark, Slurmctl};
use memwatch::proc::ProcRef;
use memwatch::sample::cgroup::CgroupDir;

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
}

/// The fixture and what was done to it.
pub struct FakeHost {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub acts: Mutex<Vec<Act>>,
    pub violations: Mutex<Vec<String>>,
    pub faults: Mutex<Faults>,
    /// The fixture cgroups' `user.oomd_omit` values (none where absent).
    pub omit: Mutex<std::collections::BTreeMap<PathBuf, String>>,
    /// The cgroups memwatch marked and has not yet unmarked.
    pub marks: Mutex<std::collections::BTreeSet<PathBuf>>,
    /// What the wake thread's reflexes did that the daemon has not yet handed to the engine.
    pub fired: Mutex<Vec<memwatch::reflex::Fired>>,
}

impl FakeHost {
    pub fn new(root: &Path, state_dir: &Path) -> Arc<FakeHost> {
        Arc::new(FakeHost {
            root: root.to_owned(),
            state_dir: state_dir.to_owned(),
            acts: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            faults: Mutex::new(Faults::default()),
            omit: Mutex::new(Default::default()),
            marks: Mutex::new(Default::default()),
            fired: Mutex::new(Vec::new()),
        })
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
    pub fn marked(&self) -> std::collections::BTreeSet<PathBuf> {
        self.marks.lock().unwrap().clone()
    }

    /// The `user.oomd_omit` value of a fixture cgroup.
    pub fn omit_of(&self, dir: &Path) -> Option<String> {
        self.omit.lock().unwrap().get(dir).cloned()
    }

    /// The state file as written now.
    pub fn state(&self) -> serde_json::Value {
        std::fs::read(self.state_dir.join("state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null)
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

    fn proc_dir(&self, pid: u32) -> PathBuf {
        self.root.join("proc").join(pid.to_string())
    }

    pub fn uid_of(&self, pid: u32) -> Option<u32> {
        memwatch::proc::read_status(&self.root, pid)
            .ok()
            .map(|s| s.uids[0])
    }

    pub fn state_of(&self, pid: u32) -> Option<char> {
        memwatch::proc::read_stat(&self.root, pid)
            .ok()
            .map(|s| s.state)
    }

    /// Sets a fixture process's state letter.
    pub fn set_state(&self, pid: u32, state: char) {
        let path = self.proc_dir(pid).join("stat");
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Some(close) = text.rfind(')') {
                let mut t = text.clone();
                t.replace_range(close + 2..close + 3, &state.to_string());
                let _ = std::fs::write(&path, t);
            }
        }
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
        let Ok(dir) = std::fs::read_dir(self.root.join("proc")) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| memwatch::proc::read_stat(&self.root, *p).is_ok_and(|s| s.ppid == pid))
            .collect()
    }

    fn freezer_file(f: &Frozen) -> PathBuf {
        match f.version {
            memwatch::sample::cgroup::Version::V1 => f.dir.join("freezer.state"),
            memwatch::sample::cgroup::Version::V2 => f.dir.join("cgroup.freeze"),
        }
    }

    /// Whether the fixture cgroup is frozen now.
    pub fn frozen(&self, dir: &Path) -> bool {
        let v1 = std::fs::read_to_string(dir.join("freezer.state")).unwrap_or_default();
        let v2 = std::fs::read_to_string(dir.join("cgroup.freeze")).unwrap_or_default();
        v1.trim() == "FROZEN" || v2.trim() == "1"
    }
}

impl HostDriver for FakeHost {
    fn pin(&self, target: ProcRef) -> Result<Option<Arc<OwnedFd>>, SignalError> {
        match memwatch::proc::read_stat(&self.root, target.pid) {
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
        if !self.proc_dir(target.pid).is_dir() {
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
        _members: &[memwatch::act::pin::Pinned],
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
            if let Ok(s) = memwatch::proc::read_stat(&self.root, pid) {
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
            if self.proc_dir(r.pid).is_dir() {
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
                for pid in std::fs::read_to_string(cgroup.dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse::<u32>().ok())
                {
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
        let value = match cgroup.version {
            memwatch::sample::cgroup::Version::V1 => "FROZEN",
            memwatch::sample::cgroup::Version::V2 => "1",
        };
        std::fs::write(Self::freezer_file(cgroup), value)?;
        Ok(!faults.freeze_slow)
    }

    fn thaw(&self, cgroup: &Frozen) -> std::io::Result<()> {
        self.act(Act::Thaw(cgroup.dir.clone()));
        let value = match cgroup.version {
            memwatch::sample::cgroup::Version::V1 => "THAWED",
            memwatch::sample::cgroup::Version::V2 => "0",
        };
        std::fs::write(Self::freezer_file(cgroup), value)
    }

    fn slurm(
        &self,
        _ctl: &Slurmctl,
        call: &SlurmCall,
        id: &str,
    ) -> Result<SlurmAnswer, memwatch::act::slurm::SlurmError> {
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
            // A filesystem without user attributes.
            return Err(CgroupError::Xattr {
                dir: mark.dir.clone(),
                attr: "user.oomd_omit=1",
                errno: memwatch::act::cgroup_error::Errno(95),
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

    fn fired_reflex(&self, job: &str) -> Option<memwatch::reflex::Fired> {
        let mut fired = self.fired.lock().unwrap();
        let at = fired.iter().position(|f| f.job == job)?;
        Some(fired.remove(at))
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
}
