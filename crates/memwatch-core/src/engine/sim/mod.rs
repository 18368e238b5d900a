//! The engine simulator: a host in memory (`host.rs`: the engine's view and driver, its state file
//! and audit log) and a clock the test moves drive the real engine through (state, input) → effects, with the invariants checked after every step
//! (`Sim::check`): one pause record per job, the state file's record the engine's own, every
//! freeze, stop and Slurm suspend preceded by its persisted record, nothing done to another user's
//! process, no deadline left behind. Each case runs for every mechanism a job can be held by
//! (signals, the v1 freezer, v2's cgroup.freeze, Slurm) where it applies. No case spawns a process
//! or touches a real cgroup.

mod calm;
mod checkpoint;
pub(super) mod harness;
mod holds;
pub(super) mod host;
mod kills;
mod lifecycle;
mod oomd;
pub(super) mod pair;
mod predicted;
mod prepared;
mod reclaim;
mod reflex;
mod spared;
mod thermal;

use crate::seam::SlurmCall;
use harness::{ALL, Kind, OWNER, PID, SLURM_ID, Sim};
use host::Act;

pub(crate) fn pause_cmd() -> serde_json::Value {
    serde_json::json!({"cmd": "pause", "target": "sim"})
}

pub(crate) fn resume_cmd() -> serde_json::Value {
    serde_json::json!({"cmd": "resume", "target": "sim"})
}

/// A pause by hand is held by the mechanism `Mechanism::choose` picks for the job, and a resume
/// undoes exactly it.
#[test]
fn a_pause_by_hand_is_held_by_the_jobs_mechanism_and_undone() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        assert!(s.cmd(pause_cmd()).ok);
        let p = s.pause().expect("paused");
        assert_eq!(p.mechanism.name(), kind.record(), "{kind:?}");
        assert!(s.held(), "{kind:?}: not held: {:?}", s.host.acts());
        assert_eq!(p.phase, crate::job::PausePhase::Held, "{kind:?}");
        assert!(s.cmd(resume_cmd()).ok);
        assert!(s.pause().is_none());
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
        if kind == Kind::Slurm {
            assert_eq!(
                s.slurm,
                vec![
                    (SlurmCall::Suspend, SLURM_ID.into()),
                    (SlurmCall::Resume, SLURM_ID.into())
                ]
            );
        }
    }
}

/// Stop here first, then everywhere: a pause through Slurm stops this node's tasks at once, before
/// Slurm has answered (a rank growing fast would outrun scontrol), keeps them stopped once the
/// suspension holds, and continues them only when the job is resumed, after `scontrol resume`.
#[test]
fn a_slurm_pause_stops_this_nodes_tasks_before_slurm_answers() {
    let mut s = Sim::new(Kind::Slurm);
    s.slurm_held = true;
    s.sample(0.97);
    let p = s.pause().expect("paused");
    assert_eq!(p.phase, crate::job::PausePhase::Pausing);
    assert_eq!(
        s.host.state_of(PID),
        Some('T'),
        "not stopped before Slurm answered: {:?}",
        s.host.acts()
    );
    assert_eq!(s.pause().unwrap().stopped.len(), 2, "{:?}", s.pause());
    // The record names what was stopped, for a restarted daemon and the guardian.
    assert_eq!(
        s.host.state()["jobs"][0]["paused"]["stopped"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "{}",
        s.host.state()
    );
    s.answer_slurm();
    assert_eq!(s.pause().unwrap().phase, crate::job::PausePhase::Held);
    assert_eq!(
        s.host.state_of(PID),
        Some('T'),
        "released once Slurm held it"
    );
    for _ in 0..10 {
        s.now += 1000;
        s.sample(0.5);
        s.answer_slurm();
    }
    assert!(s.pause().is_none(), "{:?}", s.events());
    assert!(s.all_running(), "{:?}", s.host.acts());
    assert_eq!(
        s.slurm.last(),
        Some(&(SlurmCall::Resume, SLURM_ID.into())),
        "{:?}",
        s.slurm
    );
}

/// Host memory past critical pauses the job through the policy; back under the line (after the
/// hold time) resumes it.
#[test]
fn host_memory_pauses_through_the_policy_and_recovery_resumes() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        s.sample(0.5);
        assert!(s.pause().is_none());
        s.now += 1000;
        s.sample(0.97);
        let p = s
            .pause()
            .unwrap_or_else(|| panic!("{kind:?}: {:?}", s.events()));
        assert_eq!(p.mechanism.name(), kind.record());
        assert!(s.held());
        for _ in 0..10 {
            s.now += 1000;
            s.sample(0.5);
        }
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        assert!(s.all_running(), "{kind:?}");
        assert!(
            s.events()
                .iter()
                .any(|(a, r, _)| a == "resume" && r == "recovered"),
            "{:?}",
            s.events()
        );
    }
}

/// A second pause of a job being paused does nothing (the record is the mark, keyed by the job):
/// one Slurm suspend, one freeze, one stop.
#[test]
fn a_second_pause_while_pausing_does_nothing() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        s.slurm_held = true;
        s.host.faults.lock().unwrap().freeze_slow = true;
        assert!(s.cmd(pause_cmd()).ok);
        let first = s.pause().unwrap();
        let second = s.cmd(pause_cmd());
        assert!(!second.ok || s.pause().unwrap().since_ms == first.since_ms);
        let acts = s.host.acts();
        let freezes = acts.iter().filter(|a| matches!(a, Act::Freeze(_))).count();
        let stops = acts
            .iter()
            .filter(|a| matches!(a, Act::StopTree(_)))
            .count();
        let suspends = s
            .slurm
            .iter()
            .filter(|(c, _)| *c == SlurmCall::Suspend)
            .count();
        // A Slurm pause stops this node's tasks first, then asks Slurm: one of each.
        let expected = if kind == Kind::Slurm { 2 } else { 1 };
        assert!(
            freezes + stops + suspends == expected,
            "{kind:?}: {acts:?} {:?}",
            s.slurm
        );
        if kind == Kind::Slurm || kind == Kind::V1 || kind == Kind::V2 {
            assert_eq!(s.pause().unwrap().phase, crate::job::PausePhase::Pausing);
        }
        s.answer_slurm();
        s.settle(true);
        assert_eq!(
            s.pause().unwrap().phase,
            crate::job::PausePhase::Held,
            "{kind:?}"
        );
    }
}

/// A mechanism that fails falls back to signals: the record then names signals and the stopped
/// processes; and a job whose signals fail too is left with no pause and nothing stopped.
#[test]
fn a_failing_mechanism_falls_back_to_signals() {
    for kind in [Kind::V1, Kind::V2, Kind::Slurm] {
        let mut s = Sim::new(kind);
        s.host.faults.lock().unwrap().freeze_fails = true;
        s.slurm_fails = true;
        assert!(s.cmd(pause_cmd()).ok);
        let p = s
            .pause()
            .unwrap_or_else(|| panic!("{kind:?}: {:?}", s.events()));
        assert_eq!(p.mechanism.name(), "signals", "{kind:?}");
        assert_eq!(
            p.stopped.iter().map(|r| r.pid).collect::<Vec<_>>(),
            vec![PID, PID + 1]
        );
        assert_eq!(s.host.state_of(PID), Some('T'));
        assert!(s.cmd(resume_cmd()).ok);
        assert!(s.all_running(), "{kind:?}");
    }
    let mut s = Sim::new(Kind::Signals);
    s.host.faults.lock().unwrap().stop_fails = true;
    let r = s.cmd(pause_cmd());
    assert!(!r.ok || s.pause().is_none());
    assert!(s.pause().is_none());
    assert!(s.all_running());
}

/// A freeze that does not settle at once is `Pausing` until it does; one that never settles is
/// thawed and the job stopped with signals.
#[test]
fn a_slow_freeze_settles_or_falls_back() {
    for kind in [Kind::V1, Kind::V2] {
        for settles in [true, false] {
            let mut s = Sim::new(kind);
            s.host.faults.lock().unwrap().freeze_slow = true;
            assert!(s.cmd(pause_cmd()).ok);
            assert_eq!(s.pause().unwrap().phase, crate::job::PausePhase::Pausing);
            s.settle(settles);
            let p = s.pause().unwrap();
            assert_eq!(p.phase, crate::job::PausePhase::Held);
            if settles {
                assert_eq!(p.mechanism.name(), kind.record());
            } else {
                assert_eq!(p.mechanism.name(), "signals");
                assert_eq!(s.host.state_of(PID), Some('T'));
                let dir = harness::cgroup_dir(&s.root(), kind).unwrap();
                assert!(!s.host.frozen(&dir), "{kind:?}: left frozen");
            }
        }
    }
}

/// A pause that cannot be recorded is refused before anything is stopped.
#[test]
fn a_pause_that_cannot_be_recorded_stops_nothing() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        s.host.faults.lock().unwrap().state_fails = true;
        let r = s.cmd(pause_cmd());
        assert!(!r.ok, "{kind:?}: a pause with no record was accepted");
        assert!(s.pause().is_none());
        assert!(s.host.acts().is_empty(), "{kind:?}: {:?}", s.host.acts());
        assert!(s.slurm.is_empty());
    }
}

/// A memory pause no way out can help ends at the longest pause (samples 10 s apart): the way out's
/// decision at `decide_seconds` and the stop at `max_pause_seconds` each come at their deadline,
/// woken by `poll_timeout`, not by a sample.
#[test]
fn the_longest_pause_ends_at_its_deadline() {
    for kind in ALL {
        let mut s = Sim::with(
            kind,
            "[policy]\nmax_pause_seconds = 30\n[way_out]\ndecide_seconds = 5\n",
            &[],
        );
        s.sample(0.97);
        let since = s.pause().expect("paused").since_ms;
        let mut woke = Vec::new();
        for _ in 0..5 {
            let next = s.now + 10_000;
            woke.extend(s.advance_to(next));
            s.sample(0.97);
        }
        for due in [since + 5_000, since + 30_000] {
            assert!(woke.contains(&due), "{kind:?}: woke at {woke:?}, due {due}");
        }
        let at = |action: &str, reason: &str| {
            s.events()
                .into_iter()
                .find(|(a, r, _)| a == action && r == reason)
                .map(|e| e.2)
        };
        assert_eq!(at("way_out", "no_way_out"), Some(since + 5_000), "{kind:?}");
        assert_eq!(at("terminate", "way_out"), Some(since + 30_000), "{kind:?}");
    }
}

/// `on_max_pause = "terminate"`: SIGTERM at the longest pause, SIGKILL at the grace's end (10 s),
/// each at its deadline; a Slurm job is requeued through Slurm instead.
#[test]
fn terminate_and_its_grace_end_at_their_deadlines() {
    for kind in ALL {
        let mut s = Sim::with(
            kind,
            "[policy]\nmax_pause_seconds = 5\non_max_pause = \"terminate\"\n",
            &[],
        );
        assert!(s.cmd(pause_cmd()).ok);
        // A pause by hand has no longest pause: nothing is due.
        s.advance_to(s.now + 60_000);
        assert!(s.event_at("terminate").is_none());
        assert!(s.cmd(resume_cmd()).ok);
        s.sample(0.97);
        let since = s.pause().expect("paused").since_ms;
        s.advance_to(since + 30_000);
        let terminated = s.event_at("terminate");
        assert_eq!(
            terminated,
            Some(since + 5_000),
            "{kind:?}: {:?}",
            s.events()
        );
        if kind == Kind::Slurm {
            assert!(s.slurm.contains(&(SlurmCall::Requeue, SLURM_ID.into())));
        } else {
            assert!(
                s.host
                    .acts()
                    .contains(&Act::Signal(PID, crate::config::SignalName::TERM))
            );
        }
        assert_eq!(
            s.event_at("kill"),
            Some(since + 15_000),
            "{kind:?}: {:?}",
            s.events()
        );
    }
}

/// Detaching a paused job resumes it first.
#[test]
fn detaching_a_paused_job_resumes_it() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        assert!(s.cmd(pause_cmd()).ok);
        assert!(
            s.cmd(serde_json::json!({"cmd": "detach", "target": "sim"}))
                .ok
        );
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
        assert!(s.host.state()["jobs"].as_array().is_some_and(Vec::is_empty));
    }
}

/// Another user's process in the job's cgroup keeps the freezer out: the job is stopped with
/// signals, and that process is never touched.
#[test]
fn another_users_process_keeps_the_freezer_out() {
    for kind in [Kind::V1, Kind::V2] {
        let stranger = PID + 7;
        let mut s = Sim::with(kind, "", &[(stranger, 0)]);
        assert!(s.cmd(pause_cmd()).ok);
        let p = s.pause().unwrap();
        assert_eq!(p.mechanism.name(), "signals", "{kind:?}");
        assert_eq!(s.host.state_of(stranger), Some('S'));
        assert!(
            !s.host.acts().iter().any(|a| matches!(a, Act::Freeze(_))),
            "{kind:?}: {:?}",
            s.host.acts()
        );
    }
}

/// Another user cannot pause the job; nothing is done to it.
#[test]
fn another_user_cannot_pause_the_job() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        let r = s.cmd_as(OWNER + 1, pause_cmd());
        assert!(!r.ok);
        assert!(s.host.acts().is_empty() && s.slurm.is_empty(), "{kind:?}");
    }
}

/// A resume while Slurm still works on the suspend is queued behind it; the job ends up running.
#[test]
fn a_resume_during_a_slurm_suspend_comes_after_it() {
    let mut s = Sim::new(Kind::Slurm);
    s.slurm_held = true;
    assert!(s.cmd(pause_cmd()).ok);
    assert!(s.cmd(resume_cmd()).ok);
    s.answer_slurm();
    s.answer_slurm();
    assert_eq!(
        s.slurm,
        vec![
            (SlurmCall::Suspend, SLURM_ID.into()),
            (SlurmCall::Resume, SLURM_ID.into())
        ]
    );
    assert!(s.pause().is_none());
}

/// A step the way out cannot take is skipped with its typed reason (`WhyNot`), shown to people as
/// its `Display`: emergency swap needs a fix to apply (no config file here), a loan needs
/// `way_out.lend`; with both skipped there is no way out.
#[test]
fn a_skipped_step_says_why_not() {
    use crate::engine::WhyNot;
    for kind in ALL {
        let mut s = Sim::with(
            kind,
            "[way_out]\nsteps = [\"swap\", \"lend\"]\ndecide_seconds = 5\n",
            &[],
        );
        s.sample(0.97);
        assert!(s.pause().is_some(), "{kind:?}: not paused");
        let next = s.now + 10_000;
        s.advance_to(next);
        s.sample(0.97);
        let view = s.engine.view();
        let w = view
            .jobs
            .iter()
            .find(|j| j.name == "sim")
            .and_then(|j| j.way_out.clone())
            .expect("a way out");
        let outcomes: Vec<(String, String)> = w
            .taken
            .iter()
            .map(|t| (t.step.clone(), t.outcome.clone()))
            .collect();
        assert_eq!(
            outcomes,
            [
                (
                    "swap".to_owned(),
                    format!(
                        "skipped: {}",
                        WhyNot::NothingToReclaim {
                            no_fix: Box::new(WhyNot::NoConfig)
                        }
                    )
                ),
                (
                    "lend".to_owned(),
                    format!("skipped: {}", WhyNot::LendNotAllowed)
                ),
            ],
            "{kind:?}"
        );
        assert!(
            s.events()
                .iter()
                .any(|(a, r, _)| a == "way_out" && r == "no_way_out"),
            "{kind:?}: {:?}",
            s.events()
        );
        s.check();
    }
}

/// The daemon never attaches what would stop it: itself, an ancestor of it, pid 1 or a process
/// that is not there; each refusal says which, changes nothing, and the job already attached runs
/// on.
#[test]
fn the_daemon_never_attaches_itself_an_ancestor_or_init() {
    let mut s = Sim::new(Kind::Signals);
    // The daemon runs below the job's worker (started by hand from a shell in the job, say).
    s.host.add_process(host::DAEMON_PID, PID + 1, 0, "0::/\n");
    let attach = |pid: u32| serde_json::json!({"cmd": "attach", "pid": pid, "name": "x"});
    for (pid, said) in [
        (host::DAEMON_PID, "the memwatch daemon itself"),
        (PID + 1, "an ancestor of the memwatch daemon"),
        (1, "refusing to attach to pid 1"),
        (4242, "no process with pid 4242"),
    ] {
        let r = s.cmd_as(0, attach(pid));
        assert!(!r.ok, "pid {pid} was attached");
        let error = r.error.unwrap_or_default();
        assert!(error.contains(said), "pid {pid}: {error}");
    }
    assert!(s.host.acts().is_empty(), "{:?}", s.host.acts());
    let jobs: Vec<String> = s
        .engine
        .view()
        .jobs
        .iter()
        .map(|j| j.name.clone())
        .collect();
    assert_eq!(jobs, ["sim"]);
}
