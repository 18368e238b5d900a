//! Every event's `reason` in a real run is a label docs/api.md lists. A job growing toward its own
//! cgroup's limit, with `checkpoint_signal` set, is asked to checkpoint with reason `job_cgroup` —
//! never a word of the sentence for people ("qa's cgroup at 95 %"), such as the job's name — then
//! paused for it, and finds no way out.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;

use common::cgroup::MemCgroup;
use common::{Daemon, Opts, eventually};

const MIB: u64 = 1 << 20;

/// The labels of docs/api.md's table of event reasons (its header begins "| `reason` |").
fn documented() -> Vec<String> {
    let doc = std::fs::read_to_string(common::repo().join("docs/api.md")).unwrap();
    let mut lines = doc
        .lines()
        .skip_while(|l| !l.starts_with("## `/api/v1/events`"))
        .skip_while(|l| !l.starts_with("| `reason` |"))
        .skip(2);
    let mut labels = Vec::new();
    for l in lines.by_ref().take_while(|l| l.starts_with('|')) {
        let cell = l.split('|').nth(1).unwrap().trim();
        labels.push(cell.trim_matches('`').to_owned());
    }
    assert!(labels.len() > 20, "docs/api.md's reasons: {labels:?}");
    labels
}

fn find<'a>(
    events: &'a [serde_json::Value],
    action: &str,
    job: &str,
) -> Option<&'a serde_json::Value> {
    events
        .iter()
        .find(|e| e["action"] == action && e["job"] == job)
}

#[test]
fn a_checkpoint_before_a_cgroup_pause_has_reason_job_cgroup_and_every_reason_is_documented() {
    let documented = documented();
    let cg = MemCgroup::new(512 * MIB).expect("a memory cgroup (needs root)");
    // The checkpoint is asked for when the cgroup turns critical (95 %, about 486 MiB) while its
    // limit is more than twice the grace away at the job's growth (26 MiB at 32 MiB/s: 0.8 s); the
    // pause follows the grace. No way-out step: the way out's own event comes a second later.
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        extra_config: "[policy]\ncheckpoint_signal = \"SIGUSR1\"\ncheckpoint_grace_ms = 200\n\
                       [way_out]\nsteps = []\ndecide_seconds = 1\n",
        ..Opts::default()
    });
    // A job that ignores SIGUSR1 (its checkpoint signal), growing steadily toward the limit.
    let script = format!(
        "trap \"\" USR1; exec {} --rate-mib 32 --total-mib 500 --hold-ms 120000",
        common::memhog().display()
    );
    let mut hog = cg.spawn(Path::new("/bin/sh"), &["-c", &script]);
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = hog.id();
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "qa"]).0, 0);

    let ended = || {
        d.events()
            .iter()
            .any(|e| e["action"] == "way_out" && e["job"] == "qa" && e["reason"] == "no_way_out")
    };
    assert!(
        eventually(60.0, ended),
        "no way_out event; events: {:#?}\nusage {} MiB",
        d.events(),
        cg.usage() / MIB
    );
    let events = d.events();
    let checkpoint = find(&events, "checkpoint", "qa").expect("a checkpoint event");
    assert_eq!(checkpoint["reason"], "job_cgroup", "{checkpoint}");
    assert!(
        checkpoint["detail"]
            .as_str()
            .unwrap()
            .starts_with("qa's cgroup"),
        "{checkpoint}"
    );
    let pause = find(&events, "pause", "qa").expect("a pause event");
    assert_eq!(pause["reason"], "job_cgroup", "{pause}");
    // Its reason is the limit's it names: the job's cgroup's as it nears its limit, or the host's
    // when the host's MemAvailable falls faster meanwhile (seen once in CI, before the job's growth
    // was known: "host: 22Gi left, growing 253Mi/s: full in 91 s").
    let near: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["action"] == "near_exhaustion" && e["job"] == "qa")
        .collect();
    assert!(!near.is_empty(), "no near_exhaustion event: {events:#?}");
    for e in near {
        let detail = e["detail"].as_str().unwrap_or_default();
        let limit = match e["reason"].as_str() {
            Some("job_cgroup") => "cgroup: ",
            Some("host_memory") => "host: ",
            other => panic!("near_exhaustion with reason {other:?}: {e}"),
        };
        assert!(detail.starts_with(limit), "{e}");
    }
    // The job ignored its checkpoint signal and is still there, paused.
    assert!(common::proc_state(pid).is_some_and(|s| s != 'Z'));

    // Every reason recorded in this run, counted, and exported is one docs/api.md lists.
    for e in &events {
        let reason = e["reason"].as_str().unwrap();
        assert!(
            documented.iter().any(|l| l == reason),
            "undocumented reason {reason:?}: {e}"
        );
    }
    let (_, body) = d.get("/api/v1/events");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let counted = v["interventions"].as_array().unwrap();
    assert!(
        counted
            .iter()
            .any(|c| c["action"] == "checkpoint" && c["reason"] == "job_cgroup"),
        "{v}"
    );
    for c in counted {
        let reason = c["reason"].as_str().unwrap();
        assert!(documented.iter().any(|l| l == reason), "{c}");
    }
    let metrics = d.metrics();
    for l in metrics
        .lines()
        .filter(|l| l.starts_with("memwatch_interventions_total{"))
    {
        let reason = l.split("reason=\"").nth(1).unwrap().split('"').next();
        assert!(documented.iter().any(|d| Some(d.as_str()) == reason), "{l}");
    }
    assert!(
        metrics.contains(
            "memwatch_interventions_total{action=\"checkpoint\",reason=\"job_cgroup\"} 1\n"
        ),
        "{metrics}"
    );
    assert_eq!(d.ctl(&["detach", "qa"]).0, 0);
    let _ = hog.kill();
    let _ = hog.wait();
}
