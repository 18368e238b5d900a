//! Slurm's word checked, over two nodes: on the real two-node cluster of
//! tests/common/slurm_nodes.rs, node 1's `scontrol suspend` carries the suspension out but answers
//! 4 s late, after `command_timeout_ms` (a busy slurmctld). Node 1 settles it by the job's state read
//! back, so it knows it holds the job through Slurm; once node 1 has room the job runs again on
//! both nodes and stays running: it never stays suspended after every node's room came back.
//! Before, memwatch fell back to signals, recorded no Slurm suspension, said `running`, and squeue
//! said S with node 2's step frozen for good.

mod common;

use std::path::Path;

use common::eventually;
use common::slurm::{RemovedOnDrop, held_through_slurm, make_room};
use common::slurm_nodes::{cluster, ranks, wait_adopted};

#[test]
fn a_suspend_answered_late_on_one_node_never_leaves_the_job_suspended() {
    use std::os::unix::fs::PermissionsExt;
    let fill = Path::new("/dev/shm").join(format!("memwatch-nodes-late-{}", std::process::id()));
    let _gone = RemovedOnDrop(fill.clone());
    // Keys of `[slurm]` first (the section the cluster's config ends with), then the policy.
    let config = "command_timeout_ms = 1000\n[policy]\nmax_pause_seconds = 120\n\
                  [way_out]\nsteps = []\n";
    let (nodes, d1, d2) = cluster([config, config], [None, None]);
    // Node 1's scontrol answers a suspend 4 s after carrying it out.
    let wrapper = std::fs::read_to_string(&nodes.scontrol).unwrap();
    let real = wrapper
        .lines()
        .find(|l| l.contains("exec "))
        .unwrap()
        .replacen("exec ", "", 1);
    std::fs::write(
        &nodes.scontrol,
        format!(
            "#!/bin/sh\n{real}\nrc=$?\n\
             [ \"$1\" = suspend ] && [ \"$(hostname)\" = {n1} ] && sleep 4\nexit $rc\n",
            n1 = nodes.names[0]
        ),
    )
    .unwrap();
    std::fs::set_permissions(&nodes.scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();

    let script = format!("#!/bin/bash\n{}", ranks(&nodes, &fill));
    let id = nodes.sbatch(
        &["--ntasks-per-node=1", "--mem=300M", "-J", "late"],
        &script,
    );
    let name = format!("slurm-{id}");
    wait_adopted(&d2, &id, &nodes.names[1]);
    assert!(
        eventually(60.0, || nodes.state(&id) == "S"),
        "squeue never showed the job suspended (state {:?}); node 1's events: {:?}",
        nodes.state(&id),
        d1.events()
    );
    d1.wait_log("the late answer settled by the job's state", |l| {
        l.contains("Slurm answered late or not at all, but the job is as asked")
    });
    d1.wait_until(
        |d| held_through_slurm(d, &name),
        "node 1's pause is not held through Slurm",
    );

    // Node 1 gets room (node 2 never needed the pause): the job runs again on both nodes.
    make_room(&fill);
    assert!(
        eventually(30.0, || nodes.state(&id) == "R"),
        "the job stayed suspended (state {:?}); node 1 says {:?}; its events: {:?}",
        nodes.state(&id),
        d1.job_state(&name),
        d1.events()
    );
    for (i, d) in [(1, &d1), (2, &d2)] {
        d.wait_until(
            |d| d.job_state(&name).as_deref() == Some("running"),
            &format!("node {i}'s memwatch does not show the job running"),
        );
    }
    // And it stays running: over the next 20 of node 1's samples, every read says R.
    let until = d1.samples() + 20;
    while d1.samples() < until {
        assert_eq!(nodes.state(&id), "R", "node 1's events: {:?}", d1.events());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!((nodes.oom_kills(0, &id), nodes.oom_kills(1, &id)), (0, 0));
    nodes.run("scancel", &[&id]).unwrap();
}
