//! A job whose dataset is hot in its page cache, on a real v1 memory cgroup limited to 256 MiB: it
//! holds 200 MiB of its own memory (78 %, under its warn line), then reads a 48 MiB file three times,
//! as a trainer reads its dataset each epoch. The kernel keeps the file as page cache charged to the
//! cgroup, and the second read moves it to the active list: usage reaches about 97 % of the limit,
//! over the critical line (95 %), and so does usage less inactive file cache (kubelet's working set),
//! while the memory the kernel could not drop before an OOM kill stays near 80 %. memwatch must not
//! pause it: no pause event, the reflex still armed, the job finishes, no OOM kill.
//!
//! Then the same job grows for real (another 100 MiB at 1 GiB/s, which the cgroup cannot hold once
//! the cache is dropped): memwatch must pause it before the OOM killer fires.
//!
//! Kept in its own test binary so no other test competes with it for the CPU.

mod common;

use std::io::BufRead;

use common::recorded_pause;

const MIB: u64 = 1 << 20;

/// One at a time: each job wants the CPU to itself.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_dataset_hot_in_the_page_cache_over_the_line_is_not_paused_and_real_growth_is() {
    epochs(48, 3);
}

/// A dataset larger than the room its cgroup leaves: read twice, it keeps the cgroup at its limit,
/// where the job's growth drops cache and its usage barely moves.
#[test]
fn a_job_at_its_limit_by_its_page_cache_is_not_paused_and_real_growth_is() {
    epochs(96, 2);
}

/// The job of the module's documentation, its dataset `mib` MiB read `epochs` times.
fn epochs(mib: u64, epochs: u32) {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let Some((cg, d)) = common::cache::cgroup_and_daemon("page_cache", 256 * MIB) else {
        return;
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = common::cache::uncached_file(dir.path(), "dataset", mib);
    let go = dir.path().join("go");
    let grow = dir.path().join("grow");
    // memhog says `ready`, then `done 200` once it holds its 200 MiB; then the epochs of the
    // dataset, `read`, and once `grow` exists a second memhog of 100 MiB.
    let script = format!(
        "echo ready; while [ ! -e {go} ]; do sleep 0.01; done; \
         {memhog} --rate-mib 1024 --total-mib 200 --hold-ms 120000 | \
         (read ready; read held; \
         for e in $(seq {epochs}); do dd if={file} of=/dev/null bs=1M status=none; done; echo read; \
         {memhog} --rate-mib 1024 --total-mib 100 --hold-ms 120000 --wait-file {grow})",
        go = go.display(),
        grow = grow.display(),
        memhog = common::memhog().display(),
        file = file.display(),
    );
    let (mut job, mut out) = common::cache::attached_job(&cg, &d, &script, "epochs");
    let oom_before = cg.oom_kills();

    std::fs::write(&go, "").unwrap();
    // Read on a thread of its own: a job left paused would never say it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0) {
            if tx.send(line.trim().to_owned()).is_err() {
                break;
            }
            line.clear();
        }
    });
    let said = rx.recv_timeout(std::time::Duration::from_secs(60));
    assert_eq!(
        said.as_deref(),
        Ok("read"),
        "the job did not read its dataset {epochs} times within 60 s (frozen: {}):\n{}",
        cg.frozen(),
        d.log_text()
    );
    let usage = cg.usage();
    assert!(
        usage > 244 * MIB,
        "the cache never took the job past its critical line (95 % of 256 MiB): usage {} MiB",
        usage / MIB
    );
    // Three full samples with the cache hot: each one a chance for the engine to pause.
    d.wait_samples(3);
    let paused = d
        .events()
        .into_iter()
        .filter(|e| e["job"] == "epochs" && e["action"] == "pause")
        .collect::<Vec<_>>();
    assert!(
        paused.is_empty(),
        "a job whose own memory stayed under its line was paused for its page cache: {paused:#?}\n{}",
        d.log_text()
    );
    assert!(!cg.frozen(), "the job's freezer is frozen");
    assert_eq!(
        recorded_pause(&d.runtime, "epochs").map(|p| p["phase"].clone()),
        Some("armed".into()),
        "the reflex is no longer armed"
    );

    // Real growth: 100 MiB more than the cgroup holds once its cache is dropped.
    std::fs::write(&grow, "").unwrap();
    d.wait_until(
        |d| {
            d.events()
                .iter()
                .any(|e| e["job"] == "epochs" && e["action"] == "pause")
        },
        "the job paused as it grew past its line",
    );
    assert_eq!(
        cg.oom_kills(),
        oom_before,
        "the OOM killer fired:\n{}",
        d.log_text()
    );
    cg.thaw();
    let _ = job.kill();
    let _ = job.wait();
}
