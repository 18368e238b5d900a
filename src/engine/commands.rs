//! Control commands, with authorisation: root may act on any process; any other user only on
//! processes whose real uid is theirs. A refusal changes nothing.

use super::Engine;
use crate::control::{Caller, Request, Response};
use crate::job::Job;
use crate::policy::{self, By};
use crate::proc;

impl Engine {
    /// Answers one control request.
    pub fn handle(&mut self, request: Request, caller: Caller, now_ms: u64) -> Response {
        let result = match request {
            Request::Attach { pid, name } => self.attach(pid, name, caller, now_ms),
            Request::Detach { target } => self.detach(&target, caller, now_ms),
            Request::Pause { target } => self.user_pause(&target, caller, now_ms),
            Request::Resume { target } => self.user_resume(&target, caller, now_ms),
            Request::Jobs {} => {
                let jobs = self
                    .jobs
                    .values()
                    .filter(|j| caller.is_root() || j.owner_uid == caller.uid)
                    .map(|j| self.job_view(j))
                    .collect();
                return Response::jobs(jobs);
            }
        };
        match result {
            Ok(name) => match self.jobs.get(&name) {
                Some(j) => Response::job(self.job_view(j)),
                None => Response::jobs(Vec::new()),
            },
            Err(e) => Response::error(e),
        }
    }

    /// The job `target` names (a name or a pid), if the caller may act on it.
    fn find(&self, target: &str, caller: Caller) -> Result<String, String> {
        let job = self
            .jobs
            .values()
            .find(|j| j.name == target || target.parse::<u32>().is_ok_and(|p| p == j.root.pid))
            .ok_or_else(|| format!("no attached job named {target:?} (see `memwatch jobs`)"))?;
        if !caller.is_root() && caller.uid != job.owner_uid {
            return Err(format!(
                "permission denied: job {:?} belongs to uid {}, you are uid {}",
                job.name, job.owner_uid, caller.uid
            ));
        }
        Ok(job.name.clone())
    }

    fn attach(
        &mut self,
        pid: u32,
        name: Option<String>,
        caller: Caller,
        now_ms: u64,
    ) -> Result<String, String> {
        let root = &self.process_root;
        if pid == 0 {
            return Err("pid 0 is not a process".into());
        }
        let stat = proc::read_stat(root, pid).map_err(|_| format!("no process with pid {pid}"))?;
        if stat.is_kernel_thread() {
            return Err(format!(
                "pid {pid} ({}) is a kernel thread, not a job",
                stat.comm
            ));
        }
        if pid == 1 {
            return Err(
                "refusing to attach to pid 1: pausing it would pause the whole system".into(),
            );
        }
        let me = std::process::id();
        if pid == me {
            return Err(format!("pid {pid} is the memwatch daemon itself"));
        }
        // Attaching an ancestor of the daemon would pause the daemon with its tree.
        if proc::descendants(root, pid).is_some_and(|t| t.procs.iter().any(|p| p.pid == me)) {
            return Err(format!(
                "pid {pid} is an ancestor of the memwatch daemon; pausing it would pause memwatch"
            ));
        }
        let status =
            proc::read_status(root, pid).map_err(|e| format!("cannot read pid {pid}: {e}"))?;
        let owner = status.uids[0];
        if !caller.is_root() && caller.uid != owner {
            return Err(format!(
                "permission denied: pid {pid} belongs to uid {owner}, you are uid {}",
                caller.uid
            ));
        }
        if let Some(j) = self.jobs.values().find(|j| j.root.pid == pid) {
            return Err(format!("pid {pid} is already attached as {:?}", j.name));
        }
        let name = name.unwrap_or_else(|| format!("{}-{pid}", stat.comm));
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "job name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
            ));
        }
        if name.parse::<u32>().is_ok() {
            return Err(format!(
                "job name {name:?} must not be a number (numbers name pids)"
            ));
        }
        if self.jobs.contains_key(&name) {
            return Err(format!("a job named {name:?} is already attached"));
        }
        let cg = crate::job::measure::cgroup_of(root, pid);
        let job = Job::new(
            name.clone(),
            stat.proc_ref(),
            owner,
            now_ms,
            cg,
            self.cfg.sampling.growth_window_ms.0,
        );
        self.jobs.insert(name.clone(), job);
        self.save();
        self.record(
            now_ms,
            "attach",
            &name,
            "user",
            format!("pid {pid} by uid {}", caller.uid),
            false,
        );
        Ok(name)
    }

    fn detach(&mut self, target: &str, caller: Caller, now_ms: u64) -> Result<String, String> {
        let name = self.find(target, caller)?;
        self.resume_job(&name);
        self.jobs.remove(&name);
        policy::forget(&mut self.policy, &name);
        self.save();
        self.record(
            now_ms,
            "detach",
            &name,
            "user",
            format!("by uid {}", caller.uid),
            false,
        );
        Ok(name)
    }

    fn user_pause(&mut self, target: &str, caller: Caller, now_ms: u64) -> Result<String, String> {
        let name = self.find(target, caller)?;
        if self.jobs.get(&name).is_some_and(|j| j.pause.is_some()) {
            return Err(format!("job {name:?} is already paused"));
        }
        self.pause_job(&name, By::User, "paused by the user", now_ms)
            .map_err(|e| e.to_string())?;
        policy::user_pause(&mut self.policy, &name, now_ms);
        self.record(
            now_ms,
            "pause",
            &name,
            "user",
            format!("by uid {}", caller.uid),
            self.cfg.policy.dry_run,
        );
        Ok(name)
    }

    fn user_resume(&mut self, target: &str, caller: Caller, now_ms: u64) -> Result<String, String> {
        let name = self.find(target, caller)?;
        if self.jobs.get(&name).is_some_and(|j| j.pause.is_none()) {
            return Err(format!("job {name:?} is not paused"));
        }
        self.resume_job(&name);
        policy::user_resume(&mut self.policy, &name);
        self.record(
            now_ms,
            "resume",
            &name,
            "user",
            format!("by uid {}", caller.uid),
            self.cfg.policy.dry_run,
        );
        Ok(name)
    }
}
