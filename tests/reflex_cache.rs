//! The freezer reflex ahead of its read of the cache, on a real v1 memory cgroup limited to 256 MiB: a
//! job first holds 225 MiB of its own memory (past its warn line, 80 %, under its critical line, 95 %),
//! then reads 24 MiB of a file, which the kernel keeps as page cache: its usage crosses the critical
//! line (to about 97 %, short of the limit, so nothing is reclaimed) while its unreclaimable memory
//! (usage less clean page cache) stays under it. The reflex read the cache at the job's last crossing
//! under the line (warn), when it had none, so at the crossing of
//! critical it freezes the job's own freezer cgroup first and reads memory.stat after: the cache it then
//! reads holds the job under its line, so it thaws the cgroup at once. The job reads what it reads, is
//! never paused (no pause event, its record stays `armed`), its freezer is left thawed and the OOM
//! killer never fires.
//!
//! Kept in its own test binary so no other test competes with it for the CPU.

mod common;

use std::io::BufRead;

use common::{eventually, recorded_pause};

const MIB: u64 = 1 << 20;

#[test]
fn page_cache_over_the_line_is_frozen_ahead_only_for_a_read_and_never_paused() {
    let Some((cg, d)) = common::cache::cgroup_and_daemon("reflex_cache", 256 * MIB) else {
        return;
    };
    // 64 MiB, of which the job reads 24.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = common::cache::uncached_file(dir.path(), "data", 64);
    let go = dir.path().join("go");
    // memhog says `ready`, then `done 225` once it holds its 225 MiB (for a minute); then 24 MiB of
    // the file.
    let script = format!(
        "echo ready; while [ ! -e {go} ]; do sleep 0.01; done; \
         {memhog} --rate-mib 1024 --total-mib 225 --hold-ms 60000 | \
         (read ready; read held; dd if={file} of=/dev/null bs=1M count=24 status=none; echo done; \
         exec sleep 60)",
        go = go.display(),
        memhog = common::memhog().display(),
        file = file.display()
    );
    let (mut job, mut out) = common::cache::attached_job(&cg, &d, &script, "reader");
    let armed = d
        .jobs()
        .into_iter()
        .find(|j| j["name"] == "reader")
        .unwrap()["reflex"]
        .clone();
    assert_eq!(armed["how"], "freezer", "the API's reflex: {armed}");
    let oom_before = cg.oom_kills();

    std::fs::write(&go, "").unwrap();
    // Read on a thread of its own: a job left frozen would never say it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut last = String::new();
        let _ = out.read_line(&mut last);
        let _ = tx.send(last);
    });
    let last = rx.recv_timeout(std::time::Duration::from_secs(60));
    assert_eq!(
        last.as_deref().map(str::trim),
        Ok("done"),
        "the job did not read the file within 60 s (its freezer frozen: {}):\n{}",
        cg.frozen(),
        d.log_text()
    );
    assert!(
        cg.usage() > 243 * MIB,
        "the cache never took the job past its critical line (95 % of 256 MiB): usage {} MiB",
        cg.usage() / MIB
    );
    let thawed = "frozen ahead of the read of its cache";
    assert!(
        eventually(5.0, || d.log_text().contains(thawed)),
        "the reflex never froze ahead of its read of the cache and thawed:\n{}",
        d.log_text()
    );
    assert!(!cg.frozen(), "the job's freezer was left frozen");
    assert!(
        d.events()
            .iter()
            .all(|e| !(e["job"] == "reader" && e["action"] == "pause")),
        "a job whose unreclaimable memory stayed under its line was paused: {:#?}",
        d.events()
    );
    assert_eq!(
        recorded_pause(&d.runtime, "reader").map(|p| p["phase"].clone()),
        Some("armed".into()),
        "the reflex is no longer armed"
    );
    assert_eq!(cg.oom_kills(), oom_before, "the OOM killer fired");
    let _ = job.kill();
    let _ = job.wait();
}
