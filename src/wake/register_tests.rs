//! The registrar's tests: its order, its queue, and its end with the wake thread.

use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use crate::wake::Wakers;

/// A cgroup directory whose `cgroup.event_control` is a FIFO: a writer's open waits until a
/// reader opens it, as a slow registration holds its writer.
fn slow_cgroup() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("memory.usage_in_bytes"), "0\n").unwrap();
    nix::unistd::mkfifo(
        &d.path().join("cgroup.event_control"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    d
}

#[test]
fn a_registration_that_waits_holds_neither_its_caller_nor_a_later_one_out_of_order_and_one_asked_again_is_not_written()
 {
    let d = slow_cgroup();
    let registered = Arc::new(tokio::sync::Notify::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let wakers = Wakers::start(
        Arc::new(tokio::sync::Notify::new()),
        Arc::default(),
        Arc::default(),
        registered.clone(),
        0,
    )
    .unwrap();
    // Asked from another thread, so that a call that waited for the registration would show as
    // no answer rather than as a test that never ends.
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = d.path().to_owned();
    let wakers = std::thread::spawn(move || {
        let asked = wakers.watch_v1_thresholds("a", &dir, &[100, 200, 300], None, 7);
        let other = wakers.watch_v1_thresholds("b", &dir, &[400], None, 8);
        let again = wakers.watch_v1_thresholds("b", &dir, &[500], None, 9);
        tx.send((asked.is_ok(), other.is_ok() && again.is_ok()))
            .unwrap();
        wakers
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(60)),
        Ok((true, true)),
        "asked, while nothing reads the control file"
    );
    let wakers = wakers.join().unwrap();
    assert!(
        wakers.take_registered().is_empty(),
        "nothing is registered yet"
    );

    // The kernel's side: the registrations' writes, read until both are done.
    let fifo = d.path().join("cgroup.event_control");
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            // One open for the writers all (read and write: the FIFO never ends, nor is a
            // writer's open met by a reader just closing, whose writes would fail).
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&fifo)
                .unwrap();
            let (mut text, mut buf) = (String::new(), [0u8; 4096]);
            while !text.ends_with(" 500") {
                let n = f.read(&mut buf).unwrap();
                text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
            }
            text
        })
    };
    let mut done = Vec::new();
    while done.len() < 3 {
        let told = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), registered.notified()).await
        });
        assert!(told.is_ok(), "not told: {done:?}");
        done.extend(wakers.take_registered());
    }
    let got: Vec<(&str, u64, bool)> = done
        .iter()
        .map(|r| (r.job.as_str(), r.generation, r.result.is_ok()))
        .collect();
    assert_eq!(
        got,
        [("a", 7, true), ("b", 8, false), ("b", 9, true)],
        "in order, b's first asked again before its first write"
    );
    let text = reader.join().unwrap();
    // Three writes of "<eventfd> <usage fd> <bytes>" for generation 7, none for 8 (asked
    // again), then one for 9.
    let words: Vec<&str> = text.split(' ').collect();
    let (efd, usage) = (words[0], words[1]);
    let first = format!("{efd} {usage} 100{efd} {usage} 200{efd} {usage} 300");
    assert!(text.starts_with(&first), "{text}");
    assert!(!text.contains(" 400"), "{text}");
    assert!(text.ends_with(" 500") && text.len() > first.len(), "{text}");
}

#[test]
fn thresholds_are_registered_from_the_line_up_then_nearest_the_usage_first() {
    use super::in_order;
    let t = [150, 255, 285, 288, 297];
    // A job at its start: the reflex's line and those past it first, then half its limit
    // (the one it crosses first of the rest).
    assert_eq!(in_order(&t, Some(3), Some(285)), [285, 288, 297, 150, 255]);
    // Without a line: the one it crosses first is written first.
    assert_eq!(in_order(&t, Some(3), None), [150, 255, 285, 288, 297]);
    // A job at 286 whose limit changed: up from 288, then down from 285.
    assert_eq!(
        in_order(&t, Some(286), Some(285)),
        [288, 297, 285, 255, 150]
    );
    // At a threshold: it lies below (crossed on the way down).
    assert_eq!(in_order(&t, Some(285), None), [288, 297, 285, 255, 150]);
    // Between half and the line: the line up, then the warning under it, then down.
    assert_eq!(
        in_order(&t, Some(200), Some(285)),
        [285, 288, 297, 255, 150]
    );
    assert_eq!(in_order(&t, None, Some(285)), [285, 288, 297, 150, 255]);
    assert_eq!(in_order(&t, None, None), t);
}

#[test]
fn a_jobs_usage_is_read_until_its_thresholds_are_in_so_that_its_reflex_fires_before_any_is() {
    use crate::reflex::tests::{MIB, v1_reflex};
    let d = slow_cgroup();
    let usage = d.path().join("memory.usage_in_bytes");
    let state = d.path().join("freezer.state");
    let armory = Arc::new(crate::reflex::Armory::default());
    armory.arm(v1_reflex("job", d.path()));
    let registered = Arc::new(tokio::sync::Notify::new());
    let wakers = Wakers::start(
        Arc::new(tokio::sync::Notify::new()),
        Arc::default(),
        armory.clone(),
        registered,
        0,
    )
    .unwrap();
    let thresholds = [500 * MIB, 800 * MIB, 950 * MIB, 951 * MIB];
    wakers
        .watch_v1_thresholds(
            "job",
            d.path(),
            &thresholds,
            Some((950 * MIB, 1000 * MIB)),
            1,
        )
        .unwrap();
    // The registrar waits at the control file's open (a FIFO no one reads): no threshold is
    // written, and the job grows past its line.
    std::fs::write(&usage, format!("{}\n", 990 * MIB)).unwrap();
    // What fired is recorded after the freeze is written: wait on the record, not the state.
    let t = std::time::Instant::now();
    let fired = loop {
        let fired = armory.take_fired();
        if !fired.is_empty() {
            break fired;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the reflex did not fire while the thresholds registered"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(std::fs::read_to_string(&state).unwrap(), "FROZEN");
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].unreclaimable(), 990 * MIB);
    assert!(wakers.take_registered().is_empty(), "registered already");
    // The writes go through once read: each threshold.
    let mut text = String::new();
    std::fs::File::open(d.path().join("cgroup.event_control"))
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let words: Vec<&str> = text.split(' ').collect();
    let (efd, fd) = (words[0], words[1]);
    let writes = |order: [u64; 4]| -> String {
        order
            .iter()
            .map(|m| format!("{efd} {fd} {}", m * MIB))
            .collect()
    };
    // By the usage the registrar read at its start: 10 MiB (the line up first) or 990 MiB,
    // where the job grew before it (down from the line).
    assert!(
        text == writes([950, 951, 500, 800]) || text == writes([951, 950, 800, 500]),
        "{text}"
    );
    let t = std::time::Instant::now();
    while wakers.take_registered().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "never registered");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_registrar_held_by_a_registration_fills_its_queue_and_a_dropped_order_is_an_error_until_it_drains()
 {
    let d = slow_cgroup();
    std::fs::write(d.path().join("memory.current"), "0\n").unwrap();
    let queued = super::super::COMMANDS_QUEUED;
    // Room in the wake thread's queue for every order, so that only the registration holds the
    // registrar.
    let (wakers, thread, _run) = Wakers::with_test_thread(2 * queued, Arc::default());
    let commands = thread.commands;
    wakers
        .watch_v1_thresholds("held", d.path(), &[100], None, 1)
        .unwrap();
    // The registrar took it: it hands the job's eventfd to the wake thread, then waits at the
    // control file's open (a FIFO no one reads), as it waits for the kernel's grace periods.
    match commands.recv_timeout(Duration::from_secs(10)) {
        Ok(super::Cmd::Watch(Some(job), _, super::Kind::Eventfd)) => assert_eq!(job, "held"),
        _ => panic!("the registration's watch never reached the wake thread"),
    }
    let read = |job: &str| wakers.read_usage(job, d.path(), &[100, 200], 150, 200);
    let mut taken = 0;
    let dropped = loop {
        match read(&format!("job{taken}")) {
            Ok(()) => taken += 1,
            Err(e) => break e,
        }
        assert!(taken <= queued, "{taken} orders taken by a held registrar");
    };
    assert_eq!(dropped.kind(), std::io::ErrorKind::WouldBlock, "{dropped}");
    assert!(dropped.to_string().contains("queue is full"), "{dropped}");
    // Its queue holds them all.
    assert_eq!(taken, queued);
    assert_eq!(
        read("again").map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "still held"
    );

    // The registration goes through (its write is read): the queue drains and takes orders.
    let fifo = d.path().join("cgroup.event_control");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::fs::File::open(&fifo)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    });
    let t = std::time::Instant::now();
    while let Err(e) = read("after") {
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the queue never drained"
        );
        std::thread::yield_now();
    }
    assert!(reader.join().unwrap().ends_with(" 100"));
    // Every order taken reached the wake thread, in the order given, and the refused ones did not.
    let jobs: Vec<String> = (0..taken)
        .map(|i| format!("job{i}"))
        .chain(["after".to_owned()])
        .collect();
    let mut got = Vec::new();
    while got.len() < jobs.len() {
        match commands.recv_timeout(Duration::from_secs(10)) {
            Ok(super::Cmd::Reads(r)) => got.push(r.job().to_owned()),
            Ok(_) => panic!("a command that was not given"),
            Err(e) => panic!(
                "{} of {} orders reached the wake thread: {e}",
                got.len(),
                jobs.len()
            ),
        }
    }
    assert_eq!(got, jobs);
}

#[test]
fn a_cgroup_without_the_control_file_is_told_at_once() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("memory.usage_in_bytes"), "0\n").unwrap();
    let wakers = Wakers::start(
        Arc::new(tokio::sync::Notify::new()),
        Arc::default(),
        Arc::default(),
        Arc::new(tokio::sync::Notify::new()),
        0,
    )
    .unwrap();
    let e = wakers
        .watch_v1_thresholds("job", d.path(), &[100], None, 1)
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert!(wakers.take_registered().is_empty());
}

#[test]
fn a_full_wake_queue_holds_the_registrar_and_drops_no_command() {
    // Room for one: the wake thread (this test) takes none until all are given.
    let (wakers, thread, run) = Wakers::with_test_thread(1, Arc::default());
    let jobs: Vec<String> = (0..20).map(|i| format!("job{i}")).collect();
    for job in &jobs {
        wakers.unwatch(job);
    }
    let finished = wakers.finished.clone();
    drop(wakers);
    let mut got = Vec::new();
    while let Ok(cmd) = thread.commands.recv_timeout(Duration::from_secs(10)) {
        match cmd {
            super::Cmd::Unwatch(Some(job)) => got.push(job),
            _ => panic!("a command that was not given"),
        }
    }
    // Every command, in the order given, and the registrar ended with its orders.
    assert_eq!(got, jobs);
    run.join().unwrap();
    assert!(!finished.ended.load(std::sync::atomic::Ordering::Acquire));
}

#[test]
fn the_registrar_ends_with_the_wake_thread_and_later_orders_are_refused() {
    let (wakers, thread, run) = Wakers::with_test_thread(1, Arc::default());
    // The wake thread stops taking commands: its end of the queue is gone (the registrar is the
    // one to tell of it).
    drop(thread.commands);
    assert!(!wakers.ended());
    wakers.unwatch("job");
    run.join().unwrap();
    assert!(wakers.ended());
    // The owner's next order is refused, not taken for a watch.
    let refused = wakers
        .send(super::Cmd::Unwatch(Some("later".to_owned())))
        .unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::BrokenPipe, "{refused}");
}
