//! Quiet when calm: full samples stretch to `sampling.calm_interval_ms` only while the kernel
//! watches for change and nothing is near trouble; anything that moves brings back the usual
//! interval at once, and the host's MemAvailable is still read every interval while fast growth
//! could reach its critical line within a stretched interval.

use crate::engine::{Wake, WakeAnswer};
use crate::job::Watch;

use super::harness::{Kind, Sim};
use super::{pause_cmd, resume_cmd};

/// A sim whose host and job the kernel watches (a PSI trigger, v1 thresholds), sampled calm.
fn watched(extra: &str) -> Sim {
    let mut s = Sim::with(Kind::V1, extra, &[]);
    s.engine.set_host_watched(true);
    s.engine.set_watch("sim", Watch::Watched);
    s.sample(0.30);
    s
}

#[test]
fn calm_stretches_the_full_samples_and_reads_the_host_in_between() {
    let mut s = watched("");
    assert!(s.engine.calm(s.now));
    assert_eq!(s.engine.sample_interval_ms(s.now), 10_000);
    // 9.6 GiB above the critical line (0.90 of 16 GiB): 4 GiB/s would use it in 2.4 s, so the
    // host is read that often between full samples (and no job is probed: the kernel watches it).
    let every = s.engine.probe_interval_ms(s.now).expect("the host is read");
    assert!((2390..=2400).contains(&every), "{every}");
    assert!(s.engine.probe_host(s.now));
    // Less room, more reads.
    s.now += 1000;
    s.sample(0.45);
    assert!(s.engine.calm(s.now));
    let every = s.engine.probe_interval_ms(s.now).expect("the host is read");
    assert!((1790..=1800).contains(&every), "{every}");
    // Over half the host used, with a job attached: still the host alone, as its room needs (4.8
    // GiB above the line: every 1.2 s), not the job, which the kernel watches.
    s.now += 1000;
    s.sample(0.60);
    assert!(s.engine.calm(s.now));
    let every = s.engine.probe_interval_ms(s.now).expect("the host is read");
    assert!((1190..=1200).contains(&every), "{every}");
    // A level raised (the host at warn): the job and the host, fast while it changes.
    s.now += 1000;
    s.sample(0.85);
    assert!(!s.engine.calm(s.now));
    assert_eq!(s.engine.probe_interval_ms(s.now), Some(10));
    // With a calm interval of 2 s the room lasts: nothing is read between full samples.
    let mut s = watched("[sampling]\ncalm_interval_ms = 2000\n");
    assert_eq!(s.engine.sample_interval_ms(s.now), 2000);
    assert_eq!(s.engine.probe_interval_ms(s.now), None);
    assert!(!s.engine.probe_host(s.now));
    s.now += 2000;
    s.sample(0.30);
    assert!(s.engine.calm(s.now));
}

/// A job whose usage sits over its critical line by its page cache (a dataset read at its limit)
/// is watched in name only: as its own memory grows the kernel drops cache and its usage barely
/// moves, so no threshold tells of it. The engine is not calm and probes it; once its usage is back
/// under the line, the thresholds watch it again.
#[test]
fn a_job_over_its_line_by_its_page_cache_is_probed_not_left_to_its_thresholds() {
    let mut s = watched("");
    s.cgroup_limit = Some(1 << 30);
    s.probe_cgroup(1000 << 20, 300 << 20);
    assert_eq!(
        s.engine.why_not_calm(s.now),
        Some("a job's usage is over its critical line, held under it by its page cache")
    );
    assert_eq!(s.engine.probe_interval_ms(s.now), Some(100));
    assert!(s.pause().is_none(), "700 MiB of 1 GiB is not critical");
    // Its own memory grew into the cache: the probe's reading of it pauses the job.
    s.now += 100;
    s.probe_cgroup(1000 << 20, 10 << 20);
    assert!(s.pause().is_some(), "990 MiB of 1 GiB held");
}

#[test]
fn anything_near_trouble_brings_back_the_usual_interval() {
    // The host within 5 points of its warn line (0.80).
    let mut s = watched("");
    s.now += 1000;
    s.sample(0.76);
    assert_eq!(
        s.engine.why_not_calm(s.now),
        Some("a level is raised, changing or near its warn line")
    );
    assert_eq!(s.engine.sample_interval_ms(s.now), 1000);
    s.now += 1000;
    s.sample(0.30);
    assert!(s.engine.calm(s.now), "calm again once the host is back");

    // The kernel woke the daemon (a threshold crossed): fast probing, and no stretching, for a while.
    assert_eq!(s.engine.handle_wake(s.now, Wake::Job), WakeAnswer::Probe);
    assert!(!s.engine.calm(s.now));
    assert_eq!(s.engine.sample_interval_ms(s.now), 1000);
    assert_eq!(s.engine.probe_interval_ms(s.now), Some(10));
    s.advance_to(s.now + 3000);
    assert!(s.engine.calm(s.now));

    // A pause.
    assert!(s.cmd(pause_cmd()).ok);
    assert_eq!(s.engine.why_not_calm(s.now), Some("a job is paused"));
    assert!(s.cmd(resume_cmd()).ok);
    s.now += 1000;
    s.sample(0.30);
    assert!(s.engine.calm(s.now));
}

#[test]
fn without_the_kernels_watch_nothing_is_stretched() {
    // The host's pressure has no PSI trigger (a fixture tree, an old kernel).
    let mut s = watched("");
    s.engine.set_host_watched(false);
    assert!(!s.engine.calm(s.now));
    assert_eq!(
        s.engine.why_not_calm(s.now),
        Some("no PSI trigger on the host")
    );
    assert_eq!(s.engine.sample_interval_ms(s.now), 1000);
    // A job whose cgroup has no threshold: only full samples see it grow.
    s.engine.set_host_watched(true);
    s.engine.set_watch("sim", Watch::Probed);
    assert_eq!(
        s.engine.why_not_calm(s.now),
        Some("a job's cgroup is not watched (no thresholds, no reads of its usage)")
    );
    s.engine.set_watch("sim", Watch::Watched);
    assert!(s.engine.calm(s.now));
    // Stretching turned off: calm_interval_ms at interval_ms.
    let s = watched("[sampling]\ninterval_ms = 1000\ncalm_interval_ms = 1000\n");
    assert!(!s.engine.calm(s.now));
    assert_eq!(s.engine.sample_interval_ms(s.now), 1000);
    // A calm interval below the interval is the interval.
    let s = watched("[sampling]\ninterval_ms = 2000\ncalm_interval_ms = 500\n");
    assert_eq!(s.engine.sample_interval_ms(s.now), 2000);
}

#[test]
fn the_hosts_pressure_alone_while_calm_is_answered_by_one_full_sample() {
    // Calm, every job watched by its own thresholds: a stall elsewhere on the host asks for a full
    // sample now, and opens no window of fast probes.
    let mut s = watched("");
    assert!(s.engine.calm(s.now));
    assert_eq!(
        s.engine.handle_wake(s.now, Wake::HostPressure),
        WakeAnswer::FullSample
    );
    assert!(s.engine.calm(s.now), "{:?}", s.engine.why_not_calm(s.now));
    assert_ne!(s.engine.probe_interval_ms(s.now), Some(10));
    // That sample finds the host near its warn line: calm ends there, as with any sample.
    s.now += 100;
    s.sample(0.78);
    assert!(!s.engine.calm(s.now));
    assert_eq!(s.engine.sample_interval_ms(s.now), 1000);
    // Not calm: the host's pressure is probed fast for a while, as a job's crossing is.
    assert_eq!(
        s.engine.handle_wake(s.now, Wake::HostPressure),
        WakeAnswer::Probe
    );
    assert_eq!(s.engine.probe_interval_ms(s.now), Some(10));
    // A job that the kernel does not watch keeps the fast probes on the host's pressure too.
    let mut s = watched("");
    s.engine.set_watch("sim", Watch::Probed);
    assert_eq!(
        s.engine.handle_wake(s.now, Wake::HostPressure),
        WakeAnswer::Probe
    );
    assert_eq!(s.engine.probe_interval_ms(s.now), Some(10));
}

/// While calm, a job whose cgroup's members held its whole tree at the last walk is looked at
/// through them: the plan hands them over (and the measurement to compare usage with); a look that
/// found them the same keeps the walk's measurement and takes the cgroup's usage as a probe does.
/// Not calm, or at the smaps_rollup cadence, every look is a walk.
#[test]
fn a_calm_jobs_tree_is_looked_at_through_its_cgroups_members() {
    let mut s = watched("");
    s.cgroup_limit = Some(4 << 30);
    let members =
        crate::job::members::Members::of(vec![super::harness::PID, super::harness::PID + 1]);
    s.members = Some(members.clone());
    s.now += 10_000;
    s.sample(0.30);
    let walked = s.now;
    assert!(s.engine.calm(s.now));
    s.now += 10_000;
    let plan = s.engine.measure_plan(s.now);
    assert_eq!(plan.len(), 1);
    assert_eq!(plan[0].members_at_walk.as_ref(), Some(&members));
    let previous = plan[0].previous.as_ref().expect("the walk's measurement");
    assert_eq!(previous.timestamp_ms, walked);
    s.sample_unchanged(0.30, (1 << 30) + (2 << 20));
    let view = s.engine.view();
    let job = &view.jobs[0];
    let sample = job.sample.as_ref().unwrap();
    assert_eq!(
        sample.timestamp_ms, walked,
        "the walk's measurement is kept"
    );
    assert_eq!(sample.processes.len(), 2);
    assert_eq!(
        sample.cgroup.as_ref().map(|c| c.usage_bytes),
        Some((1 << 30) + (2 << 20)),
        "the look's usage is the job's now"
    );
    assert!(s.engine.calm(s.now), "a look changes nothing of calm");
    // A walk that found the members short of the tree: none handed over next time.
    s.members = None;
    s.now += 10_000;
    s.sample(0.30);
    s.now += 10_000;
    assert_eq!(s.engine.measure_plan(s.now)[0].members_at_walk, None);
    // Members again, then the host near its warn line: not calm, so the next look walks.
    s.members = Some(members.clone());
    s.now += 10_000;
    s.sample(0.30);
    s.now += 10_000;
    s.sample(0.78);
    assert!(!s.engine.calm(s.now));
    s.now += 1_000;
    assert_eq!(s.engine.measure_plan(s.now)[0].members_at_walk, None);
    // Calm again: handed over until the smaps_rollup cadence (5 minutes) asks for a walk.
    s.now += 10_000;
    s.sample(0.30);
    s.now += 10_000;
    s.sample(0.30);
    assert!(s.engine.calm(s.now));
    let mut walks = 0;
    for _ in 0..31 {
        s.now += 10_000;
        let plan = s.engine.measure_plan(s.now);
        if plan[0].members_at_walk.is_none() {
            walks += 1;
            s.sample(0.30);
        } else {
            s.sample_unchanged(0.30, (1 << 30) + (2 << 20));
        }
        assert!(s.engine.calm(s.now));
    }
    assert_eq!(walks, 1, "one walk in 310 s of calm looks");
}
