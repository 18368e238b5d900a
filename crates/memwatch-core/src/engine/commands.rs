//! Control commands, with authorisation: root may act on any process; any other user only on
//! processes whose real uid is theirs. A refusal changes nothing.

use super::Engine;
use crate::audit::{Action, Reason};
use crate::control::{Caller, Refusal, Request, Response};
use crate::job::Job;
use crate::policy;

use super::trainer::Answer;
use super::{OpenedConfig, Prepared};

/// A job's config file asked for at attach, with what the host read of it beforehand.
pub(super) struct ConfigAsk {
    file: std::path::PathBuf,
    profile: String,
    keys: Vec<String>,
    opened: Option<OpenedConfig>,
    within: Option<u32>,
}

impl ConfigAsk {
    /// The config, read with user `owner`'s rights: the host's read where it is this one, else
    /// one made now through `view`.
    fn open(
        self,
        view: &dyn crate::seam::HostView,
        owner: u32,
    ) -> Result<crate::adapt::JobConfig, Refusal> {
        let result = match self.opened {
            Some(o) if o.is(&self.file, &self.profile, &self.keys, owner, self.within) => o.result,
            _ => view.open_config(&self.file, &self.profile, &self.keys, owner, self.within),
        };
        result.map_err(|e| Refusal::invalid(e.to_string()))
    }
}

impl Engine {
    /// Answers one control request, with what the host read for it beforehand (`prepared`, see
    /// [`Read::of`](super::Read::of); a read not handed in is made through the view).
    pub fn handle_command(
        &mut self,
        request: Request,
        caller: Caller,
        prepared: Prepared,
        now_ms: u64,
    ) -> Response {
        let result = match request {
            Request::Attach {
                pid,
                itself,
                name,
                config_file,
                profile,
                keys,
                launch,
            } => {
                let pid = if itself {
                    match self.caller_itself(pid, caller) {
                        Ok(peer) => peer,
                        Err(refusal) => return Response::refused(refusal),
                    }
                } else {
                    pid
                };
                let config = match config_file {
                    Some(file) => Some(ConfigAsk {
                        file,
                        profile: profile.unwrap_or_else(|| super::DEFAULT_PROFILE.into()),
                        keys,
                        opened: prepared.config,
                        within: match super::config_root(self.view.as_ref(), pid, itself, caller) {
                            Ok(w) => w,
                            Err(e) => return Response::refused(Refusal::invalid(e)),
                        },
                    }),
                    None if profile.is_some() || !keys.is_empty() => {
                        return Response::error("--profile and --key need --config-file");
                    }
                    None => None,
                };
                match self.attach_as(pid, name, config, caller, now_ms, None) {
                    Ok(name) => {
                        if let (Some(j), Some(mut l)) = (self.jobs.get_mut(&name), launch) {
                            l.previous.truncate(16);
                            let relaunch = (l.run > 1).then(|| {
                                format!(
                                    "run {} of at most {}: {}",
                                    l.run,
                                    l.max_restarts + 1,
                                    l.previous.last().map_or("", String::as_str)
                                )
                            });
                            j.launch = Some(l);
                            self.save();
                            if let Some(detail) = relaunch {
                                self.record(
                                    now_ms,
                                    Action::Attach,
                                    &name,
                                    Reason::Relaunch,
                                    detail,
                                    false,
                                );
                            }
                        }
                        let mut r = Response::job(self.job_view(&self.jobs[&name]));
                        r.token = self.jobs[&name].config.as_ref().map(|c| c.token.clone());
                        return r;
                    }
                    Err(e) => Err(e),
                }
            }
            Request::Directives {
                target,
                since,
                token,
            } => return self.directives(&target, since, token, caller, now_ms),
            Request::Ack {
                target,
                generation,
                epoch,
                token,
                cannot_apply,
                checkpoint,
            } => {
                if checkpoint {
                    return self.checkpoint_saved(&target, token, caller, now_ms);
                }
                let answer = match cannot_apply {
                    Some(why) => Answer::Declined(why),
                    None => Answer::Applied { epoch },
                };
                return self.answer(&target, generation, answer, token, caller, now_ms);
            }
            Request::Progress {
                target,
                progress,
                token,
            } => return self.progress(&target, progress, token, caller, now_ms),
            Request::Oom { target, oom, token } => {
                return self.cuda_oom(&target, oom, token, caller, now_ms);
            }
            Request::Detach { target } => self.detach(&target, caller, now_ms),
            Request::AttachSlurm { job_id, name } => {
                self.attach_slurm(&job_id, name, caller, prepared.slurm_pids, now_ms)
            }
            Request::DetachSlurm { job_id } => self.detach_slurm(&job_id, caller, now_ms),
            Request::Pause { target } => {
                let r = self.user_pause(&target, caller, now_ms);
                return self.pause_reply(r);
            }
            Request::Resume { target } => {
                let r = self.user_resume(&target, caller, now_ms);
                return self.pause_reply(r);
            }
            Request::Jobs {} => {
                // One rule with HTTP: every user sees every job's summary; its owner and root its
                // details too.
                let jobs = self
                    .jobs
                    .values()
                    .map(|j| {
                        let v = self.job_view(j);
                        if caller.is_root() || j.owner_uid == caller.uid {
                            v
                        } else {
                            v.summary()
                        }
                    })
                    .collect();
                let mut r = Response::jobs(jobs);
                r.ended = Some(
                    self.ended
                        .iter()
                        .filter(|e| caller.is_root() || e.owner_uid == caller.uid)
                        .cloned()
                        .collect(),
                );
                return r;
            }
        };
        match result {
            Ok(name) => match self.jobs.get(&name) {
                Some(j) => Response::job(self.job_view(j)),
                None => Response::jobs(Vec::new()),
            },
            Err(e) => Response::refused(e),
        }
    }

    /// The answer to a pause or resume: the job, and whether it was only a dry run.
    fn pause_reply(&self, result: Result<String, Refusal>) -> Response {
        let mut r = match result {
            Ok(name) => match self.jobs.get(&name) {
                Some(j) => Response::job(self.job_view(j)),
                None => Response::jobs(Vec::new()),
            },
            Err(e) => Response::refused(e),
        };
        r.dry_run = r.ok && self.cfg.policy.dry_run;
        r
    }

    /// The job `target` names (a name or a pid), if the caller may act on it.
    /// The job `target` names (a name or a root pid), if the caller is its owner or root.
    fn find(&self, target: &str, caller: Caller) -> Result<String, Refusal> {
        self.find_authorised(target, None, caller)
    }

    /// The job `target` names, if the caller is its owner (or root) or presents its token.
    pub(super) fn find_authorised(
        &self,
        target: &str,
        token: Option<&str>,
        caller: Caller,
    ) -> Result<String, Refusal> {
        let job = self
            .jobs
            .values()
            .find(|j| j.name == target || target.parse::<u32>().is_ok_and(|p| p == j.root.pid))
            .ok_or_else(|| {
                Refusal::not_found(format!(
                    "no attached job named {target:?} (see `memwatch jobs`)"
                ))
            })?;
        let by_token = match (token, job.config.as_ref()) {
            (Some(t), Some(c)) => crate::adapt::token_matches(&c.token, t),
            _ => false,
        };
        if by_token || caller.is_root() || caller.uid == job.owner_uid {
            Ok(job.name.clone())
        } else {
            Err(Refusal::forbidden(if caller == Caller::ANONYMOUS {
                format!(
                    "permission denied: job {:?} needs its owner or its token",
                    job.name
                )
            } else {
                format!(
                    "permission denied: job {:?} belongs to uid {}, you are uid {}{}",
                    job.name,
                    job.owner_uid,
                    caller.uid,
                    if token.is_some() {
                        " (and the token does not match)"
                    } else {
                        ""
                    }
                )
            }))
        }
    }

    /// Attaches the tree under `pid`; for Slurm job `slurm` when given (an adoption), to which the job
    /// belongs from its first event on.
    /// The pid of a caller attaching itself, who says it is `said` in its own pid namespace: the
    /// socket's peer, where the two agree (`Caller::itself`).
    fn caller_itself(&self, said: u32, caller: Caller) -> Result<u32, Refusal> {
        let nspid = match caller.pid.and_then(|p| u32::try_from(p).ok()) {
            Some(peer) => {
                self.view
                    .status(peer)
                    .map_err(|e| {
                        Refusal::not_found(format!("cannot read the caller, pid {peer}: {e}"))
                    })?
                    .nspid
            }
            None => Vec::new(),
        };
        caller.itself(said, &nspid).map_err(Refusal::invalid)
    }

    pub(super) fn attach_as(
        &mut self,
        pid: u32,
        name: Option<String>,
        config: Option<ConfigAsk>,
        caller: Caller,
        now_ms: u64,
        slurm: Option<&str>,
    ) -> Result<String, Refusal> {
        if pid == 0 {
            return Err(Refusal::invalid("pid 0 is not a process"));
        }
        let stat = self
            .view
            .stat(pid)
            .map_err(|_| Refusal::not_found(format!("no process with pid {pid}")))?;
        if stat.is_kernel_thread() {
            return Err(Refusal::invalid(format!(
                "pid {pid} ({}) is a kernel thread, not a job",
                stat.comm
            )));
        }
        if pid == 1 {
            return Err(Refusal::invalid(
                "refusing to attach to pid 1: pausing it would pause the whole system",
            ));
        }
        let me = self.view.own_pid();
        if pid == me {
            return Err(Refusal::invalid(format!(
                "pid {pid} is the memwatch daemon itself"
            )));
        }
        // Attaching an ancestor of the daemon would pause the daemon with its tree.
        if self
            .view
            .tree(pid)
            .is_some_and(|t| t.iter().any(|p| p.pid == me))
        {
            return Err(Refusal::invalid(format!(
                "pid {pid} is an ancestor of the memwatch daemon; pausing it would pause memwatch"
            )));
        }
        let status = self
            .view
            .status(pid)
            .map_err(|e| Refusal::not_found(format!("cannot read pid {pid}: {e}")))?;
        let owner = status.uids[0];
        if !caller.is_root() && caller.uid != owner {
            return Err(Refusal::forbidden(format!(
                "permission denied: pid {pid} belongs to uid {owner}, you are uid {}",
                caller.uid
            )));
        }
        if let Some(j) = self.jobs.values().find(|j| j.root.pid == pid) {
            return Err(Refusal::conflict(format!(
                "pid {pid} is already attached as {:?}",
                j.name
            )));
        }
        let cap = self.cfg.max_jobs_per_uid;
        if !caller.is_root()
            && self
                .jobs
                .values()
                .filter(|j| j.owner_uid == caller.uid)
                .count()
                >= cap
        {
            return Err(Refusal::limit(format!(
                "uid {} already has {cap} jobs attached (control.max_jobs_per_uid); detach one first",
                caller.uid
            )));
        }
        // Unnamed: after its container or Slurm job, if it has one ("slurm-4242",
        // "docker-3f2a1b9c0d1e"), else after its command; with the pid if that name is taken.
        let (cg, origin) = self.view.cgroup_of(pid);
        let name = name.unwrap_or_else(|| match &origin {
            Some(o) if !self.jobs.contains_key(&o.short()) => o.short(),
            Some(o) => format!("{}-{pid}", o.short()),
            None => format!("{}-{pid}", stat.comm),
        });
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Refusal::invalid(format!(
                "job name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        if name.parse::<u32>().is_ok() {
            return Err(Refusal::invalid(format!(
                "job name {name:?} must not be a number (numbers name pids)"
            )));
        }
        if self.jobs.contains_key(&name) {
            return Err(Refusal::conflict(format!(
                "a job named {name:?} is already attached"
            )));
        }
        let job_config = match config {
            Some(ask) => Some(ask.open(self.view.as_ref(), owner)?),
            None => None,
        };
        let mut job = Job::new(
            name.clone(),
            stat.proc_ref(),
            owner,
            now_ms,
            cg,
            self.cfg.sampling.growth_window_ms.0,
        );
        job.origin = origin;
        job.cgroup_owner = self.view.cgroup_owner(job.cgroup_dir.as_ref());
        job.config = job_config.map(|mut c| {
            c.self_attached = caller.pid.is_some_and(|p| i64::from(p) == i64::from(pid));
            c
        });
        // From here on the root is signalled only through this descriptor.
        job.pidfd = self
            .host
            .pin(stat.proc_ref())
            .map_err(|_| Refusal::not_found(format!("no process with pid {pid}")))?;
        job.freezer = self.freezer_of(stat.proc_ref(), owner);
        job.slurm = slurm.map(str::to_owned);
        self.jobs.insert(name.clone(), job);
        self.save();
        let (reason, detail) = match slurm {
            Some(id) => (
                Reason::Slurm,
                format!("Slurm job {id}: its first task here, pid {pid}"),
            ),
            None => (Reason::User, format!("pid {pid} by uid {}", caller.uid)),
        };
        self.record(now_ms, Action::Attach, &name, reason, detail, false);
        Ok(name)
    }

    pub(super) fn detach(
        &mut self,
        target: &str,
        caller: Caller,
        now_ms: u64,
    ) -> Result<String, Refusal> {
        let name = self.find(target, caller)?;
        self.resume_job(&name);
        self.jobs.remove(&name);
        policy::forget(&mut self.policy, &name);
        self.save();
        self.record(
            now_ms,
            Action::Detach,
            &name,
            Reason::User,
            format!("by uid {}", caller.uid),
            false,
        );
        Ok(name)
    }

    fn user_pause(&mut self, target: &str, caller: Caller, now_ms: u64) -> Result<String, Refusal> {
        let name = self.find(target, caller)?;
        if self.jobs.get(&name).is_some_and(|j| j.pause.is_some()) {
            return Err(Refusal::conflict(format!("job {name:?} is already paused")));
        }
        let state = policy::user_pause(&mut self.policy, &name, now_ms);
        self.pause_job(&name, state, "paused by the user", now_ms)
            .map_err(|e| Refusal::failed(e.to_string()))?;
        self.record(
            now_ms,
            Action::Pause,
            &name,
            Reason::User,
            format!("by uid {}", caller.uid),
            self.cfg.policy.dry_run,
        );
        Ok(name)
    }

    fn user_resume(
        &mut self,
        target: &str,
        caller: Caller,
        now_ms: u64,
    ) -> Result<String, Refusal> {
        let name = self.find(target, caller)?;
        if self.jobs.get(&name).is_some_and(|j| j.pause.is_none()) {
            return Err(Refusal::conflict(format!("job {name:?} is not paused")));
        }
        self.resume_job(&name);
        policy::user_resume(&mut self.policy, &name);
        self.record(
            now_ms,
            Action::Resume,
            &name,
            Reason::User,
            format!("by uid {}", caller.uid),
            self.cfg.policy.dry_run,
        );
        Ok(name)
    }
}
