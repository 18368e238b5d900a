//! Two nodes of one Slurm job, each its own engine on its own host, sharing one Slurm in memory
//! ([`FakeSlurm`]: the job's state and `AdminComment`, slurmctld up or down, answers late) that their
//! Slurm calls reach through the hold protocol (`slurm::protocol`), exactly as the daemon's reach
//! scontrol. Besides each engine's own invariants, after every step: **a job never runs while a
//! live node holds its suspension** (the last-holder rule), and at the end of each case no node is
//! left paused and the job runs.
//!
//! Cases: both nodes hold and the first to hold recovers first; the later holder recovers first; a
//! late answer (slurmctld carries a call out but scontrol times out); a node that dies holding (its
//! hold runs out and the other node resumes the job); slurmctld down while a node recovers.

use std::sync::{Arc, Mutex};

use crate::held::Slurmctl;
use crate::job::PausePhase;
use crate::seam::{SlurmAnswer, SlurmCall, SlurmError};
use crate::slurm::protocol::{self, Node};

use super::harness::{Kind, SLURM_ID, Sim};

/// How long a hold counts in these cases (seconds; `[slurm] hold_seconds`).
const HOLD_SECONDS: u64 = 30;

/// Slurm's controller as the nodes see it: one job, its state and its `AdminComment`.
#[derive(Clone, Default)]
pub struct FakeSlurm(Arc<Mutex<Controller>>);

#[derive(Default)]
struct Controller {
    suspended: bool,
    comment: String,
    /// slurmctld cannot be reached: every call fails as scontrol says then.
    down: bool,
    /// The next this many changes are carried out but answered late (scontrol's timeout).
    late: usize,
    /// Every scontrol call, as its arguments.
    calls: Vec<String>,
}

impl FakeSlurm {
    /// Runs `call` for node `ctl` at `now_ms` (the engines' clock; Slurm's is in seconds).
    pub fn call(
        &self,
        ctl: &Slurmctl,
        call: &SlurmCall,
        id: &str,
        now_ms: u64,
    ) -> Result<SlurmAnswer, SlurmError> {
        let node = Node::of(ctl, now_ms / 1000);
        match call {
            SlurmCall::Suspend => protocol::suspend(self, node, id).map(|()| SlurmAnswer::Done),
            SlurmCall::Resume => protocol::resume(self, node, id),
            SlurmCall::Hold => protocol::hold(self, node, id),
            SlurmCall::Holders => protocol::holders(self, node, id),
            _ => Ok(SlurmAnswer::Done),
        }
    }

    pub fn suspended(&self) -> bool {
        self.0.lock().unwrap().suspended
    }

    pub fn comment(&self) -> String {
        self.0.lock().unwrap().comment.clone()
    }

    pub fn set_down(&self, down: bool) {
        self.0.lock().unwrap().down = down;
    }

    pub fn answer_late(&self, changes: usize) {
        self.0.lock().unwrap().late = changes;
    }

    pub fn calls(&self) -> Vec<String> {
        self.0.lock().unwrap().calls.clone()
    }
}

impl protocol::Scontrol for FakeSlurm {
    fn scontrol(&self, args: &[&str]) -> Result<String, SlurmError> {
        let mut c = self.0.lock().unwrap();
        let command = format!("scontrol {}", args.join(" "));
        c.calls.push(args.join(" "));
        let failed = |stderr: &str| SlurmError::Failed {
            command: command.clone(),
            status: "exit status: 1".into(),
            stderr: stderr.into(),
        };
        if c.down {
            return Err(failed(
                "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
            ));
        }
        match args {
            ["show", "job", "-o", id] => {
                let state = if c.suspended { "SUSPENDED" } else { "RUNNING" };
                let comment = if c.comment.is_empty() {
                    String::new()
                } else {
                    format!(" AdminComment={} ", c.comment)
                };
                return Ok(format!(
                    "JobId={id} JobName=train JobState={state} Command=/a WorkDir=/tmp{comment} StdErr=/tmp/e\n"
                ));
            }
            ["suspend", _] if c.suspended => {
                return Err(failed("Job/step already suspending or suspended"));
            }
            ["suspend", _] => c.suspended = true,
            ["resume", _] if !c.suspended => return Err(failed("Job is not suspended")),
            ["resume", _] => c.suspended = false,
            ["update", _, value] => {
                c.comment = value.strip_prefix("AdminComment=").unwrap_or("").to_owned();
            }
            _ => return Err(failed("unknown command")),
        }
        if c.late > 0 {
            c.late -= 1;
            return Err(SlurmError::Late {
                command,
                timeout_ms: 5000,
            });
        }
        Ok(String::new())
    }
}

/// The nodes (`None`: dead) of one job, and its Slurm.
pub struct Pair {
    pub nodes: Vec<Option<Sim>>,
    pub slurm: FakeSlurm,
    pub now: u64,
}

impl Pair {
    /// Two nodes, "node-a" and "node-b", each with the job's tasks, holds of `HOLD_SECONDS`.
    pub fn new() -> Pair {
        let slurm = FakeSlurm::default();
        let extra = format!("[slurm]\nhold_seconds = {HOLD_SECONDS}\n");
        let nodes = ["node-a", "node-b"]
            .iter()
            .map(|n| {
                let mut s = Sim::on_node(Kind::Slurm, &extra, &[], n);
                s.shared_slurm = Some(slurm.clone());
                Some(s)
            })
            .collect();
        Pair {
            nodes,
            slurm,
            now: 1_000,
        }
    }

    fn node(&mut self, i: usize) -> &mut Sim {
        self.nodes[i].as_mut().expect("a live node")
    }

    /// A full sample on node `i` at the pair's clock, host memory `used`: its Slurm as the shared
    /// one says (the job suspended here whenever it is anywhere).
    pub fn sample(&mut self, i: usize, used: f64) {
        let (now, suspended) = (self.now, self.slurm.suspended());
        let s = self.node(i);
        s.advance_to(now);
        s.slurm_suspended = Some(suspended);
        s.sample(used);
        self.check();
    }

    /// `seconds` of full samples, one a second on every live node, node `i` at `used[i]`.
    pub fn run(&mut self, seconds: u64, used: [f64; 2]) {
        for _ in 0..seconds {
            self.now += 1000;
            for (i, u) in used.iter().enumerate() {
                if self.nodes[i].is_some() {
                    self.sample(i, *u);
                }
            }
        }
    }

    /// Node `i`'s daemon dies (its host with it): nothing of it runs again.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    /// Whether node `i` holds the job paused (its pause held, through Slurm).
    pub fn holds(&self, i: usize) -> bool {
        self.nodes[i]
            .as_ref()
            .and_then(|s| s.pause())
            .is_some_and(|p| p.phase == PausePhase::Held && p.suspended().is_some())
    }

    /// The last-holder rule: the job runs only when no live node holds its suspension.
    pub fn check(&self) {
        if self.slurm.suspended() {
            return;
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(s) = n {
                assert!(
                    !self.holds(i),
                    "Slurm job {SLURM_ID} runs while {} holds it (comment {:?}); calls {:?}",
                    s.node,
                    self.slurm.comment(),
                    self.slurm.calls()
                );
            }
        }
    }

    /// The end of every case: the job runs and no live node is paused.
    pub fn all_clear(&self) {
        assert!(
            !self.slurm.suspended(),
            "the job is left suspended (comment {:?}); calls {:?}",
            self.slurm.comment(),
            self.slurm.calls()
        );
        for s in self.nodes.iter().flatten() {
            assert!(
                s.pause().is_none(),
                "{} left paused: {:?}",
                s.node,
                s.pause()
            );
        }
    }
}

/// Node a needs the job suspended, then node b too: both hold it. a recovers first and releases
/// its hold; b's keeps the job suspended until b recovers.
#[test]
fn both_nodes_hold_and_only_the_last_resumes() {
    let mut p = Pair::new();
    p.run(1, [0.97, 0.5]);
    assert!(p.holds(0) && p.slurm.suspended());
    p.run(1, [0.97, 0.97]);
    assert!(p.holds(1), "b holds too: {:?}", p.slurm.comment());
    assert!(p.slurm.comment().contains("node-a@") && p.slurm.comment().contains("node-b@"));
    // a has room, b not: a's pause ends here, the job stays suspended.
    p.run(20, [0.5, 0.97]);
    assert!(!p.holds(0));
    assert!(p.slurm.suspended(), "b still needs it");
    assert!(
        !p.slurm.comment().contains("node-a@"),
        "a released its hold"
    );
    p.run(20, [0.5, 0.5]);
    p.all_clear();
    assert_eq!(p.slurm.comment(), "", "no hold left");
}

/// The later holder recovers first: it releases its hold and leaves the job to the first.
#[test]
fn the_later_holder_recovers_first() {
    let mut p = Pair::new();
    p.run(2, [0.97, 0.5]);
    p.run(2, [0.97, 0.97]);
    assert!(p.holds(0) && p.holds(1));
    p.run(20, [0.97, 0.5]);
    assert!(!p.holds(1) && p.holds(0));
    assert!(p.slurm.suspended());
    p.run(20, [0.5, 0.5]);
    p.all_clear();
}

/// slurmctld carries out a suspend and a resume but scontrol times out each time: each node
/// reads the job's state back and takes the call as done.
#[test]
fn a_late_answer_is_read_back() {
    let mut p = Pair::new();
    p.slurm.answer_late(1);
    p.run(1, [0.97, 0.5]);
    assert!(
        p.holds(0),
        "the late suspend counted: {:?}",
        p.slurm.calls()
    );
    assert!(p.slurm.suspended());
    p.run(1, [0.97, 0.97]);
    p.run(20, [0.5, 0.97]);
    p.slurm.answer_late(3);
    p.run(20, [0.5, 0.5]);
    p.all_clear();
}

/// Node a dies holding the job; node b never needed it suspended. b reads who holds it every
/// 10 s: a, until a's hold runs out; then b clears the holds and resumes the job, saying so.
#[test]
fn a_node_that_dies_holding_is_outlived() {
    let mut p = Pair::new();
    p.run(2, [0.97, 0.5]);
    assert!(p.holds(0));
    p.kill(0);
    p.run(HOLD_SECONDS / 2, [0.0, 0.5]);
    assert!(p.slurm.suspended(), "a's hold still counts");
    let b = p.nodes[1].as_ref().unwrap();
    let view = b.engine.view();
    assert_eq!(
        view.jobs[0].slurm_holders,
        ["node-a"],
        "b sees who holds it"
    );
    p.run(HOLD_SECONDS + 15, [0.0, 0.5]);
    p.all_clear();
    let b = p.nodes[1].as_ref().unwrap();
    assert!(
        b.events()
            .iter()
            .any(|(action, reason, _)| action == "resume" && reason == "slurm"),
        "b says it resumed the job: {:?}",
        b.events()
    );
}

/// slurmctld is down when node a recovers: its resume fails, its tasks are continued by hand and
/// its hold stays in the comment. Once slurmctld is back and a's hold has run out, a (now a node
/// that sees the job suspended without holding it) resumes it.
#[test]
fn slurmctld_down_while_a_node_recovers() {
    let mut p = Pair::new();
    p.run(2, [0.97, 0.5]);
    assert!(p.holds(0));
    p.slurm.set_down(true);
    p.run(20, [0.5, 0.5]);
    assert!(!p.holds(0), "a's pause ended here all the same");
    p.slurm.set_down(false);
    p.run(HOLD_SECONDS + 15, [0.5, 0.5]);
    p.all_clear();
}
