//! Benchmarks (ignored; `cargo test --test slurm_nodes_bench -- --ignored --nocapture`, runs from
//! `MEMWATCH_BENCH_RUNS`, 20 by default), on the real two-node cluster of
//! tests/common/slurm_nodes.rs, one cluster for every run of each.
//!
//! Fast growth on one node: node 1's rank touches 400 MiB at 1 GiB/s, then at 256 MiB/s, in a
//! 300 MiB job ([`fast_ranks`]). Reports per rate the MiB the rank had touched when it was stopped
//! (from its stamps; the critical line, 95 %, is 285 MiB), the OOM kills in both nodes' job cgroups,
//! how long from room (the job's limit raised on node 1) to the job running again, and how many
//! runs completed.
//!
//! Two nodes needing the same pause. Per run: node 1's rank fills
//! its job cgroup past critical and node 1 suspends the job; node 2's host memory goes critical and
//! node 2 holds the job too; node 2 recovers first; for 30 of node 1's samples the job's state is
//! read every 20 ms; node 1 gets room, and the job runs on and ends by itself (both ranks exit).
//! Reports per run whether the job ever ran while node 1 still held it, the OOM kills in both
//! nodes' job cgroups, whether the job completed, and how long from node 1's room to the job running
//! again.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::eventually;
use common::slurm::{RemovedOnDrop, held_through_slurm, make_room};
use common::slurm_nodes::{cluster, fast_ranks, host_memory, touched_mib, wait_adopted};

fn runs() -> usize {
    std::env::var("MEMWATCH_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// The `q` quantile of sorted `v` (NaN when empty).
fn quantile(v: &[f64], q: f64) -> f64 {
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

#[test]
#[ignore = "benchmark: run with --ignored"]
fn a_rank_growing_fast_benchmark() {
    let runs = runs();
    let policy = "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = []\n";
    let (nodes, d1, d2) = cluster([policy, policy], [None, None]);
    let mut lines = Vec::new();
    for rate in [1024u32, 256] {
        let (mut oom_kills, mut completed, mut suspended) = (0, 0, 0);
        let (mut touched, mut resumed_ms): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        for run in 0..runs {
            let tag = format!("{}-{rate}-{run}", std::process::id());
            let stamps = nodes.dir.path().join(format!("stamps-{tag}"));
            let done = Path::new("/dev/shm").join(format!("memwatch-bench-fast-{tag}"));
            let _gone = RemovedOnDrop(done.clone());
            let id = nodes.sbatch(
                &["--ntasks-per-node=1", "--mem=300M", "-J", "fastbench"],
                &fast_ranks(&nodes, rate, &stamps, &done),
            );
            let name = format!("slurm-{id}");
            wait_adopted(&d2, &id, &nodes.names[1]);
            let held = eventually(60.0, || nodes.state(&id) == "S")
                && eventually(10.0, || held_through_slurm(&d1, &name));
            suspended += usize::from(held);
            let at_stop = touched_mib(&stamps);
            touched.push(at_stop as f64);
            let room = Instant::now();
            nodes.raise_limit(0, &id, 1 << 30);
            let resumed = eventually(30.0, || nodes.state(&id) != "S")
                .then(|| room.elapsed().as_secs_f64() * 1000.0);
            resumed_ms.extend(resumed);
            completed += usize::from(nodes.completed(&id));
            oom_kills += nodes.oom_kills(0, &id) + nodes.oom_kills(1, &id);
            eprintln!(
                "{rate} MiB/s run {run}: job {id}, held {held}, stopped at {at_stop} MiB, resumed {resumed:?} ms after room"
            );
        }
        touched.sort_by(f64::total_cmp);
        resumed_ms.sort_by(f64::total_cmp);
        let line = format!(
            "BENCH fast-growth {rate} MiB/s: {runs} runs; suspended and held {suspended}; OOM kills {oom_kills}; \
             completed {completed}; MiB touched at the stop p50 {:.0} / min {:.0} / max {:.0} (critical line 285, \
             limit 300); room → running p50 {:.0} / p90 {:.0} / max {:.0} ms",
            quantile(&touched, 0.5),
            quantile(&touched, 0.0),
            quantile(&touched, 1.0),
            quantile(&resumed_ms, 0.5),
            quantile(&resumed_ms, 0.9),
            quantile(&resumed_ms, 1.0),
        );
        eprintln!("{line}");
        lines.push((line, (suspended, oom_kills, completed)));
    }
    for (line, figures) in lines {
        assert_eq!(figures, (runs, 0, runs), "{line}");
    }
}

#[test]
#[ignore = "benchmark: run with --ignored"]
fn both_nodes_need_the_pause_benchmark() {
    let runs = runs();
    let host = tempfile::tempdir().unwrap();
    common::copy_tree(&common::fixture_root(), host.path());
    host_memory(host.path(), 0.5);
    // The way out off: node 1's pause is held until the benchmark makes room (with it on, the
    // checkpoint step requeues the job once the pause has waited `decide_seconds`).
    let policy = "[policy]\nmax_pause_seconds = 120\n[policy.host_memory]\nleave_hold_ms = 0\n\
                  [way_out]\nsteps = []\n";
    let (nodes, d1, d2) = cluster([policy, policy], [None, Some(host.path())]);
    let (mut ran_while_held, mut oom_kills, mut completed) = (0, 0, 0);
    let mut resumed_ms: Vec<f64> = Vec::new();
    for run in 0..runs {
        let tag = format!("{}-{run}", std::process::id());
        let fill = Path::new("/dev/shm").join(format!("memwatch-bench-fill-{tag}"));
        let done = Path::new("/dev/shm").join(format!("memwatch-bench-done-{tag}"));
        let _gone = (RemovedOnDrop(fill.clone()), RemovedOnDrop(done.clone()));
        // Node 1's rank fills 1 MiB every 40 ms toward the job's 300 MiB and exits once the file is
        // gone; node 2's rank waits for the end.
        let script = format!(
            "#!/bin/bash\nsrun -N2 --ntasks-per-node=1 bash -c 'if [ \"$SLURMD_NODENAME\" = {n1} ]; then\n\
               for i in $(seq 1 299); do\n\
                 if [ $i -gt 1 ] && [ ! -e {fill} ]; then break; fi\n\
                 dd if=/dev/zero bs=1M count=1 status=none >> {fill}; sleep 0.04\n\
               done; touch {done}\n\
             else while [ ! -e {done} ]; do sleep 0.1; done; fi'\n",
            n1 = nodes.names[0],
            fill = fill.display(),
            done = done.display(),
        );
        let id = nodes.sbatch(
            &["--ntasks-per-node=1", "--mem=300M", "-J", "bench"],
            &script,
        );
        let name = format!("slurm-{id}");
        let job = name.as_str();
        wait_adopted(&d2, &id, &nodes.names[1]);
        assert!(
            eventually(60.0, || nodes.state(&id) == "S"),
            "run {run}: node 1 never suspended the job"
        );
        let is = |action: &'static str| {
            move |e: &serde_json::Value| e["action"] == action && e["job"] == job
        };
        host_memory(host.path(), 0.97);
        d2.wait_event("node 2's pause", is("pause"));
        host_memory(host.path(), 0.5);
        d2.wait_event("node 2's resume", is("resume"));
        let until = d1.samples() + 30;
        let mut ran = false;
        while d1.samples() < until {
            ran |= nodes.state(&id) == "R";
            std::thread::sleep(Duration::from_millis(20));
        }
        ran_while_held += usize::from(ran);
        let room = Instant::now();
        make_room(&fill);
        let resumed = eventually(30.0, || nodes.state(&id) != "S")
            .then(|| room.elapsed().as_secs_f64() * 1000.0);
        resumed_ms.extend(resumed);
        completed += usize::from(nodes.completed(&id));
        oom_kills += nodes.oom_kills(0, &id) + nodes.oom_kills(1, &id);
        eprintln!(
            "run {run}: job {id}, ran while node 1 held it: {ran}, resumed {resumed:?} ms after node 1's room"
        );
    }
    resumed_ms.sort_by(f64::total_cmp);
    let p = |q: f64| quantile(&resumed_ms, q);
    eprintln!(
        "BENCH both-nodes: {runs} runs; the job ran while node 1 held it in {ran_while_held}; \
         OOM kills {oom_kills}; completed {completed}; node 1's room → running p50 {:.0} / p90 {:.0} / max {:.0} ms",
        p(0.5),
        p(0.9),
        p(1.0)
    );
    assert_eq!((ran_while_held, oom_kills, completed), (0, 0, runs));
}
