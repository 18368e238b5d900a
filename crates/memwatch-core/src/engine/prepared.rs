//! Reads a control request needs from the host, made before the engine takes the request and off
//! the task that runs the engine: a job's config file (a user's file, read with its owner's rights,
//! which may sit on a slow disk) and Slurm's list of a job's pids on this node (`scontrol
//! listpids`, a process that may take its whole timeout). The engine says what a request needs
//! ([`Read::of`]); the host makes the read and hands it in with the request ([`Prepared`]). The
//! engine takes a read only where it is the one it would make itself (the same file, profile, keys
//! and owner; the same Slurm job) and makes its own through its `HostView` otherwise, as a test's
//! engine does when handed nothing.

use std::path::PathBuf;

use crate::adapt::{ConfigFileError, JobConfig};
use crate::control::Request;
use crate::seam::SlurmError;

/// The profile a config file is read with when the request names none.
pub const DEFAULT_PROFILE: &str = "generic";

/// A read a request needs from the host.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    /// The config file of an attach of `pid`, with its profile and key overrides; read with the
    /// rights of the process's owner, and only for a caller who may attach it (root, or that owner).
    Config {
        /// The process to be attached.
        pid: u32,
        /// The config file.
        file: PathBuf,
        /// The profile its knobs are found by.
        profile: String,
        /// KNOB=dotted.path overrides.
        keys: Vec<String>,
        /// The process attaches itself (its path may be in its own mount namespace).
        itself: bool,
    },
    /// Slurm job `job_id`'s pids on this node, where its job cgroup is not found here.
    SlurmPids {
        /// The Slurm job's id.
        job_id: String,
    },
}

impl Read {
    /// What `request` from `caller` needs read before the engine takes it; `None`: nothing. A
    /// process attaching itself is the socket's peer (the engine checks that it agrees).
    pub fn of(request: &Request, caller: crate::control::Caller) -> Option<Read> {
        match request {
            Request::Attach {
                pid,
                itself,
                config_file: Some(file),
                profile,
                keys,
                ..
            } => Some(Read::Config {
                pid: match caller.pid.and_then(|p| u32::try_from(p).ok()) {
                    Some(peer) if *itself => peer,
                    _ => *pid,
                },
                file: file.clone(),
                profile: profile.clone().unwrap_or_else(|| DEFAULT_PROFILE.into()),
                keys: keys.clone(),
                itself: *itself,
            }),
            Request::AttachSlurm { job_id, .. } => Some(Read::SlurmPids {
                job_id: job_id.clone(),
            }),
            _ => None,
        }
    }
}

/// What the host read for a request ([`Read`]), handed to the engine with it.
#[derive(Debug, Default)]
pub struct Prepared {
    /// A job's config file, opened.
    pub config: Option<OpenedConfig>,
    /// Slurm's list of a job's pids.
    pub slurm_pids: Option<ListedPids>,
}

/// A job's config file, opened with the rights of user `owner`.
#[derive(Debug)]
pub struct OpenedConfig {
    /// The file.
    pub file: PathBuf,
    /// The profile its knobs were found by.
    pub profile: String,
    /// The key overrides.
    pub keys: Vec<String>,
    /// Whose rights it was read with (the process's owner, read from its status).
    pub owner: u32,
    /// The process whose root the path was resolved in ([`config_root`]).
    pub within: Option<u32>,
    /// The config, or why it cannot be one.
    pub result: Result<JobConfig, ConfigFileError>,
}

impl OpenedConfig {
    /// Whether this is the read of `file`, `profile` and `keys` with `owner`'s rights, in the root
    /// of `within`.
    pub fn is(
        &self,
        file: &std::path::Path,
        profile: &str,
        keys: &[String],
        owner: u32,
        within: Option<u32>,
    ) -> bool {
        self.file == file
            && self.profile == profile
            && self.keys == keys
            && self.owner == owner
            && self.within == within
    }
}

/// Where an attach's config path is, as the caller gave it: `None`, in the daemon's own mount
/// namespace; `Some(pid)`, in that of process `pid`, whose root the path is then resolved in for as
/// long as the job runs. A job attaching itself from another namespace (a container) names its own;
/// a caller in another namespace than the daemon's (a daemon under systemd has one of its own)
/// attaching job `pid` from the job's namespace names the job's, which outlives the caller. A path
/// from a third namespace, given for another process, would outlive its caller: refused.
pub fn config_root(
    view: &dyn crate::seam::HostView,
    pid: u32,
    itself: bool,
    caller: crate::control::Caller,
) -> Result<Option<u32>, String> {
    let Some(peer) = caller.pid.and_then(|p| u32::try_from(p).ok()) else {
        return Ok(None);
    };
    let ns = |p: u32| view.mount_namespace(p);
    let (Some(mine), Some(theirs)) = (ns(view.own_pid()), ns(peer)) else {
        return Ok(None);
    };
    if mine == theirs {
        return Ok(None);
    }
    if itself {
        return Ok(Some(peer));
    }
    if ns(pid) == Some(theirs) {
        return Ok(Some(pid));
    }
    Err(format!(
        "the config file's path is in the caller's mount namespace (pid {peer}), which is neither \
         the daemon's nor the job's: let the job attach itself with it (the Python client, \
         memwatch-train), or attach from the job's or the daemon's side"
    ))
}

/// `scontrol listpids`' answer for Slurm job `job_id`.
#[derive(Debug)]
pub struct ListedPids {
    /// The Slurm job's id.
    pub job_id: String,
    /// Its pids on this node, or why there is no list.
    pub result: Result<Vec<u32>, SlurmError>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Caller;

    #[test]
    fn an_attach_with_a_config_and_a_slurm_attach_need_reads_and_nothing_else_does() {
        let attach = |config: Option<&str>, profile: Option<&str>| Request::Attach {
            pid: 42,
            itself: false,
            name: None,
            config_file: config.map(PathBuf::from),
            profile: profile.map(str::to_owned),
            keys: vec!["batch_size=train.batch".into()],
            launch: None,
        };
        assert_eq!(
            Read::of(&attach(Some("/home/u/ds.json"), None), Caller::ANONYMOUS),
            Some(Read::Config {
                pid: 42,
                file: "/home/u/ds.json".into(),
                profile: DEFAULT_PROFILE.into(),
                keys: vec!["batch_size=train.batch".into()],
                itself: false,
            })
        );
        assert!(matches!(
            Read::of(&attach(Some("/a.yaml"), Some("hf")), Caller::ANONYMOUS),
            Some(Read::Config { profile, .. }) if profile == "hf"
        ));
        assert_eq!(Read::of(&attach(None, None), Caller::ANONYMOUS), None);
        // A process attaching itself from a container says its namespace's pid: its config is
        // read for the socket's peer.
        let peer = Caller {
            uid: 1000,
            pid: Some(81234),
        };
        let mut itself = attach(Some("/work/ds.json"), None);
        if let Request::Attach { itself: i, .. } = &mut itself {
            *i = true;
        }
        assert!(matches!(
            Read::of(&itself, peer),
            Some(Read::Config { pid: 81234, .. })
        ));
        assert!(matches!(
            Read::of(&attach(Some("/work/ds.json"), None), peer),
            Some(Read::Config { pid: 42, .. })
        ));
        assert_eq!(
            Read::of(
                &Request::AttachSlurm {
                    job_id: "4242".into(),
                    name: None
                },
                Caller::ANONYMOUS
            ),
            Some(Read::SlurmPids {
                job_id: "4242".into()
            })
        );
        assert_eq!(
            Read::of(&Request::Pause { target: "x".into() }, Caller::ANONYMOUS),
            None
        );
    }
}
