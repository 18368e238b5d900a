//! The package as memwatch's users run it: systemd as PID 1 and cgroup v2 only, on a real Debian 13
//! (systemd 257, kernel 6.12) booted under qemu, which this machine (no systemd, cgroup v1) is not.
//! `scripts/vm/run.sh` boots the guest once (its image cached by `scripts/vm/image.sh`) and runs the
//! scenarios in `scripts/vm/scenarios/` in it against the .deb that `scripts/build-deb.sh` makes:
//! `install` (apt-get offline, the service started, metrics, status, the wake thread
//! at real-time priority, no stale samples, the unit's
//! exposure, restart and stop), `freeze-v2` (a systemd unit's job growing toward its MemoryMax is
//! frozen through cgroup.freeze, never OOM-killed, and thawed on detach), `launch-systemd` (`memwatch
//! launch` as root and as an ordinary user runs the job in a transient scope of its own, removed when it
//! ends, nothing at the root of the tree; the user with no user bus is served through the manager's
//! private socket, and with no manager refused with what to do), `user-jobs` (a `systemd-run` service, a `--scope`, a
//! container-style scope in machine.slice and an ordinary user's `systemd-run --user` service attached
//! by that user: each paused by hand and by the policy, by the freezer where the attached tree owns its
//! cgroup and by signals where it does not, resumed, detached, alive, never OOM-killed; the user may
//! not attach or pause root's job), `containers-v2` (Debian's docker.io under systemd: a container
//! attached by host pid, named after it, paused and resumed; docker's own pause and unpause beside
//! memwatch's freeze, which share `cgroup.freeze` on v2; a container at its `--memory` limit paused,
//! never OOM-killed), `reaction-v2` (8 runs into MemoryMax=512M with the package's
//! config: none OOM-killed; 4 with a level-only policy: the crossing-to-pause times, a benchmark,
//! and the reflex, whose reads of memory.current freeze the job at its line, makes the stop in at
//! least one of them; 4 more with the reflex off, side by side; an attached job that does reach
//! its limit is reported
//! OOM-killed; the PSI trigger on a job's cgroup wakes the daemon), `calm-v2` (with a calm v2 job
//! attached the daemon stretches its full samples, the wake thread's reads of the job's usage
//! standing in for v1's thresholds; a read tells the daemon when the job grows past half its limit;
//! its CPU idle and with the job, side by side), `oomd` and `earlyoom` (each kills
//! a job alone; with memwatch the job is paused first, marked `user.oomd_omit` while held, and
//! survives), `way-out-v2` (the way out of a unit's memory pause: a limit
//! lent through systemd, which its reloads keep and which goes back to the unit's own; zram emergency
//! swap the job's pages go out to, removed after; the swap step skipped, with its reason, for a unit
//! with MemorySwapMax=0), `crash-under-systemd` (the
//! daemon killed while it holds a frozen job, restarted by systemd: the new daemon holds the job),
//! `crash-rounds` (the same 8 times in a row, SIGKILL, SIGABRT and SIGQUIT in turn, the cgroup read
//! every 50 ms), `gap-rounds` (10 rounds, each a fresh job into MemoryMax=400M at 200 MiB/s with the
//! daemon SIGKILLed at the first sign of a pause, or up to 290 ms after it: no job OOM-killed, each
//! held by the successor or running inside its limit; its per-round log is
//! `target/vm/out/gap-rounds.log`), `restart-held` (`systemctl restart` and a package upgrade while the daemon holds a
//! frozen job: the new daemon holds it, never thawed) and
//! `guardian-no-restart` (the same with restarts off: the guardian thaws it after its grace). Each reports
//! `VMRESULT SCENARIO ok|fail DETAIL` lines with the numbers it measured; they are printed here.
//!
//! Needs root (debootstrap, qemu's disks); fails otherwise, unless `MEMWATCH_ALLOW_SKIP=vm`. The boot takes minutes under TCG.

mod common;

use std::process::Command;
use std::sync::OnceLock;

/// One `VMRESULT` line.
#[derive(Debug)]
struct Outcome {
    scenario: String,
    ok: bool,
    detail: String,
}

/// The scenarios of the one boot, in the order they run (the crashes last: they kill the daemon).
const SCENARIOS: [&str; 16] = [
    "boot",
    "install",
    "freeze-v2",
    "launch-systemd",
    "user-jobs",
    "containers-v2",
    "reaction-v2",
    "calm-v2",
    "oomd",
    "earlyoom",
    "way-out-v2",
    "restart-held",
    "crash-under-systemd",
    "crash-rounds",
    "gap-rounds",
    "guardian-no-restart",
];

/// Builds the package and memhog, boots the guest once for every test here, and returns its results;
/// None when not root and the run allows the VM tests to be skipped (`MEMWATCH_ALLOW_SKIP=vm`).
fn vm() -> Option<&'static [Outcome]> {
    static RUN: OnceLock<Option<Vec<Outcome>>> = OnceLock::new();
    RUN.get_or_init(|| {
        if !nix::unistd::Uid::effective().is_root() {
            common::skip::cannot_run(
                "vm",
                "the VM tests need root (debootstrap builds the guest, qemu boots it)",
            );
            return None;
        }
        let deb = common::repo().join(common::script_output("scripts/build-deb.sh", &["--debug"]));
        let started = std::time::Instant::now();
        let out = Command::new(common::repo().join("scripts/vm/run.sh"))
            .args(SCENARIOS)
            .env("MEMWATCH_VM_DEB", &deb)
            .env("MEMWATCH_VM_MEMHOG", common::memhog())
            .current_dir(common::repo())
            .output()
            .expect("run scripts/vm/run.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!(
            "scripts/vm/run.sh {} ({} s, {}):\n{}{stdout}",
            SCENARIOS.join(" "),
            started.elapsed().as_secs(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
        );
        let outcomes: Vec<Outcome> = stdout
            .lines()
            .filter_map(|l| {
                let mut parts = l.strip_prefix("VMRESULT ")?.splitn(3, ' ');
                Some(Outcome {
                    scenario: parts.next()?.to_string(),
                    ok: parts.next()? == "ok",
                    detail: parts.next().unwrap_or("").to_string(),
                })
            })
            .collect();
        Some(outcomes)
    })
    .as_deref()
}

/// Every line of these scenarios is there and ok, but for the checks named in `except` (a line's
/// detail starts with its check's name and a colon).
fn assert_ok(outcomes: &[Outcome], scenarios: &[&str], except: &[&str]) {
    for s in scenarios {
        let lines: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.scenario == *s && !except.iter().any(|c| o.detail.starts_with(c)))
            .collect();
        assert!(!lines.is_empty(), "scenario {s} reported nothing");
        let failed: Vec<&str> = lines
            .iter()
            .filter(|o| !o.ok)
            .map(|o| o.detail.as_str())
            .collect();
        assert!(failed.is_empty(), "scenario {s} failed: {failed:#?}");
    }
}

#[test]
fn the_package_runs_under_systemd_and_freezes_with_cgroup_v2_on_debian_13() {
    let Some(outcomes) = vm() else { return };
    assert_ok(
        outcomes,
        &["boot", "install", "freeze-v2", "launch-systemd"],
        &[],
    );
    assert!(
        outcomes
            .iter()
            .any(|o| o.scenario == "install" && o.ok && o.detail.starts_with("realtime: ")),
        "install: no ok line on the wake thread's real-time priority"
    );
}

/// Jobs as users start them (system and user services, scopes, a container's scope), each held by
/// the mechanism its cgroup allows, by hand and by the policy, never OOM-killed; at the rates the
/// guest reaches, 8 runs into a 512 MiB limit with the package's config, none OOM-killed (the
/// level-only runs are figures, but the reflex must make the stop in some of them); an OOM kill
/// memwatch let happen is reported; the job cgroup's PSI trigger wakes the daemon.
#[test]
fn jobs_as_users_start_them_are_held_and_fast_growth_is_survived_on_cgroup_v2() {
    let Some(outcomes) = vm() else { return };
    assert_ok(outcomes, &["user-jobs", "reaction-v2"], &[]);
    for check in [
        "shipped-4096: ",
        "reflex-v2: ",
        "oom-reported: ",
        "psi-wake: ",
    ] {
        assert!(
            outcomes
                .iter()
                .any(|o| o.scenario == "reaction-v2" && o.ok && o.detail.starts_with(check)),
            "reaction-v2: no ok line starting {check:?}"
        );
    }
}

/// A calm v2 job lets the daemon be calm: the wake thread's reads of its memory.current stand in for
/// v1's thresholds (the full samples stretch with the job attached, and a read tells of its growth
/// past half its limit).
#[test]
fn a_calm_v2_job_is_watched_by_the_daemons_own_reads_and_lets_it_be_calm() {
    let Some(outcomes) = vm() else { return };
    assert_ok(outcomes, &["calm-v2"], &[]);
    for check in ["calm: ", "crossing: ", "calm-again: "] {
        assert!(
            outcomes
                .iter()
                .any(|o| o.scenario == "calm-v2" && o.ok && o.detail.starts_with(check)),
            "calm-v2: no ok line starting {check:?}"
        );
    }
}

/// The way out under systemd: a limit lent to a unit through its manager (`systemctl show` has it,
/// `daemon-reload` and `set-property` keep it) and given back; zram swap the job's pages go out to,
/// the job resumed alive and the device removed; a unit with MemorySwapMax=0 skips the swap step and
/// says why; a plain unit no fix can help is pushed out to swap while frozen (`memory.reclaim`),
/// resumed, and finishes with no OOM kill.
#[test]
fn the_way_out_lends_through_systemd_and_swaps_where_the_unit_allows() {
    let Some(outcomes) = vm() else { return };
    assert_ok(outcomes, &["way-out-v2"], &[]);
    assert!(
        outcomes
            .iter()
            .any(|o| o.scenario == "way-out-v2" && o.ok && o.detail.starts_with("reclaim: ")),
        "way-out-v2: no ok line on a plain unit pushed out while held"
    );
}

/// Beside systemd-oomd: a job under MemoryHigh= alone in a slice oomd watches is killed by oomd
/// without memwatch; attached, it is paused at memory.high's level (its limit), its cgroup carries
/// user.oomd_omit=1 while held, oomd leaves it alone for longer than its duration, and a detach takes
/// the mark off. Beside earlyoom (-m 10): alone, earlyoom kills a job growing in host memory; with
/// host_memory critical 0.85, memwatch pauses it first and it survives (the line with memwatch's
/// defaults is a measurement of who acts first, ok either way).
#[test]
fn systemd_oomd_and_earlyoom_leave_a_job_memwatch_holds_alone() {
    let Some(outcomes) = vm() else { return };
    assert_ok(outcomes, &["oomd", "earlyoom"], &[]);
    for (s, check) in [
        ("oomd", "alone: killed by systemd-oomd"),
        ("oomd", "paused: frozen"),
        ("oomd", "survived: alive"),
        ("oomd", "unmarked: memwatch detach took user.oomd_omit off"),
        ("earlyoom", "alone: earlyoom"),
        (
            "earlyoom",
            "configured: memwatch (host_memory critical 0.85) froze the job",
        ),
    ] {
        assert!(
            outcomes
                .iter()
                .any(|o| o.scenario == s && o.ok && o.detail.starts_with(check)),
            "{s}: no ok line starting {check:?}"
        );
    }
}

/// The daemon restarted (`systemctl restart`, a package upgrade) or crashed (SIGKILL once, then
/// SIGKILL, SIGABRT and SIGQUIT 8 times in a row) while it holds a job frozen at its memory limit:
/// the new daemon goes on holding the job, never thawed into the OOM killer (the stopping daemon
/// keeps the pause, the guardian waits for the successor); with restarts off, the guardian thaws
/// the job once its grace (5 s) is over.
#[test]
fn a_frozen_job_is_handed_to_the_restarted_daemon_or_thawed_after_the_grace() {
    let Some(outcomes) = vm() else { return };
    assert_ok(
        outcomes,
        &[
            "restart-held",
            "crash-under-systemd",
            "crash-rounds",
            "guardian-no-restart",
        ],
        &[],
    );
}

/// The daemon killed at the first sign of each pause of a fresh job near its line (10 rounds): no
/// job dies, each is held by the daemon systemd restarts, or by the guardian in the gap, or runs
/// inside its limit. The rounds' log is printed.
#[test]
fn a_daemon_killed_at_a_pause_costs_no_job_its_life() {
    let Some(outcomes) = vm() else { return };
    let log = common::repo().join("target/vm/out/gap-rounds.log");
    eprintln!(
        "{}:\n{}",
        log.display(),
        std::fs::read_to_string(&log).unwrap_or_else(|e| format!("unreadable: {e}"))
    );
    assert_ok(outcomes, &["gap-rounds"], &[]);
}

/// Docker containers on cgroup v2 with systemd: attached by host pid and named after their container
/// in its `docker-ID.scope`, paused and resumed by hand with docker saying "running" after; held
/// through `docker pause` and `docker unpause` of the same `cgroup.freeze` (runc refuses both); a user's
/// `docker pause` left alone by memwatch's resume; a container at its `--memory` limit paused by the
/// policy, never OOM-killed, resumed once `docker update` raised it.
#[test]
fn docker_containers_are_held_and_released_on_cgroup_v2_beside_dockers_own_pause() {
    let Some(outcomes) = vm() else { return };
    assert_ok(outcomes, &["containers-v2"], &[]);
}
