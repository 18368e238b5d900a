//! The swap step for a job no fix can help (attached without a config): emergency swap made, the
//! held job's memory pushed out while it stays held (the policy does not resume it halfway, even
//! when its level comes back as the push goes on), then resumed into that room. A daemon killed
//! mid-push leaves a job its successor resumes whole; a job that brings back most of what was
//! pushed out and runs out of room again goes on down the ladder, never pushed out again.

use std::collections::VecDeque;

use crate::engine::{WayOutDone, WayOutTask};
use crate::held::{Device, Record};
use crate::way_out::{Phase, Reclaimed};

use super::harness::{Kind, ROOT, Sim, cgroup_dir};

const GIB: u64 = 1 << 30;

/// A v2 job with a 1 GiB limit it fills, emergency swap possible (a swapfile directory), held at
/// its line and down to the swap step, its emergency swap made: the push handed off.
fn pushing() -> Sim {
    let mut s = Sim::with(
        Kind::V2,
        "[way_out]\nsteps = [\"swap\", \"lend\"]\nswapfile_dir = \"/sim/swap\"\ndecide_seconds = 5\n",
        &[],
    );
    s.way_out_tasks = Some(VecDeque::new());
    s.cgroup_limit = Some(GIB);
    s.sample(0.5);
    assert!(s.held(), "held at its line: {:?}", s.events());
    s.now += 6_000;
    s.sample(0.5);
    let made = match s.way_out_tasks.as_mut().and_then(VecDeque::pop_front) {
        Some(WayOutTask::Make { job, bytes, .. }) => Record {
            device: Device::File(format!("{ROOT}/swap/memwatch-swap-sim").into()),
            job,
            bytes,
        },
        other => panic!("no swap asked for: {other:?}; {:?}", s.events()),
    };
    // The room it needs (its shortfall, nil here, and the margin), with the margin again to spare.
    assert_eq!(made.bytes, 512 << 20);
    s.way_out_done(WayOutDone::Made {
        job: "sim".into(),
        result: Ok(made),
    });
    match s.way_out_tasks.as_mut().and_then(VecDeque::pop_front) {
        Some(WayOutTask::Reclaim { job, dir, bytes }) => {
            assert_eq!(job, "sim");
            assert_eq!(Some(dir.dir), cgroup_dir(&s.root(), Kind::V2));
            assert_eq!(bytes, 256 << 20);
        }
        other => panic!("no push: {other:?}; {:?}", s.events()),
    }
    assert_eq!(phase(&s), Some(Phase::Reclaiming));
    s
}

fn phase(s: &Sim) -> Option<Phase> {
    s.engine
        .view()
        .jobs
        .into_iter()
        .find(|j| j.name == "sim")
        .and_then(|j| j.way_out.map(|w| w.phase))
}

fn pushed(refaults_at: u64) -> WayOutDone {
    WayOutDone::Reclaimed {
        job: "sim".into(),
        result: Ok(Reclaimed {
            how: "memory.reclaim".into(),
            usage_before: GIB,
            usage_after: 64 << 20,
            swap_after: 960 << 20,
            ms: 3_000,
            refaults_at: Some(refaults_at),
        }),
    }
}

#[test]
fn a_held_job_is_pushed_out_then_resumed_into_that_room() {
    let mut s = pushing();
    // Its level comes back as the push goes on: the policy leaves the resume to the push.
    s.cgroup_limit = Some(8 * GIB);
    for _ in 0..3 {
        s.now += 1_000;
        s.sample(0.5);
    }
    assert!(s.held(), "resumed halfway: {:?}", s.events());
    s.way_out_done(pushed(0));
    assert!(s.all_running(), "{:?}", s.host.acts());
    assert!(s.pause().is_none());
    assert_eq!(phase(&s), Some(Phase::Clearing));
    let events = s.events();
    assert!(
        events
            .iter()
            .any(|(a, r, _)| a == "way_out" && r == "reclaim"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(a, r, _)| a == "resume" && r == "way_out"),
        "{events:?}"
    );
}

#[test]
fn a_daemon_killed_mid_push_leaves_the_job_resumed_whole() {
    let mut s = pushing();
    s.now += 500;
    s.restart();
    assert!(s.pause().is_none(), "{:?}", s.events());
    assert!(s.all_running(), "{:?}", s.host.acts());
}

#[test]
fn a_job_that_brings_its_memory_back_is_not_pushed_out_again() {
    let mut s = pushing();
    s.way_out_done(pushed(100));
    assert!(s.all_running());
    // It brings back 900 MiB of the 960 pushed out and fills its limit again.
    let dir = cgroup_dir(&s.root(), Kind::V2).unwrap();
    let back = 100 + (900u64 << 20) / 4096;
    s.host.set_cgroup_file(
        &dir,
        "memory.stat",
        &format!("anon 1073741824\nworkingset_refault_anon {back}\n"),
    );
    // Its level back to ok (its usage fell with the push)...
    s.cgroup_limit = Some(8 * GIB);
    for _ in 0..5 {
        s.now += 1_000;
        s.sample(0.5);
    }
    assert!(s.pause().is_none());
    // ...then at its line again.
    s.cgroup_limit = Some(GIB);
    s.now += 1_000;
    s.sample(0.5);
    s.now += 1_000;
    s.sample(0.5);
    let taken: Vec<String> = s
        .engine
        .view()
        .jobs
        .into_iter()
        .find(|j| j.name == "sim")
        .and_then(|j| j.way_out)
        .map(|w| {
            w.taken
                .into_iter()
                .map(|t| format!("{}: {}", t.step, t.outcome))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        taken
            .iter()
            .any(|t| t
                .contains("not pushed out again (it thrashes: it brought back 900 of the 960 MiB")),
        "{taken:#?}"
    );
    assert!(
        !s.way_out_tasks
            .iter()
            .flatten()
            .any(|t| matches!(t, WayOutTask::Reclaim { .. })),
        "pushed again: {:?}",
        s.way_out_tasks
    );
}
