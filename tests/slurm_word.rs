//! Slurm's word checked and a rank stopped here first, on a real single-node Slurm cluster (as in
//! tests/slurm.rs): an `scontrol suspend` answered after the timeout is settled by the job's state
//! read back, and a rank growing at 1 GiB/s is stopped on its node before Slurm suspends the job.

mod common;

use std::sync::Mutex;

use common::slurm::{cluster_and_daemon, cluster_and_daemon_with, held_through_slurm, make_room};
use common::{eventually, memhog};

/// One cluster at a time: two jobs filling memory on two cores would race each other's pauses.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Slurm's word is checked, not assumed: an `scontrol suspend` that carries the suspension out but
/// answers after `command_timeout_ms` (a busy slurmctld, here a wrapper that sleeps after the real
/// call) is settled by the job's state read back, so memwatch knows the job is suspended through
/// Slurm and resumes it through Slurm once there is room. Before, it fell back to signals, recorded
/// no Slurm suspension and said `running` while squeue said S for good.
#[test]
fn a_suspend_slurm_answers_late_is_known_and_resumed_through_slurm() {
    use std::os::unix::fs::PermissionsExt;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (cluster, d) = cluster_and_daemon_with(
        |c| {
            let slow = c.dir.path().join("scontrol-slow");
            std::fs::write(
                &slow,
                format!(
                    "#!/bin/sh\n{} \"$@\"\nrc=$?\n[ \"$1\" = suspend ] && sleep 4\nexit $rc\n",
                    c.scontrol.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
            format!(
                "[slurm]\nscontrol = {slow:?}\nscancel = {:?}\ncommand_timeout_ms = 1000\n\
                 [policy]\nmax_pause_seconds = 120\n",
                c.scancel
            )
        },
        &[],
    );

    // One task fills a tmpfs file (charged to the job's cgroup) toward the job's 300 MiB and stops
    // once the file is gone.
    let fill = std::path::Path::new("/dev/shm").join(format!("memwatch-late-{}", cluster.node));
    let script = format!(
        "#!/bin/bash\n\
         srun -n1 bash -c 'for i in $(seq 1 299); do\n\
           if [ $i -gt 1 ] && [ ! -e {fill} ]; then break; fi\n\
           dd if=/dev/zero bs=1M count=1 status=none >> {fill}; sleep 0.04\n\
         done; exec sleep 600'\n",
        fill = fill.display(),
    );
    let id = cluster.sbatch(&["-n1", "--mem=300M", "-J", "mwlate"], &script);
    let name = format!("slurm-{id}");
    assert!(
        eventually(60.0, || cluster.state(&id) == "S"),
        "squeue never showed the job suspended (state {:?}); events: {:?}",
        cluster.state(&id),
        d.events()
    );
    d.wait_log("the late answer settled by the job's state", |l| {
        l.contains("Slurm answered late or not at all, but the job is as asked")
    });
    d.wait_until(
        |d| held_through_slurm(d, &name),
        "the job's pause is not held through Slurm",
    );

    // Room is made: the job is resumed through Slurm, not left suspended.
    make_room(&fill);
    assert!(
        eventually(30.0, || cluster.state(&id) == "R"),
        "the job stayed suspended (state {:?}); memwatch says {:?}; events: {:?}",
        cluster.state(&id),
        d.job_state(&name),
        d.events()
    );
    d.wait_until(
        |d| d.job_state(&name).as_deref() == Some("running"),
        "memwatch does not show the job running",
    );
    cluster.run("scancel", &[&id]).unwrap();
    assert!(eventually(20.0, || cluster.state(&id).is_empty()));
    let _ = std::fs::remove_file(&fill);
}

/// Stop here first: a rank growing at 1 GiB/s toward its Slurm job's limit is stopped on this node
/// at once, while the suspension goes through Slurm (scontrol, slurmctld, slurmd), which it would
/// otherwise outrun into the job cgroup's OOM killer; the whole job is then suspended (squeue S),
/// and no OOM kill happened anywhere in the job's cgroups (the step's and task's included).
#[test]
fn a_rank_growing_fast_is_stopped_here_before_slurm_suspends_the_job() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (cluster, d) = cluster_and_daemon(
        "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = []\n",
        &[],
    );
    let script = format!(
        "#!/bin/bash\nsrun -n1 {hog} --rate-mib 1024 --total-mib 400 --hold-ms 600000\n",
        hog = memhog().display(),
    );
    let id = cluster.sbatch(&["-n1", "--mem=300M", "-J", "mwfast"], &script);
    let name = format!("slurm-{id}");
    assert!(
        eventually(60.0, || cluster.state(&id) == "S"),
        "squeue never showed the job suspended (state {:?}); events: {:?}",
        cluster.state(&id),
        d.events()
    );
    d.wait_until(
        |d| held_through_slurm(d, &name),
        "the pause is not held through Slurm",
    );
    // Every memory cgroup of the job, the step's and the task's too (v1 counts a kill only where
    // it happened).
    let mut kills = Vec::new();
    let mut dirs = vec![cluster.job_cgroup(&id)];
    while let Some(dir) = dirs.pop() {
        if let Ok(t) = std::fs::read_to_string(dir.join("memory.oom_control")) {
            kills.push((
                dir.clone(),
                t.lines()
                    .find(|l| l.starts_with("oom_kill "))
                    .map(str::to_owned),
            ));
        }
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    // Why and how early it was stopped (`--nocapture` shows it: the headroom left at the stop).
    let events = d.events();
    let paused = events.iter().find(|e| e["action"] == "pause");
    eprintln!(
        "paused: {}",
        paused.map_or("never", |e| e["detail"].as_str().unwrap_or(""))
    );
    assert!(kills.len() >= 2, "the job's cgroups: {kills:?}");
    assert!(
        kills
            .iter()
            .all(|(_, k)| k.as_deref() == Some("oom_kill 0")),
        "the OOM killer fired: {kills:?}; events: {events:?}; the daemon's log:\n{}",
        d.log_text()
    );
    let events = d.events();
    assert!(
        !events.iter().any(|e| e["action"] == "oom_kill"),
        "{events:?}; the daemon's log:\n{}",
        d.log_text()
    );
    let job = d
        .jobs()
        .into_iter()
        .find(|j| j["name"] == name.as_str())
        .unwrap();
    assert!(
        !job["pause"]["stopped"].as_array().is_none_or(Vec::is_empty),
        "this node's tasks were not stopped first: {job}"
    );
    cluster.run("scancel", &[&id]).unwrap();
    assert!(eventually(20.0, || cluster.state(&id).is_empty()));
}
