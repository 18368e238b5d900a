//! A real single-node Slurm cluster (Debian's slurm-wlm and munge, cgroup plugin on): the prolog in
//! deploy/slurm/ attaches a two-task job by its id, one task crossing critical suspends the whole job
//! through Slurm (squeue says S, both tasks stopped), making room resumes it through Slurm, metrics
//! and events carry the Slurm job id, and the epilog detaches it.

mod common;

use std::sync::Mutex;

use common::prometheus::{Prometheus, dashboard_queries};
use common::slurm::{Cluster, RemovedOnDrop, cluster_and_daemon, gone, make_room, stopped};
use common::{Daemon, Opts, bin, eventually, memhog, proc_state};

/// Every process of the job's step 0 tasks on this node.
fn step_tasks(cluster: &Cluster, id: &str) -> Vec<u32> {
    let step = cluster.job_cgroup(id).join("step_0");
    let mut out = Vec::new();
    for task in ["task_0", "task_1"] {
        let procs =
            std::fs::read_to_string(step.join(task).join("cgroup.procs")).unwrap_or_default();
        out.extend(
            procs
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

/// One cluster at a time: two jobs filling memory on two cores would race each other's pauses.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn a_slurm_job_is_attached_by_its_prolog_suspended_whole_and_resumed() {
    // No way out: the pause must last until the test makes room, however long a loaded machine
    // takes to get there (the ladder would requeue the job after `decide_seconds`).
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (cluster, d) = cluster_and_daemon(
        "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = []\n",
        &[],
    );

    // Task 0 fills a tmpfs file (charged to the job's cgroup) at 25 MiB/s toward the job's 300 MiB,
    // and stops filling once the file is gone; task 1 holds 16 MiB.
    let shm = cluster
        .dir
        .path()
        .join(format!("memwatch-test-{}", cluster.node));
    let script = format!(
        "#!/bin/bash\n\
         srun -n2 bash -c 'if [ \"$SLURM_PROCID\" = 0 ]; then\n\
           for i in $(seq 1 299); do\n\
             if [ $i -gt 1 ] && [ ! -e /dev/shm/{fill} ]; then break; fi\n\
             dd if=/dev/zero bs=1M count=1 status=none >> /dev/shm/{fill}; sleep 0.04\n\
           done; exec sleep 600\n\
         else exec {hog} --rate-mib 64 --total-mib 16 --hold-ms 600000; fi'\n",
        fill = shm.file_name().unwrap().to_string_lossy(),
        hog = memhog().display(),
    );
    let fill = std::path::Path::new("/dev/shm").join(shm.file_name().unwrap());
    let id = cluster.sbatch(&["-n2", "--mem=300M", "-J", "mwtest"], &script);
    let name = format!("slurm-{id}");

    // The prolog attached it by id; memwatch adopted it once its tasks ran, all of them.
    d.wait_until(
        |d| {
            d.jobs().iter().any(|j| {
                j["name"] == name.as_str()
                    && j["sample"]["process_count"].as_u64().unwrap_or(0) >= 2
            })
        },
        "the prolog's attach never became a job with the tasks",
    );
    assert!(
        eventually(20.0, || step_tasks(&cluster, &id).len() >= 2),
        "step 0's tasks never started"
    );
    let tasks = step_tasks(&cluster, &id);
    let job = d
        .jobs()
        .into_iter()
        .find(|j| j["name"] == name.as_str())
        .unwrap();
    assert_eq!(job["origin"]["kind"], "slurm", "{job}");
    assert_eq!(job["origin"]["id"], id.as_str(), "{job}");
    assert_eq!(
        job["sample"]["cgroup"]["limit_bytes"].as_u64(),
        Some(300 << 20),
        "the job's limit is its Slurm job cgroup's: {job}"
    );
    let listed: Vec<u64> = job["sample"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    assert!(
        tasks.iter().any(|t| listed.contains(&u64::from(*t))),
        "the step's tasks are the job's processes: {listed:?} vs {tasks:?}"
    );
    d.wait_metrics("memwatch_job_info with slurm_job_id", |metrics| {
        metrics.lines().any(|l| {
            l.starts_with("memwatch_job_info{") && l.contains(&format!("slurm_job_id=\"{id}\""))
        })
    });

    // Task 0 crosses critical: the whole job is suspended through Slurm.
    assert!(
        eventually(30.0, || cluster.state(&id) == "S"),
        "squeue never showed the job suspended (state {:?}); events: {:?}",
        cluster.state(&id),
        d.events()
    );
    // A dd that was ending as the job stopped is left out.
    let tasks: Vec<u32> = step_tasks(&cluster, &id)
        .into_iter()
        .filter(|p| proc_state(*p).is_some_and(|s| s != 'Z'))
        .collect();
    assert!(tasks.len() >= 2, "{tasks:?}");
    assert!(
        eventually(5.0, || tasks.iter().all(|p| gone(*p) || stopped(*p))),
        "not every task stopped: {:?}; freezer {:?}; usage {:?}",
        tasks
            .iter()
            .map(|p| (p, proc_state(*p)))
            .collect::<Vec<_>>(),
        std::fs::read_to_string(format!(
            "/sys/fs/cgroup/freezer/slurm_{}/uid_0/job_{id}/step_0/freezer.state",
            cluster.node
        )),
        std::fs::read_to_string(cluster.job_cgroup(&id).join("memory.usage_in_bytes")),
    );
    assert_eq!(d.job_state(&name).as_deref(), Some("paused"));
    let is_pause = |e: &serde_json::Value| e["action"] == "pause" && e["job"] == name.as_str();
    let pause = d
        .wait_event("a pause event", is_pause)
        .into_iter()
        .find(is_pause)
        .unwrap();
    assert_eq!(pause["slurm_job_id"], id.as_str(), "{pause}");
    let oom = std::fs::read_to_string(cluster.job_cgroup(&id).join("memory.oom_control"))
        .unwrap_or_default();
    assert!(oom.contains("oom_kill 0"), "the OOM killer fired: {oom}");

    // Room is made (the file is deleted): memwatch resumes the job through Slurm.
    make_room(&fill);
    assert!(
        eventually(30.0, || cluster.state(&id) == "R"),
        "the job was never resumed (state {:?}); events: {:#?}",
        cluster.state(&id),
        d.events()
    );
    assert!(
        eventually(5.0, || tasks.iter().all(|p| gone(*p) || !stopped(*p))),
        "a task is still stopped"
    );
    d.wait_until(
        |d| d.job_state(&name).as_deref() == Some("running"),
        "memwatch does not show the job running",
    );

    // The job ends; the epilog detaches it.
    cluster.run("scancel", &[&id]).unwrap();
    d.wait_until(
        |d| {
            d.events().iter().any(|e| {
                e["action"] == "detach"
                    && e["slurm_job_id"] == id.as_str()
                    && (e["reason"] == "slurm" || e["reason"] == "user")
            })
        },
        "the epilog never detached the job",
    );
    assert!(eventually(20.0, || cluster.state(&id).is_empty()));
    // Every event of the job names its Slurm job, the prolog's attach before any task ran here
    // included.
    let events: Vec<serde_json::Value> = d
        .events()
        .into_iter()
        .filter(|e| e["job"] == name.as_str())
        .collect();
    assert!(
        events.iter().any(|e| e["action"] == "attach"),
        "no attach event: {events:#?}"
    );
    for e in &events {
        assert_eq!(e["slurm_job_id"], id.as_str(), "{e}");
    }
    let _ = std::fs::remove_file(&fill);
}

/// The way out, job-wide: a Slurm job that outgrows its memory with no room to be had (the ladder is
/// the checkpoint step alone) is stopped through Slurm: memwatch resumes it and requeues it
/// (`scontrol requeue`), and Slurm runs it again, rather than anything relaunching it on this node.
#[test]
fn a_slurm_job_with_no_way_out_is_requeued_through_slurm() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Removed last, once the cluster has ended the job that fills it.
    let fill =
        std::path::Path::new("/dev/shm").join(format!("memwatch-requeue-{}", std::process::id()));
    let _gone = RemovedOnDrop(fill.clone());
    let (cluster, d) = cluster_and_daemon(
        "[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = [\"checkpoint\"]\ndecide_seconds = 1\n",
        &[],
    );
    let runs = cluster.dir.path().join("runs");
    // The first run fills a tmpfs file (charged to the job's cgroup) toward the job's 300 MiB; a run
    // after a requeue says which it is and waits.
    let script = format!(
        "#!/bin/bash\n\
         echo \"restart=${{SLURM_RESTART_COUNT:-0}}\" >> {runs}\n\
         if [ \"${{SLURM_RESTART_COUNT:-0}}\" -gt 0 ]; then exec sleep 600; fi\n\
         srun -n1 bash -c 'for i in $(seq 1 299); do\n\
           dd if=/dev/zero bs=1M count=1 status=none >> {fill}; sleep 0.04\n\
         done; exec sleep 600'\n",
        runs = runs.display(),
        fill = fill.display(),
    );
    let id = cluster.sbatch(&["-n1", "--mem=300M", "--requeue", "-J", "noroom"], &script);
    let name = format!("slurm-{id}");
    assert!(
        eventually(30.0, || cluster.state(&id) == "S"),
        "squeue never showed the job suspended (state {:?}); events: {:?}",
        cluster.state(&id),
        d.events()
    );
    // No room comes: the ladder's last step requeues the job through Slurm.
    d.wait_until(
        |d| {
            d.events().iter().any(|e| {
                e["job"] == name.as_str()
                    && e["action"] == "terminate"
                    && e["detail"]
                        .as_str()
                        .is_some_and(|t| t.contains(&format!("requeued Slurm job {id}")))
            })
        },
        "memwatch never requeued the Slurm job",
    );
    let _ = std::fs::remove_file(&fill);
    cluster.run_requeued(&id, &runs, "restart=1");
    let show = cluster
        .run("scontrol", &["show", "job", &id])
        .unwrap_or_default();
    assert!(show.contains("Restarts=1"), "{show}");
    // memwatch recorded no error for the job on the way.
    assert!(
        d.events()
            .iter()
            .all(|e| e["action"] != "error" || e["job"] != name.as_str()),
        "{:?}",
        d.events()
    );
}

/// The Grafana cluster dashboard, against a real Prometheus scraping two memwatch instances with a
/// Slurm job each, attached by id by hand (the cluster is opt-in: `MEMWATCH_SLURM_DEFAULT=off`, and
/// the prolog attaches only a third job whose comment opts in). One job is paused, one grows: every
/// panel query returns data, the Slurm job variable lists the jobs, and the recording rules aggregate
/// per Slurm job.
#[test]
fn every_cluster_dashboard_query_returns_data_for_two_nodes_with_a_slurm_job_each() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::prepare();
    let extra = cluster.memwatch_config();
    let start = || {
        Daemon::start(Opts {
            root: "/".into(),
            interval_ms: 200,
            extra_config: &extra,
            ..Opts::default()
        })
    };
    let (a, b) = (start(), start());
    let memwatch = bin();
    cluster.start(&[
        ("MEMWATCH", memwatch.to_str().unwrap()),
        ("MEMWATCH_SOCKET", a.socket.to_str().unwrap()),
        ("MEMWATCH_SLURM_DEFAULT", "off"),
    ]);
    let hog = |rate: &str| {
        format!(
            "#!/bin/bash\nsrun -n1 {} --rate-mib {rate} --total-mib 200 --hold-ms 600000\n",
            memhog().display()
        )
    };
    let grows = cluster.sbatch(&["-n1", "--mem=300M", "-J", "grows"], &hog("1"));
    let held = cluster.sbatch(&["-n1", "--mem=300M", "-J", "held"], &hog("64"));
    for (d, id) in [(&a, &grows), (&b, &held)] {
        assert!(
            eventually(30.0, || cluster.state(id) == "R"),
            "job {id} never ran"
        );
        assert!(
            eventually(20.0, || d.ctl(&["attach", "--slurm-job", id]).0 == 0),
            "could not attach Slurm job {id}"
        );
        let name = format!("slurm-{id}");
        d.wait_until(
            |d| d.job_state(&name).as_deref() == Some("running"),
            "the Slurm job was never adopted",
        );
    }
    // The cluster is opt-in: the prolog attached only the job whose comment opted in.
    let opted = cluster.sbatch(
        &["-n1", "--mem=100M", "--comment=memwatch=on", "-J", "opted"],
        "#!/bin/bash\nsrun -n1 sleep 600\n",
    );
    let opted_name = format!("slurm-{opted}");
    a.wait_until(
        |a| a.job_state(&opted_name).is_some(),
        "the prolog did not attach the job that opted in",
    );
    let mut on_a: Vec<String> = a
        .jobs()
        .iter()
        .filter_map(|j| j["name"].as_str().map(str::to_owned))
        .collect();
    on_a.sort();
    let mut want_a = vec![format!("slurm-{grows}"), opted_name];
    want_a.sort();
    assert_eq!(on_a, want_a, "the jobs that did not opt in stay unattached");
    // A pause by hand on `b` suspends its job through Slurm: a paused job and an intervention.
    let paused = format!("slurm-{held}");
    assert_eq!(b.ctl(&["pause", &paused]).0, 0);
    assert!(eventually(10.0, || cluster.state(&held) == "S"));

    let rules = common::repo().join("dashboards/recording.yml");
    let prom = Prometheus::start(&[a.addr, b.addr], &[&rules]);
    let exprs = dashboard_queries(&common::repo().join("dashboards/memwatch-cluster-grafana.json"));
    assert!(exprs.len() >= 12, "{exprs:?}");
    let empty = prom.without_data(&exprs, 60);
    assert!(empty.is_empty(), "cluster panels without data: {empty:#?}");
    // Each as soon as Prometheus has scraped it, and evaluated the rules over it.
    let mut want = vec![grows.clone(), held.clone(), opted.clone()];
    want.sort();
    common::wait::until(
        "the Slurm job variable lists the jobs",
        || {
            let mut ids = prom.label_values("slurm_job_id", "memwatch_job_info");
            ids.sort();
            ids
        },
        |ids| *ids == want,
    );
    common::wait::until(
        "both instances",
        || prom.label_values("instance", "memwatch_up"),
        |v| v.len() == 2,
    );
    for (id, paused) in [(&held, 1), (&grows, 0)] {
        let query =
            format!("slurm_job_id:memwatch_job_paused:sum{{slurm_job_id=\"{id}\"}} == {paused}");
        common::wait::until(&query, || prom.has_data(&query), |has| *has);
    }
    assert_eq!(b.ctl(&["resume", &paused]).0, 0);
    assert!(eventually(10.0, || cluster.state(&held) == "R"));
}

/// When Slurm will not suspend the job (here scontrol always fails), the pause falls back to
/// signals, and reaches every task of the job on this node: a task that is not a descendant of the
/// leader (another step's, started by its own slurmstepd) is stopped too, and both are continued on
/// resume. The job cgroup is laid out as Slurm's cgroup plugin lays it out, on v1's memory controller.
#[test]
fn without_slurm_the_pause_stops_every_task_with_signals() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let top = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/memory/slurm_mwfake{}",
        std::process::id()
    ));
    let job = top.join("uid_0/job_77");
    let steps = [job.join("step_batch/task_0"), job.join("step_0/task_0")];
    for s in &steps {
        std::fs::create_dir_all(s).expect("a v1 memory cgroup (needs root)");
    }
    let mut batch = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let mut task = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    std::fs::write(steps[0].join("cgroup.procs"), batch.id().to_string()).unwrap();
    std::fs::write(steps[1].join("cgroup.procs"), task.id().to_string()).unwrap();
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 100,
        extra_config: "[slurm]\nscontrol = \"false\"\n",
        ..Opts::default()
    });
    let (code, out, err) = d.ctl(&["attach", "--slurm-job", "77"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("attached slurm-77 (Slurm job 77"), "{out}");
    let (code, _, err) = d.ctl(&["pause", "slurm-77"]);
    assert_eq!(code, 0, "{err}");
    let (a, b) = (batch.id(), task.id());
    assert!(
        eventually(5.0, || proc_state(a) == Some('T')
            && proc_state(b) == Some('T')),
        "both tasks stopped with signals: {:?} {:?}",
        proc_state(a),
        proc_state(b)
    );
    d.wait_log("the fallback logged", |log| {
        log.contains("cannot suspend the Slurm job")
    });
    assert_eq!(d.ctl(&["resume", "slurm-77"]).0, 0);
    assert!(eventually(5.0, || proc_state(a) == Some('S')
        && proc_state(b) == Some('S')));
    // Root may attach a job with no process here yet (it waits); a bad id is refused.
    let (code, _, err) = d.ctl(&["attach", "--slurm-job", "78"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(d.ctl(&["detach", "--slurm-job", "78"]).0, 0);
    let (code, _, err) = d.ctl(&["attach", "--slurm-job", "7a"]);
    assert_ne!(code, 0);
    assert!(err.contains("not a Slurm job id"), "{err}");
    drop(d);
    for c in [&mut batch, &mut task] {
        let _ = c.kill();
        let _ = c.wait();
    }
    for s in &steps {
        let _ = std::fs::remove_dir(s);
        let _ = std::fs::remove_dir(s.parent().unwrap());
    }
    for d in [job.clone(), top.join("uid_0"), top] {
        let _ = std::fs::remove_dir(d);
    }
}

/// `memwatch launch` inside an allocation keeps the job in Slurm's cgroup (under Slurm's limit) and
/// knows it as part of the Slurm job; a job Slurm requeued starts again with `MEMWATCH_RESUME=1`.
#[test]
fn launch_inside_an_allocation_stays_in_the_slurm_job_and_resumes_after_a_requeue() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (cluster, d) = cluster_and_daemon("", &[("MEMWATCH_SLURM_DEFAULT", "off")]);
    let memwatch = bin();
    let out = cluster.dir.path().join("runs");
    let script = format!(
        "#!/bin/bash\n{} launch --name trained --socket {} -- sh -c 'echo resume=$MEMWATCH_RESUME >> {}; exec sleep 600'\n",
        memwatch.display(),
        d.socket.display(),
        out.display()
    );
    let id = cluster.sbatch(
        &["-n1", "--mem=200M", "--requeue", "-J", "launched"],
        &script,
    );
    // The job's first sample (its cgroup's limit) comes one sampling tick after the attach.
    d.wait_until(
        |d| {
            d.jobs()
                .iter()
                .any(|j| j["name"] == "trained" && !j["sample"].is_null())
        },
        "memwatch launch did not attach its job, or the job was never sampled",
    );
    let job = d
        .jobs()
        .into_iter()
        .find(|j| j["name"] == "trained")
        .unwrap();
    assert_eq!(job["origin"]["kind"], "slurm", "{job}");
    assert_eq!(job["origin"]["id"], id.as_str(), "{job}");
    assert_eq!(
        job["sample"]["cgroup"]["limit_bytes"].as_u64(),
        Some(200 << 20),
        "Slurm's limit, not a cgroup of memwatch's: {job}"
    );
    // The run writes its line once the launcher lets it start, after the attach.
    let first = common::wait::file("the first run's line", &out, |t| t.ends_with('\n'));
    assert_eq!(first, "resume=0\n", "the first run does not resume");
    cluster.run("scontrol", &["requeue", &id]).unwrap();
    cluster.run_requeued(&id, &out, "resume=1");
}
