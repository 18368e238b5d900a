//! The control socket's messages: `attach`, `detach`, `pause`, `resume`, `jobs`, and the trainer's
//! `directives`, `ack`, `progress` and `oom`. One JSON object
//! per line each way (a wire format). The daemon takes the caller's uid from the socket
//! (SO_PEERCRED), never from the message; the socket is the `memwatch` crate's (`control`).

use serde::{Deserialize, Serialize};

use crate::adapt::{Directive, Progress};
use crate::job::JobView;

/// The longest request line accepted.
pub const MAX_LINE: usize = 64 * 1024;

/// A command sent to the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Follow a process tree as a job (`memwatch attach PID`).
    Attach {
        /// The tree's root; with `self`, the caller's own pid as it sees it (in a container, its
        /// pid namespace's).
        pid: u32,
        /// The process sending the request attaches itself: the daemon takes its pid from the
        /// socket (SO_PEERCRED, which the kernel gives in the daemon's pid namespace), and `pid`,
        /// which must be the peer's pid in its own namespace, is only a check (`Caller::itself`).
        #[serde(default, rename = "self", skip_serializing_if = "std::ops::Not::not")]
        itself: bool,
        /// The job's name (default: the root's command name).
        #[serde(default)]
        name: Option<String>,
        /// The job's training config, to be rewritten at epoch boundaries.
        #[serde(default)]
        config_file: Option<std::path::PathBuf>,
        /// deepspeed, hf, accelerate or generic.
        #[serde(default)]
        profile: Option<String>,
        /// KNOB=dotted.path overrides (all of them for the generic profile).
        #[serde(default)]
        keys: Vec<String>,
        /// Set by `memwatch launch`: which run this is, and how the earlier ones ended.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        launch: Option<crate::job::Launched>,
    },
    /// `target` is a job name or a pid.
    Detach {
        /// The job to detach.
        target: String,
    },
    /// A Slurm job by id: every task of it on this node, from its job cgroup (root may attach one
    /// before its first task starts here: a prolog).
    #[serde(rename = "attach_slurm")]
    AttachSlurm {
        /// The Slurm job's id.
        job_id: String,
        /// The job's name (default: `slurm-ID`).
        #[serde(default)]
        name: Option<String>,
    },
    /// Detaches the job that belongs to a Slurm job (the epilog), or stops waiting for it.
    #[serde(rename = "detach_slurm")]
    DetachSlurm {
        /// The Slurm job's id.
        job_id: String,
    },
    /// Pause a job (`memwatch pause`).
    Pause {
        /// A job name or a pid.
        target: String,
    },
    /// Resume a job (`memwatch resume`).
    Resume {
        /// A job name or a pid.
        target: String,
    },
    /// A struct variant, so that extra fields (a claimed `uid`, say) are rejected.
    Jobs {},
    /// Directives newer than `since` (the trainer, at an epoch boundary).
    Directives {
        /// A job name or a pid.
        target: String,
        /// The newest generation the trainer has.
        #[serde(default)]
        since: u64,
        /// The job's token, for a caller that is not its owner.
        #[serde(default)]
        token: Option<String>,
    },
    /// The trainer applied everything up to `generation` at `epoch`; or, with `cannot_apply`, it
    /// cannot apply those changes, and why.
    Ack {
        /// A job name or a pid.
        target: String,
        /// Every directive up to this one is applied.
        #[serde(default)]
        generation: u64,
        /// The epoch it was applied at.
        #[serde(default)]
        epoch: u64,
        /// The checkpoint memwatch asked for is saved.
        #[serde(default)]
        checkpoint: bool,
        /// The job's token, for a caller that is not its owner.
        #[serde(default)]
        token: Option<String>,
        /// Why the trainer cannot apply the changes.
        #[serde(default)]
        cannot_apply: Option<String>,
    },
    /// A CUDA out-of-memory error inside a training step, and what the trainer did about it
    /// (docs/protocol.md, "CUDA OOM reports").
    Oom {
        /// A job name or a pid.
        target: String,
        /// What the trainer reports.
        oom: crate::cuda_oom::OomReport,
        /// The job's token, for a caller that is not its owner.
        #[serde(default)]
        token: Option<String>,
    },
    /// The trainer's progress.
    Progress {
        /// A job name or a pid.
        target: String,
        /// What the trainer reports.
        progress: Progress,
        /// The job's token, for a caller that is not its owner.
        #[serde(default)]
        token: Option<String>,
    },
}

/// What a trainer gets at an epoch boundary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectivesReply {
    /// The newest generation staged.
    pub generation: u64,
    /// Directives newer than the `since` asked for, oldest first.
    pub directives: Vec<Directive>,
    /// The knobs as the file holds them now, by knob name.
    pub knobs: std::collections::BTreeMap<String, crate::rewrite::Scalar>,
    /// memwatch asks for a checkpoint now (then stops the job cleanly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<crate::adapt::CheckpointRequest>,
}

/// What kind of refusal an answer is, so that whoever asked (the trainer's HTTP endpoints, `memwatch
/// launch`) can act on it without reading the message, which is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed, or asks for something that cannot be (pid 0, a bad name, a
    /// generation never staged).
    Invalid,
    /// No attached job (or Slurm job, or process) by that name, pid or id.
    NotFound,
    /// The caller is neither the job's owner nor root, and does not hold its token.
    Forbidden,
    /// The job is already in the state asked for, or the name or pid is taken.
    Conflict,
    /// A bound was reached (jobs per user).
    Limit,
    /// memwatch tried and the effect failed (a signal, a freeze, Slurm).
    Failed,
    /// The daemon cannot answer now: it is shutting down.
    Unavailable,
}

/// A refused command: its kind, and what people are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What kind of refusal it is.
    pub kind: ErrorKind,
    /// The reason, in words.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Refusal {
            kind,
            message: message.into(),
        }
    }
    /// [`ErrorKind::Invalid`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Refusal::new(ErrorKind::Invalid, message)
    }
    /// [`ErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> Self {
        Refusal::new(ErrorKind::NotFound, message)
    }
    /// [`ErrorKind::Forbidden`].
    pub fn forbidden(message: impl Into<String>) -> Self {
        Refusal::new(ErrorKind::Forbidden, message)
    }
    /// [`ErrorKind::Conflict`].
    pub fn conflict(message: impl Into<String>) -> Self {
        Refusal::new(ErrorKind::Conflict, message)
    }
    /// [`ErrorKind::Limit`].
    pub fn limit(message: impl Into<String>) -> Self {
        Refusal::new(ErrorKind::Limit, message)
    }
    /// [`ErrorKind::Failed`].
    pub fn failed(message: impl Into<String>) -> Self {
        Refusal::new(ErrorKind::Failed, message)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `error`: what kind of refusal it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
    /// The job the request concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobView>,
    /// With `jobs`: every job the caller may see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<Vec<JobView>>,
    /// With `jobs`: the caller's jobs that ended recently, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Vec<crate::job::EndedJob>>,
    /// Given once, to the caller that attached a job with a config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// With `directives`: what the trainer is to apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directives: Option<DirectivesReply>,
    /// The daemon runs in dry-run mode: a pause or resume was recorded, not carried out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl Response {
    fn empty(ok: bool) -> Self {
        Response {
            ok,
            error: None,
            kind: None,
            job: None,
            jobs: None,
            ended: None,
            token: None,
            directives: None,
            dry_run: false,
        }
    }
    /// A refusal of a request that is malformed or cannot be ([`ErrorKind::Invalid`]).
    pub fn error(message: impl Into<String>) -> Self {
        Response::refused(Refusal::invalid(message))
    }
    /// A refusal, with its kind.
    pub fn refused(r: Refusal) -> Self {
        Response {
            error: Some(r.message),
            kind: Some(r.kind),
            ..Response::empty(false)
        }
    }
    /// The refusal this answer is, if it is one (an answer without a kind, from an older daemon,
    /// counts as invalid).
    pub fn refusal(&self) -> Option<Refusal> {
        (!self.ok).then(|| {
            Refusal::new(
                self.kind.unwrap_or(ErrorKind::Invalid),
                self.error
                    .clone()
                    .unwrap_or_else(|| "the daemon refused without a reason".into()),
            )
        })
    }
    /// Success, with nothing more to say.
    pub fn ok() -> Self {
        Response::empty(true)
    }
    /// Success, naming the job.
    pub fn job(job: JobView) -> Self {
        Response {
            job: Some(job),
            ..Response::empty(true)
        }
    }
    /// Success, listing jobs.
    pub fn jobs(jobs: Vec<JobView>) -> Self {
        Response {
            jobs: Some(jobs),
            ..Response::empty(true)
        }
    }
}

/// Who is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The caller's uid (SO_PEERCRED, never what it claims).
    pub uid: u32,
    /// The caller's pid, where the kernel says.
    pub pid: Option<i32>,
}

impl Caller {
    /// Root may act on every job.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// The pid of a caller that attaches itself and says it is `said`: the socket's peer, where
    /// `said` is the peer's pid in its innermost pid namespace, the last of `nspid` (the peer's
    /// `NSpid`, outermost first; without one, the kernel has a single namespace and the pids must
    /// be the same). A client in a container knows only its namespace's pid; the socket's is the
    /// daemon's.
    pub fn itself(&self, said: u32, nspid: &[u32]) -> Result<u32, String> {
        let peer = self
            .pid
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or("the socket does not say which process sent this request: attach by pid")?;
        let inner = nspid.last().copied().unwrap_or(peer);
        if inner != said {
            return Err(format!(
                "the caller says it is pid {said}, but the socket's peer is pid {peer} here and pid \
                 {inner} in its own pid namespace: a process may attach only itself this way"
            ));
        }
        Ok(peer)
    }
    /// An HTTP caller: no uid known, so only a job's token can authorise it.
    pub const ANONYMOUS: Caller = Caller {
        uid: u32::MAX,
        pid: None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process attaching itself is the socket's peer, where the pid it says is the peer's in its
    /// own namespace; anything else is refused, naming both.
    #[test]
    fn a_caller_attaching_itself_is_the_sockets_peer_where_the_pids_agree() {
        let peer = Caller {
            uid: 1000,
            pid: Some(81234),
        };
        // In a container: the host's pid, then the container's.
        assert_eq!(peer.itself(7, &[81234, 7]), Ok(81234));
        // No pid namespace of its own (or no NSpid line): the same pid.
        assert_eq!(peer.itself(81234, &[81234]), Ok(81234));
        assert_eq!(peer.itself(81234, &[]), Ok(81234));
        let lie = peer.itself(8, &[81234, 7]).unwrap_err();
        assert!(
            lie.contains("says it is pid 8") && lie.contains("peer is pid 81234 here and pid 7"),
            "{lie}"
        );
        assert!(Caller::ANONYMOUS.itself(7, &[]).is_err());
        let wire: Request =
            serde_json::from_str(r#"{"cmd": "attach", "pid": 7, "self": true}"#).unwrap();
        assert!(matches!(
            wire,
            Request::Attach {
                pid: 7,
                itself: true,
                ..
            }
        ));
        let plain: Request = serde_json::from_str(r#"{"cmd": "attach", "pid": 7}"#).unwrap();
        assert!(matches!(plain, Request::Attach { itself: false, .. }));
        assert!(!serde_json::to_string(&plain).unwrap().contains("self"));
    }
}
