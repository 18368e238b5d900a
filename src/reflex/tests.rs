//! The reflex's tests, on fixture cgroups (files in a temp directory); their helpers serve the wake
//! thread's tests too.

use super::*;

pub(crate) const MIB: u64 = 1 << 20;

/// A v2 job's cgroup on a fixture tree: usage, memory.stat, `cgroup.freeze` (0) and one member.
pub(crate) fn v2_cgroup(usage: u64, inactive_file: u64) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    set(d.path(), usage, inactive_file);
    std::fs::write(d.path().join("cgroup.freeze"), "0").unwrap();
    std::fs::write(d.path().join("cgroup.procs"), "4242\n").unwrap();
    d
}

pub(crate) fn set(dir: &Path, usage: u64, inactive_file: u64) {
    std::fs::write(dir.join("memory.current"), format!("{usage}\n")).unwrap();
    std::fs::write(
        dir.join("memory.stat"),
        format!("anon {usage}\nfile 0\ninactive_file {inactive_file}\n"),
    )
    .unwrap();
}

/// Root's v2 reflex for `job`, freezing `dir` at 950 MiB of a 1000 MiB limit.
fn v2_reflex(job: &str, dir: &Path) -> Reflex {
    let frozen = Frozen {
        version: Version::V2,
        dir: dir.to_owned(),
    };
    let act = Reflex::freezer(&frozen).unwrap();
    Reflex::open(job, dir, Version::V2, 950 * MIB, 0, Path::new("/"), act)
}

/// The same, armed.
pub(crate) fn armed(dir: &Path) -> Armory {
    let armory = Armory::default();
    armory.arm(v2_reflex("job", dir));
    armory
}

pub(crate) fn freeze_word(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cgroup.freeze")).unwrap()
}

#[test]
fn the_time_between_reads_is_the_fastest_growths_time_to_the_line_and_half_the_margin() {
    assert_eq!(poll_after(0, 0), POLL_MIN);
    assert_eq!(poll_after(MIB, 0), POLL_MIN, "1 MiB at 4 GiB/s is 0.24 ms");
    // At the line of a 512 MiB limit (95 %): half of its 25.6 MiB margin, 3.1 ms at 4 GiB/s.
    let margin = 512 * MIB - (512.0 * MIB as f64 * 0.95).ceil() as u64;
    let at_line = poll_after(0, margin);
    assert!(
        at_line > Duration::from_millis(3) && at_line < Duration::from_millis(4),
        "{at_line:?}"
    );
    assert_eq!(
        poll_after(40 * MIB, 0),
        Duration::from_secs_f64(40.0 / 4096.0)
    );
    assert_eq!(poll_after(768 << 20, 512 << 20), Duration::from_millis(250));
    assert_eq!(poll_after(64 << 30, 0), POLL_MAX);
}

/// A dataset hot in the job's page cache (active, read each epoch) holds it under its line as
/// inactive cache does; dirty pages, which must be written out before they can be dropped, do not.
#[test]
fn active_page_cache_holds_a_job_under_its_line_and_dirty_pages_do_not() {
    let d = v2_cgroup(200 * MIB, 0);
    let armory = armed(d.path());
    let now = Instant::now();
    assert_eq!(armory.crossing("job", now), Crossing::Below(750 * MIB));
    let stat = |active: u64, dirty: u64| {
        std::fs::write(d.path().join("memory.current"), format!("{}\n", 990 * MIB)).unwrap();
        std::fs::write(
            d.path().join("memory.stat"),
            format!(
                "anon {}\nfile {}\ninactive_file {}\nactive_file {active}\nfile_dirty {dirty}\nfile_writeback 0\n",
                690 * MIB,
                300 * MIB,
                10 * MIB
            ),
        )
        .unwrap();
    };
    // 990 MiB charged, 310 MiB of it clean cache: 680 MiB, 270 MiB under the line.
    // Frozen ahead (the cache it read under the line was none), thawed once it read this one.
    stat(300 * MIB, 0);
    assert_eq!(armory.crossing("job", now), Crossing::Cached(270 * MIB));
    assert_eq!(freeze_word(d.path()), "10");
    // 280 MiB of the cache dirty: 960 MiB the kernel cannot drop at once.
    stat(300 * MIB, 280 * MIB);
    assert_eq!(armory.crossing("job", now), Crossing::Fired);
    assert_eq!(freeze_word(d.path()), "101");
    let fired = armory.take_fired();
    assert_eq!(fired[0].unreclaimable(), 960 * MIB);
    assert_eq!(fired[0].usage, 990 * MIB);
}

#[test]
fn a_v2_reflex_fires_once_past_its_line_and_is_disarmed() {
    let d = v2_cgroup(200 * MIB, 0);
    let armory = armed(d.path());
    let now = Instant::now();
    assert_eq!(armory.crossing("job", now), Crossing::Below(750 * MIB));
    assert_eq!(freeze_word(d.path()), "0");
    set(d.path(), 990 * MIB, 0);
    assert_eq!(armory.crossing("job", now), Crossing::Fired);
    assert_eq!(freeze_word(d.path()), "1");
    let fired = armory.take_fired();
    assert_eq!(fired.len(), 1);
    assert_eq!(
        fired[0].done,
        Done::Froze(Frozen {
            version: Version::V2,
            dir: d.path().to_owned()
        })
    );
    assert_eq!(fired[0].unreclaimable(), 990 * MIB);
    assert_eq!(armory.crossing("job", now), Crossing::None, "fired once");
    assert!(armory.armed_jobs().is_empty());
}

#[test]
fn inactive_file_cache_over_the_line_is_not_a_crossing() {
    // 990 MiB charged, 300 MiB of it inactive file cache the kernel would reclaim first: a
    // working set of 690 MiB, 260 MiB below the line.
    let d = v2_cgroup(990 * MIB, 300 * MIB);
    let armory = armed(d.path());
    let now = Instant::now();
    assert_eq!(armory.crossing("job", now), Crossing::Cached(260 * MIB));
    assert_eq!(freeze_word(d.path()), "0");
    // The cache turns into anonymous memory: at the line.
    set(d.path(), 990 * MIB, 10 * MIB);
    assert_eq!(armory.crossing("job", now), Crossing::Fired);
    assert_eq!(freeze_word(d.path()), "1");
    assert_eq!(armory.take_fired()[0].unreclaimable(), 980 * MIB);
}

#[test]
fn a_reflex_that_cannot_read_leaves_it_to_the_engine_and_a_v1_reflex_freezes_its_cgroup() {
    let d = v2_cgroup(990 * MIB, 0);
    std::fs::remove_file(d.path().join("memory.current")).unwrap();
    let armory = armed(d.path());
    let now = Instant::now();
    assert_eq!(armory.crossing("job", now), Crossing::Unread);
    assert!(armory.disarm("job"));
    assert_eq!(armory.crossing("job", now), Crossing::None);

    let v1 = tempfile::tempdir().unwrap();
    std::fs::write(
        v1.path().join("memory.usage_in_bytes"),
        format!("{}\n", 990 * MIB),
    )
    .unwrap();
    std::fs::write(v1.path().join("memory.stat"), "total_inactive_file 0\n").unwrap();
    std::fs::write(v1.path().join("freezer.state"), "THAWED").unwrap();
    let frozen = Frozen {
        version: Version::V1,
        dir: v1.path().to_owned(),
    };
    let act = Reflex::freezer(&frozen).unwrap();
    armory.arm(Reflex::open(
        "v1",
        v1.path(),
        Version::V1,
        950 * MIB,
        0,
        Path::new("/"),
        act,
    ));
    assert_eq!(armory.crossing("v1", now), Crossing::Fired);
    assert_eq!(
        std::fs::read_to_string(v1.path().join("freezer.state")).unwrap(),
        "FROZEN"
    );
}

#[test]
fn a_freezer_reflex_over_the_line_by_the_cache_last_seen_freezes_before_it_reads_the_cache() {
    // Armed with no cache; memory.stat then cannot be read: the freeze is made on the usage
    // and the cache last seen, before memory.stat is read, and it stands.
    let d = v2_cgroup(200 * MIB, 0);
    let armory = armed(d.path());
    set(d.path(), 990 * MIB, 0);
    std::fs::remove_file(d.path().join("memory.stat")).unwrap();
    assert_eq!(armory.crossing("job", Instant::now()), Crossing::Fired);
    assert_eq!(freeze_word(d.path()), "1");
    assert_eq!(armory.take_fired()[0].unreclaimable(), 990 * MIB);
}

#[test]
fn a_look_below_the_line_reads_the_cache_that_the_next_crossing_goes_by() {
    // Armed with no cache; at 900 MiB (under the line by usage) 100 MiB is cache, still there at
    // 990 MiB: the crossing goes by the cache seen at 900 MiB, so it reads first and freezes
    // nothing.
    let d = v2_cgroup(200 * MIB, 0);
    let armory = armed(d.path());
    let now = Instant::now();
    set(d.path(), 900 * MIB, 100 * MIB);
    assert_eq!(armory.crossing("job", now), Crossing::Below(50 * MIB));
    set(d.path(), 990 * MIB, 100 * MIB);
    assert_eq!(armory.crossing("job", now), Crossing::Cached(60 * MIB));
    assert_eq!(
        freeze_word(d.path()),
        "0",
        "frozen ahead of a cache it had seen"
    );
}

#[test]
fn a_freeze_ahead_of_cache_that_grew_is_thawed_at_once_and_made_again_a_second_later_at_most() {
    // Armed with no cache; then 300 MiB of the 990 MiB charged is inactive file cache. The
    // fixture's file keeps each write at the next offset, so it shows every write in order.
    let d = v2_cgroup(200 * MIB, 0);
    let armory = armed(d.path());
    let now = Instant::now();
    set(d.path(), 990 * MIB, 300 * MIB);
    assert_eq!(armory.crossing("job", now), Crossing::Cached(260 * MIB));
    assert_eq!(freeze_word(d.path()), "10", "frozen, then thawed");
    assert!(armory.take_fired().is_empty());
    // The cache it read is the one it goes by: no freeze while the cache holds the job under.
    assert_eq!(armory.crossing("job", now), Crossing::Cached(260 * MIB));
    assert_eq!(freeze_word(d.path()), "10");
    // The cache seen falls to 10 MiB (the working set 5 MiB under the line), then grows again
    // within the second after the thaw: read first, so no second freeze.
    let later = now + THAWED_READ_FIRST / 2;
    set(d.path(), 955 * MIB, 10 * MIB);
    assert_eq!(armory.crossing("job", later), Crossing::Cached(5 * MIB));
    set(d.path(), 990 * MIB, 300 * MIB);
    assert_eq!(armory.crossing("job", later), Crossing::Cached(260 * MIB));
    assert_eq!(freeze_word(d.path()), "10");
    // A second later, the same is frozen ahead and thawed again.
    set(d.path(), 955 * MIB, 10 * MIB);
    assert_eq!(armory.crossing("job", later), Crossing::Cached(5 * MIB));
    set(d.path(), 990 * MIB, 300 * MIB);
    let second = now + THAWED_READ_FIRST;
    assert_eq!(armory.crossing("job", second), Crossing::Cached(260 * MIB));
    assert_eq!(freeze_word(d.path()), "1010");
    // The cache turns into anonymous memory: read first, then frozen.
    set(d.path(), 990 * MIB, 10 * MIB);
    assert_eq!(armory.crossing("job", now), Crossing::Fired);
    assert_eq!(freeze_word(d.path()), "10101");
    assert_eq!(armory.take_fired()[0].unreclaimable(), 980 * MIB);
}

/// A v1 job's fixture cgroup (usage, memory.stat and freezer.state in one directory) and root's
/// freezer reflex on it, at 950 MiB.
pub(crate) fn v1_reflex(job: &str, dir: &Path) -> Reflex {
    std::fs::write(dir.join("memory.usage_in_bytes"), format!("{}\n", 10 * MIB)).unwrap();
    std::fs::write(dir.join("memory.stat"), "total_inactive_file 0\n").unwrap();
    std::fs::write(dir.join("freezer.state"), "THAWED").unwrap();
    let frozen = Frozen {
        version: Version::V1,
        dir: dir.to_owned(),
    };
    let act = Reflex::freezer(&frozen).unwrap();
    Reflex::open(job, dir, Version::V1, 950 * MIB, 0, Path::new("/"), act)
}

/// The only test that holds the real v1 freezer active: the held cgroup is named by this process.
#[test]
fn the_v1_freezer_is_kept_active_while_a_v1_freezer_reflex_is_armed_and_never_with_a_process() {
    let hierarchy = Path::new("/sys/fs/cgroup/freezer");
    if !rustix::process::geteuid().is_root() || !hierarchy.join("cgroup.procs").exists() {
        crate::test_skip::cannot_run("v1_freezer_reflex", "needs root and a v1 freezer");
        return;
    }
    let held = hierarchy.join(format!("memwatch-freezer-active.{}", std::process::id()));
    let state = |dir: &Path| std::fs::read_to_string(dir.join("freezer.state")).unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let armory = Armory::new(Path::new("/"));
    assert_eq!(armory.held_active(), None, "held before any reflex");

    // A v2 freezer reflex turns no kernel key: nothing is held for it.
    let v2 = v2_cgroup(10 * MIB, 0);
    armory.arm(v2_reflex("v2", v2.path()));
    assert_eq!(armory.held_active(), None, "held for a v2 reflex");

    armory.arm(v1_reflex("a", a.path()));
    assert_eq!(armory.held_active().as_deref(), Some(held.as_path()));
    assert_eq!(state(&held).trim(), "FROZEN");
    let procs = std::fs::read_to_string(held.join("cgroup.procs")).unwrap();
    assert_eq!(procs.trim(), "", "the held cgroup has members");
    armory.arm(v1_reflex("b", b.path()));
    assert!(armory.disarm("a"));
    assert_eq!(
        armory.held_active().as_deref(),
        Some(held.as_path()),
        "let go while b's reflex is armed"
    );
    // b fires: the freeze is made with the freezer active, and the hold is let go of once what it
    // did is taken, not on the wake thread.
    std::fs::write(
        b.path().join("memory.usage_in_bytes"),
        format!("{}\n", 990 * MIB),
    )
    .unwrap();
    assert_eq!(armory.crossing("b", Instant::now()), Crossing::Fired);
    assert_eq!(state(b.path()), "FROZEN");
    assert!(held.exists(), "let go of on the wake thread");
    assert_eq!(armory.take_fired().len(), 1);
    assert_eq!(
        armory.held_active(),
        None,
        "held with only a v2 reflex armed"
    );
    assert!(!held.exists(), "the held cgroup was left behind");

    // A process found in this daemon's cgroup: not frozen, and nothing held.
    std::fs::create_dir(&held).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    std::fs::write(held.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    armory.arm(v1_reflex("a", a.path()));
    assert_eq!(armory.held_active(), None, "held with a process in it");
    assert_eq!(state(&held).trim(), "THAWED", "the process was frozen");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert!(armory.disarm("a"));

    // One left frozen by a daemon that is gone is let go of at the next start.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let left = hierarchy.join(format!("memwatch-freezer-active.{}", gone.id()));
    std::fs::create_dir(&left).unwrap();
    std::fs::write(left.join("freezer.state"), "FROZEN").unwrap();
    // And one whose daemon is a zombie its parent has not reaped (as this test's child is).
    let mut zombie = std::process::Command::new("true").spawn().unwrap();
    let undead = hierarchy.join(format!("memwatch-freezer-active.{}", zombie.id()));
    std::fs::create_dir(&undead).unwrap();
    std::fs::write(undead.join("freezer.state"), "FROZEN").unwrap();
    let stat = format!("/proc/{}/stat", zombie.id());
    while !std::fs::read_to_string(&stat).unwrap().contains(") Z ") {
        std::thread::yield_now();
    }
    let _next = Armory::new(Path::new("/"));
    assert!(!left.exists(), "a dead daemon's held cgroup stayed");
    assert!(!undead.exists(), "a zombie daemon's held cgroup stayed");
    zombie.wait().unwrap();
    // This process's own is its own to let go of: the sleeper's empty cgroup is removed here.
    std::fs::remove_dir(&held).unwrap();
}

#[test]
fn the_owner_task_is_told_of_a_fire_only_once_the_job_had_its_cpu_to_stop_on() {
    let d = v2_cgroup(200 * MIB, 0);
    let armory = armed(d.path());
    // Nothing fired: nothing to wait for.
    assert_eq!(armory.let_it_stop(), Duration::ZERO);
    set(d.path(), 990 * MIB, 0);
    let before = Instant::now();
    assert_eq!(armory.crossing("job", before), Crossing::Fired);
    armory.let_it_stop();
    assert!(before.elapsed() >= super::LET_IT_STOP);
    // Once that is over, a later notification is not held.
    assert_eq!(armory.let_it_stop(), Duration::ZERO);
}
