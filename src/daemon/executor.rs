//! The one executor of the engine's effects (`Engine::poll_effect`): each carried out off the owner
//! task, its outcome fed back through one bounded channel (`Engine::handle_outcome`). Slurm calls
//! run one at a time on a thread of their own, in the order the engine decided them (a resume never
//! overtakes the suspend it undoes); the rest run on tokio's blocking pool.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::act::driver::{Host, HostDriver};
use crate::act::freeze::Freezing as _;
use crate::engine::{Effect, Engine, Outcome, SlurmRequest};

/// Outcomes that may wait for the owner task at once.
pub const OUTCOME_CAPACITY: usize = 64;
/// Slurm calls that may wait for the Slurm thread.
const SLURM_QUEUE: usize = 256;
/// How long the stop waits for Slurm calls under way.
const FLUSH_WAIT: Duration = Duration::from_secs(30);

/// What the Slurm thread is asked.
enum ToSlurm {
    Call(Box<SlurmRequest>),
    /// Answer once every call queued before this one has finished.
    Flush(std_mpsc::Sender<()>),
}

/// Carries out effects; see the module's doc.
pub struct Executor {
    outcomes: mpsc::Sender<Outcome>,
    slurm: std_mpsc::SyncSender<ToSlurm>,
    host: Host,
}

impl Executor {
    /// An executor acting on the machine under `process_root`, and where its outcomes arrive.
    pub fn start(process_root: &std::path::Path) -> (Executor, mpsc::Receiver<Outcome>) {
        let (outcomes, rx) = mpsc::channel(OUTCOME_CAPACITY);
        let (slurm, work) = std_mpsc::sync_channel::<ToSlurm>(SLURM_QUEUE);
        let host = Host::new(process_root);
        let (tx, worker_host) = (outcomes.clone(), host.clone());
        let spawned = std::thread::Builder::new()
            .name("slurm-calls".into())
            .spawn(move || {
                while let Ok(msg) = work.recv() {
                    match msg {
                        ToSlurm::Call(w) => {
                            let outcome = run_slurm(&worker_host, *w);
                            if tx.blocking_send(outcome).is_err() {
                                break;
                            }
                        }
                        ToSlurm::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the Slurm thread; Slurm calls will fail and fall back to signals");
        }
        (
            Executor {
                outcomes,
                slurm,
                host,
            },
            rx,
        )
    }

    /// Carries out every effect the engine has queued; call after every `handle_*`.
    pub fn drain(&self, engine: &mut Engine, now_ms: u64) {
        while let Some(effect) = engine.poll_effect() {
            if let Some(refused) = self.run(effect) {
                engine.handle_outcome(refused, now_ms);
            }
        }
    }

    /// Hands one effect off; an outcome at once when it could not be (the Slurm queue full).
    fn run(&self, effect: Effect) -> Option<Outcome> {
        match effect {
            Effect::Settle { job, frozen } => {
                let tx = self.outcomes.clone();
                tokio::task::spawn_blocking(move || {
                    let settled = frozen.settled_within(crate::act::freeze::SETTLE);
                    let _ = tx.blocking_send(Outcome::Settled {
                        job,
                        frozen,
                        settled,
                    });
                });
                None
            }
            Effect::Slurm(request) => match self.slurm.try_send(ToSlurm::Call(Box::new(request))) {
                Ok(()) => None,
                Err(std_mpsc::TrySendError::Full(ToSlurm::Call(r)))
                | Err(std_mpsc::TrySendError::Disconnected(ToSlurm::Call(r))) => {
                    Some(r.outcome(Err(crate::act::slurm::SlurmError::Busy)))
                }
                Err(_) => None,
            },
            Effect::WayOut(task) => {
                let tx = self.outcomes.clone();
                tokio::task::spawn_blocking(move || {
                    let _ = tx.blocking_send(Outcome::WayOut(
                        crate::work::way_out::run_way_out_task(task),
                    ));
                });
                None
            }
            Effect::Adapt(task) => {
                let tx = self.outcomes.clone();
                tokio::task::spawn_blocking(move || {
                    let _ = tx
                        .blocking_send(Outcome::Adapted(crate::work::adapt::run_adapt_task(*task)));
                });
                None
            }
        }
    }

    /// At stop, after `Engine::shutdown`: waits for the Slurm calls under way, takes in every
    /// outcome that came, and carries out what is left here and now (the resumes a stop makes),
    /// feeding each outcome straight back. Swap and config work not yet started is dropped.
    pub fn finish(
        &self,
        engine: &mut Engine,
        outcomes: &mut mpsc::Receiver<Outcome>,
        now: impl Fn() -> u64,
    ) {
        let (done, flushed) = std_mpsc::channel();
        if self.slurm.send(ToSlurm::Flush(done)).is_ok()
            && flushed.recv_timeout(FLUSH_WAIT).is_err()
        {
            tracing::warn!("Slurm calls still under way at stop");
        }
        loop {
            let mut any = false;
            while let Ok(o) = outcomes.try_recv() {
                engine.handle_outcome(o, now());
                any = true;
            }
            while let Some(effect) = engine.poll_effect() {
                any = true;
                match effect {
                    Effect::Slurm(request) => {
                        engine.handle_outcome(run_slurm(&self.host, request), now());
                    }
                    Effect::Settle { job, frozen } => {
                        let settled = frozen.settled_within(crate::act::freeze::SETTLE);
                        engine.handle_outcome(
                            Outcome::Settled {
                                job,
                                frozen,
                                settled,
                            },
                            now(),
                        );
                    }
                    Effect::WayOut(_) | Effect::Adapt(_) => {}
                }
            }
            if !any {
                break;
            }
        }
    }
}

/// Runs one Slurm call.
fn run_slurm(host: &Host, request: SlurmRequest) -> Outcome {
    let result = host.slurm(&request.ctl, &request.call, &request.id);
    request.outcome(result)
}
