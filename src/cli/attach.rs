//! `memwatch attach PID`: asks the daemon to follow a process tree, and hands back the job's token
//! (printed, or written to a private file before anything changes).

use std::path::Path;

use super::{Cli, Failure, SocketArg, control_call, print_job, usage};
use crate::control::Request;

/// What `memwatch attach PID` was asked.
pub(super) struct Attach<'a> {
    pub pid: u32,
    pub name: Option<String>,
    pub config_file: Option<&'a Path>,
    pub profile: Option<String>,
    pub keys: Vec<String>,
    pub token_file: Option<&'a Path>,
}

pub(super) fn run(cli: &Cli, socket: &SocketArg, a: Attach<'_>) -> Result<(), Failure> {
    // The token file is opened before the attach, so a path that cannot be written fails before
    // anything changes.
    let mut token_out = match a.token_file {
        Some(path) => Some((path, open_private(path)?)),
        None => None,
    };
    // Absolute, but not resolved: the daemon refuses symlinks itself.
    let config_file = match a.config_file {
        Some(f) => Some(
            std::path::absolute(f).map_err(|e| usage(anyhow::anyhow!("{}: {e}", f.display())))?,
        ),
        None => None,
    };
    let attached = control_call(
        cli,
        socket,
        Request::Attach {
            pid: a.pid,
            itself: false,
            name: a.name,
            config_file,
            profile: a.profile,
            keys: a.keys,
            launch: None,
        },
    );
    let r = match attached {
        Ok(r) if r.ok => r,
        other => {
            if let Some((path, _)) = token_out.take() {
                let _ = std::fs::remove_file(path);
            }
            other?
        }
    };
    let token = r.token.clone();
    if let (Some((path, file)), Some(t)) = (token_out.as_mut(), token.as_ref()) {
        use std::io::Write;
        writeln!(file, "{t}")
            .and_then(|()| file.sync_all())
            .map_err(|e| anyhow::anyhow!("{}: cannot write the token: {e}", path.display()))?;
    }
    print_job("attached", r)?;
    if let Some(t) = token {
        println!("token: {t}");
        println!("  (the trainer sends it as `Authorization: Bearer <token>`; keep it private)");
    }
    Ok(())
}

/// Creates `path` for a secret: new or truncated, mode 0600, never through a symbolic link.
fn open_private(path: &std::path::Path) -> Result<std::fs::File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            usage(anyhow::anyhow!(
                "{}: cannot create the token file: {e}",
                path.display()
            ))
        })
}
