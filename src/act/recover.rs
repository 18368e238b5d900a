//! Undoing a predecessor's pauses: what a restarted daemon does first, and what the guardian does when
//! the daemon died and nobody restarted it. Idempotent: continuing a running process or thawing a
//! thawed cgroup changes nothing, so running it twice (guardian, then a new daemon) is safe.
//!
//! A pause is recorded before its first signal (write-ahead), with the cgroup it is about to freeze, so
//! a kill at any instant leaves a record of everything it may have stopped. The record's list of
//! stopped processes can be short of the truth (the kill landed mid-walk), so recovery also continues
//! every stopped member of the job's current tree. A member a user had stopped by hand inside a job
//! memwatch paused is continued too; that is the price of never leaving a job frozen.
//!
//! `undo_pause` is memwatch-core's (`seam`): it acts through any `HostDriver` and reads through any
//! `HostView`; here it is given the machine's.

/// What recovery did for one job.
pub type Recovered = super::driver::Released;

pub use memwatch_core::seam::undo_pause;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::oomd::Marking as _;
    use crate::act::persist::{HoldRecord, PersistedJob, PersistedPause, PhaseRecord};
    use crate::proc::ProcRef;
    use crate::view::RootView;
    use std::path::Path;

    /// A job a killed daemon had suspended through Slurm is resumed through Slurm: the recorded
    /// scontrol is run with `resume ID`, the recorded systemd-oomd mark is taken off, and what
    /// recovery did says so.
    #[test]
    fn a_suspended_slurm_job_is_resumed_through_slurm_and_its_oomd_mark_taken_off() {
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls");
        let scontrol = dir.path().join("scontrol");
        crate::act::test_script(
            &scontrol,
            &format!("#!/bin/sh\necho \"$@\" >> {}\n", calls.display()),
        );
        // The job's cgroup carries the systemd-oomd mark the pause set (where the filesystem takes
        // user attributes); the recovery takes it off.
        let cgroup = dir.path().join("job.scope");
        std::fs::create_dir(&cgroup).unwrap();
        let marks = vec![crate::act::oomd::OomdMark {
            dir: cgroup.clone(),
            previous: None,
        }];
        let marked = marks[0].set().is_ok();
        let job = PersistedJob {
            name: "slurm-4242".into(),
            // A process that is not there: only the Slurm job is left to resume.
            root: ProcRef {
                pid: u32::MAX - 1,
                start_time: 1,
            },
            owner_uid: 0,
            attached_at_ms: 0,
            paused: Some(PersistedPause {
                since_ms: 1,
                by: crate::policy::By::Policy,
                reason: "job cgroup".into(),
                phase: PhaseRecord::Held,
                stopped: Vec::new(),
                hold: HoldRecord::SlurmSuspend {
                    job_id: "4242".into(),
                    scontrol: scontrol.display().to_string(),
                    scancel: "scancel".into(),
                    timeout_ms: 5000,
                    holder: String::new(),
                    hold_seconds: 0,
                },
                causes: Vec::new(),
                projected: None,
                strict: false,
                expired: false,
                oomd_omit: marks.clone(),
                line: None,
            }),
            config: None,
            launch: None,
            way_out: None,
            slurm: Some("4242".into()),
        };
        let host = crate::act::driver::Host::new(Path::new("/"));
        let done = undo_pause(&host, &RootView::new(Path::new("/")), &job).unwrap();
        assert_eq!(done.slurm_resumed.as_deref(), Some("4242"));
        assert!(
            done.to_string().starts_with("resumed Slurm job 4242"),
            "{done}"
        );
        assert_eq!(std::fs::read_to_string(&calls).unwrap(), "resume 4242\n");
        if marked {
            assert_eq!(done.unmarked, 1);
            assert!(done.to_string().contains("1 systemd-oomd mark"), "{done}");
            assert_eq!(crate::act::oomd::read(&cgroup), Ok(None));
        }
    }
}
