//! Follow the job, not its first task: on the real two-node cluster of tests/common/slurm_nodes.rs
//! without `PrologFlags=Contain` (no extern step holds the job on a node between its steps), a job
//! of two steps. On the node without the batch script, step 0's task ends and nothing of the job is
//! left there; memwatch follows the job into step 1 there, pauses it (through Slurm, job-wide) when
//! step 1's rank crosses its line, and lets it go when the job's epilog runs.

mod common;

use std::path::Path;

use common::eventually;
use common::slurm::{RemovedOnDrop, make_room};
use common::slurm_nodes::cluster_with;

#[test]
fn without_contain_the_job_is_followed_into_its_next_step_until_its_epilog() {
    let fill = Path::new("/dev/shm").join(format!("memwatch-steps-{}", std::process::id()));
    let _gone = RemovedOnDrop(fill.clone());
    let policy = "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = []\n";
    let (nodes, d1, d2) = cluster_with(false, None, [policy, policy], [None, None]);
    // Step 0: a short task on each node. Step 1: the rank on the node without the batch script
    // fills `fill` (tmpfs, charged to its job cgroup) 1 MiB every 40 ms toward the job's 300 MiB
    // and stops filling once the file is gone; the batch node's rank sleeps.
    let script = format!(
        "#!/bin/bash\nexport BATCH=$SLURMD_NODENAME\n\
         srun -N2 --ntasks-per-node=1 sleep 1\n\
         srun -N2 --ntasks-per-node=1 bash -c 'if [ \"$SLURMD_NODENAME\" != \"$BATCH\" ]; then\n\
           for i in $(seq 1 299); do\n\
             if [ $i -gt 1 ] && [ ! -e {fill} ]; then break; fi\n\
             dd if=/dev/zero bs=1M count=1 status=none >> {fill}; sleep 0.04\n\
           done; fi; exec sleep 600'\n",
        fill = fill.display(),
    );
    let id = nodes.sbatch(
        &["--ntasks-per-node=1", "--mem=300M", "-J", "steps"],
        &script,
    );
    let name = format!("slurm-{id}");
    assert!(
        eventually(30.0, || nodes.state(&id) == "R"),
        "the job never ran (state {:?})\n{}",
        nodes.state(&id),
        nodes.logs()
    );
    let line = nodes
        .run("scontrol", &["show", "job", "-o", &id])
        .unwrap_or_default();
    let batch = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("BatchHost="))
        .unwrap_or_else(|| panic!("no BatchHost: {line}"))
        .to_owned();
    let other = usize::from(batch == nodes.names[0]);
    let d = [&d1, &d2][other];
    let node = &nodes.names[other];
    let job = name.as_str();

    // Step 0's task ends on the other node: memwatch follows the job on, into its next step.
    d.wait_event(&format!("{node}'s memwatch follows the job on"), |e| {
        e["action"] == "attach"
            && e["job"] == job
            && e["slurm_job_id"] == id.as_str()
            && e["detail"]
                .as_str()
                .is_some_and(|t| t.contains("following it into its next step"))
    });
    // Step 1's rank there crosses its line: that node's memwatch suspends the whole job.
    assert!(
        eventually(60.0, || nodes.state(&id) == "S"),
        "{node} never suspended the job in its second step (state {:?}); its events: {:?}\n{}",
        nodes.state(&id),
        d.events(),
        nodes.logs()
    );
    let pause = d.wait_event(&format!("{node}'s pause"), |e| {
        e["action"] == "pause" && e["job"] == job
    });
    let pause = pause
        .iter()
        .find(|e| e["action"] == "pause" && e["job"] == job)
        .unwrap();
    assert_eq!(pause["slurm_job_id"], id.as_str(), "{pause}");
    assert_eq!(nodes.oom_kills(other, &id), 0);

    // Room: the job runs again; then it ends and its epilog lets it go on that node.
    make_room(&fill);
    assert!(
        eventually(30.0, || nodes.state(&id) == "R"),
        "the job was never resumed (state {:?}); {node}'s events: {:?}",
        nodes.state(&id),
        d.events()
    );
    d.wait_until(
        |d| d.job_state(&name).as_deref() == Some("running"),
        &format!("{node}'s memwatch does not show the job running in its second step"),
    );
    nodes.run("scancel", &[&id]).unwrap();
    d.wait_event(&format!("{node}'s epilog let the job go"), |e| {
        e["action"] == "detach" && e["slurm_job_id"] == id.as_str() && e["reason"] != "gone"
    });
    assert_eq!(nodes.oom_kills(other, &id), 0);
}
