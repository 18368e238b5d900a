//! The hold protocol: how the nodes that follow one Slurm job agree on its job-wide suspension
//! without talking to each other. Each node that needs the job suspended holds it (an entry in the
//! job's `AdminComment`, [`Holds`], renewed while it needs it and counting for `hold_seconds`
//! after); a node with room again releases its hold, and only the **last holder** resumes the job.
//! A node that dies holding it holds it until its entry runs out; then the first node that reads
//! the holds and finds only run-out entries on a job Slurm still holds suspended resumes it.
//!
//! Slurm is reached through [`Scontrol`] (the daemon's is the real `scontrol`, the simulator's a
//! Slurm in memory shared by several engines), so the rules here are what both run.

use super::call::{HOLD_TRIES, SlurmAnswer, SlurmError};
use super::holds::{self, Holds};
use crate::held::Slurmctl;

/// Slurm as the protocol reaches it: `scontrol` with its arguments, its stdout back.
pub trait Scontrol {
    /// Runs `scontrol ARGS…`.
    fn scontrol(&self, args: &[&str]) -> Result<String, SlurmError>;
}

/// A job's `JobState` from `scontrol show job -o`'s one line.
pub fn job_state(line: &str) -> Option<&str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("JobState="))
        .filter(|s| !s.is_empty())
}

/// This node in the protocol at one moment: its name in the holds (empty: it keeps none, and a
/// resume resumes whoever else needs the job suspended), how long its hold counts, and now (Unix
/// seconds: Slurm's nodes keep their clocks together, as munge's credentials need).
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    /// Its name in the holds.
    pub holder: &'a str,
    /// How long its hold counts without being renewed, in seconds.
    pub hold_seconds: u64,
    /// Now, in Unix seconds.
    pub now: u64,
}

impl<'a> Node<'a> {
    /// This node as `ctl` names it, at `now`.
    pub fn of(ctl: &'a Slurmctl, now: u64) -> Node<'a> {
        Node {
            holder: &ctl.holder,
            hold_seconds: ctl.hold_seconds,
            now,
        }
    }
}

/// Suspends the whole job (`scontrol suspend`, checked: [`checked`]) and records this node's hold.
pub fn suspend(s: &dyn Scontrol, node: Node, id: &str) -> Result<(), SlurmError> {
    checked(s, &["suspend", id], id, "SUSPENDED")?;
    take_hold(s, node, id);
    Ok(())
}

/// Releases this node's hold and resumes the job (`scontrol resume`, checked) unless other nodes
/// still hold it: then it stays suspended ([`SlurmAnswer::KeptBy`]), and the last of them resumes
/// it. Holds that cannot be read do not keep a job suspended.
pub fn resume(s: &dyn Scontrol, node: Node, id: &str) -> Result<SlurmAnswer, SlurmError> {
    if !node.holder.is_empty() {
        let released = update_holds(
            s,
            id,
            |h| h.without(node.holder, node.now),
            |h| h.of(node.holder, node.now).is_none(),
        );
        match released {
            Ok(h) => {
                let others = h.others(node.holder, node.now);
                if !others.is_empty() {
                    return Ok(SlurmAnswer::KeptBy(others));
                }
            }
            Err(e) => {
                tracing::warn!(slurm_job_id = id, error = %e, "cannot read or release the holds on the Slurm job's suspension; resuming it")
            }
        }
    }
    checked(s, &["resume", id], id, "RUNNING").map(|()| SlurmAnswer::Done)
}

/// While this node holds the job: reads its state back, suspends it again if it runs (resumed behind
/// this node's back: by a person, or by a node that did not see this node's hold), and renews this
/// node's hold once half its time has passed.
pub fn hold(s: &dyn Scontrol, node: Node, id: &str) -> Result<SlurmAnswer, SlurmError> {
    let line = show(s, id)?;
    let holds = Holds::parse(holds::admin_comment(&line));
    match job_state(&line) {
        Some("SUSPENDED") => {
            let fresh = holds
                .of(node.holder, node.now)
                .is_some_and(|h| h.until >= node.now + node.hold_seconds / 2);
            let mut holders = holds.others(node.holder, node.now);
            if !node.holder.is_empty() {
                if !fresh {
                    take_hold(s, node, id);
                }
                holders.insert(0, node.holder.to_owned());
            }
            Ok(SlurmAnswer::Holders(holders))
        }
        Some("RUNNING") => suspend(s, node, id).map(|()| SlurmAnswer::Resuspended),
        Some(state) => Err(SlurmError::State(state.to_owned())),
        None => Err(SlurmError::NoState),
    }
}

/// For a node that does not hold the job: the nodes whose holds count now. A job Slurm holds
/// suspended whose holds have all run out (their nodes died holding it, or lost Slurm for longer
/// than `hold_seconds`) is resumed here: [`SlurmAnswer::Orphaned`] names those nodes. A suspension
/// with no memwatch holds at all (a person's) is left alone.
pub fn holders(s: &dyn Scontrol, node: Node, id: &str) -> Result<SlurmAnswer, SlurmError> {
    let line = show(s, id)?;
    let holds = Holds::parse(holds::admin_comment(&line));
    let counting = holds.others("", node.now);
    let ran_out: Vec<String> = holds
        .holds
        .iter()
        .filter(|h| h.until <= node.now)
        .map(|h| h.node.clone())
        .collect();
    if counting.is_empty() && !ran_out.is_empty() && job_state(&line) == Some("SUSPENDED") {
        // Cleared first: a node that comes back renews its hold from nothing and is counted again.
        update_holds(
            s,
            id,
            |h| h.without("", node.now),
            |h| h.holds.iter().all(|h| h.until > node.now),
        )?;
        checked(s, &["resume", id], id, "RUNNING")?;
        return Ok(SlurmAnswer::Orphaned(ran_out));
    }
    Ok(SlurmAnswer::Holders(counting))
}

/// The job's one line from `scontrol show job -o`.
fn show(s: &dyn Scontrol, id: &str) -> Result<String, SlurmError> {
    s.scontrol(&["show", "job", "-o", id])
}

/// The job's holds as Slurm has them.
fn read_holds(s: &dyn Scontrol, id: &str) -> Result<Holds, SlurmError> {
    show(s, id).map(|line| Holds::parse(holds::admin_comment(&line)))
}

/// Writes `change` of the job's holds, read back until it is there (another node may write the
/// comment between our read and our write); the holds as last read.
fn update_holds(
    s: &dyn Scontrol,
    id: &str,
    change: impl Fn(&Holds) -> Holds,
    there: impl Fn(&Holds) -> bool,
) -> Result<Holds, SlurmError> {
    let mut holds = read_holds(s, id)?;
    for _ in 0..HOLD_TRIES {
        if there(&holds) {
            return Ok(holds);
        }
        let value = format!("AdminComment={}", change(&holds).render());
        s.scontrol(&["update", &format!("JobId={id}"), &value])?;
        holds = read_holds(s, id)?;
    }
    if there(&holds) {
        Ok(holds)
    } else {
        Err(SlurmError::HoldsRace)
    }
}

/// Records this node's hold on the job's suspension (renewed: it counts `hold_seconds` from now).
/// A failure is logged: the suspension is made all the same, and the holds only decide who may
/// resume it.
fn take_hold(s: &dyn Scontrol, node: Node, id: &str) {
    if node.holder.is_empty() {
        return;
    }
    let until = node.now + node.hold_seconds;
    let written = update_holds(
        s,
        id,
        |h| h.with(node.holder, until, node.now),
        |h| {
            h.of(node.holder, node.now)
                .is_some_and(|h| h.until >= until)
        },
    );
    if let Err(e) = written {
        tracing::warn!(slurm_job_id = id, node = node.holder, error = %e, "cannot record this node's hold on the Slurm job's suspension");
    }
}

/// Runs `scontrol ARGS`; when it fails or does not finish in time (slurmctld busy: the request may
/// have been carried out all the same; a resume of a job another node already resumed), reads the
/// job's state back and counts the call done when the job is in `wanted`, failed otherwise. What
/// this cannot see: a request still queued in slurmctld that takes effect after the read.
pub fn checked(s: &dyn Scontrol, args: &[&str], id: &str, wanted: &str) -> Result<(), SlurmError> {
    match s.scontrol(args) {
        Ok(_) => Ok(()),
        Err(e) => {
            let shown = show(s, id);
            let not_as_asked = |state| SlurmError::NotAsAsked {
                call: Box::new(e.clone()),
                state: Box::new(state),
            };
            match shown.as_deref().map(job_state) {
                Ok(Some(state)) if state == wanted => {
                    tracing::warn!(slurm_job_id = id, error = %e, state, "Slurm answered late or not at all, but the job is as asked: done");
                    Ok(())
                }
                Ok(Some(state)) => Err(not_as_asked(SlurmError::State(state.to_owned()))),
                Ok(None) => Err(not_as_asked(SlurmError::NoState)),
                Err(q) => Err(SlurmError::Unreadable {
                    call: Box::new(e),
                    read: Box::new(q.clone()),
                }),
            }
        }
    }
}
