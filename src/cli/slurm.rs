//! `memwatch attach --slurm-job ID` and `memwatch detach --slurm-job ID`: what the prolog and the
//! epilog in deploy/slurm/ run.

use super::{Cli, Failure, SocketArg, control_call};
use crate::control::Request;

pub(super) fn attach(
    cli: &Cli,
    socket: &SocketArg,
    id: &str,
    name: Option<String>,
) -> Result<(), Failure> {
    let r = control_call(
        cli,
        socket,
        Request::AttachSlurm {
            job_id: id.to_owned(),
            name,
        },
    )?;
    match r.job {
        Some(j) => println!("attached {} (Slurm job {id}, leader pid {})", j.name, j.pid),
        None => println!(
            "attached Slurm job {id}: memwatch follows it from its first process on this node"
        ),
    }
    Ok(())
}

pub(super) fn detach(cli: &Cli, socket: &SocketArg, id: &str) -> Result<(), Failure> {
    control_call(
        cli,
        socket,
        Request::DetachSlurm {
            job_id: id.to_owned(),
        },
    )?;
    println!("detached Slurm job {id}");
    Ok(())
}
