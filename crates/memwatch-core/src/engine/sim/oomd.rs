//! systemd-oomd marks: a pause the policy holds on a cgroup v2 job marks the job's cgroup
//! `user.oomd_omit=1` (in the record before it is set), and every way the pause ends puts back what
//! was there; a pause by hand marks nothing; a mark that cannot be set never stops the pause.
//! `Sim::check` holds the host's marks to the pause's record after every step of every case.

use std::collections::BTreeSet;

use super::harness::{Kind, PID, Sim, cgroup_dir};
use super::host::Act;

/// A policy pause marks the job's cgroup, and recovery, a detach, the job's end and a restart that
/// undoes the pause each put the old value back.
#[test]
fn a_policy_pause_marks_the_job_for_oomd_and_every_end_takes_the_mark_off() {
    let mut s = Sim::new(Kind::V2);
    let dir = cgroup_dir(&s.root(), Kind::V2).unwrap();
    // A value someone else set before: it comes back after the pause.
    s.host.omit.lock().unwrap().insert(dir.clone(), "0".into());
    s.sample(0.97);
    let p = s.pause().expect("paused by the policy");
    assert_eq!(p.oomd_omit.len(), 1);
    assert_eq!(p.oomd_omit[0].previous.as_deref(), Some("0"));
    assert_eq!(s.host.marked(), BTreeSet::from([dir.clone()]));
    assert_eq!(s.host.omit_of(&dir).as_deref(), Some("1"));
    assert_eq!(
        s.host.state()["jobs"][0]["paused"]["oomd_omit"][0]["previous"],
        "0"
    );
    for _ in 0..10 {
        s.now += 1000;
        s.sample(0.5);
    }
    assert!(s.pause().is_none(), "{:?}", s.events());
    assert_eq!(s.host.omit_of(&dir).as_deref(), Some("0"));

    // Held across a restart, then taken off by a detach.
    s.now += 1000;
    s.sample(0.97);
    assert!(s.pause().is_some());
    s.restart();
    assert_eq!(s.pause().map(|p| p.oomd_omit.len()), Some(1));
    assert_eq!(s.host.omit_of(&dir).as_deref(), Some("1"));
    assert!(
        s.cmd(serde_json::json!({"cmd": "detach", "target": "sim"}))
            .ok
    );
    assert_eq!(s.host.omit_of(&dir).as_deref(), Some("0"));

    // A job whose root is gone while held: the restarted daemon undoes the pause from its record.
    let mut s = Sim::new(Kind::V2);
    s.sample(0.97);
    assert_eq!(s.host.omit_of(&dir_of(&s)).as_deref(), Some("1"));
    s.host.remove_process(PID);
    s.restart();
    assert!(s.pause().is_none());
    assert_eq!(s.host.omit_of(&dir_of(&s)), None);
    assert!(s.host.acts().contains(&Act::OomdUnmark(dir_of(&s))));

    // The job's root exits while the daemon holds it.
    let mut s = Sim::new(Kind::V2);
    s.sample(0.97);
    s.host.remove_process(PID);
    s.gone = true;
    s.now += 1000;
    s.sample(0.97);
    assert!(s.pause().is_none(), "{:?}", s.events());
    assert_eq!(s.host.omit_of(&dir_of(&s)), None);
}

fn dir_of(s: &Sim) -> std::path::PathBuf {
    cgroup_dir(&s.root(), Kind::V2).unwrap()
}

/// A pause by hand is the user's to keep, and systemd-oomd's to end: nothing is marked.
#[test]
fn a_pause_by_hand_marks_nothing() {
    let mut s = Sim::new(Kind::V2);
    assert!(
        s.cmd(serde_json::json!({"cmd": "pause", "target": "sim"}))
            .ok
    );
    assert!(s.pause().is_some_and(|p| p.oomd_omit.is_empty()));
    assert!(s.host.marked().is_empty());
}

/// Where the mark cannot be set the job is paused all the same, and the record lists no mark.
#[test]
fn a_mark_that_fails_never_stops_the_pause() {
    let mut s = Sim::new(Kind::V2);
    s.host.faults.lock().unwrap().mark_fails = true;
    s.sample(0.97);
    let p = s.pause().expect("paused without the mark");
    assert!(p.oomd_omit.is_empty(), "{p:?}");
    assert!(s.held());
    s.check();
    assert!(
        s.host.state()["jobs"][0]["paused"]["oomd_omit"]
            .as_array()
            .is_some_and(|m| m.is_empty())
    );
}

/// A mark something else took off while the job is held (systemd re-applying the unit's settings)
/// is set again at the next full sample; it still comes off with the pause.
#[test]
fn a_mark_taken_off_under_a_held_pause_is_set_again() {
    let mut s = Sim::new(Kind::V2);
    let dir = dir_of(&s);
    s.sample(0.97);
    assert_eq!(s.host.omit_of(&dir).as_deref(), Some("1"));
    s.host.omit.lock().unwrap().remove(&dir);
    s.now += 1000;
    s.sample(0.97);
    assert_eq!(s.host.omit_of(&dir).as_deref(), Some("1"));
    for _ in 0..10 {
        s.now += 1000;
        s.sample(0.5);
    }
    assert!(s.pause().is_none());
    assert_eq!(s.host.omit_of(&dir), None);
}
