//! A real DDP job across the two-node Slurm cluster of tests/common/slurm_nodes.rs: `srun -N2
//! --ntasks-per-node=1` starts one PyTorch rank per node (gloo over the nodes' bridge, CPU), each
//! rank on `memwatch.pytorch.AdaptiveLoader` talking to its own node's memwatch. Only rank 0's
//! node comes under pressure (its GPU, a fake NVML, at 92 %, and its task's memory cgroup at 86 %):
//! that node's memwatch alone asks for fewer workers and half the micro-batch, and both ranks take
//! the same micro-batch and accumulation from the same optimizer step, the effective batch kept,
//! their weights equal at the end, and the job completes.

mod common;

use std::path::Path;

use common::eventually;
use common::python::ready_python;
use common::slurm_nodes::cluster_with;

/// memwatch's rules for the test (as python/tests/scenario.py): a change a second, bounds that allow
/// one cut of each knob (workers 4 → 2, micro-batch 8 → 4), and no pause.
const CONFIG: &str = "[adapt]\nsettle_seconds = 1\nverify_seconds = 10\nmin_workers = 2\n\
                      min_micro_batch = 4\n[policy.job_cgroup]\naction = \"pause\"\nwarn = 0.8\n\
                      warn_leave = 0.7\ncritical = 0.995\ncritical_leave = 0.99\nenter_hold_ms = 0\n\
                      leave_hold_ms = 5000\n";

const NO_GPU_LOAD: &str = r#"{"driver_version": "550.54.15", "devices": [{"name": "NVIDIA Fake",
 "uuid": "GPU-00000000-0000-4000-8000-000000000000", "pci_bus_id": "00000000:01:00.0",
 "memory_total": 25769803776, "memory_used": 1073741824, "temperature": 50, "processes": []}]}"#;

fn records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn of<'a>(run: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    run.iter().filter(|r| r["kind"] == kind).collect()
}

/// The v1 memory cgroup directory of process `pid`.
fn memory_cgroup(pid: u64) -> std::path::PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let rel = text
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        })
        .unwrap_or_else(|| panic!("no memory cgroup for {pid}: {text}"));
    Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'))
}

fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_ddp_job_over_two_nodes_takes_one_nodes_change_on_every_rank_at_the_same_step() {
    let Some(python) = ready_python("slurm_ddp") else {
        return;
    };
    let (nodes, d1, d2) = cluster_with(true, Some(NO_GPU_LOAD), [CONFIG, CONFIG], [None, None]);
    let dir = nodes.dir.path();
    let repo = common::repo();
    for rank in 0..2 {
        std::fs::write(
            dir.join(format!("train{rank}.json")),
            r#"{"train": {"micro_batch": 8, "accumulation": 2, "workers": 4, "pin_memory": true}, "epochs": 5}"#,
        )
        .unwrap();
    }
    let go = dir.join("go");
    let sockets: String = (0..2)
        .map(|i| {
            format!(
                "{}) export MEMWATCH_SOCKET={} ;;\n",
                nodes.names[i],
                [&d1, &d2][i].socket.display()
            )
        })
        .collect();
    // Rank 0 on the batch node (the allocation's first), which is the rendezvous.
    let script = format!(
        "#!/bin/bash\n\
         export MASTER_ADDR=$(getent hosts $SLURMD_NODENAME | cut -d' ' -f1) MASTER_PORT={port}\n\
         export PYTHONPATH={repo}/python/src OMP_NUM_THREADS=1\n\
         srun -N2 --ntasks-per-node=1 bash -c 'case $SLURMD_NODENAME in\n{sockets}esac\n\
           export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS\n\
           exec {python} {trainers}/ddp_train.py {dir}/train$RANK.json {dir}/out$RANK.jsonl {go} {dir}/output'\n",
        port = 29_000 + std::process::id() % 1000,
        repo = repo.display(),
        python = python.display(),
        trainers = repo.join("python/tests/trainers").display(),
        dir = dir.display(),
        go = go.display(),
    );
    let id = nodes.sbatch(
        &["--ntasks-per-node=1", "--mem=2000M", "-J", "ddp"],
        &script,
    );
    let out = |rank: usize| dir.join(format!("out{rank}.jsonl"));
    let ready = |rank: usize| {
        of(&records(&out(rank)), "ready")
            .first()
            .map(|r| (*r).clone())
    };
    assert!(
        eventually(240.0, || ready(0).is_some() && ready(1).is_some()),
        "the ranks never reached their first step (state {:?}); rank 0: {:?}; rank 1: {:?}\n{}",
        nodes.state(&id),
        records(&out(0)),
        records(&out(1)),
        nodes.logs()
    );
    // Each rank is attached to its own node's memwatch; which node runs rank 0 is Slurm's choice.
    let has = |d: &common::Daemon, name: &str| d.jobs().iter().any(|j| j["name"] == name);
    assert!(
        eventually(20.0, || (has(&d1, "ddp0") && has(&d2, "ddp1"))
            || (has(&d2, "ddp0") && has(&d1, "ddp1"))),
        "the ranks are not each attached on their node: {:?} / {:?}",
        d1.jobs(),
        d2.jobs()
    );
    let (d0, other) = if has(&d1, "ddp0") {
        (&d1, &d2)
    } else {
        (&d2, &d1)
    };

    // Rank 0's node only: its GPU at 92 %, and its task's memory cgroup at 86 % (warn).
    let pid = ready(0).unwrap()["pid"].as_u64().unwrap();
    let total: u64 = 24 << 30;
    let used = total * 92 / 100;
    d0.set_gpu_state(&format!(
        r#"{{"driver_version": "550.54.15", "devices": [{{"name": "NVIDIA Fake",
         "uuid": "GPU-00000000-0000-4000-8000-000000000000", "pci_bus_id": "00000000:01:00.0",
         "memory_total": {total}, "memory_used": {used}, "temperature": 50,
         "processes": [{{"pid": {pid}, "used_memory": {used}}}]}}]}}"#
    ));
    let cg = memory_cgroup(pid);
    let usage = read_u64(&cg.join("memory.usage_in_bytes"));
    let inactive = std::fs::read_to_string(cg.join("memory.stat"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("total_inactive_file ")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    let limit = (usage.saturating_sub(inactive) as f64 / 0.86) as u64;
    std::fs::write(cg.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
    let staged = |d: &common::Daemon, name: &str| {
        d.jobs().into_iter().find(|j| j["name"] == name).map(|j| {
            j["config"]["directives"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
    };
    assert!(
        eventually(30.0, || staged(d0, "ddp0").is_some_and(|d| !d.is_empty())),
        "rank 0's memwatch staged no change ({} at {} MiB of {} MiB); events {:?}",
        cg.display(),
        usage >> 20,
        limit >> 20,
        d0.events()
    );
    std::fs::write(&go, "").unwrap();
    let finished = |rank: usize| !of(&records(&out(rank)), "finished").is_empty();
    assert!(
        eventually(300.0, || finished(0) && finished(1)),
        "the ranks never finished (state {:?}); rank 0: {:?}",
        nodes.state(&id),
        records(&out(0)).last()
    );
    let (job0, job1) = (staged(d0, "ddp0"), staged(other, "ddp1"));
    std::fs::write(dir.join("go.done"), "").unwrap();
    assert!(
        eventually(60.0, || nodes.state(&id).is_empty()),
        "the job did not end (state {:?})",
        nodes.state(&id)
    );
    let state = nodes
        .run("scontrol", &["show", "job", "-o", &id])
        .unwrap_or_default();
    assert!(state.contains("JobState=COMPLETED"), "{state}");

    // Only rank 0's memwatch asked, and rank 0 applied it.
    let job0 = job0.expect("rank 0's job");
    assert!(!job0.is_empty());
    assert!(
        job0.iter().all(|x| !x["applied_epoch"].is_null()),
        "{job0:?}"
    );
    assert_eq!(job1, Some(Vec::new()), "rank 1's memwatch asked too");
    let runs = [records(&out(0)), records(&out(1))];
    let steps = [of(&runs[0], "step"), of(&runs[1], "step")];
    assert!(!steps[0].is_empty() && steps[0].len() == steps[1].len());
    let knobs = |s: &serde_json::Value| (s["micro"].as_u64(), s["accumulation"].as_u64());
    let differ: Vec<_> = steps[0]
        .iter()
        .zip(&steps[1])
        .filter(|(a, b)| knobs(a) != knobs(b))
        .collect();
    assert!(
        differ.is_empty(),
        "the ranks disagree: {:?}",
        &differ[..differ.len().min(3)]
    );
    assert_eq!(knobs(steps[0][0]), (Some(8), Some(2)));
    assert_eq!(knobs(steps[0][steps[0].len() - 1]), (Some(4), Some(4)));
    let changed_at = steps[0].iter().position(|s| knobs(s) == (Some(4), Some(4)));
    // Every optimizer step of each rank saw 16 samples: 32 over the job, before and after.
    assert!(
        steps.iter().flatten().all(|s| s["samples"] == 16),
        "an optimizer step with other than 16 samples"
    );
    let ends = [of(&runs[0], "end")[0], of(&runs[1], "end")[0]];
    assert_eq!(ends[0]["checksum"], ends[1]["checksum"], "{ends:?}");
    assert_eq!((nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)), (0, 0));
    eprintln!(
        "{} optimizer steps on each rank, both at micro-batch 4 × 4 from step {:?}",
        steps[0].len(),
        changed_at.map(|i| i + 1)
    );
}
