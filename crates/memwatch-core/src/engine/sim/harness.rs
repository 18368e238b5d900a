//! The simulator's harness: one engine on a host in memory (`host.rs`) with a clock the test moves,
//! its effects drained and answered here, and the invariants checked after every step.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::audit::Audit;
use crate::engine::{Effect, Engine, Intents, LeftBehind, Outcome, Settings, Stores};
use crate::host::Version;
use crate::seam::{SlurmAnswer, SlurmCall};

use super::host::FakeHost;

/// Where the host's /sys would be: the cgroups are named under it.
pub const ROOT: &str = "/sim";
/// The state directory the configuration names (nothing is written there).
pub const STATE_DIR: &str = "/sim/state";
/// This node's name in Slurm.
pub const NODE: &str = "simnode";
/// The job's owner.
pub const OWNER: u32 = 1000;
/// The job's root; its worker is `PID + 1`.
pub const PID: u32 = 4100;
/// Its Slurm job id, where it is one.
pub const SLURM_ID: &str = "77";

/// What should hold the job's pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Signals,
    V1,
    V2,
    Slurm,
}

pub const ALL: [Kind; 4] = [Kind::Signals, Kind::V1, Kind::V2, Kind::Slurm];

impl Kind {
    /// The state file's name for the mechanism.
    pub fn record(self) -> &'static str {
        match self {
            Kind::Signals => "signals",
            Kind::V1 => "cgroup_v1_freezer",
            Kind::V2 => "cgroup_v2_freeze",
            Kind::Slurm => "slurm_suspend",
        }
    }
}

/// One engine on one host in memory.
pub struct Sim {
    pub host: Arc<FakeHost>,
    pub engine: Engine,
    pub now: u64,
    pub kind: Kind,
    /// Slurm calls made, in order.
    pub slurm: Vec<(SlurmCall, String)>,
    /// Slurm answers no.
    pub slurm_fails: bool,
    /// Slurm calls are answered only by `answer_slurm`.
    pub slurm_held: bool,
    /// What Slurm answers a call that went through (`Done` when there is none for it).
    pub slurm_answers: VecDeque<(SlurmCall, SlurmAnswer)>,
    /// Whether Slurm holds the job suspended on this node, as the full samples find it.
    pub slurm_suspended: Option<bool>,
    held: VecDeque<Outcome>,
    /// Freezes still settling, answered by `settle`.
    pub settling: VecDeque<(String, crate::held::Frozen)>,
    /// The OOM kills the job's cgroup reports in each sample; `None`: none (and no cgroup, unless
    /// it has a limit).
    pub oom_kills: Option<u64>,
    /// The job's cgroup limit in each sample (bytes); `None`: unlimited (or no cgroup).
    pub cgroup_limit: Option<u64>,
    /// The job's root has exited: samples measure nothing of it.
    pub gone: bool,
    /// The members of the job's cgroup each walk reports (`None`: they do not hold the tree).
    pub members: Option<crate::job::members::Members>,
    /// A Slurm in memory that this node shares with others (`pair.rs`): its calls run the hold
    /// protocol against it, and each full sample finds the job suspended here as it says.
    pub shared_slurm: Option<super::pair::FakeSlurm>,
    /// This node's Slurm name.
    pub node: String,
    /// Swap work the engine handed off, kept for the case to answer (`None`: such work is a
    /// violation, as for a job with no way out).
    pub way_out_tasks: Option<VecDeque<crate::engine::WayOutTask>>,
    config: String,
}

/// The job's own cgroup directory for `kind`, if it has one.
pub fn cgroup_dir(root: &Path, kind: Kind) -> Option<PathBuf> {
    match kind {
        Kind::V1 => Some(root.join("sys/fs/cgroup/freezer/simjob")),
        Kind::V2 => Some(root.join("sys/fs/cgroup/simjob")),
        _ => None,
    }
}

impl Sim {
    pub fn new(kind: Kind) -> Sim {
        Sim::with(kind, "", &[])
    }

    /// A job of `kind` (a root and one worker of `OWNER`, plus `strangers`: processes of other
    /// uids in its cgroup), attached by its owner, with `extra` config.
    pub fn with(kind: Kind, extra: &str, strangers: &[(u32, u32)]) -> Sim {
        Sim::on_node(kind, extra, strangers, NODE)
    }

    /// As [`Sim::with`], on the Slurm node named `node`.
    pub fn on_node(kind: Kind, extra: &str, strangers: &[(u32, u32)], node: &str) -> Sim {
        let r = Path::new(ROOT);
        let host = FakeHost::new(r);
        let membership = match kind {
            Kind::Signals => "0::/user.slice/sim\n".to_owned(),
            Kind::V1 => "7:freezer:/simjob\n0::/\n".to_owned(),
            Kind::V2 => "0::/simjob\n".to_owned(),
            Kind::Slurm => {
                format!("6:memory:/slurm/uid_{OWNER}/job_{SLURM_ID}/step_0/task_0\n0::/\n")
            }
        };
        host.add_process(1, 0, 0, "0::/\n");
        host.add_process(PID, 1, OWNER, &membership);
        host.add_process(PID + 1, PID, OWNER, &membership);
        let mut members = vec![PID, PID + 1];
        for (pid, uid) in strangers {
            host.add_process(*pid, PID, *uid, &membership);
            members.push(*pid);
        }
        match cgroup_dir(r, kind) {
            Some(d) if kind == Kind::V1 => {
                host.add_cgroup(&d, Version::V1, &members, &[("freezer.state", "THAWED\n")]);
            }
            Some(d) => {
                // A cgroup v2 hierarchy with memory accounting, as systemd-oomd watches: the
                // engine finds the job's cgroup, and a policy pause marks it.
                host.account_v2_memory();
                host.add_cgroup(
                    &d,
                    Version::V2,
                    &members,
                    &[
                        ("memory.current", "1048576\n"),
                        ("memory.max", "max\n"),
                        ("memory.high", "max\n"),
                        ("cgroup.freeze", "0\n"),
                        ("cgroup.events", "populated 1\nfrozen 0\n"),
                    ],
                );
            }
            None => {}
        }
        // No way out (its swap and config work are the executor's, not the host's), unless a case
        // names its steps (and then takes none of them).
        let extra = if extra.contains("steps =") {
            extra.to_owned()
        } else if extra.contains("[way_out]\n") {
            extra.replace("[way_out]\n", "[way_out]\nsteps = []\n")
        } else {
            format!("{extra}\n[way_out]\nsteps = []\n")
        };
        let text = format!(
            "[host]\nroot = {ROOT:?}\nprocess_root = {ROOT:?}\n[control]\nstate_dir = {STATE_DIR:?}\n{extra}"
        );
        let config = text.clone();
        let engine = Sim::engine_on(&host, &text, node);
        let mut sim = Sim {
            host,
            engine,
            now: 1_000,
            kind,
            slurm: Vec::new(),
            slurm_fails: false,
            slurm_held: false,
            slurm_answers: VecDeque::new(),
            slurm_suspended: None,
            held: VecDeque::new(),
            settling: VecDeque::new(),
            oom_kills: None,
            cgroup_limit: None,
            gone: false,
            members: None,
            shared_slurm: None,
            node: node.to_owned(),
            way_out_tasks: None,
            config,
        };
        let r = sim.cmd(serde_json::json!({"cmd": "attach", "pid": PID, "name": "sim"}));
        assert!(r.ok, "attach: {:?}", r.error);
        sim
    }

    /// The daemon is killed and a new one starts on the same state file and host: the engine is
    /// replaced by one that recovers from the file.
    pub fn restart(&mut self) {
        let state = self.host.load_state();
        self.engine = Sim::engine_on(&self.host, &self.config, &self.node);
        self.engine.recover(state, self.now);
        self.drain();
        self.check();
    }

    /// An engine with `config` on `host`, its stores the host's: its state file and its audit log
    /// (the events logged so far loaded), nothing left beside them.
    pub fn engine(host: &Arc<FakeHost>, config: &str) -> Engine {
        Sim::engine_on(host, config, NODE)
    }

    /// As [`Sim::engine`], on the Slurm node named `node`.
    pub fn engine_on(host: &Arc<FakeHost>, config: &str, node: &str) -> Engine {
        Sim::engine_node(
            host,
            Settings::from(&crate::config::parse(config).unwrap()),
            node,
        )
    }

    /// An engine with `settings` on `host`, as [`Sim::engine`].
    pub fn engine_of(host: &Arc<FakeHost>, settings: Settings) -> Engine {
        Sim::engine_node(host, settings, NODE)
    }

    fn engine_node(host: &Arc<FakeHost>, settings: Settings, node: &str) -> Engine {
        let stores = Stores::new(
            host.store(),
            Audit::new(host.logged(), host.sink()),
            node.into(),
            LeftBehind {
                swaps: Vec::new(),
                intents: Intents::of_lines([]),
            },
        );
        Engine::with_host(settings, None, host.clone(), host.clone(), stores)
    }

    pub fn root(&self) -> PathBuf {
        self.host.root.clone()
    }

    /// A control command from the job's owner.
    pub fn cmd(&mut self, request: serde_json::Value) -> crate::control::Response {
        self.cmd_as(OWNER, request)
    }

    pub fn cmd_as(&mut self, uid: u32, request: serde_json::Value) -> crate::control::Response {
        self.cmd_prepared(uid, request, crate::engine::Prepared::default())
    }

    /// A control command from user `uid`, with what the host read for it beforehand.
    pub fn cmd_prepared(
        &mut self,
        uid: u32,
        request: serde_json::Value,
        prepared: crate::engine::Prepared,
    ) -> crate::control::Response {
        let request = serde_json::from_value(request).unwrap();
        let caller = crate::control::Caller { uid, pid: None };
        let r = self
            .engine
            .handle_command(request, caller, prepared, self.now);
        self.drain();
        self.check();
        r
    }

    /// The host's part of a full sample at `self.now`: `used` of 16 GiB in use.
    fn host_sample(&self, used: f64) -> crate::sample::Sample {
        let total: u64 = 16 << 30;
        let mut sample = crate::sample::Sample {
            timestamp_ms: self.now,
            ..Default::default()
        };
        sample.host.memory = Some(crate::sample::meminfo::MemInfo {
            total_bytes: total,
            free_bytes: ((1.0 - used) * total as f64) as u64,
            available_bytes: ((1.0 - used) * total as f64) as u64,
            ..Default::default()
        });
        sample
    }

    /// A full sample at `self.now`: host memory `used` of 16 GiB in use, the job's tree as in
    /// the host.
    pub fn sample(&mut self, used: f64) {
        let sample = self.host_sample(used);
        let proc = |pid: u32| {
            serde_json::json!({"pid": pid, "ppid": PID, "name": "sim", "state": "S",
                "rss_bytes": 4u64 << 30, "pss_bytes": 4u64 << 30, "pss_read_ms": self.now,
                "swap_bytes": 0, "gpu_bytes": null})
        };
        let job: crate::job::JobSample = serde_json::from_value(serde_json::json!({
            "timestamp_ms": self.now, "processes": [proc(PID), proc(PID + 1)], "process_count": 2,
            "rss_bytes": 8u64 << 30, "pss_bytes": 8u64 << 30, "pss_read_ms": self.now,
            "swap_bytes": 0, "gpu_bytes": null, "gpus": null,
            "cgroup": (self.oom_kills.is_some() || self.cgroup_limit.is_some()).then(|| serde_json::json!({"version": 2, "path": "/sim",
                "usage_bytes": 1u64 << 30, "limit_bytes": self.cgroup_limit, "oom_kills": self.oom_kills.unwrap_or(0),
                "inactive_file_bytes": 0, "anon_bytes": 1u64 << 30, "file_bytes": 0}))
        }))
        .unwrap();
        let freezer = cgroup_dir(&self.root(), self.kind).map(|dir| crate::held::Frozen {
            version: if self.kind == Kind::V1 {
                Version::V1
            } else {
                Version::V2
            },
            dir,
        });
        let measured = crate::engine::Measured {
            name: "sim".into(),
            sample: if self.gone {
                crate::job::Measurement::Gone
            } else {
                crate::job::Measurement::Walked {
                    sample: job,
                    members: self.members.clone(),
                }
            },
            freezer,
            slurm_suspended: self.slurm_suspended,
            pinned: None,
            // As the shell reads it: the freezer held by, thawed behind the engine's back.
            held_thawed: self
                .pause()
                .and_then(|p| p.held_freezer().cloned())
                .is_some_and(|f| !self.host.frozen(&f.dir)),
        };
        self.engine
            .handle_sample(Arc::new(sample), vec![measured], self.now, self.now);
        self.drain();
        self.check();
    }

    /// A probe at `self.now` of the job's cgroup: `usage` bytes, `cache` of them clean page cache
    /// (inactive), its limit `cgroup_limit`.
    pub fn probe_cgroup(&mut self, usage: u64, cache: u64) {
        let cg: crate::sample::cgroup::CgroupMemory = serde_json::from_value(serde_json::json!({
            "version": 2, "path": "/sim", "usage_bytes": usage, "limit_bytes": self.cgroup_limit,
            "oom_kills": 0, "inactive_file_bytes": cache, "anon_bytes": usage - cache,
            "file_bytes": cache}))
        .unwrap();
        self.engine
            .handle_probe(None, vec![("sim".into(), cg)], self.now);
        self.drain();
        self.check();
    }

    /// A full sample at `self.now` whose look at the job found its cgroup's members as at the last
    /// walk: the tree not walked, the cgroup's usage `usage` bytes now.
    pub fn sample_unchanged(&mut self, used: f64, usage: u64) {
        let sample = self.host_sample(used);
        let cg: crate::sample::cgroup::CgroupMemory = serde_json::from_value(serde_json::json!({
            "version": 2, "path": "/sim", "usage_bytes": usage, "limit_bytes": self.cgroup_limit,
            "oom_kills": self.oom_kills.unwrap_or(0), "inactive_file_bytes": 0, "anon_bytes": usage,
            "file_bytes": 0}))
        .unwrap();
        let measured = crate::engine::Measured {
            name: "sim".into(),
            sample: crate::job::Measurement::Unchanged(cg),
            freezer: None,
            slurm_suspended: self.slurm_suspended,
            pinned: None,
            held_thawed: false,
        };
        self.engine
            .handle_sample(Arc::new(sample), vec![measured], self.now, self.now);
        self.drain();
        self.check();
    }

    /// Moves the clock to `t`, waking the engine at each deadline it names on the way (as the
    /// daemon does); returns the deadlines it woke at.
    pub fn advance_to(&mut self, t: u64) -> Vec<u64> {
        let mut woke = Vec::new();
        while let Some(d) = self.engine.poll_timeout() {
            if d > t {
                break;
            }
            self.now = d.max(self.now);
            woke.push(self.now);
            self.engine.handle_timeout(self.now);
            self.drain();
            self.check();
        }
        self.now = t;
        woke
    }

    /// Carries out the engine's effects as the daemon's executor would, answering for the host.
    pub fn drain(&mut self) {
        while let Some(effect) = self.engine.poll_effect() {
            match effect {
                Effect::Settle { job, frozen } => self.settling.push_back((job, frozen)),
                Effect::Slurm(request) => {
                    let (call, id) = (request.call.clone(), request.id.clone());
                    if call == SlurmCall::Suspend {
                        let s = self.host.state();
                        let recorded = s["jobs"].as_array().is_some_and(|jobs| {
                            jobs.iter().any(|j| {
                                j["paused"]["hold"]["kind"] == "slurm_suspend"
                                    && j["paused"]["hold"]["job_id"] == id.as_str()
                            })
                        });
                        if !recorded {
                            self.host
                                .violations
                                .lock()
                                .unwrap()
                                .push(format!("Slurm job {id} suspended with no pause recorded"));
                        }
                    }
                    if let Some(slurm) = &self.shared_slurm {
                        let result = slurm.call(&request.ctl, &call, &id, self.now);
                        self.slurm.push((call, id));
                        self.engine
                            .handle_outcome(request.outcome(result), self.now);
                        continue;
                    }
                    let answer = match self.slurm_answers.front() {
                        Some((c, _)) if *c == call => {
                            self.slurm_answers.pop_front().map(|(_, a)| a)
                        }
                        _ => None,
                    };
                    self.slurm.push((call, id));
                    let outcome = request.outcome(if self.slurm_fails {
                        // slurmctld down: scontrol says so and exits 1.
                        Err(crate::seam::SlurmError::Failed {
                            command: "scontrol show job -o".into(),
                            status: "exit status: 1".into(),
                            stderr: "slurm_load_jobs error: Unable to contact slurm controller (connect failure)".into(),
                        })
                    } else {
                        Ok(answer.unwrap_or(SlurmAnswer::Done))
                    });
                    if self.slurm_held {
                        self.held.push_back(outcome);
                    } else {
                        self.engine.handle_outcome(outcome, self.now);
                    }
                }
                Effect::WayOut(t) if self.way_out_tasks.is_some() => {
                    if let Some(q) = self.way_out_tasks.as_mut() {
                        q.push_back(t);
                    }
                }
                Effect::WayOut(_) | Effect::Adapt(_) => self
                    .host
                    .violations
                    .lock()
                    .unwrap()
                    .push("swap or config work with no way out and no config".into()),
            }
        }
    }

    /// Slurm answers the oldest call held back.
    pub fn answer_slurm(&mut self) {
        if let Some(o) = self.held.pop_front() {
            self.engine.handle_outcome(o, self.now);
            self.drain();
            self.check();
        }
    }

    /// Swap work comes back: `done` answers the oldest task handed off.
    pub fn way_out_done(&mut self, done: crate::engine::WayOutDone) {
        self.engine.handle_outcome(Outcome::WayOut(done), self.now);
        self.drain();
        self.check();
    }

    /// The oldest freeze still settling settles (or not).
    pub fn settle(&mut self, settled: bool) {
        if let Some((job, frozen)) = self.settling.pop_front() {
            self.engine.handle_outcome(
                Outcome::Settled {
                    job,
                    frozen,
                    settled,
                },
                self.now,
            );
            self.drain();
            self.check();
        }
    }

    /// The job's pause as the engine holds it.
    pub fn pause(&self) -> Option<crate::job::Pause> {
        self.engine
            .view()
            .jobs
            .iter()
            .find(|j| j.name == "sim")
            .and_then(|j| j.pause.clone())
    }

    /// Events, oldest first, as (action, reason, time).
    pub fn events(&self) -> Vec<(String, String, u64)> {
        self.engine
            .view()
            .events
            .iter()
            .map(|e| {
                (
                    e.action.as_str().to_owned(),
                    e.reason.as_str().to_owned(),
                    e.timestamp_ms,
                )
            })
            .collect()
    }

    /// The time of the first event with `action`.
    pub fn event_at(&self, action: &str) -> Option<u64> {
        self.events()
            .into_iter()
            .find(|(a, _, _)| a == action)
            .map(|(_, _, t)| t)
    }

    /// Every process of the host's job is running and its cgroup thawed.
    pub fn all_running(&self) -> bool {
        [PID, PID + 1]
            .iter()
            .all(|p| self.host.state_of(*p) == Some('S'))
            && cgroup_dir(&self.root(), self.kind).is_none_or(|d| !self.host.frozen(&d))
    }

    /// The job is held: stopped, frozen or suspended through Slurm.
    pub fn held(&self) -> bool {
        match self.kind {
            Kind::Signals => self.host.state_of(PID) == Some('T'),
            Kind::V1 | Kind::V2 => {
                cgroup_dir(&self.root(), self.kind).is_some_and(|d| self.host.frozen(&d))
            }
            Kind::Slurm => self
                .slurm
                .last()
                .is_some_and(|(c, _)| *c == SlurmCall::Suspend),
        }
    }

    /// The invariants, after every step: nothing the host flagged (an act ahead of its record,
    /// another user's process touched); the state file holds exactly the engine's pause record
    /// (mechanism and start); a systemd-oomd mark on the job's cgroup exactly while a pause records
    /// it, and never one after the pause; no deadline left in the past; every event's reason one
    /// the API lists.
    pub fn check(&self) {
        let violations = self.host.violations.lock().unwrap().clone();
        assert!(violations.is_empty(), "{:?}: {violations:?}", self.kind);
        let marked = self.host.marked();
        let recorded_marks: std::collections::BTreeSet<PathBuf> = self
            .pause()
            .map(|p| p.oomd_omit.iter().map(|m| m.dir.clone()).collect())
            .unwrap_or_default();
        assert_eq!(
            marked,
            recorded_marks,
            "{:?}: systemd-oomd marks on the host differ from the pause's (pause: {:?})",
            self.kind,
            self.pause()
        );
        let state = self.host.state();
        let recorded = state["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["name"] == "sim"))
            .map(|j| j["paused"].clone());
        match (self.pause(), recorded) {
            (Some(p), Some(r)) if !p.dry_run => {
                assert_eq!(r["since_ms"], p.since_ms, "{:?}: record {r}", self.kind);
                assert_eq!(
                    r["hold"]["kind"],
                    p.mechanism.name(),
                    "{:?}: the record names another mechanism: {r}",
                    self.kind
                );
            }
            (None, Some(r)) => assert!(
                r.is_null() || (r["phase"] == "armed" && self.engine.armed_reflex("sim").is_some()),
                "{:?}: a pause left in the file: {r}",
                self.kind
            ),
            // Every pause is written ahead: a live one the file does not hold would be lost to a
            // crash. A dry run's pause stops nothing and is written only as the view shows it.
            (Some(p), None) => assert!(
                p.dry_run,
                "{:?}: a pause the state file does not hold: {p:?}",
                self.kind
            ),
            (Some(_), Some(_)) | (None, None) => {}
        }
        if let Some(d) = self.engine.poll_timeout() {
            assert!(
                d >= self.now,
                "{:?}: a deadline at {d} still due at {}",
                self.kind,
                self.now
            );
        }
        for e in self.engine.view().events {
            assert!(
                !matches!(e.reason, crate::reason::Reason::Other(_)),
                "{:?}: unlisted reason in {e:?}",
                self.kind
            );
        }
    }
}
