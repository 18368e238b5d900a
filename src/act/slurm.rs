//! Slurm's commands: the job-wide suspend, resume, requeue, cancel and signal through scontrol and
//! scancel, each with a timeout. Where a job is on this node is `crate::slurm`'s.

use std::time::Duration;

use crate::command::RunError;

use super::driver::SlurmAnswer;
pub use crate::job::held::{Slurmctl, Suspended};
use memwatch_core::slurm::protocol::{self, Node};

pub use memwatch_core::seam::{HOLD_TRIES, SlurmError};

/// Runs a Slurm command for at most `timeout`. Its stdout on success; otherwise what went wrong, with
/// the command's own words.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, SlurmError> {
    crate::command::run(program, args, timeout).map_err(|e| match e {
        RunError::Spawn { command, source } => SlurmError::Spawn {
            command,
            reason: source.to_string(),
        },
        RunError::Failed {
            command,
            status,
            stderr,
        } => SlurmError::Failed {
            command,
            status: status.to_string(),
            stderr,
        },
        RunError::Late { command, timeout } => SlurmError::Late {
            command,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        },
    })
}

/// Now, in Unix seconds (the holds' clock: Slurm's nodes keep their clocks together, as munge's
/// credentials need).
fn unix_now() -> u64 {
    crate::clock::wall_ms() / 1000
}

/// This node's name in the holds: `[slurm] node_name`, else the host name up to its first dot
/// (what slurmd uses unless started with -N or given a NodeHostname).
pub fn node_name(cfg: &crate::config::Slurm) -> String {
    if !cfg.node_name.is_empty() {
        return cfg.node_name.clone();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .and_then(|h| h.split('.').next().map(str::to_owned))
        .unwrap_or_default()
}

/// Slurm's commands for a job, run from a `job::held::Slurmctl` (plain data in memwatch-core):
/// suspend, resume, hold, requeue, cancel, signal, list the pids, each bounded by the record's
/// timeout.
pub trait Scontrol {
    /// Suspends the whole job, on every node (`scontrol suspend`). Slurm's word is checked, not
    /// assumed: a call that gave no answer in time is settled by the job's state read back.
    /// This node's hold is recorded once the job is suspended (`act::slurm_holds`).
    fn suspend(&self, id: &str) -> Result<(), SlurmError>;

    /// Releases this node's hold and resumes the job (`scontrol resume`, checked like
    /// [`Scontrol::suspend`]) unless other nodes still hold it: then it stays suspended, and the
    /// last of them resumes it. Holds that cannot be read do not keep a job suspended.
    fn resume(&self, id: &str) -> Result<SlurmAnswer, SlurmError>;

    /// While this node holds the job: reads its state back, suspends it again if it runs (resumed
    /// behind this node's back: by a person, or by a node that did not see this node's hold), and
    /// renews this node's hold once half its time has passed.
    fn hold(&self, id: &str) -> Result<SlurmAnswer, SlurmError>;

    /// The nodes whose holds on job `id` count now (read only: `SlurmCall::Holders`).
    fn holders(&self, id: &str) -> Result<SlurmAnswer, SlurmError>;

    /// Puts the job back in the queue: its processes are ended and it runs again when scheduled.
    fn requeue(&self, id: &str) -> Result<(), SlurmError>;

    /// Cancels the job.
    fn cancel(&self, id: &str) -> Result<(), SlurmError>;

    /// Sends `signal` (a name such as "USR1") to every step's tasks, the batch script included.
    fn signal(&self, id: &str, signal: &str) -> Result<(), SlurmError>;

    /// The job's pids on this node, from `scontrol listpids`.
    fn listpids(&self, id: &str) -> Result<Vec<u32>, SlurmError>;
}

impl Scontrol for Slurmctl {
    fn suspend(&self, id: &str) -> Result<(), SlurmError> {
        protocol::suspend(&Real(self), Node::of(self, unix_now()), id)
    }

    fn resume(&self, id: &str) -> Result<SlurmAnswer, SlurmError> {
        protocol::resume(&Real(self), Node::of(self, unix_now()), id)
    }

    fn hold(&self, id: &str) -> Result<SlurmAnswer, SlurmError> {
        protocol::hold(&Real(self), Node::of(self, unix_now()), id)
    }

    fn holders(&self, id: &str) -> Result<SlurmAnswer, SlurmError> {
        protocol::holders(&Real(self), Node::of(self, unix_now()), id)
    }

    fn requeue(&self, id: &str) -> Result<(), SlurmError> {
        scontrol(self, &["requeue", id]).map(drop)
    }

    fn cancel(&self, id: &str) -> Result<(), SlurmError> {
        run(&self.scancel, &[id], Duration::from_millis(self.timeout_ms)).map(drop)
    }

    fn signal(&self, id: &str, signal: &str) -> Result<(), SlurmError> {
        run(
            &self.scancel,
            &["--full", &format!("--signal={signal}"), id],
            Duration::from_millis(self.timeout_ms),
        )
        .map(drop)
    }

    fn listpids(&self, id: &str) -> Result<Vec<u32>, SlurmError> {
        scontrol(self, &["listpids", id]).map(|t| crate::slurm::parse_listpids(&t))
    }
}

/// The real scontrol of a `Slurmctl`, as the hold protocol reaches Slurm.
struct Real<'a>(&'a Slurmctl);

impl protocol::Scontrol for Real<'_> {
    fn scontrol(&self, args: &[&str]) -> Result<String, SlurmError> {
        scontrol(self.0, args)
    }
}

fn scontrol(ctl: &Slurmctl, args: &[&str]) -> Result<String, SlurmError> {
    run(&ctl.scontrol, args, Duration::from_millis(ctl.timeout_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memwatch_core::slurm::holds::Holds;

    #[test]
    fn a_command_that_fails_or_hangs_says_so() {
        let e = run("false", &[], Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, SlurmError::Failed { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("`false` failed"), "{e}");
        let e = run("sleep", &["5"], Duration::from_millis(100)).unwrap_err();
        assert_eq!(
            e,
            SlurmError::Late {
                command: "sleep 5".into(),
                timeout_ms: 100
            }
        );
        let e = e.to_string();
        assert!(e.contains("did not finish within 100 ms"), "{e}");
        let e = run(
            "/nonexistent/scontrol",
            &["resume", "1"],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, SlurmError::Spawn { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("cannot run `/nonexistent/scontrol resume 1`"),
            "{e}"
        );
        assert_eq!(
            run("echo", &["hi"], Duration::from_secs(5)).unwrap(),
            "hi\n"
        );
    }

    /// An `scontrol` that carries the call out but answers after the timeout (a busy slurmctld):
    /// the job's state read back decides, so a suspension that did happen is known, and one that
    /// did not is a failure that says what the job is.
    #[test]
    fn a_late_answer_is_settled_by_the_jobs_state() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let scontrol = dir.path().join("scontrol");
        crate::act::test_script(
            &scontrol,
            &format!(
                "#!/bin/sh\nstate={}\ncase $1 in\n  suspend) echo SUSPENDED >$state; sleep 5 ;;\n  resume) sleep 5 ;;\n  show) echo \"JobId=$4 JobName=train JobState=$(cat $state) Reason=None\" ;;\nesac\n",
                state.display()
            ),
        );
        std::fs::write(&state, "RUNNING\n").unwrap();
        let ctl = Slurmctl {
            scontrol: scontrol.to_string_lossy().into_owned(),
            scancel: "scancel".into(),
            timeout_ms: 300,
            holder: String::new(),
            hold_seconds: 0,
        };
        ctl.suspend("42").expect("suspended, though late");
        // This resume changes nothing and answers late: the job is still suspended.
        let e = ctl.resume("42").unwrap_err();
        assert!(
            matches!(&e, SlurmError::NotAsAsked { call, state }
                if matches!(**call, SlurmError::Late { timeout_ms: 300, .. })
                    && **state == SlurmError::State("SUSPENDED".into())),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("did not finish within 300 ms") && e.contains("the job is SUSPENDED"),
            "{e}"
        );
        assert_eq!(
            protocol::job_state("JobId=7 JobState=RUNNING Reason=None"),
            Some("RUNNING")
        );
        assert_eq!(protocol::job_state("JobId=7 JobState= x"), None);
    }

    /// A scontrol that keeps a job's state and AdminComment in files, as slurmctld would.
    fn fake_scontrol(dir: &std::path::Path) -> String {
        let scontrol = dir.join("scontrol");
        let d = dir.display();
        crate::act::test_script(
            &scontrol,
            &format!(
                "#!/bin/sh\ncd {d}\ncase $1 in\n  \
                 suspend) echo SUSPENDED >state ;;\n  \
                 resume) echo RUNNING >state ;;\n  \
                 update) printf '%s' \"${{3#AdminComment=}}\" >comment ;;\n  \
                 show) c=$(cat comment 2>/dev/null); a=''; [ -n \"$c\" ] && a=\" AdminComment=$c \"; \
                 echo \"JobId=$4 JobName=train JobState=$(cat state) Command=/a WorkDir=/tmp$a StdErr=/tmp/e\" ;;\n\
                 esac\n"
            ),
        );
        std::fs::write(dir.join("state"), "RUNNING\n").unwrap();
        scontrol.to_string_lossy().into_owned()
    }

    fn read(dir: &std::path::Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// Two nodes hold one job: the first to recover releases its hold and leaves the job
    /// suspended; the job resumed behind the other's back is suspended again by its check; the last
    /// holder's resume resumes it, and the comment is left as the administrator wrote it.
    #[test]
    fn a_suspension_is_resumed_only_by_its_last_holder() {
        let dir = tempfile::tempdir().unwrap();
        let scontrol = fake_scontrol(dir.path());
        std::fs::write(dir.path().join("comment"), "reviewed by ops").unwrap();
        let node = |name: &str| Slurmctl {
            scontrol: scontrol.clone(),
            scancel: "scancel".into(),
            timeout_ms: 5000,
            holder: name.into(),
            hold_seconds: 120,
        };
        let (n1, n2) = (node("node1"), node("node2"));
        n1.suspend("7").unwrap();
        n2.suspend("7").unwrap();
        assert_eq!(read(dir.path(), "state"), "SUSPENDED");
        let holds = Holds::parse(&read(dir.path(), "comment"));
        let nodes: Vec<&str> = holds.holds.iter().map(|h| h.node.as_str()).collect();
        assert_eq!(nodes, ["node1", "node2"]);
        assert_eq!(holds.rest, "reviewed by ops");
        let until = holds.holds[0].until;
        assert!(
            (unix_now() + 110..=unix_now() + 120).contains(&until),
            "{until}"
        );

        // node2 has room first: node1 still holds the job.
        assert_eq!(
            n2.resume("7").unwrap(),
            SlurmAnswer::KeptBy(vec!["node1".into()])
        );
        assert_eq!(read(dir.path(), "state"), "SUSPENDED");
        assert_eq!(
            n1.hold("7").unwrap(),
            SlurmAnswer::Holders(vec!["node1".into()])
        );
        assert_eq!(
            n2.holders("7").unwrap(),
            SlurmAnswer::Holders(vec!["node1".into()])
        );

        // Someone resumes the job behind node1's back: node1's check suspends it again.
        std::fs::write(dir.path().join("state"), "RUNNING\n").unwrap();
        assert_eq!(n1.hold("7").unwrap(), SlurmAnswer::Resuspended);
        assert_eq!(read(dir.path(), "state"), "SUSPENDED");

        // node1 has room: the last holder resumes the job.
        assert_eq!(n1.resume("7").unwrap(), SlurmAnswer::Done);
        assert_eq!(read(dir.path(), "state"), "RUNNING");
        assert_eq!(read(dir.path(), "comment"), "reviewed by ops");

        // A hold that ran out (its node died holding the job) keeps nothing suspended.
        n1.suspend("7").unwrap();
        std::fs::write(
            dir.path().join("comment"),
            format!("memwatch_hold=node1@{},dead@5", unix_now() + 100),
        )
        .unwrap();
        assert_eq!(n1.resume("7").unwrap(), SlurmAnswer::Done);
        assert_eq!(read(dir.path(), "state"), "RUNNING");
        assert_eq!(read(dir.path(), "comment"), "");

        // Without holds (a record older than them), a resume resumes.
        let old = Slurmctl {
            holder: String::new(),
            ..node("x")
        };
        n2.suspend("7").unwrap();
        assert_eq!(old.resume("7").unwrap(), SlurmAnswer::Done);
        assert_eq!(read(dir.path(), "state"), "RUNNING");
    }
}
