//! The checkpoint signal before a pause (`policy.checkpoint_signal`): a job at its critical line is
//! asked to save first, through its root, and paused only when the grace runs out; a Slurm job
//! attached by id is asked through Slurm, every task on every node.

use crate::seam::SlurmCall;

use super::harness::{ALL, Kind, PID, SLURM_ID, Sim};
use super::host::Act;
use crate::config::SignalName;

const CONFIG: &str = "[policy]\ncheckpoint_signal = \"SIGUSR1\"\ncheckpoint_grace_ms = 2000\n";

#[test]
fn a_critical_job_is_asked_to_checkpoint_then_paused_when_the_grace_runs_out() {
    let usr1 = SignalName::parse("SIGUSR1").expect("a signal name");
    for kind in ALL {
        let mut s = Sim::with(kind, CONFIG, &[]);
        s.sample(0.97);
        assert!(s.pause().is_none(), "{kind:?}: paused before the grace");
        let asked: Vec<_> = s
            .events()
            .into_iter()
            .filter(|e| e.0 == "checkpoint")
            .collect();
        assert_eq!(asked.len(), 1, "{kind:?}: {:?}", s.events());
        assert_eq!(asked[0].1, "host_memory", "{kind:?}");
        // Asked through its root, whatever holds its pause (this Slurm job is attached by pid).
        assert_eq!(
            s.host
                .acts()
                .iter()
                .filter(|a| **a == Act::Signal(PID, usr1))
                .count(),
            1,
            "{kind:?}: {:?}",
            s.host.acts()
        );
        assert!(s.slurm.is_empty(), "{kind:?}: {:?}", s.slurm);
        assert!(s.all_running(), "{kind:?}: stopped while it saves");

        // Within the grace: asked once, still running.
        s.now += 1000;
        s.sample(0.97);
        assert!(s.pause().is_none(), "{kind:?}");
        assert_eq!(s.events().iter().filter(|e| e.0 == "checkpoint").count(), 1);

        // The grace is over and the job is still critical: paused.
        s.now += 1500;
        s.sample(0.97);
        assert!(s.pause().is_some(), "{kind:?}: {:?}", s.events());
        let pause = s.event_at("pause").expect("a pause event");
        let checkpoint = s.event_at("checkpoint").expect("a checkpoint event");
        assert!(
            checkpoint + 2000 <= pause,
            "{kind:?}: {checkpoint} then {pause}"
        );
        s.check();
    }
}

/// A job whose host recovers while it saves (the level back below critical within the grace) is
/// never paused.
#[test]
fn a_job_that_recovers_within_the_grace_runs_on() {
    let config = "[policy]\ncheckpoint_signal = \"SIGUSR1\"\ncheckpoint_grace_ms = 60000\n";
    for kind in ALL {
        let mut s = Sim::with(kind, config, &[]);
        s.sample(0.97);
        assert_eq!(s.events().iter().filter(|e| e.0 == "checkpoint").count(), 1);
        for _ in 0..30 {
            s.now += 1000;
            s.sample(0.5);
        }
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        assert!(s.all_running(), "{kind:?}");
        assert!(
            !s.events().iter().any(|e| e.0 == "pause"),
            "{kind:?}: {:?}",
            s.events()
        );
        s.check();
    }
}

/// A Slurm job attached by id (`memwatch attach --slurm-job`) is asked through Slurm (`scancel
/// --signal`, every task on every node), not through this node's root alone.
#[test]
fn a_slurm_job_attached_by_id_is_asked_through_slurm() {
    let usr1 = SignalName::parse("SIGUSR1").expect("a signal name");
    let mut s = Sim::with(Kind::Slurm, CONFIG, &[]);
    let r = s.cmd(serde_json::json!({"cmd": "detach", "target": "sim"}));
    assert!(r.ok, "detach: {:?}", r.error);
    // No Slurm cgroup plugin here: its tasks come from `scontrol listpids`.
    *s.host.listpids.lock().unwrap() = Some(vec![PID, PID + 1]);
    let r = s.cmd_as(
        0,
        serde_json::json!({"cmd": "attach_slurm", "job_id": SLURM_ID, "name": "sim"}),
    );
    assert!(r.ok, "attach by id: {:?}", r.error);
    s.sample(0.97);
    assert!(s.pause().is_none(), "paused before the grace");
    assert!(
        s.slurm
            .contains(&(SlurmCall::Signal("USR1".into()), SLURM_ID.into())),
        "{:?}",
        s.slurm
    );
    assert!(
        !s.host.acts().contains(&Act::Signal(PID, usr1)),
        "{:?}",
        s.host.acts()
    );
    assert_eq!(s.events().iter().filter(|e| e.0 == "checkpoint").count(), 1);
    s.check();
}
