//! The cgroup freezer against real processes: a job in a cgroup of its own is frozen whole, however
//! it forks.

mod common;

use common::{Daemon, Opts, eventually, proc_state};

/// A job that forks all the time (a shell running a short command in a loop) in a cgroup of its
/// own is frozen whole at each pause: a child forked after a full sample's walk does not make the
/// engine take the cgroup for someone else's and fall back to signals.
#[test]
fn a_job_forking_all_the_time_is_frozen_at_each_pause() {
    let mut cg = common::cgroup::MemCgroup::new(1 << 30).expect("a memory cgroup (needs root)");
    assert!(cg.with_freezer(), "no freezer cgroup to give the job");
    let mut job = cg.spawn(
        std::path::Path::new("/bin/bash"),
        &["-c", "while :; do /bin/true; done"],
    );
    let shell = job.id();
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 100,
        ..Opts::default()
    });
    let (code, _, err) = d.ctl(&["attach", &shell.to_string(), "--name", "forky"]);
    assert_eq!(code, 0, "{err}");
    let frozen = || match &cg.freezer {
        Some(_) => cg.frozen(),
        None => std::fs::read_to_string(cg.dir.join("cgroup.events"))
            .is_ok_and(|s| s.lines().any(|l| l == "frozen 1")),
    };
    for round in 0..8 {
        // Full samples walk the tree while it forks; the pause uses what the last one decided.
        d.wait_samples(3);
        assert_eq!(d.ctl(&["pause", "forky"]).0, 0);
        d.wait_until(
            |d| d.job_state("forky").as_deref() == Some("paused"),
            "paused",
        );
        let mechanism = d.jobs()[0]["pause"]["mechanism"].clone();
        assert!(
            eventually(2.0, frozen),
            "round {round}: the cgroup was not frozen (pause by {mechanism}; the shell is {:?})",
            proc_state(shell)
        );
        assert_ne!(proc_state(shell), Some('T'), "round {round}: signalled");
        assert_eq!(d.ctl(&["resume", "forky"]).0, 0);
        d.wait_until(
            |d| d.job_state("forky").as_deref() == Some("running"),
            "resumed",
        );
        assert!(eventually(2.0, || !frozen()), "round {round}: left frozen");
    }
    let _ = job.kill();
    let _ = job.wait();
}
