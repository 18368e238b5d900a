//! Another program run to its end within a time limit, its output read as it comes: the one way the
//! daemon and the CLI run a helper (scontrol, scancel, busctl, a container engine). A program that
//! outlives its limit is killed and reaped; one that writes more than a pipe holds does not block.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

/// Why a program did not run to a successful end. Each names the command as it was run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// It could not be started (not installed, not executable) or waited for.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// It did not end within its limit, and was killed.
    #[error("`{command}` did not end within {} ms", .timeout.as_millis())]
    Late {
        /// The command line.
        command: String,
        /// Its limit.
        timeout: Duration,
    },
    /// It ended unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How it ended.
        status: ExitStatus,
        /// What it said on stderr, trimmed.
        stderr: String,
    },
}

impl RunError {
    /// The command line the error is about.
    pub fn command(&self) -> &str {
        match self {
            RunError::Spawn { command, .. }
            | RunError::Late { command, .. }
            | RunError::Failed { command, .. } => command,
        }
    }
}

/// Runs `program ARGS…` (stdin empty) for at most `timeout`: its stdout on success.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, RunError> {
    let command = if args.is_empty() {
        program.to_owned()
    } else {
        format!("{program} {}", args.join(" "))
    };
    let spawn = |source: std::io::Error, command: &str| RunError::Spawn {
        command: command.to_owned(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn(e, &command))?;
    // Read both pipes while it runs: a program that fills one would otherwise wait on us forever.
    let started = std::time::Instant::now();
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
        });
        rx
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = match child.wait_timeout(timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::Late { command, timeout });
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(spawn(e, &command));
        }
    };
    // It ended: its pipes close, unless it left a process of its own holding them, which must not
    // hold us past the limit either (what came by then is what it said).
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(100));
    let stdout = out.recv_timeout(left).unwrap_or_default();
    let stderr = err.recv_timeout(left).unwrap_or_default();
    if status.success() {
        Ok(stdout)
    } else {
        Err(RunError::Failed {
            command,
            status,
            stderr: stderr.trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_output_on_success() {
        let out = run(
            "sh",
            &["-c", "echo one; echo two >&2"],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out, "one\n");
    }

    #[test]
    fn a_failure_keeps_its_words_and_status() {
        let e = run(
            "sh",
            &["-c", "echo nope >&2; exit 3"],
            Duration::from_secs(10),
        )
        .unwrap_err();
        match &e {
            RunError::Failed { status, stderr, .. } => {
                assert_eq!(status.code(), Some(3));
                assert_eq!(stderr, "nope");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(e.command(), "sh -c echo nope >&2; exit 3");
    }

    #[test]
    fn a_late_program_is_killed() {
        let started = std::time::Instant::now();
        let e = run("sleep", &["30"], Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, RunError::Late { .. }), "{e:?}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "it waited out the sleep"
        );
    }

    #[test]
    fn more_than_a_pipe_holds_does_not_block() {
        let out = run(
            "sh",
            &["-c", "head -c 1000000 /dev/zero"],
            Duration::from_secs(20),
        )
        .unwrap();
        assert_eq!(out.len(), 1_000_000);
    }

    #[test]
    fn a_missing_program_says_so() {
        let e = run("memwatch-no-such-program", &[], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, RunError::Spawn { .. }), "{e:?}");
        assert!(e.to_string().contains("memwatch-no-such-program"), "{e}");
    }
}
