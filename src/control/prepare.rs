//! The reads a control request needs, made on the blocking pool before the request reaches the
//! owner task (memwatch-core's `engine::Read` says which): a job's config file, read with its
//! owner's rights, and Slurm's `scontrol listpids`. Either can take long (a config on a slow
//! network disk, scontrol up to `[slurm] command_timeout_ms`); made here, they hold up the caller
//! alone, never the task that pauses jobs.

use std::sync::Arc;

use memwatch_core::engine::{ListedPids, OpenedConfig, Prepared, Read};

use super::{Caller, Request};
use crate::job::held::Slurmctl;
use crate::view::{HostView, RootView};

/// Makes a request's reads through the host's own view, as the engine would.
pub struct Preparer {
    view: RootView,
    ctl: Slurmctl,
    node: String,
}

impl Preparer {
    /// Reads through `view`, Slurm's through `ctl` for node `node`.
    pub fn new(view: RootView, ctl: Slurmctl, node: String) -> Arc<Preparer> {
        Arc::new(Preparer { view, ctl, node })
    }

    /// The daemon's: its view under `[host] process_root`, Slurm's commands for this node.
    pub fn of(config: &crate::config::Config) -> Arc<Preparer> {
        let node = crate::act::slurm::node_name(&config.slurm);
        Preparer::new(
            RootView::new(&config.host.process_root),
            Slurmctl::new(&config.slurm, &node),
            node,
        )
    }

    /// What `request` from `caller` needs read, read on the blocking pool; nothing for a request
    /// that needs no read (or a read that panicked: the engine then makes its own).
    pub async fn prepare(self: &Arc<Self>, request: &Request, caller: Caller) -> Prepared {
        let Some(read) = Read::of(request, caller) else {
            return Prepared::default();
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.read(read, caller))
            .await
            .unwrap_or_default()
    }

    /// Makes one read. A config file is read only for a caller who may attach the process (root,
    /// or the process's owner): for anyone else the engine refuses the attach, and nothing of
    /// theirs is read with another user's rights.
    pub fn read(&self, read: Read, caller: Caller) -> Prepared {
        match read {
            Read::Config {
                pid,
                file,
                profile,
                keys,
                itself,
            } => {
                let Ok(status) = self.view.status(pid) else {
                    return Prepared::default();
                };
                let owner = status.uids[0];
                if !caller.is_root() && caller.uid != owner {
                    return Prepared::default();
                }
                let Ok(within) =
                    memwatch_core::engine::config_root(&self.view, pid, itself, caller)
                else {
                    return Prepared::default();
                };
                let result = self.view.open_config(&file, &profile, &keys, owner, within);
                Prepared {
                    config: Some(OpenedConfig {
                        file,
                        profile,
                        keys,
                        owner,
                        within,
                        result,
                    }),
                    slurm_pids: None,
                }
            }
            Read::SlurmPids { job_id } => {
                // Where Slurm's cgroup plugin holds the job, the engine reads its cgroup instead.
                if !memwatch_core::slurm::valid_id(&job_id)
                    || self.view.slurm_job(&job_id, &self.node).is_some()
                {
                    return Prepared::default();
                }
                let result = self.view.slurm_listpids(&self.ctl, &job_id);
                Prepared {
                    config: None,
                    slurm_pids: Some(ListedPids { job_id, result }),
                }
            }
        }
    }
}
