//! Slurm's commands: the job-wide suspend, resume, requeue, cancel and signal through scontrol and
//! scancel, each with a timeout. Where a job is on this node is `crate::slurm`'s.

use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

pub use crate::job::held::{Slurmctl, Suspended};

/// Runs a Slurm command for at most `timeout`. Its stdout on success; otherwise what went wrong, with
/// the command's own words.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, String> {
    let shown = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    match child.wait_timeout(timeout) {
        Ok(Some(status)) => {
            let out = child
                .wait_with_output()
                .map_err(|e| format!("`{shown}`: {e}"))?;
            if status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            } else {
                let err = String::from_utf8_lossy(&out.stderr);
                Err(format!("`{shown}` failed ({status}): {}", err.trim()))
            }
        }
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "`{shown}` did not finish within {} ms",
                timeout.as_millis()
            ))
        }
        Err(e) => Err(format!("`{shown}`: {e}")),
    }
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

    /// Suspends the whole job, on every node (`scontrol suspend`).
    pub fn suspend(&self, id: &str) -> Result<(), String> {
        self.scontrol(&["suspend", id]).map(drop)
    }

    /// Resumes a suspended job (`scontrol resume`).
    pub fn resume(&self, id: &str) -> Result<(), String> {
        self.scontrol(&["resume", id]).map(drop)
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
}
