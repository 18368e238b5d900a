//! A suspension several nodes hold: while this node holds a Slurm job, each full sample checks it
//! through Slurm (`SlurmCall::Hold`: the job's state and holds read back, this node's hold renewed),
//! one check at a time; a job found running behind this node's back is suspended again and this
//! node's tasks stopped again; a resume other nodes' holds keep from being made still continues
//! this node's tasks.

use crate::seam::{SlurmAnswer, SlurmCall};

use super::harness::{Kind, PID, SLURM_ID, Sim};

/// The Slurm calls made for the job, as (call, id).
fn calls(s: &Sim, call: &SlurmCall) -> usize {
    s.slurm.iter().filter(|(c, _)| c == call).count()
}

#[test]
fn a_held_slurm_job_is_checked_once_a_sample_and_held_again_when_found_running() {
    let mut s = Sim::new(Kind::Slurm);
    s.sample(0.97);
    assert_eq!(
        s.pause().map(|p| p.phase),
        Some(crate::job::PausePhase::Held)
    );
    // Each full sample checks the hold; one check at a time while Slurm has not answered.
    s.slurm_held = true;
    for _ in 0..3 {
        s.now += 1000;
        s.sample(0.97);
    }
    assert_eq!(calls(&s, &SlurmCall::Hold), 1, "{:?}", s.slurm);
    s.answer_slurm();
    s.slurm_held = false;

    // Someone resumed the job, and SIGCONT reached this node's tasks: the check suspends the job
    // again and this node's tasks are stopped again.
    s.host.set_state(PID, 'S');
    s.host.set_state(PID + 1, 'S');
    s.slurm_answers
        .push_back((SlurmCall::Hold, SlurmAnswer::Resuspended));
    s.now += 1000;
    s.sample(0.97);
    assert_eq!(calls(&s, &SlurmCall::Hold), 2, "{:?}", s.slurm);
    assert_eq!(s.host.state_of(PID), Some('T'), "{:?}", s.host.acts());
    assert_eq!(s.host.state_of(PID + 1), Some('T'));
    let again = s
        .events()
        .into_iter()
        .filter(|(action, _, _)| action == "pause")
        .count();
    assert_eq!(
        again,
        2,
        "the first pause and the hold again: {:?}",
        s.events()
    );
    assert!(s.pause().is_some());

    // This node has room; other nodes still hold the job: its tasks here run again all the same
    // (Slurm's own suspension holds them where it is made with the freezer) and the pause ends.
    s.slurm_answers
        .push_back((SlurmCall::Resume, SlurmAnswer::KeptBy(vec!["node2".into()])));
    for _ in 0..10 {
        s.now += 1000;
        s.sample(0.5);
    }
    assert!(s.pause().is_none(), "{:?}", s.events());
    assert!(s.all_running(), "{:?}", s.host.acts());
    assert_eq!(s.slurm.last(), Some(&(SlurmCall::Resume, SLURM_ID.into())));
    // No check once the pause is over.
    let checks = calls(&s, &SlurmCall::Hold);
    s.now += 1000;
    s.sample(0.5);
    assert_eq!(calls(&s, &SlurmCall::Hold), checks);
}

/// A job another node suspended through Slurm (its cgroups frozen by Slurm here, no pause of this
/// node's): shown paused on this node, with since when and which nodes hold it, and counted by
/// `memwatch_job_paused`; running again once Slurm resumes it. This node makes no pause of its own,
/// and its only Slurm calls read the holders: at once, then every 10 s.
#[test]
fn a_job_another_node_suspended_shows_paused_here_with_who_holds_it() {
    let mut s = Sim::new(Kind::Slurm);
    s.slurm_suspended = Some(false);
    s.sample(0.5);
    let view = |s: &Sim| s.engine.view().jobs.into_iter().next().expect("the job");
    assert_eq!(view(&s).state, "running");
    assert!(view(&s).slurm_holders.is_empty());
    s.slurm_suspended = Some(true);
    s.now += 1000;
    let since = s.now;
    s.slurm_answers.push_back((
        SlurmCall::Holders,
        SlurmAnswer::Holders(vec!["node1".into()]),
    ));
    s.sample(0.5);
    for _ in 0..5 {
        let v = view(&s);
        assert_eq!(v.state, "paused");
        assert_eq!(v.slurm_suspended_since_ms, Some(since));
        assert_eq!(v.slurm_holders, ["node1"]);
        assert!(v.pause.is_none(), "not this node's pause: {:?}", v.pause);
        s.now += 1000;
        s.sample(0.5);
    }
    assert_eq!(
        s.slurm,
        [(SlurmCall::Holders, SLURM_ID.to_owned())],
        "one read of the holders"
    );
    s.now += 10_000;
    s.slurm_answers.push_back((
        SlurmCall::Holders,
        SlurmAnswer::Holders(vec!["node1".into(), "node3".into()]),
    ));
    s.sample(0.5);
    assert_eq!(calls(&s, &SlurmCall::Holders), 2, "{:?}", s.slurm);
    assert_eq!(view(&s).slurm_holders, ["node1", "node3"]);
    assert!(s.slurm.iter().all(|(c, _)| *c == SlurmCall::Holders));
    // Slurm cannot answer: the read is tried again 10 s later, not at every sample.
    s.slurm_fails = true;
    s.now += 10_000;
    s.sample(0.5);
    for _ in 0..5 {
        s.now += 1000;
        s.sample(0.5);
    }
    assert_eq!(calls(&s, &SlurmCall::Holders), 3, "{:?}", s.slurm);
    s.slurm_fails = false;
    s.slurm_suspended = Some(false);
    s.sample(0.5);
    let v = view(&s);
    assert_eq!(v.state, "running");
    assert_eq!(v.slurm_suspended_since_ms, None);
    assert!(v.slurm_holders.is_empty());
}

/// Slurm's word checked by a restarted daemon too: it goes on holding the Slurm suspension its
/// predecessor recorded, and its first full sample reads the job back. The job was resumed while no
/// daemon ran (and SIGCONT reached this node's tasks): it is suspended again and the tasks here are
/// stopped again.
#[test]
fn a_restarted_daemon_reads_its_slurm_suspension_back_and_holds_the_job_again() {
    let mut s = Sim::new(Kind::Slurm);
    s.sample(0.97);
    assert!(s.pause().is_some_and(|p| p.suspended().is_some()));
    s.now += 500;
    s.restart();
    assert!(s.pause().is_some(), "not held on: {:?}", s.events());
    let checks = calls(&s, &SlurmCall::Hold);
    // Resumed behind its back while the daemon was down.
    s.host.set_state(PID, 'S');
    s.host.set_state(PID + 1, 'S');
    s.slurm_answers
        .push_back((SlurmCall::Hold, SlurmAnswer::Resuspended));
    s.now += 1000;
    s.sample(0.97);
    assert_eq!(calls(&s, &SlurmCall::Hold), checks + 1, "{:?}", s.slurm);
    assert_eq!(s.host.state_of(PID), Some('T'), "{:?}", s.host.acts());
    assert_eq!(s.host.state_of(PID + 1), Some('T'));
    let at = s.now;
    assert!(
        s.events()
            .iter()
            .any(|(action, reason, t)| action == "pause" && reason == "slurm" && *t == at),
        "{:?}",
        s.events()
    );
}

/// A freeze undone behind the engine's back (on cgroup v2 `docker unpause` writes the job's own
/// `cgroup.freeze`): the next full sample finds it thawed, freezes it again and says so; a freeze
/// that holds is left alone.
#[test]
fn a_freeze_undone_by_another_is_made_again_at_the_next_sample() {
    for kind in [Kind::V2, Kind::V1] {
        let mut s = Sim::new(kind);
        s.sample(0.97);
        let f = s
            .pause()
            .and_then(|p| p.held_freezer().cloned())
            .unwrap_or_else(|| panic!("{kind:?}: held by a freezer: {:?}", s.pause()));
        assert!(s.host.frozen(&f.dir));
        s.now += 1000;
        s.sample(0.97);
        let again = |s: &Sim| {
            s.engine
                .view()
                .events
                .iter()
                .filter(|e| e.reason == crate::reason::Reason::Freeze)
                .count()
        };
        assert_eq!(again(&s), 0, "{kind:?}: a held freeze is left alone");
        s.host.set_frozen(&f.dir, false);
        s.now += 1000;
        s.sample(0.97);
        assert!(s.host.frozen(&f.dir), "{kind:?}: frozen again");
        assert_eq!(again(&s), 1, "{kind:?}: {:?}", s.engine.view().events);
        assert_eq!(
            s.pause().map(|p| (p.phase, p.mechanism.name())),
            Some((crate::job::PausePhase::Held, f_kind(kind)))
        );
    }
}

fn f_kind(kind: Kind) -> &'static str {
    match kind {
        Kind::V1 => "cgroup_v1_freezer",
        _ => "cgroup_v2_freeze",
    }
}
