//! The simulator's host carrying out the engine's acts: each recorded, checked against the state
//! file and the owner's reach at the moment it happens, and faultable.

use super::*;

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
        self.state_at_stop
            .lock()
            .unwrap()
            .push((root.pid, self.state()));
        match self
            .recorded_pause_of_root(root.pid)
            .or_else(|| self.recorded_pause_naming(root.pid).map(|p| (p, owner)))
        {
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

    fn freeze(&self, cgroup: &Frozen) -> Result<bool, CgroupError> {
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
            // Injected: the freezer's file cannot be written (EACCES).
            return Err(CgroupError::Write {
                path: cgroup.dir.join("cgroup.freeze"),
                errno: Errno(13),
            });
        }
        self.act(Act::Freeze(cgroup.dir.clone()));
        self.set_frozen(&cgroup.dir, true);
        Ok(!faults.freeze_slow)
    }

    fn thaw(&self, cgroup: &Frozen) -> Result<(), CgroupError> {
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

    fn arm_reflex(&self, job: &str, _memory: &CgroupDir, _plan: &ReflexPlan) -> bool {
        let state = self.state();
        let recorded = state["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["name"] == job))
            .is_some_and(|j| j["paused"]["phase"] == "armed");
        if !recorded {
            self.violate(format!(
                "{job}'s reflex handed over with no armed record: {state}"
            ));
        }
        self.act(Act::ArmReflex(job.to_owned()));
        true
    }
}
