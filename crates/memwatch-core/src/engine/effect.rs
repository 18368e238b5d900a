//! The engine's poll surface, outward: work it decided on that must not run on the owner task, as
//! data (`poll_effect`), and what came of it, back in (`handle_outcome`). The daemon's executor
//! (`src/daemon/executor.rs`) carries effects out and feeds every outcome back; a test drains them
//! and answers for the host instead.
//!
//! What stays inline, on the owner task, is what cannot wait: the write-ahead record of a pause,
//! then the freeze or the first SIGSTOP (through the engine's `HostDriver`).

use crate::held::Frozen;
use crate::held::Slurmctl;
use crate::seam::{SlurmAnswer, SlurmCall};

use super::{AdaptDone, AdaptTask, Engine, WayOutDone, WayOutTask};

/// Work the engine hands off, in the order it was decided.
#[derive(Debug)]
pub enum Effect {
    /// Watch a freeze settle (up to `freeze::SETTLE`).
    Settle {
        /// The job.
        job: String,
        /// Its frozen cgroup.
        frozen: Frozen,
    },
    /// One Slurm call for a whole job. Calls run one at a time, in order: a resume never overtakes
    /// the suspend it undoes.
    Slurm(SlurmRequest),
    /// Emergency swap made or removed.
    WayOut(WayOutTask),
    /// A config read, rewrite or check.
    Adapt(Box<AdaptTask>),
}

/// One Slurm call the engine asks for.
#[derive(Debug)]
pub struct SlurmRequest {
    /// The job (memwatch's name).
    pub job: String,
    /// The call.
    pub call: SlurmCall,
    /// The Slurm job's id.
    pub id: String,
    /// The commands and their timeout.
    pub ctl: Slurmctl,
    /// For a requeue or cancel that ends the job: why, for its event.
    pub ending: Option<Ending>,
}

impl SlurmRequest {
    /// What came of it.
    pub fn outcome(self, result: Result<SlurmAnswer, crate::seam::SlurmError>) -> Outcome {
        Outcome::Slurm {
            job: self.job,
            call: self.call,
            id: self.id,
            result,
            ending: self.ending,
        }
    }
}

/// Why a job is being ended through Slurm: its `terminate` event is recorded when Slurm answers.
#[derive(Debug, Clone)]
pub struct Ending {
    /// Why, for people.
    pub reason: String,
    /// Why, for the API.
    pub cause: crate::reason::Reason,
    /// What memwatch had stopped with signals: continued after the TERM if Slurm will not end the
    /// job and this node's processes are ended by hand.
    pub stopped: Vec<crate::host::ProcRef>,
}

/// What came of an effect.
#[derive(Debug)]
pub enum Outcome {
    /// A freeze settled, or did not within `freeze::SETTLE`.
    Settled {
        /// The job.
        job: String,
        /// Its cgroup.
        frozen: Frozen,
        /// Whether it froze.
        settled: bool,
    },
    /// A Slurm call finished.
    Slurm {
        /// The job (memwatch's name).
        job: String,
        /// The call.
        call: SlurmCall,
        /// The Slurm job's id.
        id: String,
        /// What Slurm said.
        result: Result<SlurmAnswer, crate::seam::SlurmError>,
        /// As the effect had it.
        ending: Option<Ending>,
    },
    /// Swap work finished.
    WayOut(WayOutDone),
    /// Config work finished.
    Adapted(AdaptDone),
}

impl Engine {
    /// The next effect to carry out, oldest first; `None` when there is nothing left. Drained after
    /// every `handle_*` call.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Queues an effect.
    pub(super) fn emit(&mut self, effect: Effect) {
        self.effects.push_back(effect);
    }

    /// Takes in what came of an effect.
    pub fn handle_outcome(&mut self, outcome: Outcome, now_ms: u64) {
        match outcome {
            Outcome::Settled {
                job,
                frozen,
                settled,
            } => self.freeze_settled(&job, &frozen, settled, now_ms),
            Outcome::Slurm {
                job,
                call,
                id,
                result,
                ending,
            } => self.slurm_done(&job, &call, &id, result, ending, now_ms),
            Outcome::WayOut(done) => self.way_out_done(done, now_ms),
            Outcome::Adapted(done) => self.adapt_done(done, now_ms),
        }
    }
}
