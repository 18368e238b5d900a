//! The owner task never waits on the disk: while the daemon's read of a job's config hangs on a real
//! slow filesystem (a FUSE mount whose open() sleeps, `tests/stall/slowfs.py`), `/metrics` and the
//! control socket keep answering within 50 ms. Needs root, /dev/fuse, fuse3 and python3-fusepy
//! (`scripts/test.sh` installs them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{Daemon, Opts, eventually};

/// The slow filesystem, unmounted on drop.
struct SlowFs {
    src: PathBuf,
    mnt: PathBuf,
    child: Child,
}

impl SlowFs {
    fn mount(src: &Path, mnt: &Path) -> SlowFs {
        let child = Command::new("/usr/bin/python3")
            .arg(common::repo().join("tests/stall/slowfs.py"))
            .arg(src)
            .arg(mnt)
            .spawn()
            .expect("start tests/stall/slowfs.py (needs Debian's python3-fusepy and fuse3)");
        let fs = SlowFs {
            src: src.to_owned(),
            mnt: mnt.to_owned(),
            child,
        };
        assert!(
            eventually(10.0, || std::fs::read(mnt.join("train.json")).is_ok()),
            "the FUSE mount did not come up (needs /dev/fuse and root)"
        );
        fs
    }

    fn set_delay(&self, seconds: f64) {
        std::fs::write(self.src.join(".delay"), seconds.to_string()).unwrap();
    }

    /// Opens started and not yet ended.
    fn opens_in_progress(&self) -> i64 {
        let log = std::fs::read_to_string(self.src.join(".opens")).unwrap_or_default();
        log.lines().filter(|l| l.starts_with("start")).count() as i64
            - log.lines().filter(|l| l.starts_with("end")).count() as i64
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
        self.set_delay(0.0);
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mnt)
            .stderr(std::process::Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn metrics_and_the_control_socket_answer_while_a_config_read_hangs() {
    let src = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    std::fs::write(
        src.path().join("train.json"),
        r#"{"per_device_train_batch_size": 32, "gradient_accumulation_steps": 2,
            "dataloader_num_workers": 4, "dataloader_pin_memory": true}"#,
    )
    .unwrap();
    let fs = SlowFs::mount(src.path(), mnt.path());
    let d = Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        interval_ms: 100,
        ..Opts::default()
    });
    let mut job = Command::new("sleep").arg("120").spawn().unwrap();
    let config = mnt.path().join("train.json");
    let (code, _, err) = d.ctl(&[
        "attach",
        &job.id().to_string(),
        "--name",
        "slow",
        "--config-file",
        config.to_str().unwrap(),
        "--profile",
        "hf",
    ]);
    assert_eq!(code, 0, "{err}");
    // From now on every open on the mount hangs for 4 s; the daemon re-reads the config each sample.
    fs.set_delay(4.0);
    assert!(
        eventually(5.0, || fs.opens_in_progress() > 0),
        "the daemon never read the config on the slow mount"
    );
    let (mut worst_metrics, mut worst_socket) = (Duration::ZERO, Duration::ZERO);
    let started = Instant::now();
    let mut probes = 0;
    while started.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        let (status, body) = d.get("/metrics");
        worst_metrics = worst_metrics.max(t.elapsed());
        assert_eq!(status, 200);
        assert!(body.contains("memwatch_up 1"), "{body}");
        worst_socket = worst_socket.max(common::jobs_round_trip(&d.socket));
        probes += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        fs.opens_in_progress() > 0,
        "the read was no longer hanging at the end: the test did not test a stall"
    );
    eprintln!(
        "{probes} probes while a config read hung: /metrics at most {worst_metrics:?}, control socket at most {worst_socket:?}"
    );
    // Each open on the mount hangs for 4 s: an answer that waited on the read would take seconds. The
    // bound says "did not wait on the stall", not how fast an answer is (a loaded machine takes tens
    // of milliseconds; the figures above are what to compare).
    assert!(
        worst_metrics < Duration::from_secs(1),
        "/metrics took {worst_metrics:?}: it waited on the hung read"
    );
    assert!(
        worst_socket < Duration::from_secs(1),
        "the control socket took {worst_socket:?}: it waited on the hung read"
    );
    let _ = job.kill();
    let _ = job.wait();
    drop(d);
    drop(fs);
}

/// A sampler stuck on a hung filesystem: the daemon says it is not ready (503) while its latest sample
/// is stale, keeps serving /metrics, and is ready again once sampling resumes.
#[test]
fn a_stuck_sampler_makes_the_daemon_not_ready_until_it_recovers() {
    let src = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    common::copy_tree(&common::fixture_root(), src.path());
    std::fs::write(src.path().join("train.json"), "{}").unwrap();
    let fs = SlowFs::mount(src.path(), mnt.path());
    let d = Daemon::start(Opts {
        root: mnt.path().to_owned(),
        gpu_state: None,
        interval_ms: 200,
        ..Opts::default()
    });
    assert_eq!(d.get("/-/ready").0, 200);
    // Every open under the host root now hangs for 9 s: the next full sample cannot finish.
    fs.set_delay(9.0);
    let hung = Instant::now();
    assert!(
        eventually(8.0, || d.get("/-/ready").0 == 503),
        "still ready {:?} after sampling hung",
        hung.elapsed()
    );
    eprintln!("not ready {:?} after sampling hung", hung.elapsed());
    let (status, body) = d.get("/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("memwatch_up 1"));
    fs.set_delay(0.0);
    assert!(
        eventually(15.0, || d.get("/-/ready").0 == 200),
        "not ready again after the filesystem recovered"
    );
    drop(d);
    drop(fs);
}
