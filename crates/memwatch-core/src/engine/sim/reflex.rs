//! The reflex, as the engine sees it: armed with its record written first, fired (the wake thread's
//! act is played on the host: the root stopped, or the freezer written), then taken over as the
//! policy's pause held the same way, undone where it was not the policy's to make, and undone by a
//! restarted daemon from its record alone.

use crate::config::SignalName;
use crate::engine::{ReflexHow, ReflexPlan};
use crate::held::Frozen;
use crate::held::{Done, Fired, Woken};
use crate::host::ProcRef;
use crate::host::Version;
use crate::job::Watch;

use super::harness::{Kind, OWNER, PID, Sim, cgroup_dir};
use super::host::Act;

fn root() -> ProcRef {
    ProcRef {
        pid: PID,
        start_time: 1000 + u64::from(PID),
    }
}

/// Arms the job's reflex the way `kind` would be held (signals: its root; V1, V2: its cgroup's
/// freezer), and checks its record is in the state file.
fn arm(s: &mut Sim) -> Done {
    let (how, done) = match s.kind {
        Kind::V1 | Kind::V2 => {
            let f = Frozen {
                version: if s.kind == Kind::V1 {
                    Version::V1
                } else {
                    Version::V2
                },
                dir: cgroup_dir(&s.root(), s.kind).unwrap(),
            };
            (ReflexHow::Freeze(f.clone()), Done::Froze(f))
        }
        _ => (ReflexHow::Stop(root()), Done::Stopped(root())),
    };
    let plan = ReflexPlan {
        critical_bytes: 95 << 20,
        how,
        owner: OWNER,
        pidfd: None,
    };
    s.engine.arm_reflex("sim", &plan).unwrap();
    s.check();
    let state = s.host.state();
    let r = &state["jobs"][0]["paused"];
    assert_eq!(r["phase"], "armed", "{:?}: {r}", s.kind);
    assert_eq!(r["hold"]["kind"], s.kind.record(), "{:?}: {r}", s.kind);
    if s.kind == Kind::Signals {
        assert_eq!(r["stopped"][0]["pid"], PID, "{r}");
    }
    // The line it watches, for the guardian to hold while no daemon runs, where the job has a
    // memory cgroup with a limit (a resumed v2 job's: `a_resumed_job_is_armed_ahead…`).
    if !r["line"].is_null() {
        assert_eq!(r["line"]["critical_bytes"], 95u64 << 20, "{r}");
        assert_eq!(r["line"]["limit_bytes"].as_u64(), s.cgroup_limit, "{r}");
    }
    done
}

/// The wake thread's act, played on the host.
fn fire(s: &Sim, done: &Done) {
    match done {
        Done::Froze(f) => s.host.set_frozen(&f.dir, true),
        Done::Stopped(r) => s.host.set_state(r.pid, 'T'),
    }
}

/// The wake thread hands what it did (at 96 MiB, `took_us` after its wake-up) to the engine, whose
/// effects are then carried out and its invariants checked.
fn handed(s: &mut Sim, done: Done, took_us: u64) {
    handed_woken(s, done, took_us, Woken::Threshold);
}

/// The same, woken by `woken`.
fn handed_woken(s: &mut Sim, done: Done, took_us: u64, woken: Woken) {
    s.engine.handle_reflex(
        Fired {
            job: "sim".into(),
            done,
            usage: 96 << 20,
            cache: Default::default(),
            took_us,
            woken,
        },
        s.now,
    );
    s.drain();
    s.check();
}

/// A freeze the reflex made is not written again by the engine: its pause waits for it to settle
/// (the executor's wait off the owner task), and holds once it has.
fn settled_unwritten(s: &mut Sim) {
    if matches!(s.kind, Kind::V1 | Kind::V2) {
        let p = s.pause().expect("paused");
        assert_eq!(p.phase, crate::job::PausePhase::Pausing, "{:?}", s.kind);
        s.settle(true);
    }
    assert!(
        !s.host.acts().iter().any(|a| matches!(a, Act::Freeze(_))),
        "{:?}: the reflex's freeze written again: {:?}",
        s.kind,
        s.host.acts()
    );
}

/// The job's pause event says `said`, and a resume by hand undoes the pause whole.
fn said_and_resumed(s: &mut Sim, said: &str) {
    let view = s.engine.view();
    let event = view
        .events
        .iter()
        .find(|e| e.job == "sim" && e.action == crate::audit::Action::Pause)
        .expect("a pause event");
    assert!(event.detail.contains(said), "{}", event.detail);
    assert!(s.cmd(super::resume_cmd()).ok);
    assert!(s.all_running(), "{:?}: {:?}", s.kind, s.host.acts());
}

/// A reflex that fired becomes the policy's pause, held by the mechanism that made it: its record
/// replaces the armed one, the rest of the tree is stopped (signals), the event says the reflex
/// stopped it and when, and a resume undoes it whole.
#[test]
fn a_fired_reflex_becomes_the_policys_pause_held_the_same_way() {
    for kind in [Kind::Signals, Kind::V1, Kind::V2] {
        let mut s = Sim::new(kind);
        let done = arm(&mut s);
        fire(&s, &done);
        handed(&mut s, done, 42);
        settled_unwritten(&mut s);
        let p = s.pause().expect("the reflex's stop became a pause");
        assert_eq!(p.mechanism.name(), kind.record(), "{kind:?}");
        assert_eq!(p.phase, crate::job::PausePhase::Held, "{kind:?}");
        assert_eq!(p.by, crate::policy::By::Policy);
        assert_eq!(
            p.held.reasons,
            [crate::policy::Cause::Resource(
                crate::policy::Resource::JobCgroup("sim".into())
            )]
        );
        assert!(s.held(), "{kind:?}");
        if kind == Kind::Signals {
            assert_eq!(s.host.state_of(PID + 1), Some('T'), "the worker too");
        }
        assert!(s.engine.armed_reflex("sim").is_none());
        assert_eq!(s.host.state()["jobs"][0]["paused"]["phase"], "held");
        said_and_resumed(&mut s, "stopped by the reflex 42 µs");
    }
}

/// The pause event says what woke the reflex: a threshold's crossing, or the wake thread's own read
/// of the cgroup's usage file (a v2 job's; a v1 job's while its thresholds register or while it is
/// over its line by its page cache).
#[test]
fn a_fired_reflexs_event_says_what_woke_it() {
    for (kind, woken, said) in [
        (
            Kind::V1,
            Woken::Threshold,
            "after the kernel's notification",
        ),
        (
            Kind::V1,
            Woken::Read,
            "after its read of memory.usage_in_bytes",
        ),
        (Kind::V2, Woken::Read, "after its read of memory.current"),
    ] {
        let mut s = Sim::new(kind);
        let done = arm(&mut s);
        fire(&s, &done);
        handed_woken(&mut s, done, 42, woken);
        settled_unwritten(&mut s);
        said_and_resumed(&mut s, &format!("stopped by the reflex 42 µs {said}"));
    }
}

/// What the reflex read is the job's cgroup from then on: the page cache of the engine's last
/// reading, which the job's growth has since made the kernel drop, does not resume the pause the
/// reflex made.
#[test]
fn the_reflexs_reading_replaces_a_cache_the_job_has_dropped_since() {
    for kind in [Kind::Signals, Kind::V1, Kind::V2] {
        let mut s = Sim::new(kind);
        s.cgroup_limit = Some(100 << 20);
        let done = arm(&mut s);
        // The engine's last reading: 97 MiB of usage, 40 MiB of it clean page cache (57 %).
        s.probe_cgroup(97 << 20, 40 << 20);
        assert!(s.pause().is_none(), "{kind:?}");
        // The reflex's: the same usage, the cache gone.
        fire(&s, &done);
        s.engine.handle_reflex(
            Fired {
                job: "sim".into(),
                done,
                usage: 97 << 20,
                cache: Default::default(),
                took_us: 42,
                woken: Woken::Threshold,
            },
            s.now,
        );
        s.drain();
        s.check();
        settled_unwritten(&mut s);
        s.now += 10;
        s.engine.handle_probe(None, Vec::new(), s.now);
        s.drain();
        s.check();
        let p = s.pause().expect("the reflex's pause");
        assert_eq!(p.phase, crate::job::PausePhase::Held, "{kind:?}");
        assert!(s.held(), "{kind:?}: {:?}", s.host.acts());
    }
}

/// The policy decides a pause on a reading of its own (here the host's memory at 97 %) while the
/// reflex's stop waits to be handed over: the pause is the reflex's, held by its mechanism, with the
/// job cgroup among its causes beside the policy's own, and the event says the reflex stopped it.
/// The stop is taken over once: the hand-over that follows finds nothing left.
#[test]
fn a_policy_pause_decided_while_the_reflexs_stop_waits_is_that_stop() {
    for kind in [Kind::Signals, Kind::V1, Kind::V2] {
        let mut s = Sim::new(kind);
        let done = arm(&mut s);
        fire(&s, &done);
        s.host.fired.lock().unwrap().push(Fired {
            job: "sim".into(),
            done,
            usage: 96 << 20,
            cache: Default::default(),
            took_us: 31,
            woken: Woken::Threshold,
        });
        s.sample(0.97);
        settled_unwritten(&mut s);
        let p = s.pause().expect("paused");
        assert_eq!(p.mechanism.name(), kind.record(), "{kind:?}");
        assert_eq!(p.phase, crate::job::PausePhase::Held, "{kind:?}");
        let job_cgroup =
            crate::policy::Cause::Resource(crate::policy::Resource::JobCgroup("sim".into()));
        assert!(p.held.reasons.contains(&job_cgroup), "{:?}", p.held.reasons);
        assert!(
            p.held.reasons.len() >= 2,
            "the policy's own cause kept: {:?}",
            p.held.reasons
        );
        assert!(s.host.fired.lock().unwrap().is_empty(), "taken over once");
        assert!(s.engine.armed_reflex("sim").is_none());
        assert!(s.held(), "{kind:?}");
        said_and_resumed(&mut s, "stopped by the reflex 31 µs");
    }
}

/// A reflex that fired on a job someone paused first is not a second pause: what the pause holds
/// stays held, once. One that fired on a job that is no longer attached is undone.
#[test]
fn a_reflex_not_the_policys_to_make_is_undone_or_left_to_the_pause_that_holds() {
    let mut s = Sim::new(Kind::Signals);
    let done = arm(&mut s);
    assert!(s.cmd(super::pause_cmd()).ok);
    fire(&s, &done);
    let before = s.host.acts().len();
    s.engine.handle_reflex(
        Fired {
            job: "sim".into(),
            done,
            usage: 96 << 20,
            cache: Default::default(),
            took_us: 7,
            woken: Woken::Threshold,
        },
        s.now,
    );
    s.drain();
    s.check();
    let p = s.pause().unwrap();
    assert_eq!(p.by, crate::policy::By::User, "the hand pause stays");
    assert!(
        !s.host.acts()[before..].contains(&Act::Signal(PID, SignalName::CONT)),
        "the held root was continued: {:?}",
        s.host.acts()
    );
    assert!(s.held());

    // Fired for a job the engine no longer has: continued at once.
    let worker = ProcRef {
        pid: PID + 1,
        start_time: 1001 + u64::from(PID),
    };
    s.host.set_state(PID + 1, 'T');
    s.engine.handle_reflex(
        Fired {
            job: "gone".into(),
            done: Done::Stopped(worker),
            usage: 1,
            cache: Default::default(),
            took_us: 1,
            woken: Woken::Threshold,
        },
        s.now,
    );
    assert!(
        s.host
            .acts()
            .contains(&Act::Signal(PID + 1, SignalName::CONT))
    );
    assert_eq!(s.host.state_of(PID + 1), Some('S'));
}

/// A freeze the reflex wrote that does not settle in time (a process stuck in the kernel) is thawed
/// and the job stopped with signals instead, as a freeze of the engine's own would be: the pause
/// holds by signals and nothing stays frozen.
#[test]
fn a_reflexs_freeze_that_does_not_settle_becomes_a_stop_by_signals() {
    for kind in [Kind::V1, Kind::V2] {
        let mut s = Sim::new(kind);
        let done = arm(&mut s);
        fire(&s, &done);
        handed(&mut s, done, 9);
        s.settle(false);
        let p = s.pause().expect("still paused");
        assert_eq!(p.mechanism.name(), "signals", "{kind:?}");
        assert_eq!(p.phase, crate::job::PausePhase::Held, "{kind:?}");
        let dir = cgroup_dir(&s.root(), kind).unwrap();
        assert!(!s.host.frozen(&dir), "{kind:?}: left frozen");
        assert_eq!(s.host.state_of(PID), Some('T'), "{kind:?}: the root");
        assert_eq!(s.host.state_of(PID + 1), Some('T'), "{kind:?}: the worker");
        said_and_resumed(&mut s, "stopped by the reflex 9 µs");
    }
}

/// A daemon killed after its reflex fired, before the engine took the stop over, leaves the armed
/// record: the restarted daemon undoes it from that record alone (the root continued, the freezer
/// thawed), and nothing of the job stays stopped.
#[test]
fn a_restarted_daemon_undoes_an_armed_record_that_may_have_fired() {
    for kind in [Kind::Signals, Kind::V1, Kind::V2] {
        let mut s = Sim::new(kind);
        let done = arm(&mut s);
        fire(&s, &done);
        assert!(!s.all_running());
        s.restart();
        assert!(s.all_running(), "{kind:?}: {:?}", s.host.acts());
        assert!(s.pause().is_none());
        match kind {
            Kind::V1 | Kind::V2 => assert!(
                s.host
                    .acts()
                    .contains(&Act::Thaw(cgroup_dir(&s.root(), kind).unwrap()))
            ),
            _ => assert!(s.host.acts().contains(&Act::Continue(vec![PID]))),
        }
    }
}

/// A job's usage thresholds past its critical line come every tenth of a percent for the first
/// percent, so a cgroup holding a little page cache at the crossing of the line (usage over it, the
/// working set not yet) is looked at again half a MiB later in 512 MiB, not 2.6 MiB later; then
/// every half percent, all under the limit, at most 24.
#[test]
fn a_jobs_thresholds_past_its_line_come_a_tenth_of_a_percent_apart() {
    let limit: u64 = 512 << 20;
    let mut s = Sim::new(Kind::V2);
    s.oom_kills = Some(0);
    s.cgroup_limit = Some(limit);
    s.sample(0.1);
    let plan = s.engine.wake_plan();
    let p = plan.iter().find(|p| p.job == "sim").expect("a wake plan");
    let t = &p.thresholds;
    let line = (limit as f64 * 0.95).ceil() as u64;
    assert_eq!(
        p.line,
        Some((line, limit)),
        "a threshold at the reflex's line to the byte"
    );
    let at = t
        .iter()
        .position(|&x| x == line)
        .unwrap_or_else(|| panic!("no threshold at the line {line}: {t:?}"));
    let tenth = limit / 1000 + 1;
    let first: Vec<u64> = t[at..].windows(2).take(10).map(|w| w[1] - w[0]).collect();
    assert_eq!(first.len(), 10, "{t:?}");
    assert!(first.iter().all(|&g| g <= tenth), "{first:?}");
    assert!(
        t[at + 10..]
            .windows(2)
            .all(|w| w[1] - w[0] <= limit / 200 + 1),
        "{t:?}"
    );
    assert!(
        t.last()
            .is_some_and(|&x| x > (limit as f64 * 0.99) as u64 && x < limit),
        "{t:?}"
    );
    assert!(t.len() <= 24 && t.windows(2).all(|w| w[0] < w[1]), "{t:?}");
}

/// The engine plans a reflex for a job whose cgroup v2 has a limit (v1's: tests/reflex.rs, on a real
/// v1 cgroup): by the job's own `cgroup.freeze` (the wake thread then reads its `memory.current`),
/// at the critical line of the limit; none without a limit, and none with `policy.reflex` off.
#[test]
fn a_reflex_is_planned_for_a_limited_v2_cgroup() {
    {
        let kind = Kind::V2;
        let mut s = Sim::new(kind);
        s.oom_kills = Some(0);
        s.sample(0.1);
        let plan = s.engine.wake_plan();
        let p = plan.iter().find(|p| p.job == "sim").expect("a wake plan");
        assert!(p.reflex.is_none(), "{kind:?}: no limit, no line");

        s.cgroup_limit = Some(4 << 30);
        s.now += 1000;
        s.sample(0.1);
        let plan = s.engine.wake_plan();
        let p = plan.iter().find(|p| p.job == "sim").expect("a wake plan");
        let r = p.reflex.as_ref().expect("a reflex with a limit");
        assert_eq!(
            r.how,
            ReflexHow::Freeze(Frozen {
                version: Version::V2,
                dir: cgroup_dir(&s.root(), kind).unwrap()
            }),
            "{kind:?}"
        );
        assert_eq!(r.critical_bytes, ((4u64 << 30) as f64 * 0.95).ceil() as u64);
        assert_eq!(
            p.line,
            Some((r.critical_bytes, 4 << 30)),
            "the wake thread's reads are timed by the line and the limit"
        );
        assert!(
            p.thresholds.contains(&(2 << 30)) && p.thresholds.iter().all(|&t| t < 4 << 30),
            "{:?}",
            p.thresholds
        );

        let mut off = Sim::with(kind, "[policy]\nreflex = false\n", &[]);
        off.cgroup_limit = Some(4 << 30);
        off.sample(0.1);
        let plan = off.engine.wake_plan();
        assert!(
            plan.iter().all(|p| p.reflex.is_none()),
            "{kind:?}: reflex = false"
        );
    }
}

/// A job whose cgroup is at its critical line until the policy pauses it, then falls back: the
/// pause's acts so far, and the state it leaves.
fn paused_at_the_line_then_calm(s: &mut Sim, watch: Watch) {
    s.cgroup_limit = Some(4 << 30);
    s.sample(0.1);
    s.engine.set_watch("sim", watch);
    s.now += 1000;
    s.sample_unchanged(0.1, 4000 << 20);
    assert!(s.held(), "paused at the line");
    for _ in 0..120 {
        s.now += 1000;
        s.sample_unchanged(0.1, 1 << 30);
        if s.pause().is_none() {
            return;
        }
    }
    panic!("never resumed: {:?}", s.pause());
}

/// A job the policy resumes is armed within the resume itself: its reflex recorded before the thaw
/// and handed over right after it, with no state write between (the sim's hand-over checks the
/// record is there). A slow disk that holds the owner task after the thaw then never leaves the
/// job growing with nothing armed to stop it, as a resume that left the arming to the next sync of
/// the watches did.
#[test]
fn a_resumed_job_is_armed_ahead_of_its_thaw_and_handed_over_right_after_it() {
    let mut s = Sim::new(Kind::V2);
    paused_at_the_line_then_calm(&mut s, Watch::Watched);
    let dir = cgroup_dir(&s.root(), Kind::V2).unwrap();
    let acts = s.host.acts();
    let thaw = acts.iter().rposition(|a| *a == Act::Thaw(dir.clone()));
    let armed = acts.iter().position(|a| *a == Act::ArmReflex("sim".into()));
    assert!(
        matches!((thaw, armed), (Some(t), Some(a)) if t < a
            && acts[t + 1..a].iter().all(|x| matches!(x, Act::Continue(_)))),
        "the thaw, then at once the hand-over: {acts:?}"
    );
    assert!(!s.held());
    let a = s.engine.armed_reflex("sim").expect("armed");
    assert_eq!(
        a.how,
        ReflexHow::Freeze(Frozen {
            version: Version::V2,
            dir
        })
    );
    assert!(a.resuming.is_none(), "the pause it covered is undone");
    let r = &s.host.state()["jobs"][0]["paused"];
    assert_eq!(r["phase"], "armed", "{r}");
    assert_eq!(r["hold"]["kind"], "cgroup_v2_freeze", "{r}");
    // Its line, for the guardian to hold while no daemon runs.
    assert_eq!(r["line"]["critical_bytes"], a.critical_bytes, "{r}");
    assert_eq!(r["line"]["limit_bytes"], 4u64 << 30, "{r}");
    assert_eq!(r["line"]["version"], 2, "{r}");
    assert!(r["line"]["memory"].is_string(), "{r}");
}

/// A v1 job resumed while its thresholds are still being registered (a limit changed during its
/// pause) is armed within the resume as well: each threshold wakes the wake thread from its own
/// write on, so the reflex need not wait for the last of them. One the kernel does not watch at all
/// is not armed: its probe decides. (What the engine asks of a job's watch is the same on either
/// version; the sim's v2 cgroup stands in, as its v1 job has no memory cgroup of its own.)
#[test]
fn a_job_resumed_while_its_thresholds_register_is_armed_within_the_resume() {
    for (watch, armed) in [
        (Watch::Watched, true),
        (Watch::Registering, true),
        (Watch::Probed, false),
    ] {
        let mut s = Sim::new(Kind::V2);
        paused_at_the_line_then_calm(&mut s, watch);
        let acts = s.host.acts();
        let resumed = acts
            .iter()
            .rposition(|a| matches!(a, Act::Continue(_) | Act::Thaw(_)));
        let handed = acts.iter().position(|a| *a == Act::ArmReflex("sim".into()));
        if armed {
            assert!(
                matches!((resumed, handed), (Some(r), Some(h)) if h == r + 1),
                "{watch:?}: the resume, then at once the hand-over: {acts:?}"
            );
            let a = s.engine.armed_reflex("sim").expect("armed");
            assert!(a.resuming.is_none(), "the pause it covered is undone");
            assert_eq!(s.host.state()["jobs"][0]["paused"]["phase"], "armed");
        } else {
            assert_eq!(handed, None, "{watch:?}: {acts:?}");
            assert!(s.engine.armed_reflex("sim").is_none());
        }
        assert!(!s.held(), "{watch:?}");
    }
}

/// A daemon killed after the reflex was recorded ahead of a resume, before the thaw, leaves a record
/// that covers the pause it was ending: the restarted daemon undoes it from that record alone, and
/// nothing of the job stays frozen.
#[test]
fn a_daemon_killed_between_the_record_ahead_and_the_thaw_leaves_nothing_frozen() {
    let mut s = Sim::new(Kind::V2);
    s.cgroup_limit = Some(4 << 30);
    s.sample(0.1);
    s.engine.set_watch("sim", Watch::Watched);
    assert!(s.cmd(super::pause_cmd()).ok);
    assert!(s.held(), "paused by hand");
    // The pause's end as a resume begins it: taken off the job, its stop recorded ahead, and the
    // daemon killed before the thaw.
    let p = s.engine.end_pause("sim").expect("the pause");
    assert!(s.engine.arm_ahead("sim", &p).is_some(), "recorded ahead");
    let r = &s.host.state()["jobs"][0]["paused"];
    assert_eq!(
        (r["phase"].as_str(), r["hold"]["kind"].as_str()),
        (Some("armed"), Some("cgroup_v2_freeze")),
        "{r}"
    );
    assert!(s.held(), "not thawed yet");
    s.restart();
    assert!(!s.held(), "{:?}", s.host.acts());
    assert!(s.all_running());
    assert!(s.pause().is_none());
}

/// The armed record ahead of a resume covers what the pause holds beside the reflex's own act: its
/// frozen cgroup where the reflex would stop the root by signals, every process it stopped where
/// the reflex would freeze.
#[test]
fn the_record_ahead_of_a_resume_covers_the_pause_and_the_reflex() {
    let worker = ProcRef {
        pid: PID + 1,
        start_time: 1000 + u64::from(PID) + 1,
    };
    let f = Frozen {
        version: Version::V1,
        dir: "/sys/fs/cgroup/freezer/job".into(),
    };
    let armed =
        |how: ReflexHow, frozen: Option<Frozen>, stopped: Vec<ProcRef>| crate::held::Armed {
            critical_bytes: 95 << 20,
            how,
            since_ms: 1,
            resuming: Some(crate::held::Resuming { frozen, stopped }),
        };
    let stop_over_freezer = super::super::reflex::record(
        &armed(ReflexHow::Stop(root()), Some(f.clone()), vec![]),
        "sim",
        None,
    );
    assert_eq!(
        stop_over_freezer.hold,
        crate::record::HoldRecord::from(&crate::held::Mechanism::choose(None, Some(f.clone())))
    );
    assert_eq!(stop_over_freezer.stopped, [root()]);
    let freeze_over_signals = super::super::reflex::record(
        &armed(ReflexHow::Freeze(f.clone()), None, vec![root(), worker]),
        "sim",
        None,
    );
    assert_eq!(
        freeze_over_signals.hold,
        crate::record::HoldRecord::from(&crate::held::Mechanism::choose(None, Some(f)))
    );
    assert_eq!(freeze_over_signals.stopped, [root(), worker]);
    let stop_over_signals = super::super::reflex::record(
        &armed(ReflexHow::Stop(root()), None, vec![root(), worker]),
        "sim",
        None,
    );
    assert_eq!(stop_over_signals.hold, crate::record::HoldRecord::Signals);
    assert_eq!(stop_over_signals.stopped, [root(), worker], "once each");
}
