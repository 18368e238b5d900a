//! Survival: a hog touching memory at 1 GiB/s inside a real memory cgroup limited to 512 MiB, with the
//! daemon attached, is paused before the cgroup's OOM killer fires — in every one of 20 runs — and held
//! while there is no room. Then the limit is raised, the hog is resumed and finishes, and the cgroup's
//! OOM-kill count is unchanged.
//! Kept in its own test binary so no other test competes with it for the CPU.

mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, eventually, memhog, proc_state};

const MIB: u64 = 1 << 20;

#[test]
fn hog_is_paused_before_the_oom_killer_in_every_run() {
    let Some(cg) = MemCgroup::new(512 * MIB) else {
        panic!("cannot create a memory cgroup: this test needs root and a memory controller");
    };
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 1000,
        ..Opts::default()
    });
    let runs = 20;
    let mut paused_at = Vec::new();
    for run in 0..runs {
        cg.set_limit(512 * MIB);
        let go = d.dir.path().join(format!("go-{run}"));
        let mut hog = cg.spawn(
            &memhog(),
            &[
                "--rate-mib",
                "1024",
                "--total-mib",
                "768",
                "--wait-file",
                go.to_str().unwrap(),
            ],
        );
        let pid = hog.id();
        let mut out = BufReader::new(hog.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let name = format!("hog{run}");
        let (code, _, err) = d.ctl(&["attach", &pid.to_string(), "--name", &name]);
        assert_eq!(code, 0, "{err}");
        let oom_before = cg.oom_kills();
        std::fs::write(&go, "").unwrap();

        assert!(
            eventually(5.0, || proc_state(pid) == Some('T')),
            "run {run}: the hog was not paused (state {:?}, OOM kills {} → {})\n{:?}",
            proc_state(pid),
            oom_before,
            cg.oom_kills(),
            d.events()
        );
        let usage: u64 = std::fs::read_to_string(cg.dir.join(if cg.version == 1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        }))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
        paused_at.push(usage / MIB);
        // A pause on a projection is brief (it ends once the job has been held for reaction_ms and no
        // longer grows, as a burst that ended would); a hog that goes on growing is then stopped at the
        // critical level by the kernel's threshold notification, and held: there is no room.
        std::thread::sleep(Duration::from_millis(1000));
        assert!(
            eventually(2.0, || proc_state(pid) == Some('T')),
            "run {run}: not held with no room (state {:?}, OOM kills {} → {})\n{:#?}",
            proc_state(pid),
            oom_before,
            cg.oom_kills(),
            d.events().iter().rev().take(12).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            proc_state(pid),
            Some('T'),
            "run {run}: resumed with no room"
        );
        assert_eq!(
            cg.oom_kills(),
            oom_before,
            "run {run}: the OOM killer fired"
        );

        cg.set_limit(3072 * MIB);
        let status = hog.wait().unwrap();
        assert!(
            status.success(),
            "run {run}: the hog did not finish: {status:?}"
        );
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "done 768", "run {run}");
        assert_eq!(
            cg.oom_kills(),
            oom_before,
            "run {run}: the OOM killer fired"
        );
        assert!(
            eventually(5.0, || d.job_state(&name).is_none()),
            "run {run}: the finished job stayed attached"
        );
    }
    let events = d.events();
    let pauses = events.iter().filter(|e| e["action"] == "pause").count();
    let resumes = events.iter().filter(|e| e["action"] == "resume").count();
    assert!(
        pauses >= runs && resumes >= runs,
        "{pauses} pauses, {resumes} resumes"
    );
    eprintln!("paused at cgroup usage (MiB of 512): {paused_at:?}");
}
