//! A real two-node Slurm cluster on this one machine (tests/common/slurm_nodes.rs: each slurmd in
//! network, UTS and mount namespaces of its own, one memwatch per node, the repository's prolog and
//! epilog): a job of one rank per node (`-N2 --ntasks-per-node=1`) is attached on both nodes; one
//! node's rank crossing critical suspends the whole job through Slurm and making room resumes it on
//! both; the way out requeues it and Slurm runs it again, attached again on both nodes.

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use common::slurm::{RemovedOnDrop, gone, make_room, stopped};
use common::slurm_nodes::{
    Nodes, cluster, fast_ranks, host_memory, ranks, touched_mib, wait_adopted,
};
use common::{eventually, proc_state};

/// One cluster at a time: two jobs filling memory on two cores would race each other's pauses.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The job's step 0 rank on node `i`, with its processes, once it runs.
fn rank(nodes: &Nodes, i: usize, id: &str) -> Vec<u32> {
    assert!(
        eventually(30.0, || !nodes.step_tasks(i, id, "0").is_empty()),
        "step 0 never started on {}; state {:?}\n{}",
        nodes.names[i],
        nodes.state(id),
        nodes.logs()
    );
    nodes.step_tasks(i, id, "0")
}

#[test]
fn one_node_at_critical_suspends_the_job_on_both_nodes_and_room_resumes_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let fill = Path::new("/dev/shm").join(format!("memwatch-nodes-{}", std::process::id()));
    let _gone = RemovedOnDrop(fill.clone());
    let policy = "[policy]\nmax_pause_seconds = 120\n";
    let (nodes, d1, d2) = cluster([policy, policy], [None, None]);
    let began = Instant::now();
    let script = format!("#!/bin/bash\n{}", ranks(&nodes, &fill));
    let id = nodes.sbatch(
        &["--ntasks-per-node=1", "--mem=300M", "-J", "twonode"],
        &script,
    );
    let name = format!("slurm-{id}");

    // Each node's prolog attached the job to its own memwatch, which follows that node's rank.
    wait_adopted(&d1, &id, &nodes.names[0]);
    wait_adopted(&d2, &id, &nodes.names[1]);
    for (i, d) in [(0, &d1), (1, &d2)] {
        let job = d.jobs().into_iter().find(|j| j["name"] == name.as_str());
        let job = job.unwrap_or_else(|| panic!("{name} is not attached on node {i}"));
        assert_eq!(job["origin"]["kind"], "slurm", "{job}");
        assert_eq!(
            job["sample"]["cgroup"]["limit_bytes"].as_u64(),
            Some(300 << 20),
            "node {i}'s limit is its own job cgroup's: {job}"
        );
    }

    // Node 1's rank crosses critical: its memwatch suspends the whole job through Slurm.
    assert!(
        eventually(60.0, || nodes.state(&id) == "S"),
        "squeue never showed the job suspended (state {:?}); node 1's events: {:?}\n{}",
        nodes.state(&id),
        d1.events(),
        nodes.logs()
    );
    let suspended = began.elapsed();
    let live = |i: usize| -> Vec<u32> {
        nodes
            .step_tasks(i, &id, "0")
            .into_iter()
            .filter(|p| !gone(*p))
            .collect()
    };
    let (r1, r2) = (live(0), live(1));
    assert!(
        !r1.is_empty() && !r2.is_empty(),
        "a rank of each node: {r1:?} {r2:?}"
    );
    assert!(
        eventually(5.0, || r1
            .iter()
            .chain(&r2)
            .all(|p| gone(*p) || stopped(*p))),
        "not every rank stopped: node 1 {:?}, node 2 {:?}",
        r1.iter().map(|p| (p, proc_state(*p))).collect::<Vec<_>>(),
        r2.iter().map(|p| (p, proc_state(*p))).collect::<Vec<_>>(),
    );
    let is_pause = |e: &serde_json::Value| e["action"] == "pause" && e["job"] == name.as_str();
    let pause = d1
        .wait_event("node 1's pause event", is_pause)
        .into_iter()
        .find(is_pause)
        .unwrap();
    assert_eq!(pause["slurm_job_id"], id.as_str(), "{pause}");
    assert_eq!(d1.job_state(&name).as_deref(), Some("paused"));
    // Node 2's rank is well under its line: its memwatch made no pause of its own.
    d2.wait_samples(5);
    assert!(
        !d2.events().iter().any(is_pause),
        "node 2 paused on its own: {:?}",
        d2.events()
    );
    // Node 2 knows all the same: Slurm froze its rank, so it shows the job paused (no pause of its
    // own) and counts it in memwatch_job_paused, as the recording rules sum over the nodes.
    d2.wait_until(
        |d| {
            d.jobs().iter().any(|j| {
                j["name"] == name.as_str()
                    && j["state"] == "paused"
                    && j["pause"].is_null()
                    && j["slurm_suspended_since_ms"].as_u64().is_some()
                    && j["slurm_holders"] == serde_json::json!([nodes.names[0]])
            })
        },
        "node 2's memwatch does not show the job suspended through Slurm, held by node 1",
    );
    let job_label = format!("job_name=\"{name}\"");
    assert!(
        eventually(5.0, || d2
            .metrics()
            .lines()
            .any(|l| l.starts_with("memwatch_job_paused{")
                && l.contains(&job_label)
                && l.ends_with(" 1"))),
        "node 2's metrics do not count the job paused:\n{}",
        d2.metrics()
    );
    assert_eq!((nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)), (0, 0));

    // Room is made: node 1's memwatch resumes the job through Slurm, on both nodes.
    make_room(&fill);
    assert!(
        eventually(30.0, || nodes.state(&id) == "R"),
        "the job was never resumed (state {:?}); node 1's events: {:?}",
        nodes.state(&id),
        d1.events()
    );
    assert!(
        eventually(5.0, || r1
            .iter()
            .chain(&r2)
            .all(|p| gone(*p) || !stopped(*p))),
        "a rank is still stopped"
    );
    for (i, d) in [(1, &d1), (2, &d2)] {
        d.wait_until(
            |d| d.job_state(&name).as_deref() == Some("running"),
            &format!("node {i}'s memwatch does not show the job running"),
        );
    }
    assert_eq!((nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)), (0, 0));
    let resumed = began.elapsed();

    // The job ends; each node's epilog detaches it from its memwatch.
    nodes.run("scancel", &[&id]).unwrap();
    for (i, d) in [(0, &d1), (1, &d2)] {
        d.wait_event(&format!("node {i}'s epilog detached the job"), |e| {
            e["action"] == "detach" && e["slurm_job_id"] == id.as_str()
        });
    }
    eprintln!(
        "suspended after {suspended:?}, resumed after {resumed:?}, detached after {:?}",
        began.elapsed()
    );
}

/// The way out, job-wide over two nodes: the ladder's checkpoint step requeues the job through
/// Slurm (`scontrol requeue`), both ranks end, and Slurm runs it again, attached again on both nodes.
#[test]
fn the_way_out_requeues_a_two_node_job_and_both_nodes_follow_its_next_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let fill = Path::new("/dev/shm").join(format!("memwatch-nodes-rq-{}", std::process::id()));
    let _gone = RemovedOnDrop(fill.clone());
    let (nodes, d1, d2) = cluster(
        [
            "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = [\"checkpoint\"]\ndecide_seconds = 1\n",
            "[policy]\nmax_pause_seconds = 120\n",
        ],
        [None, None],
    );
    let began = Instant::now();
    let runs = nodes.dir.path().join("runs");
    // The first run fills as `ranks` does (and does not stop, the file staying); a run after a
    // requeue says which it is and sleeps on both nodes.
    let script = format!(
        "#!/bin/bash\n\
         echo \"restart=${{SLURM_RESTART_COUNT:-0}}\" >> {runs}\n\
         if [ \"${{SLURM_RESTART_COUNT:-0}}\" -gt 0 ]; then exec srun -N2 --ntasks-per-node=1 sleep 600; fi\n\
         {}",
        ranks(&nodes, &fill),
        runs = runs.display(),
    );
    let id = nodes.sbatch(
        &[
            "--ntasks-per-node=1",
            "--mem=300M",
            "--requeue",
            "-J",
            "twonoderq",
        ],
        &script,
    );
    let name = format!("slurm-{id}");
    let first = [rank(&nodes, 0, &id), rank(&nodes, 1, &id)];
    wait_adopted(&d2, &id, &nodes.names[1]);
    assert!(
        eventually(60.0, || nodes.state(&id) == "S"),
        "squeue never showed the job suspended (state {:?}); node 1's events: {:?}",
        nodes.state(&id),
        d1.events()
    );
    // No room comes: the ladder's last step requeues the job through Slurm.
    d1.wait_event("node 1's memwatch requeued the Slurm job", |e| {
        e["job"] == name.as_str()
            && e["action"] == "terminate"
            && e["detail"]
                .as_str()
                .is_some_and(|t| t.contains(&format!("requeued Slurm job {id}")))
    });
    let _ = std::fs::remove_file(&fill);
    // Both ranks of the first run end, and each node's epilog detaches the job.
    assert!(
        eventually(30.0, || first.iter().flatten().all(|p| gone(*p))),
        "a rank of the first run outlived the requeue: {:?}",
        first
            .iter()
            .flatten()
            .map(|p| (p, proc_state(*p)))
            .collect::<Vec<_>>()
    );
    for (i, d) in [(0, &d1), (1, &d2)] {
        d.wait_event(&format!("node {i}'s epilog detached the first run"), |e| {
            e["action"] == "detach" && e["slurm_job_id"] == id.as_str()
        });
    }
    // Slurm holds a requeued job back until its credential expired (`cred_expire`, 5 s here, and
    // the scheduler looks every second): a node runs the prolog (and makes the extern step) only
    // for a job whose credential it no longer holds, so a run started earlier by hand
    // (`scontrol update StartTime=now`) goes unattached.
    let _ = common::wait::until(
        "the second run's line",
        || {
            let text = std::fs::read_to_string(&runs).unwrap_or_default();
            let show = nodes.run("scontrol", &["show", "job", &id]);
            (text, show, nodes.logs())
        },
        |(text, _, _)| text.lines().last() == Some("restart=1"),
    );
    let show = nodes
        .run("scontrol", &["show", "job", &id])
        .unwrap_or_default();
    assert!(show.contains("Restarts=1"), "{show}");
    // The second run is attached again on both nodes, with its own ranks.
    let second = [rank(&nodes, 0, &id), rank(&nodes, 1, &id)];
    for (i, d) in [(0, &d1), (1, &d2)] {
        common::wait::until(
            &format!("node {i}'s memwatch follows the second run's rank"),
            || (d.jobs(), d.events(), nodes.logs()),
            |(jobs, _, _)| {
                jobs.iter().any(|j| {
                    j["name"] == name.as_str()
                        && j["sample"]["processes"].as_array().is_some_and(|ps| {
                            ps.iter().any(|p| {
                                p["pid"]
                                    .as_u64()
                                    .is_some_and(|p| second[i].contains(&(p as u32)))
                            })
                        })
                })
            },
        );
    }
    assert_eq!((nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)), (0, 0));
    for d in [&d1, &d2] {
        assert!(
            d.events()
                .iter()
                .all(|e| e["action"] != "error" || e["job"] != name.as_str()),
            "{:?}",
            d.events()
        );
    }
    eprintln!("requeued and attached again after {:?}", began.elapsed());
}

/// Two nodes needing the same pause: node 1's rank crosses its line and node 1 suspends the job;
/// node 2's host memory then goes critical and node 2 suspends it too; node 2 recovers first. The
/// job must stay suspended while node 1 still needs it (node 1's rank never runs above its line,
/// no OOM kill), and run again once node 1 has room.
#[test]
fn a_suspension_two_nodes_need_is_held_until_both_have_room() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let fill = Path::new("/dev/shm").join(format!("memwatch-nodes-both-{}", std::process::id()));
    let _gone = RemovedOnDrop(fill.clone());
    let host = tempfile::tempdir().unwrap();
    common::copy_tree(&common::fixture_root(), host.path());
    host_memory(host.path(), 0.5);
    // The way out off on both nodes: node 1's pause is held until the test makes room (its
    // checkpoint step would requeue the job once the pause has waited `decide_seconds`).
    let (nodes, d1, d2) = cluster(
        [
            "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = []\n",
            "[policy]\nmax_pause_seconds = 120\n[policy.host_memory]\nleave_hold_ms = 0\n\
             [way_out]\nsteps = []\n",
        ],
        [None, Some(host.path())],
    );
    let script = format!("#!/bin/bash\n{}", ranks(&nodes, &fill));
    let id = nodes.sbatch(
        &["--ntasks-per-node=1", "--mem=300M", "-J", "bothneed"],
        &script,
    );
    let name = format!("slurm-{id}");
    wait_adopted(&d2, &id, &nodes.names[1]);
    assert!(
        eventually(60.0, || nodes.state(&id) == "S"),
        "node 1 never suspended the job (state {:?}); node 1's events: {:?}",
        nodes.state(&id),
        d1.events()
    );
    let job = name.as_str();
    let is = |action: &'static str| {
        move |e: &serde_json::Value| e["action"] == action && e["job"] == job
    };
    d1.wait_event("node 1's pause", is("pause"));

    // Each node that holds the job has its hold in the job's AdminComment, which Slurm keeps.
    let holders = || {
        let line = nodes
            .run("scontrol", &["show", "job", "-o", &id])
            .unwrap_or_default();
        let comment = memwatch::act::slurm_holds::admin_comment(&line).to_owned();
        let holds = memwatch::act::slurm_holds::Holds::parse(&comment);
        holds
            .holds
            .iter()
            .map(|h| h.node.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(10.0, || holders() == [nodes.names[0].clone()]),
        "node 1's hold is not in the job's AdminComment: {:?}",
        holders()
    );

    // Node 2's host goes critical: it suspends the job too; then it recovers, first.
    host_memory(host.path(), 0.97);
    d2.wait_event("node 2's pause", is("pause"));
    assert!(
        eventually(10.0, || holders().len() == 2),
        "node 2's hold is not in the job's AdminComment: {:?}",
        holders()
    );
    // Node 1's memwatch shows both holds (it reads them back with each check of its own).
    let held_by = |d: &common::Daemon| {
        d.jobs()
            .into_iter()
            .find(|j| j["name"] == job)
            .map(|j| j["slurm_holders"].clone())
    };
    let both = serde_json::json!([nodes.names[0], nodes.names[1]]);
    d1.wait_until(
        |d| held_by(d).as_ref() == Some(&both),
        "node 1's memwatch does not show both nodes holding the job",
    );
    host_memory(host.path(), 0.5);
    d2.wait_event("node 2's resume", is("resume"));
    // Node 2 shows the job still suspended, held by node 1.
    d2.wait_until(
        |d| held_by(d) == Some(serde_json::json!([nodes.names[0]])),
        "node 2's memwatch does not show node 1 holding the job",
    );
    // Node 2 released its hold, and node 1's kept the job suspended: node 2 resumed nothing.
    assert!(
        eventually(10.0, || holders() == [nodes.names[0].clone()]),
        "node 2's hold is still there: {:?}",
        holders()
    );
    assert!(
        eventually(10.0, || d2
            .log_text()
            .contains("stays suspended while other nodes hold it")),
        "node 2 did not say node 1 keeps the job suspended:\n{}",
        d2.log_text()
    );

    // Node 1 still needs the pause: over the next 3 s (30 of its samples) its rank never runs
    // while its cgroup is above its critical line, and nothing is OOM-killed.
    let limit = 300u64 << 20;
    let usage = || {
        std::fs::read_to_string(nodes.job_cgroup(0, &id).join("memory.usage_in_bytes"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let until = d1.samples() + 30;
    let mut running_above = None;
    while d1.samples() < until {
        let (used, state) = (usage(), nodes.state(&id));
        assert_eq!(
            state,
            "S",
            "the job ran while node 1 holds it (node 1's rank at {} MiB of 300); node 2's events: {:?}",
            used >> 20,
            d2.events()
        );
        if used * 100 >= limit * 95 && state == "R" {
            running_above.get_or_insert((used >> 20, Instant::now()));
        } else {
            running_above = None;
        }
        if let Some((mib, since)) = running_above {
            assert!(
                since.elapsed().as_millis() < 500,
                "the job ran for 500 ms with node 1's rank at {mib} MiB of 300 (OOM kills: {}); \
                 node 1's events: {:?}",
                nodes.oom_kills(0, &id),
                d1.events()
            );
        }
        assert_eq!(
            nodes.oom_kills(0, &id),
            0,
            "node 1's rank was OOM-killed; squeue {:?}; node 1's events: {:?}",
            nodes.state(&id),
            d1.events()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Node 1 gets room: the job runs again, whole, and no hold is left.
    make_room(&fill);
    assert!(
        eventually(30.0, || nodes.state(&id) == "R"),
        "the job was never resumed (state {:?})",
        nodes.state(&id)
    );
    assert_eq!(holders(), Vec::<String>::new());
    assert_eq!((nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)), (0, 0));
    nodes.run("scancel", &[&id]).unwrap();
}

/// Stop here first, across two nodes: node 1's rank grows at 1 GiB/s, then (a second job) at
/// 256 MiB/s, toward 400 MiB in a 300 MiB job. Node 1's memwatch stops its own rank at once and
/// then suspends the job through Slurm (which alone would be too slow: the runs were
/// OOM-killed inside the pause). No OOM kill anywhere in the job's cgroups on either node; once
/// node 1's rank has room (its job's limit raised) the job runs again whole and completes.
#[test]
fn a_rank_growing_fast_on_one_node_is_stopped_there_first_and_the_job_completes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let policy = "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = []\n";
    let (nodes, d1, d2) = cluster([policy, policy], [None, None]);
    for rate in [1024, 256] {
        let tag = format!("{}-{rate}", std::process::id());
        let stamps = nodes.dir.path().join(format!("stamps-{rate}"));
        let done = Path::new("/dev/shm").join(format!("memwatch-nodes-fast-{tag}"));
        let _gone = RemovedOnDrop(done.clone());
        let id = nodes.sbatch(
            &["--ntasks-per-node=1", "--mem=300M", "-J", "fast"],
            &fast_ranks(&nodes, rate, &stamps, &done),
        );
        let name = format!("slurm-{id}");
        wait_adopted(&d2, &id, &nodes.names[1]);
        assert!(
            eventually(60.0, || nodes.state(&id) == "S"),
            "{rate} MiB/s: squeue never showed the job suspended (state {:?}); node 1's events: {:?}\n{}",
            nodes.state(&id),
            d1.events(),
            nodes.logs()
        );
        d1.wait_until(
            |d| {
                d.jobs().iter().any(|j| {
                    j["name"] == name.as_str()
                        && j["pause"]["mechanism"]["kind"] == "slurm_suspend"
                        && j["pause"]["phase"] == "held"
                        && !j["pause"]["stopped"].as_array().is_none_or(Vec::is_empty)
                })
            },
            &format!(
                "{rate} MiB/s: node 1 did not stop its rank first and hold the job through Slurm"
            ),
        );
        let touched = touched_mib(&stamps);
        assert_eq!(
            (nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)),
            (0, 0),
            "{rate} MiB/s: the OOM killer fired (the rank had touched {touched} MiB); node 1's events: {:?}",
            d1.events()
        );
        assert!(
            (1..400).contains(&touched),
            "{rate} MiB/s: the rank touched {touched} MiB"
        );

        // Room: the job's limit raised on node 1; the job runs again whole and ends by itself.
        assert!(nodes.raise_limit(0, &id, 1 << 30) >= 2, "no limit raised");
        assert!(
            eventually(30.0, || nodes.state(&id) != "S"),
            "{rate} MiB/s: the job was never resumed; node 1's events: {:?}",
            d1.events()
        );
        assert!(
            eventually(60.0, || nodes.state(&id).is_empty()),
            "{rate} MiB/s: the job did not end (state {:?})",
            nodes.state(&id)
        );
        let state = nodes
            .run("scontrol", &["show", "job", "-o", &id])
            .unwrap_or_default();
        assert!(
            state.contains("JobState=COMPLETED") && touched_mib(&stamps) == 400,
            "{rate} MiB/s: the job did not complete (touched {} MiB): {state}",
            touched_mib(&stamps)
        );
        assert_eq!((nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)), (0, 0));
        assert!(
            !d1.events().iter().any(|e| e["action"] == "oom_kill"),
            "{:?}",
            d1.events()
        );
        eprintln!("{rate} MiB/s: node 1 stopped its rank at {touched} MiB; the job completed");
    }
}
