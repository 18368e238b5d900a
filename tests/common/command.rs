//! Running a helper command (Slurm's clients, `ip`, `nsenter`) and saying which failed and how.

use std::process::{Command, ExitStatus, Stdio};

/// Why a helper command gave no output.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// It could not be started.
    #[error("{command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// It failed.
    #[error("{command}: {status}: {stdout}{stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed.
        stdout: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// Runs `program args` (with whatever `setup` adds, such as an environment variable), stdin closed;
/// its stdout, or what went wrong.
pub fn output(
    program: &str,
    args: &[&str],
    setup: impl FnOnce(&mut Command),
) -> Result<String, CommandError> {
    let command = format!("{program} {}", args.join(" "));
    let mut c = Command::new(program);
    c.args(args).stdin(Stdio::null());
    setup(&mut c);
    let out = c.output().map_err(|source| CommandError::Spawn {
        command: command.clone(),
        source,
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CommandError::Failed {
            command,
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}
