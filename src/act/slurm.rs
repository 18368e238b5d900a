//! Slurm's commands: the job-wide suspend, resume, requeue, cancel and signal through scontrol and
//! scancel, each with a timeout. Where a job is on this node is `crate::slurm`'s.

use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

pub use crate::job::held::{Slurmctl, Suspended};

/// Runs a Slurm command for at most `timeout`. Its stdout on success; otherwise what went wrong, with
/// the command's own words.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, String> {
    run_timed(program, args, timeout).map_err(|e| match e {
        CallError::Failed(e) | CallError::Late(e) => e,
    })
}

/// Why a Slurm command gave no answer to go by.
#[derive(Debug)]
enum CallError {
    /// It ran and failed, or could not run: nothing was done.
    Failed(String),
    /// It did not finish in time and was killed: slurmctld may still have carried it out.
    Late(String),
}

fn run_timed(program: &str, args: &[&str], timeout: Duration) -> Result<String, CallError> {
    use CallError::Failed;
    let shown = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Failed(format!("cannot run `{shown}`: {e}")))?;
    match child.wait_timeout(timeout) {
        Ok(Some(status)) => {
            let out = child
                .wait_with_output()
                .map_err(|e| Failed(format!("`{shown}`: {e}")))?;
            if status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            } else {
                let err = String::from_utf8_lossy(&out.stderr);
                Err(Failed(format!(
                    "`{shown}` failed ({status}): {}",
                    err.trim()
                )))
            }
        }
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(CallError::Late(format!(
                "`{shown}` did not finish within {} ms",
                timeout.as_millis()
            )))
        }
        Err(e) => Err(Failed(format!("`{shown}`: {e}"))),
    }
}

/// A job's `JobState` from `scontrol show job -o`'s one line per job.
fn parse_job_state(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("JobState="))
        .filter(|s| !s.is_empty())
}

impl Slurmctl {
    /// The commands and timeout from `[slurm]`.
    pub fn new(cfg: &crate::config::Slurm) -> Self {
        Slurmctl {
            scontrol: cfg.scontrol.clone(),
            scancel: cfg.scancel.clone(),
            timeout_ms: cfg.command_timeout_ms,
        }
    }

    fn scontrol(&self, args: &[&str]) -> Result<String, String> {
        run(&self.scontrol, args, Duration::from_millis(self.timeout_ms))
    }

    /// Suspends the whole job, on every node (`scontrol suspend`). Slurm's word is checked, not
    /// assumed: a call that gave no answer in time is settled by the job's state read back.
    pub fn suspend(&self, id: &str) -> Result<(), String> {
        self.checked(&["suspend", id], id, "SUSPENDED")
    }

    /// Resumes a suspended job (`scontrol resume`), checked like [`Slurmctl::suspend`].
    pub fn resume(&self, id: &str) -> Result<(), String> {
        self.checked(&["resume", id], id, "RUNNING")
    }

    /// Runs `args`; when it fails or does not finish in time (slurmctld busy: the request may have
    /// been carried out all the same; a resume of a job another node already resumed), reads the
    /// job's state back and counts the call done when the job is in `wanted`, failed otherwise. What
    /// this cannot see: a request still queued in slurmctld that takes effect after the read.
    fn checked(&self, args: &[&str], id: &str, wanted: &str) -> Result<(), String> {
        let timeout = Duration::from_millis(self.timeout_ms);
        match run_timed(&self.scontrol, args, timeout) {
            Ok(_) => Ok(()),
            Err(CallError::Failed(e) | CallError::Late(e)) => {
                let shown = run(&self.scontrol, &["show", "job", "-o", id], timeout);
                match shown.as_deref().map(parse_job_state) {
                    Ok(Some(state)) if state == wanted => {
                        tracing::warn!(slurm_job_id = id, error = %e, state, "Slurm answered late or not at all, but the job is as asked: done");
                        Ok(())
                    }
                    Ok(Some(state)) => Err(format!("{e}; the job is {state}")),
                    Ok(None) => Err(format!("{e}; `scontrol show job` gave no JobState")),
                    Err(q) => Err(format!("{e}; the job's state cannot be read back: {q}")),
                }
            }
        }
    }

    /// Puts the job back in the queue: its processes are ended and it runs again when scheduled.
    pub fn requeue(&self, id: &str) -> Result<(), String> {
        self.scontrol(&["requeue", id]).map(drop)
    }

    /// Cancels the job.
    pub fn cancel(&self, id: &str) -> Result<(), String> {
        run(&self.scancel, &[id], Duration::from_millis(self.timeout_ms)).map(drop)
    }

    /// Sends `signal` (a name such as "USR1") to every step's tasks, the batch script included.
    pub fn signal(&self, id: &str, signal: &str) -> Result<(), String> {
        run(
            &self.scancel,
            &["--full", &format!("--signal={signal}"), id],
            Duration::from_millis(self.timeout_ms),
        )
        .map(drop)
    }

    /// The job's pids on this node, from `scontrol listpids`.
    pub fn listpids(&self, id: &str) -> Result<Vec<u32>, String> {
        self.scontrol(&["listpids", id])
            .map(|t| crate::slurm::parse_listpids(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_fails_or_hangs_says_so() {
        let e = run("false", &[], Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("`false ` failed"), "{e}");
        let e = run("sleep", &["5"], Duration::from_millis(100)).unwrap_err();
        assert!(e.contains("did not finish within 100 ms"), "{e}");
        let e = run(
            "/nonexistent/scontrol",
            &["resume", "1"],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            e.contains("cannot run `/nonexistent/scontrol resume 1`"),
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
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let scontrol = dir.path().join("scontrol");
        std::fs::write(
            &scontrol,
            format!(
                "#!/bin/sh\nstate={}\ncase $1 in\n  suspend) echo SUSPENDED >$state; sleep 5 ;;\n  resume) sleep 5 ;;\n  show) echo \"JobId=$4 JobName=train JobState=$(cat $state) Reason=None\" ;;\nesac\n",
                state.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(&state, "RUNNING\n").unwrap();
        let ctl = Slurmctl {
            scontrol: scontrol.to_string_lossy().into_owned(),
            scancel: "scancel".into(),
            timeout_ms: 300,
        };
        ctl.suspend("42").expect("suspended, though late");
        // This resume changes nothing and answers late: the job is still suspended.
        let e = ctl.resume("42").unwrap_err();
        assert!(
            e.contains("did not finish within 300 ms") && e.contains("the job is SUSPENDED"),
            "{e}"
        );
        assert_eq!(
            parse_job_state("JobId=7 JobState=RUNNING Reason=None"),
            Some("RUNNING")
        );
        assert_eq!(parse_job_state("JobId=7 JobState= x"), None);
    }
}
