//! What the host read for a request before the engine took it (`engine::Prepared`): the engine
//! takes a read that is the one it would make itself, and makes its own through the view when the
//! read handed in is another one (another file, owner or Slurm job).

use std::path::PathBuf;

use super::harness::{Kind, OWNER, PID, SLURM_ID, Sim};
use crate::adapt::{ConfigFileError, JobConfig};
use crate::engine::{ListedPids, OpenedConfig, Prepared};
use crate::rewrite::Format;
use crate::rewrite::profile::Profile;

const FILE: &str = "/home/user/train.json";

fn keys() -> Vec<String> {
    vec!["micro_batch=train.batch".into()]
}

/// The config the host opened for the job, with the owner `owner`'s rights.
fn opened(owner: u32, token: &str) -> Prepared {
    let profile = Profile::build("generic", &keys()).expect("a profile");
    let config = JobConfig {
        file: FILE.into(),
        within: None,
        format: Format::Json,
        profile,
        token: token.into(),
        generation: 0,
        directives: Vec::new(),
        progress: None,
        knobs: Default::default(),
        roomy_since_ms: None,
        last_error: None,
        unconfirmed: None,
        checkpoint: None,
        polled_at_ms: None,
        self_attached: false,
        oom_stage: None,
    };
    Prepared {
        config: Some(OpenedConfig {
            file: PathBuf::from(FILE),
            profile: "generic".into(),
            keys: keys(),
            owner,
            within: None,
            result: Ok::<_, ConfigFileError>(config),
        }),
        slurm_pids: None,
    }
}

fn attach() -> serde_json::Value {
    serde_json::json!({"cmd": "attach", "pid": PID, "name": "cfg", "config_file": FILE, "keys": keys()})
}

#[test]
fn a_config_read_before_the_attach_is_taken_when_it_is_the_owners_read_of_that_file() {
    let mut s = Sim::with(Kind::Signals, "", &[]);
    let r = s.cmd(serde_json::json!({"cmd": "detach", "target": "sim"}));
    assert!(r.ok, "detach: {:?}", r.error);
    // Read with another user's rights: not the engine's read. It makes its own through the view
    // (the simulator's, which refuses every file), and the attach is refused with its error.
    let r = s.cmd_prepared(OWNER, attach(), opened(OWNER + 1, "t-other"));
    assert!(!r.ok, "attached with a config read as another user");
    let why = r.error.unwrap_or_default();
    assert!(why.contains(FILE), "{why}");
    assert!(s.engine.jobs.is_empty(), "a refusal attached a job");
    // The owner's read of this file, profile and keys: taken as it is.
    let r = s.cmd_prepared(OWNER, attach(), opened(OWNER, "t-owner"));
    assert!(r.ok, "attach: {:?}", r.error);
    assert_eq!(r.token.as_deref(), Some("t-owner"));
    let job = &s.engine.jobs["cfg"];
    assert_eq!(job.root.pid, PID);
    assert_eq!(
        job.config.as_ref().map(|c| c.file.clone()),
        Some(PathBuf::from(FILE))
    );
    s.check();
}

#[test]
fn a_slurm_jobs_pids_listed_before_the_request_are_taken_for_that_job_only() {
    let listed = |job_id: &str| Prepared {
        config: None,
        slurm_pids: Some(ListedPids {
            job_id: job_id.into(),
            result: Ok(vec![PID, PID + 1]),
        }),
    };
    let by_id = serde_json::json!({"cmd": "attach_slurm", "job_id": SLURM_ID, "name": "sim"});
    let mut s = Sim::with(Kind::Slurm, "", &[]);
    let r = s.cmd(serde_json::json!({"cmd": "detach", "target": "sim"}));
    assert!(r.ok, "detach: {:?}", r.error);
    // The simulator has no scontrol: the view's list fails. Another job's list is not this one's,
    // so the job's user is told it has no process here.
    let r = s.cmd_prepared(OWNER, by_id.clone(), listed("1"));
    assert!(!r.ok, "attached by another job's list");
    assert!(s.engine.jobs.is_empty());
    // This job's list: its leader is attached, as the job.
    let r = s.cmd_prepared(OWNER, by_id, listed(SLURM_ID));
    assert!(r.ok, "attach by id: {:?}", r.error);
    let job = &s.engine.jobs["sim"];
    assert_eq!(job.root.pid, PID);
    assert_eq!(job.slurm.as_deref(), Some(SLURM_ID));
    s.check();
}

/// Where an attach's config path is resolved: the daemon's own view for a caller beside it; the
/// caller's root for a job attaching itself from a container; the job's root for a caller in the
/// job's namespace but not the daemon's (the CLI on a host whose daemon systemd sandboxes); refused
/// for a caller in a third namespace attaching another process.
#[test]
fn a_config_path_is_resolved_in_its_callers_namespace() {
    use crate::engine::config_root;
    let s = Sim::new(Kind::Signals);
    let caller = |pid: i32| crate::control::Caller {
        uid: 0,
        pid: Some(pid),
    };
    let (job, boxed, cli) = (PID, 7001u32, 7002u32);
    let view = s.host.as_ref();
    assert_eq!(config_root(view, job, false, caller(cli as i32)), Ok(None));
    s.host.mount_ns.lock().unwrap().insert(boxed, 2);
    assert_eq!(
        config_root(view, boxed, true, caller(boxed as i32)),
        Ok(Some(boxed))
    );
    // The daemon sandboxed in a namespace of its own: the CLI and the job share the host's.
    s.host
        .mount_ns
        .lock()
        .unwrap()
        .insert(super::host::DAEMON_PID, 5);
    assert_eq!(
        config_root(view, job, false, caller(cli as i32)),
        Ok(Some(job))
    );
    s.host.mount_ns.lock().unwrap().insert(cli, 3);
    assert!(config_root(view, job, false, caller(cli as i32)).is_err());
}
