//! The OOM killer inside a job: an event when it ends processes of the job, a pause it ends is no
//! recovery, and a job it ends is reported as OOM-killed.

use super::harness::{ALL, Kind, Sim};

/// The OOM killer ending processes of the job (a rank, a worker) is an event; when the room it made
/// ends the pause, the resume says so (reason `oom_kill`), never that the job recovered.
#[test]
fn room_the_oom_killer_made_is_no_recovery() {
    for kind in ALL {
        let mut s = Sim::new(kind);
        s.oom_kills = Some(0);
        s.sample(0.97);
        assert!(s.pause().is_some(), "{kind:?}: not paused");
        s.now += 1000;
        s.oom_kills = Some(1);
        s.sample(0.97);
        let view = s.engine.view();
        let kill = view
            .events
            .iter()
            .find(|e| e.action.as_str() == "oom_kill")
            .unwrap_or_else(|| panic!("{kind:?}: no oom_kill event: {:?}", s.events()));
        assert_eq!(kill.reason.as_str(), "job_cgroup", "{kind:?}");
        assert!(
            kill.detail.contains("1 process(es)") && kill.detail.contains("while it was paused"),
            "{kind:?}: {}",
            kill.detail
        );
        for _ in 0..10 {
            s.now += 1000;
            s.sample(0.5);
        }
        assert!(s.pause().is_none(), "{kind:?}: {:?}", s.events());
        let resume = s
            .events()
            .into_iter()
            .rfind(|e| e.0 == "resume")
            .unwrap_or_else(|| panic!("{kind:?}: no resume: {:?}", s.events()));
        assert_eq!(resume.1, "oom_kill", "{kind:?}: {:?}", s.events());

        // Without a kill, the same pause ends as a recovery.
        let mut s = Sim::new(kind);
        s.oom_kills = Some(0);
        s.sample(0.97);
        for _ in 0..10 {
            s.now += 1000;
            s.sample(0.5);
        }
        let resume = s
            .events()
            .into_iter()
            .rfind(|e| e.0 == "resume")
            .unwrap_or_else(|| panic!("{kind:?}: no resume: {:?}", s.events()));
        assert_eq!(resume.1, "recovered", "{kind:?}: {:?}", s.events());
    }
}

/// A job whose cgroup counted OOM kills after the attach and whose root is then gone ends as
/// OOM-killed: the detach event's reason is `oom_kill` and its ended record says so; one whose
/// count did not move ends as `gone`.
#[test]
fn a_job_the_oom_killer_ended_is_reported_as_oom_killed() {
    for (kills, reason) in [(1u64, "oom_kill"), (0, "gone")] {
        let mut s = Sim::new(Kind::Signals);
        let cg = |n: u64| crate::sample::cgroup::CgroupMemory {
            version: crate::host::Version::V2,
            path: "/user.slice/sim".into(),
            usage_bytes: 100 << 20,
            limit_bytes: Some(512 << 20),
            limit_source: None,
            oom_kills: Some(n),
            inactive_file_bytes: Some(0),
            active_file_bytes: None,
            dirty_bytes: None,
            anon_bytes: None,
            file_bytes: None,
        };
        // Three kills before the attach are not this job's.
        s.engine
            .handle_probe(None, vec![("sim".into(), cg(3))], s.now);
        s.now += 10;
        s.engine
            .handle_probe(None, vec![("sim".into(), cg(3 + kills))], s.now);
        s.now += 10;
        // The root is gone: the next full sample measures nothing.
        let measured = crate::engine::Measured {
            name: "sim".into(),
            sample: crate::job::Measurement::Gone,
            freezer: None,
            slurm_suspended: None,
            pinned: None,
            held_thawed: false,
        };
        s.engine.handle_sample(
            std::sync::Arc::new(crate::sample::Sample::default()),
            vec![measured],
            s.now,
            s.now,
        );
        s.drain();
        let events = s.events();
        let detach = events.iter().rev().find(|(a, _, _)| a == "detach");
        assert_eq!(
            detach.map(|(_, r, _)| r.as_str()),
            Some(reason),
            "{events:?}"
        );
        let view = s.engine.view();
        let ended = view.ended.iter().find(|e| e.name == "sim").expect("ended");
        assert_eq!(
            ended.how.contains("OOM killer killed 1 process(es)"),
            kills == 1,
            "{}",
            ended.how
        );
    }
}
