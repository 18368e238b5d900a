//! The daemon's stop and restart: a stop resumes every pause, a stop for a restart keeps the policy's
//! pauses for the successor, a restarted engine holds or undoes what it finds (records of every
//! version, a mechanism it does not know), and gives loans back the way they were made.

use super::harness::{self, ALL, Kind, OWNER, PID, SLURM_ID, Sim};
use super::host::Act;
use super::pause_cmd;
use crate::seam::SlurmCall;

/// The daemon's stop resumes every paused job, whatever holds it.
#[test]
fn a_stop_resumes_every_mechanism() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        assert!(s.cmd(pause_cmd()).ok);
        s.engine.shutdown(s.now, false);
        s.drain();
        s.check();
        assert!(s.pause().is_none());
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
        if kind == Kind::Slurm {
            assert_eq!(s.slurm.last(), Some(&(SlurmCall::Resume, SLURM_ID.into())));
        }
    }
}

/// A stop for a restart (the service manager restarts the daemon) keeps a pause the policy holds,
/// untouched and recorded held, for the successor, which goes on holding it; a pause by hand is
/// resumed as at any stop.
#[test]
fn a_stop_for_a_restart_keeps_a_policy_pause_for_the_successor() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        s.sample(0.97);
        let before = s.pause().expect("paused");
        let acts = s.host.acts().len();
        let calls = s.slurm.len();
        let kept = s.engine.shutdown(s.now, true);
        s.drain();
        s.check();
        assert_eq!(kept, vec!["sim".to_string()], "{kind:?}");
        assert_eq!(
            s.host.acts().len(),
            acts,
            "{kind:?}: the stop acted: {:?}",
            &s.host.acts()[acts..]
        );
        assert_eq!(s.slurm.len(), calls, "{kind:?}");
        assert!(s.held(), "{kind:?}");
        assert_eq!(
            s.host.state()["jobs"][0]["paused"]["phase"],
            "held",
            "{kind:?}: {}",
            s.host.state()
        );
        s.now += 500;
        s.restart();
        let after = s
            .pause()
            .unwrap_or_else(|| panic!("{kind:?}: not held after the restart: {:?}", s.events()));
        assert_eq!(after.since_ms, before.since_ms, "{kind:?}");
        assert!(s.held(), "{kind:?}");

        let mut s = Sim::new(kind);
        assert!(s.cmd(pause_cmd()).ok);
        assert!(s.engine.shutdown(s.now, true).is_empty(), "{kind:?}");
        s.drain();
        assert!(s.pause().is_none(), "{kind:?}");
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
    }
}

/// A restarted daemon goes on holding a pause the policy made, by the same mechanism, touching
/// nothing, and resumes it once its cause is read recovered; a pause by hand is undone instead.
#[test]
fn a_restart_holds_a_policy_pause_and_undoes_a_hand_pause() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        s.sample(0.97);
        let before = s.pause().expect("paused");
        let acts = s.host.acts().len();
        let calls = s.slurm.len();
        s.now += 500;
        s.restart();
        let after = s
            .pause()
            .unwrap_or_else(|| panic!("{kind:?}: not held: {:?}", s.events()));
        assert_eq!(after.mechanism, before.mechanism, "{kind:?}");
        assert_eq!(after.since_ms, before.since_ms, "{kind:?}");
        assert_eq!(after.held.reasons, before.held.reasons, "{kind:?}");
        assert_eq!(
            s.host.acts().len(),
            acts,
            "{kind:?}: {:?}",
            &s.host.acts()[acts..]
        );
        assert_eq!(s.slurm.len(), calls);
        assert!(s.held(), "{kind:?}");
        s.now += 1000;
        s.sample(0.97);
        assert!(
            s.pause().is_some(),
            "{kind:?}: resumed while still short of memory"
        );
        for _ in 0..10 {
            s.now += 1000;
            s.sample(0.5);
        }
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        assert!(s.all_running(), "{kind:?}");

        let mut s = Sim::new(kind);
        assert!(s.cmd(pause_cmd()).ok);
        s.restart();
        assert!(
            s.pause().is_none(),
            "{kind:?}: a pause by hand carried over"
        );
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
    }
}

/// A restarted engine undoes a version 1 record (the format before the pause named its mechanism)
/// and a version 2 one, from the record alone.
#[test]
fn recovery_undoes_version_1_and_version_2_records() {
    for (kind, v1) in [
        (Kind::V1, r#""frozen": {"version": 1, "dir": "DIR"}"#),
        (Kind::V2, r#""frozen": {"version": 2, "dir": "DIR"}"#),
        (
            Kind::Slurm,
            r#""slurm": {"job_id": "77", "ctl": {"scontrol": "scontrol", "scancel": "scancel", "timeout_ms": 5000}}"#,
        ),
        (Kind::Signals, r#""frozen": null"#),
    ] {
        let s = Sim::new(kind);
        let dir = harness::cgroup_dir(&s.root(), kind).unwrap_or_default();
        let text = format!(
            r#"{{"version": 1, "jobs": [{{"name": "sim", "root": {{"pid": {PID}, "start_time": {}}},
            "owner_uid": {OWNER}, "attached_at_ms": 1, "paused": {{"since_ms": 2, "by": "policy",
            "reason": "r", "stopped": [{{"pid": {}, "start_time": {}}}], {}}}}}]}}"#,
            1000 + PID,
            PID + 1,
            1001 + PID,
            v1.replace("DIR", dir.to_str().unwrap())
        );
        let old: crate::record::Persisted = serde_json::from_str(&text).unwrap();
        let hold = &old.jobs[0].paused.as_ref().unwrap().hold;
        assert_eq!(
            hold.mechanism().unwrap().name(),
            kind.record(),
            "version 1 read as {hold:?}"
        );
        let v2 = serde_json::to_string(&old).unwrap();
        let again: crate::record::Persisted = serde_json::from_str(&v2).unwrap();
        assert_eq!(again, old, "version 2 round trip");
        let mut fresh = Sim::engine(
            &s.host,
            &format!(
                "[host]\nprocess_root = {:?}\n[control]\nstate_dir = {:?}\n",
                harness::ROOT,
                harness::STATE_DIR
            ),
        );
        fresh.recover(Some(again), 5);
        let acts = s.host.acts();
        assert!(
            acts.contains(&Act::Continue(vec![PID + 1])),
            "{kind:?}: {acts:?}"
        );
        match kind {
            Kind::V1 | Kind::V2 => assert!(acts.contains(&Act::Thaw(dir)), "{acts:?}"),
            Kind::Slurm => assert!(acts.contains(&Act::Slurm(SlurmCall::Resume, "77".into()))),
            Kind::Signals => {}
        }
    }
}

/// A mechanism this build does not know (a later version's) loads, and undoing it still continues
/// the processes the record names.
#[test]
fn an_unknown_mechanism_still_continues_its_processes() {
    let s = Sim::new(Kind::Signals);
    let text = format!(
        r#"{{"version": 3, "jobs": [{{"name": "sim", "root": {{"pid": {PID}, "start_time": {}}},
        "owner_uid": {OWNER}, "attached_at_ms": 1, "paused": {{"since_ms": 2, "by": "policy",
        "reason": "r", "phase": "settling", "hold": {{"kind": "systemd_unit", "unit": "x.service"}},
        "stopped": [{{"pid": {PID}, "start_time": {}}}]}}}}]}}"#,
        1000 + PID,
        1000 + PID
    );
    let old: crate::record::Persisted = serde_json::from_str(&text).unwrap();
    let p = old.jobs[0].paused.as_ref().unwrap();
    assert_eq!(p.hold, crate::record::HoldRecord::Unknown);
    let done = crate::seam::undo_pause(s.host.as_ref(), s.host.as_ref(), &old.jobs[0]).unwrap();
    assert_eq!(done.continued, 1);
}

/// A loan is given back the way it was made, also by a restarted daemon: one recorded through a
/// systemd unit (state file version 3) goes back through that unit's manager, and one recorded
/// before loans named their owner (version 2) through cgroupfs.
#[test]
fn a_restarted_daemon_gives_a_loan_back_the_way_it_was_made() {
    use crate::held::{Bus, CgroupOwner};
    let mut s = Sim::new(Kind::V2);
    let dir = harness::cgroup_dir(&s.root(), Kind::V2).unwrap();
    let mut state = s.host.state();
    let loan = |job: &str| {
        serde_json::json!({"job": job, "dir": dir, "version": 2, "original": 400u64 << 20,
            "raised": 656u64 << 20})
    };
    let mut by_systemd = loan("ended-unit");
    by_systemd["owner"] =
        serde_json::json!({"kind": "systemd", "bus": "system", "unit": "train.service"});
    let mut by_user = loan("ended-user-unit");
    by_user["owner"] =
        serde_json::json!({"kind": "systemd", "bus": {"user": 1000}, "unit": "t.service"});
    state["loans"] = serde_json::json!([by_systemd, by_user, loan("ended-v2")]);
    s.host.set_state_file(state);
    s.restart();
    s.sample(0.5);
    let restored: Vec<CgroupOwner> = s
        .host
        .acts()
        .into_iter()
        .filter_map(|a| match a {
            Act::RestoreLimit(d, owner) if d == dir => Some(owner),
            _ => None,
        })
        .collect();
    assert_eq!(
        restored,
        [
            CgroupOwner::Systemd {
                bus: Bus::System,
                unit: "train.service".into()
            },
            CgroupOwner::Systemd {
                bus: Bus::User(1000),
                unit: "t.service".into()
            },
            CgroupOwner::Cgroupfs,
        ]
    );
    let after = s.host.state();
    assert_eq!(after["version"], crate::record::VERSION);
    assert!(
        after["loans"].is_null(),
        "settled loans are dropped: {after}"
    );
}

/// A Slurm job attached by id has task trees on this node besides its root's (a step's tasks, the
/// children of slurmstepd). They are in the pause's record before they are stopped, so that a
/// daemon killed right after their stop leaves a record whose undoing (a restarted daemon's, the
/// guardian's: `seam::undo_pause`) continues them, children first, even where Slurm resumes
/// nothing (its suspension never went through).
/// A Slurm job attached by id (as root), in Slurm's cgroup v2 layout: `procs` (pid, parent), the
/// batch script's tree (at `PID`) and its steps' task trees, in the job's task cgroup. The
/// simulator, the processes' membership and the cgroup.
fn slurm_job_by_id(procs: &[(u32, u32)]) -> (Sim, String, std::path::PathBuf) {
    let mut s = Sim::with(Kind::Slurm, "", &[]);
    assert!(
        s.cmd(serde_json::json!({"cmd": "detach", "target": "sim"}))
            .ok
    );
    let path = format!("system.slice/slurmstepd.scope/job_{SLURM_ID}/step_0/user/task_0");
    let membership = format!("0::/{path}\n");
    for &(pid, parent) in procs {
        s.host.add_process(pid, parent, OWNER, &membership);
    }
    let all: Vec<u32> = procs.iter().map(|(pid, _)| *pid).collect();
    s.host.account_v2_memory();
    let dir = std::path::Path::new(harness::ROOT)
        .join("sys/fs/cgroup")
        .join(&path);
    s.host.add_cgroup(
        &dir,
        crate::host::Version::V2,
        &all,
        &[
            ("memory.current", "1048576\n"),
            ("memory.max", "max\n"),
            ("memory.high", "max\n"),
            ("cgroup.freeze", "0\n"),
            ("cgroup.events", "populated 1\nfrozen 0\n"),
        ],
    );
    *s.host.listpids.lock().unwrap() = Some(all);
    let r = s.cmd_as(
        0,
        serde_json::json!({"cmd": "attach_slurm", "job_id": SLURM_ID, "name": "sim"}),
    );
    assert!(r.ok, "attach by id: {:?}", r.error);
    (s, membership, dir)
}

#[test]
fn a_slurm_jobs_other_task_trees_are_recorded_before_they_are_stopped() {
    const TOP: u32 = PID + 10;
    let all = [PID, PID + 1, TOP, TOP + 1];
    let (mut s, _, _) = slurm_job_by_id(&[(PID, 1), (PID + 1, PID), (TOP, 1), (TOP + 1, TOP)]);
    s.sample(0.97);
    let p = s.pause().expect("paused");
    assert_eq!(p.mechanism.name(), "slurm_suspend", "{p:?}");
    let acts = s.host.acts();
    assert!(acts.contains(&Act::StopTree(PID)), "{acts:?}");
    assert!(acts.contains(&Act::StopTree(TOP)), "{acts:?}");
    // The simulator's host refuses a stop no record names: none was refused.
    s.check();
    // The daemon is killed right after the step's tree was stopped: the state file as it was then.
    let at_stop = s
        .host
        .state_at_stop
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(top, _)| *top == TOP)
        .map(|(_, state)| state.clone())
        .expect("the step's tree was stopped");
    let old: crate::record::Persisted = serde_json::from_value(at_stop).unwrap();
    let states = || all.map(|pid| s.host.state_of(pid));
    assert_eq!(states(), [Some('T'); 4], "before the undoing");
    let done = crate::seam::undo_pause(s.host.as_ref(), s.host.as_ref(), &old.jobs[0])
        .expect("a pause on record");
    assert_eq!(done.continued, 4, "{done:?}");
    assert_eq!(states(), [Some('S'); 4], "{:?}", s.host.acts());
}

#[test]
fn a_slurm_task_started_after_the_pause_was_recorded_is_recorded_before_it_is_stopped() {
    const TOP: u32 = PID + 10;
    const LATE: u32 = PID + 20;
    let (mut s, membership, dir) = slurm_job_by_id(&[(PID, 1), (PID + 1, PID), (TOP, 1)]);
    // A step's task starts while the pause's record is written: after the tops it names were read.
    *s.host.born_at_state_write.lock().unwrap() = Some(super::host::Birth {
        pid: LATE,
        ppid: 1,
        uid: OWNER,
        membership,
        cgroup: dir,
    });
    s.sample(0.97);
    let p = s.pause().expect("paused");
    assert_eq!(p.mechanism.name(), "slurm_suspend", "{p:?}");
    assert!(s.host.born_at_state_write.lock().unwrap().is_none(), "born");
    let acts = s.host.acts();
    assert!(acts.contains(&Act::StopTree(LATE)), "{acts:?}");
    // The simulator's host refuses a stop no record names: none was refused.
    s.check();
    // The daemon is killed right after the late task's stop: its record names it, and the pause
    // is undone whole.
    let at_stop = s
        .host
        .state_at_stop
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(top, _)| *top == LATE)
        .map(|(_, state)| state.clone())
        .expect("the late task was stopped");
    let old: crate::record::Persisted = serde_json::from_value(at_stop).unwrap();
    let every = [PID, PID + 1, TOP, LATE];
    let states = || every.map(|pid| s.host.state_of(pid));
    assert_eq!(states(), [Some('T'); 4], "before the undoing");
    let done = crate::seam::undo_pause(s.host.as_ref(), s.host.as_ref(), &old.jobs[0])
        .expect("a pause on record");
    assert_eq!(done.continued, 4, "{done:?}");
    assert_eq!(states(), [Some('S'); 4], "{:?}", s.host.acts());
}
