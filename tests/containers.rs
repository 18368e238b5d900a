//! Real containers under memwatch (issue 67): docker and podman containers of a locally built image
//! (`scripts/container-image.sh`), the real daemon on the host (root `/`).
//!
//! - A container's process attached by its host pid is named after its container (docker's
//!   `config.v2.json`, podman's entry in containers/storage's `containers.json`), its
//!   cgroup is the container's, and a pause by hand holds it and a resume lets it go on, the
//!   container running, with no OOM kill.
//! - A container growing into its memory limit (`--memory`) is paused by the policy before the OOM
//!   killer, and resumed when its limit is raised (`ENGINE update`).
//! - The engine's own pause (`docker pause`, the v1 freezer on this cgroup v1 host) beside memwatch's
//!   hold: here memwatch freezes a container through the cgroup2 mount's `cgroup.freeze` (a v2
//!   freezer of its own), so `docker unpause` does not end memwatch's hold, nor memwatch's resume the
//!   user's pause. On a host without the cgroup2 mount (emulated: the daemon in a mount namespace
//!   without it) both use the one v1 freezer: the engine refuses to pause or unpause a container
//!   memwatch froze, and memwatch's resume of a container the user paused thaws it (a bug, the
//!   ignored test).
//! - The Python client inside a container, the control socket bind-mounted, attaches itself: the job
//!   is the host's pid of the container's process, not its pid 1.
//!
//! Each test runs for docker and for podman (`docker::…`, `podman::…`); an engine that does not run
//! here fails its tests with what to install, unless `MEMWATCH_ALLOW_SKIP` names it.

mod common;

use std::path::PathBuf;

use common::containers::{
    Container, Engine, container_name, daemon, for_each_engine, job, v1_freezer_dir,
};
use common::{Daemon, Opts, wait};

/// The container's program: allocates (and touches) `argv[1]` MiB, then counts a tick every 50 ms
/// into /out/tick; once /out/go exists, grows by 4 MiB every 20 ms up to `argv[2]` MiB (0: never),
/// saying how far in /out/mib.
const TICKER: &str = r#"
import os, sys, time
held = [bytearray(int(sys.argv[1]) << 20)]
mib, grow = int(sys.argv[1]), int(sys.argv[2])
def put(name, value):
    with open("/out/." + name, "w") as f:
        f.write(str(value))
    os.replace("/out/." + name, "/out/" + name)
put("mib", mib)
tick = 0
while True:
    if mib < grow and os.path.exists("/out/go"):
        held.append(bytearray(4 << 20))
        mib += 4
        put("mib", mib)
        time.sleep(0.02)
        continue
    tick += 1
    put("tick", tick)
    time.sleep(0.05)
"#;

/// The client's program in a container: attaches itself as `argv[1]` over the bind-mounted socket,
/// writes what it sent and what came back to /out/said, then sleeps.
const CLIENT: &str = r#"
import json, os, sys, time
import memwatch
c = memwatch.Client(name=sys.argv[1], socket_path="/run/memwatch.sock")
ok = c.attach()
with open("/out/.said", "w") as f:
    json.dump({"ok": ok, "pid": os.getpid(), "name": c.name}, f)
os.replace("/out/.said", "/out/said")
while True:
    time.sleep(0.2)
"#;

/// A daemon that sees this host as one with cgroup v1 only: started in a mount namespace of its own
/// without the cgroup2 mount, so that the v1 freezer is the only one it finds for a container.
fn daemon_v1_only() -> Daemon {
    Daemon::start(Opts {
        root: "/".into(),
        gpu_state: None,
        through: &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            r#"umount /sys/fs/cgroup/unified 2>/dev/null; exec "$0" "$@""#,
        ],
        ..Opts::default()
    })
}

/// A container running [`TICKER`], its /out a host directory; removed on drop (before the directory).
struct Ticker {
    c: Container,
    out: tempfile::TempDir,
}

impl Ticker {
    /// Starts the ticker in a container (`tag` names it), with more `run` options, growing to
    /// `grow_mib` once told; returns once it ticks.
    fn start(e: &Engine, tag: &str, opts: &[&str], grow_mib: u32) -> Ticker {
        let out = common::tempdir();
        let volume = format!("{}:/out", out.path().display());
        let mut all = vec!["-v", volume.as_str()];
        all.extend(opts);
        let grow = grow_mib.to_string();
        let name = container_name(e, tag);
        let c = e.run(&name, &all, &["python3", "-c", TICKER, "64", &grow]);
        let t = Ticker { c, out };
        wait::until(
            &format!("{} ticks: {}", t.c.name, t.c.engine.logs(&t.c.name)),
            || t.tick(),
            |n| *n > 0,
        );
        t
    }

    fn read(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.out.path().join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    fn tick(&self) -> u64 {
        self.read("tick")
    }

    fn mib(&self) -> u64 {
        self.read("mib")
    }

    /// Waits until it ticks on (three ticks more than now).
    fn ticks_on(&self, d: &Daemon, what: &str) {
        let from = self.tick();
        d.wait_for(
            &format!("{what}: {} ticks on", self.c.name),
            || self.tick(),
            |n| *n >= from + 3,
        );
    }

    /// Asserts that it does not tick (nor grow) over 5 of the daemon's samples (10 ticks' time).
    fn still(&self, d: &Daemon, what: &str) {
        let (tick, mib) = (self.tick(), self.mib());
        d.wait_samples(5);
        assert_eq!(
            (self.tick(), self.mib()),
            (tick, mib),
            "{what}: {} went on (ticks, MiB)",
            self.c.name
        );
    }
}

/// `memwatch attach PID` (no name): the job's name, from "attached NAME (pid PID)".
fn attach(d: &Daemon, pid: u32) -> String {
    let (code, out, err) = d.ctl(&["attach", &pid.to_string()]);
    assert_eq!(code, 0, "attach {pid}: {err}");
    out.trim()
        .strip_prefix("attached ")
        .and_then(|s| s.strip_suffix(&format!(" (pid {pid})")))
        .unwrap_or_else(|| panic!("attach said {out:?}"))
        .to_owned()
}

/// The name memwatch gives a container's job: the name its engine gave it.
fn expected_name(c: &Container) -> String {
    c.name.clone()
}

/// Whether memwatch's hold on `job` has taken, by its mechanism: the v2 or v1 freezer of its cgroup
/// frozen, or its process stopped (state T). `None` while it is not paused; the mechanism's kind and
/// directory when held.
fn held(d: &Daemon, name: &str, c: &Container) -> Option<(String, PathBuf)> {
    let j = job(d, name);
    if j["state"] != "paused" {
        return None;
    }
    let m = &j["pause"]["mechanism"];
    let kind = m["kind"].as_str().unwrap_or_default().to_owned();
    let dir = PathBuf::from(m["dir"].as_str().unwrap_or_default());
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let ok = match kind.as_str() {
        "cgroup_v2_freeze" => read("cgroup.events").lines().any(|l| l == "frozen 1"),
        "cgroup_v1_freezer" => read("freezer.state").trim() == "FROZEN",
        "signals" => common::proc_state(c.pid) == Some('T'),
        _ => false,
    };
    ok.then_some((kind, dir))
}

/// Waits until memwatch holds the job; returns its mechanism, checked to be the container's own
/// cgroup when it is a freezer.
fn wait_held(d: &Daemon, name: &str, c: &Container) -> (String, PathBuf) {
    let (kind, dir) = d
        .wait_for(
            &format!("memwatch holds {name}"),
            || held(d, name, c),
            Option::is_some,
        )
        .unwrap();
    match kind.as_str() {
        "cgroup_v2_freeze" => assert_eq!(
            dir,
            PathBuf::from("/sys/fs/cgroup/unified").join(c.cgroup("").trim_start_matches('/')),
            "the container's v2 cgroup"
        ),
        "cgroup_v1_freezer" => assert_eq!(dir, v1_freezer_dir(&c.cgroup("freezer"))),
        _ => {}
    }
    eprintln!(
        "{}: memwatch holds {name} by {kind} {}",
        c.engine.name,
        dir.display()
    );
    (kind, dir)
}

/// The container runs (the engine says so, not paused), was not OOM-killed, and its process lives.
fn runs_unharmed(c: &Container) {
    assert_eq!(c.status(), "running", "{}", c.name);
    assert!(!c.oom_killed(), "{} OOM-killed", c.name);
    assert_eq!(c.oom_kills(), 0, "OOM kills in {}", c.cgroup("memory"));
    assert!(
        common::proc_state(c.pid).is_some_and(|s| s != 'Z'),
        "{} (pid {}) is gone",
        c.name,
        c.pid
    );
}

/// Attached by its host pid, a container's process is named after the container, its cgroup is the
/// container's; paused by hand it stops, resumed it goes on, the container running all along.
fn named_paused_and_resumed_by_hand(e: &Engine) {
    let t = Ticker::start(e, "hand", &[], 0);
    let c = &t.c;
    let d = daemon();
    let name = attach(&d, c.pid);
    let j = d.wait_for(
        "the job's first sample, of the container's cgroup",
        || job(&d, &name),
        |j| j["sample"]["cgroup"]["path"].is_string(),
    );
    eprintln!(
        "{}: container {} (id {}, host pid {}) attached as {name}; origin {}, cgroup {}",
        e.name,
        c.name,
        &c.id[..12],
        c.pid,
        j["origin"],
        j["sample"]["cgroup"]["path"]
    );
    assert_eq!(name, expected_name(c), "{j:#}");
    assert_eq!(j["pid"], c.pid, "{j:#}");
    assert_eq!(j["origin"]["kind"], e.name, "{j:#}");
    assert_eq!(j["origin"]["id"], c.id.as_str(), "{j:#}");
    let cgroup = c.cgroup("memory");
    assert_ne!(cgroup, "/");
    assert_eq!(j["sample"]["cgroup"]["path"], cgroup.as_str(), "{j:#}");

    let (code, _, err) = d.ctl(&["pause", &name]);
    assert_eq!(code, 0, "{err}");
    wait_held(&d, &name, c);
    t.still(&d, "paused by memwatch");
    assert_eq!(job(&d, &name)["pause"]["by"], "user");

    let (code, _, err) = d.ctl(&["resume", &name]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(job(&d, &name)["state"], "running");
    t.ticks_on(&d, "resumed");
    runs_unharmed(c);
}

/// A container growing past its memory limit is paused by the policy (its cgroup's critical line,
/// or the projection before it) and not OOM-killed; with its limit raised it is resumed and grows on.
fn paused_at_its_limit_not_oom_killed(e: &Engine) {
    const LIMIT: u64 = 200 << 20;
    let t = Ticker::start(
        e,
        "limit",
        &["--memory", "200m", "--memory-swap", "200m"],
        300,
    );
    let c = &t.c;
    let d = daemon();
    let name = attach(&d, c.pid);
    d.wait_for(
        "the job's cgroup limit, watched",
        || job(&d, &name),
        |j| j["sample"]["cgroup"]["limit_bytes"] == LIMIT && j["watch"] == "watched",
    );
    std::fs::write(t.out.path().join("go"), "").unwrap();
    let (kind, ..) = d.wait_for(
        "paused by the policy at its limit",
        || {
            let j = job(&d, &name);
            (
                held(&d, &name, c),
                j["pause"]["by"].clone(),
                c.usage(),
                t.mib(),
            )
        },
        |(h, by, usage, _)| h.is_some() && by == "policy" && *usage >= LIMIT * 9 / 10,
    );
    let kind = kind.unwrap().0;
    let events: Vec<_> = d
        .events()
        .into_iter()
        .filter(|e| e["job"] == name.as_str() && e["action"] != "way_out")
        .map(|e| format!("{} {}: {}", e["action"], e["reason"], e["detail"]))
        .collect();
    eprintln!(
        "{}: paused at {} MiB of 200 (usage {} MiB) by {kind}; events:\n  {}",
        e.name,
        t.mib(),
        c.usage() >> 20,
        events.join("\n  ")
    );
    assert_eq!(c.oom_kills(), 0);
    assert!(!c.oom_killed());
    t.still(&d, "held at its limit");
    assert_eq!(c.oom_kills(), 0);

    e.must(&[
        "update",
        "--memory",
        "400m",
        "--memory-swap",
        "400m",
        &c.name,
    ]);
    d.wait_for(
        "resumed once its limit is raised",
        || job(&d, &name)["state"].clone(),
        |s| s == "running",
    );
    d.wait_for("grown to 300 MiB", || t.mib(), |m| *m == 300);
    t.ticks_on(&d, "resumed after the raise");
    runs_unharmed(c);
}

/// The engine's pause and memwatch's hold on this host (cgroup v1 with a cgroup2 mount): memwatch
/// freezes through the v2 freezer, the engine through the v1 freezer; neither lets the other's go.
fn engine_pause_beside_memwatch(e: &Engine) {
    let t = Ticker::start(e, "both", &[], 0);
    let c = &t.c;
    let d = daemon();
    let name = attach(&d, c.pid);

    // memwatch first: the user's pause and unpause leave memwatch's hold in place.
    assert_eq!(d.ctl(&["pause", &name]).0, 0);
    let (kind, _) = wait_held(&d, &name, c);
    assert_eq!(
        kind, "cgroup_v2_freeze",
        "a container on a cgroup v1 host with a cgroup2 mount is frozen through its v2 cgroup"
    );
    c.pause(true)
        .expect("the engine pauses a container memwatch holds");
    assert_eq!(c.status(), "paused");
    assert_eq!(c.v1_freezer(), "FROZEN");
    c.pause(false).expect("the engine unpauses it");
    assert_eq!(c.v1_freezer(), "THAWED");
    // The engine says it runs; memwatch still holds it, and it does not.
    assert_eq!(c.status(), "running");
    assert!(held(&d, &name, c).is_some(), "{:#}", job(&d, &name));
    t.still(&d, "held by memwatch after the engine's unpause");
    // On a cgroup v2 host the engine's unpause writes the cgroup.freeze memwatch froze: done here by
    // hand, memwatch finds its freeze undone at its next sample and makes it again.
    let freeze = std::path::Path::new("/sys/fs/cgroup/unified")
        .join(c.cgroup("").trim_start_matches('/'))
        .join("cgroup.freeze");
    std::fs::write(&freeze, "0").expect("write cgroup.freeze as an unpause would");
    d.wait_for(
        "memwatch's freeze made again",
        || std::fs::read_to_string(&freeze).unwrap_or_default(),
        |t| t.trim() == "1",
    );
    let said = d.wait_for(
        "the event of the freeze made again",
        || d.events(),
        |ev| {
            ev.iter()
                .any(|e| e["reason"] == "freeze" && e["action"] == "pause")
        },
    );
    eprintln!(
        "{}: {}",
        e.name,
        said.iter()
            .find(|e| e["reason"] == "freeze")
            .map(|e| e["detail"].to_string())
            .unwrap_or_default()
    );
    assert!(held(&d, &name, c).is_some(), "{:#}", job(&d, &name));
    t.still(&d, "held by memwatch again after its freeze was undone");
    assert_eq!(d.ctl(&["resume", &name]).0, 0);
    t.ticks_on(&d, "resumed by memwatch");
    runs_unharmed(c);

    // The user first: memwatch's pause and resume leave the user's pause in place.
    c.pause(true).expect("the engine pauses it");
    assert_eq!(c.status(), "paused");
    let (code, _, err) = d.ctl(&["pause", &name]);
    assert_eq!(code, 0, "{err}");
    // Its freeze does not settle (the engine's froze the processes first): memwatch stops them by
    // signals instead.
    let j = d.wait_for(
        "memwatch's pause of a paused container, held",
        || job(&d, &name),
        |j| j["state"] == "paused" && j["pause"]["phase"] == "held",
    );
    eprintln!(
        "{}: memwatch's pause of a container the engine paused: held by {}",
        e.name, j["pause"]["mechanism"]
    );
    assert_eq!(c.v1_freezer(), "FROZEN");
    assert_eq!(d.ctl(&["resume", &name]).0, 0);
    assert_eq!(job(&d, &name)["state"], "running");
    assert_eq!(c.status(), "paused");
    assert_eq!(c.v1_freezer(), "FROZEN");
    t.still(&d, "paused by the user after memwatch's resume");
    c.pause(false).expect("the engine unpauses it");
    t.ticks_on(&d, "unpaused by the user");
    assert_eq!(job(&d, &name)["state"], "running");
    runs_unharmed(c);
}

/// On a host with the v1 freezer only, memwatch freezes the container's v1 freezer cgroup, the one
/// the engine pauses with: the engine then refuses both its pause and its unpause, memwatch's hold
/// stands, and memwatch's resume lets the container go on.
fn v1_only_hold_survives_the_engines_pause_and_unpause(e: &Engine) {
    let t = Ticker::start(e, "v1hold", &[], 0);
    let c = &t.c;
    let d = daemon_v1_only();
    let name = attach(&d, c.pid);
    assert_eq!(d.ctl(&["pause", &name]).0, 0);
    let (kind, _) = wait_held(&d, &name, c);
    assert_eq!(kind, "cgroup_v1_freezer");
    let paused = c.pause(true);
    assert_eq!(c.v1_freezer(), "FROZEN");
    let unpaused = c.pause(false);
    eprintln!(
        "{}, v1 only: the engine's pause of a container memwatch froze: {paused:?}; its unpause: \
         {unpaused:?}; the engine says {}",
        e.name,
        c.status()
    );
    assert_eq!(
        c.v1_freezer(),
        "FROZEN",
        "the engine thawed memwatch's hold"
    );
    assert!(held(&d, &name, c).is_some(), "{:#}", job(&d, &name));
    t.still(&d, "held by memwatch after the engine's pause and unpause");
    assert_eq!(d.ctl(&["resume", &name]).0, 0);
    t.ticks_on(&d, "resumed by memwatch");
    runs_unharmed(c);
}

/// On a host with the v1 freezer only, a container the user paused stays paused when memwatch
/// pauses and resumes it. Fails today: memwatch takes the already frozen freezer cgroup for its
/// own freeze and thaws it at its resume (the engine still says "paused", and its unpause then
/// fails with "container not paused").
fn v1_only_users_pause_survives_memwatchs_resume(e: &Engine) {
    let t = Ticker::start(e, "v1user", &[], 0);
    let c = &t.c;
    let d = daemon_v1_only();
    let name = attach(&d, c.pid);
    c.pause(true).expect("the engine pauses it");
    assert_eq!(c.v1_freezer(), "FROZEN");
    assert_eq!(d.ctl(&["pause", &name]).0, 0);
    let j = d.wait_for(
        "memwatch's pause of a paused container, held",
        || job(&d, &name),
        |j| j["state"] == "paused" && j["pause"]["phase"] == "held",
    );
    eprintln!(
        "{}, v1 only: memwatch's pause of a container the engine paused: held by {}",
        e.name, j["pause"]["mechanism"]
    );
    assert_eq!(d.ctl(&["resume", &name]).0, 0);
    assert_eq!(c.status(), "paused");
    assert_eq!(
        c.v1_freezer(),
        "FROZEN",
        "memwatch's resume thawed the container the user paused"
    );
    t.still(&d, "paused by the user after memwatch's resume");
    c.pause(false).expect("the engine unpauses it");
    t.ticks_on(&d, "unpaused by the user");
}

/// The Python client in a container, the daemon's socket bind-mounted, attaches itself: the job's
/// pid is the container process's on the host, not its pid 1 in the container.
fn client_in_a_container_attaches_its_host_pid(e: &Engine) {
    let d = daemon();
    let out = common::tempdir();
    let volumes = [
        format!("{}:/run/memwatch.sock", d.socket.display()),
        format!("{}:/mw:ro", common::repo().join("python/src").display()),
        format!("{}:/out", out.path().display()),
    ];
    let jobname = format!("boxed-{}", e.name);
    let c = e.run(
        &container_name(e, "client"),
        &[
            "-v",
            &volumes[0],
            "-v",
            &volumes[1],
            "-v",
            &volumes[2],
            "-e",
            "PYTHONPATH=/mw",
        ],
        &["python3", "-c", CLIENT, &jobname],
    );
    let said = wait::file(
        &format!("the client's answer ({})", e.logs(&c.name)),
        &out.path().join("said"),
        |t| !t.is_empty(),
    );
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(said["ok"], true, "{said}; {}", e.logs(&c.name));
    let j = job(&d, &jobname);
    eprintln!(
        "{}: the client (pid {} in its container) attached as {}: job pid {}, container pid {} on \
         the host; origin {}",
        e.name, said["pid"], said["name"], j["pid"], c.pid, j["origin"]
    );
    assert_eq!(said["pid"], 1, "python is the container's pid 1");
    assert_eq!(j["pid"], c.pid, "the job is the host's pid: {j:#}");
    assert_eq!(j["origin"]["kind"], e.name, "{j:#}");
    assert_eq!(j["origin"]["id"], c.id.as_str(), "{j:#}");
    let j = d.wait_for(
        "the job's first sample",
        || job(&d, &jobname),
        |j| j["sample"]["cgroup"]["path"].is_string(),
    );
    assert_eq!(j["sample"]["cgroup"]["path"], c.cgroup("memory").as_str());
}

for_each_engine! {
    named_paused_and_resumed_by_hand;
    paused_at_its_limit_not_oom_killed;
    engine_pause_beside_memwatch;
    v1_only_hold_survives_the_engines_pause_and_unpause;
    v1_only_users_pause_survives_memwatchs_resume;
    client_in_a_container_attaches_its_host_pid;
}
