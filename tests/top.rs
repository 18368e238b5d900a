//! `memwatch top` in a real terminal (tmux) at 80×24 and 200×50: levels, RAM, swap, pressure and GPUs
//! with sparklines, the GPU's processes with user and command from /proc, the paused job with why and
//! until when; then p, r and d pause, resume and detach it through the control socket. The screens
//! are kept in target/artifacts/top-*.txt.

mod common;

use common::tmux::Tmux;
use common::{Daemon, Opts, eventually, proc_state};

#[test]
fn top_shows_the_machine_and_drives_a_job_in_a_real_terminal() {
    let d = Daemon::start(Opts::default());
    let mut job = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = job.id();
    // GPU 0 runs the job: the process table names its user and command from /proc.
    d.set_gpu_state(&format!(
        r#"{{"devices":[{{"name":"NVIDIA RTX 4090","uuid":"GPU-x","memory_total":25757220864,
        "memory_used":12884901888,"temperature":61,"threshold_slowdown":88,"threshold_shutdown":96,
        "processes":[{{"pid":{pid},"used_memory":12000000000}}]}}]}}"#
    ));
    d.wait_until(
        |d| d.get("/api/v1/snapshot").1.contains("RTX 4090"),
        "the new GPU state sampled",
    );
    assert_eq!(d.ctl(&["attach", &pid.to_string(), "--name", "train"]).0, 0);
    d.wait_until(
        |d| d.job_state("train").as_deref() == Some("paused"),
        "the fixture host (95 % used) pauses the job",
    );
    let artifacts = common::repo().join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let bin = common::bin();
    let socket = d.socket.to_str().unwrap().to_owned();
    let url = d.url();
    let args = [
        bin.to_str().unwrap(),
        "top",
        "--url",
        &url,
        "--socket",
        &socket,
        "--interval",
        "0.3",
    ];
    for (w, h) in [(80u16, 24u16), (200, 50)] {
        let t = Tmux::start(w, h, &args);
        t.wait_for("PAUSED");
        let screen = t.text();
        std::fs::write(artifacts.join(format!("top-{w}x{h}.txt")), &screen).unwrap();
        std::fs::write(artifacts.join(format!("top-{w}x{h}.ansi")), t.screen()).unwrap();
        for want in [
            "memwatch top · gpu-box-01",
            "CRITICAL host memory 95 %",
            "RAM ",
            "Swap ",
            "PSI  memory some",
            "GPU0 NVIDIA RTX 4090",
            "12Gi/23Gi",
            "q quit",
        ] {
            assert!(
                screen.contains(want),
                "{w}x{h}: {want:?} missing:\n{screen}"
            );
        }
        // Sparklines: block characters after the RAM numbers.
        let ram = screen.lines().find(|l| l.starts_with("RAM ")).unwrap();
        assert!(ram.contains('█') || ram.contains('▇'), "{ram}");
        let proc_row = screen
            .lines()
            .find(|l| l.contains(&pid.to_string()) && l.contains("root"))
            .unwrap_or_else(|| panic!("{w}x{h}: no GPU process row:\n{screen}"));
        assert!(
            proc_row.contains("11Gi") && proc_row.contains("sleep 60"),
            "{proc_row}"
        );
        let job_row = screen
            .lines()
            .find(|l| l.starts_with("train "))
            .unwrap_or_else(|| panic!("{w}x{h}: no job row:\n{screen}"));
        assert!(job_row.contains("PAUSED"), "{job_row}");
        if w == 200 {
            assert!(
                job_row.contains("by memwatch: host memory at 95.5 %; resume in ")
                    && job_row.contains(" min"),
                "{job_row}"
            );
        }
        assert!(screen.lines().count() <= h as usize);
        if w == 80 {
            t.keys(&["q"]);
            continue;
        }
        // The keys act through the control socket.
        t.keys(&["r"]);
        t.wait_for("resumed train");
        assert!(eventually(2.0, || proc_state(pid) == Some('S')));
        t.wait_for("running");
        t.keys(&["p"]);
        t.wait_for("paused train");
        assert!(eventually(2.0, || proc_state(pid) == Some('T')));
        t.keys(&["d"]);
        t.wait_for("press d again to detach train");
        t.keys(&["d"]);
        t.wait_for("detached train");
        assert!(d.jobs().is_empty());
        assert!(
            eventually(2.0, || proc_state(pid) == Some('S')),
            "detach resumes"
        );
        t.keys(&["q"]);
    }
    let _ = job.kill();
    let _ = job.wait();
}
