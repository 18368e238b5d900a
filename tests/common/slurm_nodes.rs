//! A real two-node Slurm cluster on this one machine: munged and slurmctld in the root namespace
//! (slurmctld on the bridge's address), and two `slurmd -N NODE` with generated names, each in a
//! machine of its own (`netns.rs`: network, UTS and mount namespaces; its address on a bridge, its
//! hostname, its /etc/hosts; the other node's `slurm_NODE` memory and freezer cgroups hidden, as on a
//! second machine). Debian's slurm-wlm 22.05, cgroup v1 plugins, `PrologFlags=Contain` (or not: [`cluster_with`]). One memwatch
//! runs in each node ([`Nodes::daemon`]: in its namespaces, listening on its address), and the
//! repository's prolog and epilog on each node talk to that node's memwatch. Everything is killed
//! and removed on drop, a panicking test included.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::command::CommandError;
use super::netns::{Machine, Net};
use super::slurm::{free_port, munged_and_slurmctld, script};
use super::{Daemon, Opts, eventually};
use std::time::Instant;

/// The cgroup controllers Slurm's v1 plugins make `slurm_NODE` in.
const CONTROLLERS: [&str; 4] = ["memory", "freezer", "cpuset", "devices"];

pub struct Nodes {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    /// The nodes' names (their hostnames too); node `i`'s cgroups are `slurm_<names[i]>/…`.
    pub names: [String; 2],
    /// Wrappers that run scontrol and scancel against this cluster (for memwatch's `[slurm]`).
    pub scontrol: PathBuf,
    pub scancel: PathBuf,
    children: Vec<Child>,
    machines: Vec<Machine>,
    net: Net,
    started: bool,
}

/// Job ids of this test process's own, from 1 000 on (below Slurm's `MaxJobId`): memwatch finds a
/// job by id under any `slurm_*` cgroup root it sees, and a single-node test cluster running at the
/// same time on this machine numbers its jobs from 1.
fn first_job_id() -> u32 {
    static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    1_000 + (std::process::id() % 600_000) * 100 + (n % 10) * 10
}

impl Nodes {
    /// Makes the two machines and writes the configuration; no Slurm daemon runs yet. Panics when
    /// this cannot be done (it needs root, `ip` and `unshare`).
    pub fn prepare(contain: bool) -> Nodes {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_owned();
        for sub in ["state", "spool", "log"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        // Made before the cluster: a panic on the way drops what was made.
        let mut net = Net::new();
        let names = [format!("{}n1", net.tag), format!("{}n2", net.tag)];
        let machines: Vec<Machine> = names.iter().map(|n| net.machine(n, &d)).collect();
        let nodes = Nodes {
            conf: d.join("slurm.conf"),
            names: names.clone(),
            scontrol: d.join("scontrol"),
            scancel: d.join("scancel"),
            children: Vec::new(),
            machines,
            net,
            started: false,
            dir,
        };
        let hosts = format!(
            "127.0.0.1 localhost\n{} mwctld\n{} {}\n{} {}\n",
            nodes.net.gateway, nodes.machines[0].addr, names[0], nodes.machines[1].addr, names[1]
        );
        for (i, m) in nodes.machines.iter().enumerate() {
            m.hosts(&hosts);
            for controller in ["memory", "freezer"] {
                m.hide(
                    &Path::new("/sys/fs/cgroup")
                        .join(controller)
                        .join(format!("slurm_{}", names[1 - i])),
                );
            }
        }
        std::fs::write(
            &nodes.conf,
            format!(
                "ClusterName=memwatchnodes\nFirstJobId={first_job}\n\
                 SlurmctldHost=localhost({gateway})\n\
                 SlurmctldPort={ctld_port}\n\
                 SlurmdPort={slurmd_port}\n\
                 SlurmUser=root\nSlurmdUser=root\n\
                 AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d}/munge.sock,cred_expire=5\n\
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n\
                 SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd-%n.log\n\
                 ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n{contain}\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n\
                 SchedulerType=sched/builtin\nSchedulerParameters=sched_interval=1\nReturnToService=2\nMpiDefault=none\n\
                 JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 Prolog={d}/prolog.sh\nEpilog={d}/epilog.sh\n\
                 NodeName={n1} NodeHostname={n1} NodeAddr={a1} CPUs=2 RealMemory=4096 State=UNKNOWN\n\
                 NodeName={n2} NodeHostname={n2} NodeAddr={a2} CPUs=2 RealMemory=4096 State=UNKNOWN\n\
                 PartitionName=debug Nodes={n1},{n2} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n",
                gateway = nodes.net.gateway,
                first_job = first_job_id(),
                contain = if contain { "PrologFlags=Contain\n" } else { "" },
                ctld_port = free_port(),
                slurmd_port = free_port(),
                d = d.display(),
                n1 = names[0],
                n2 = names[1],
                a1 = nodes.machines[0].addr,
                a2 = nodes.machines[1].addr,
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("cgroup.conf"),
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n\
             ConstrainCores=no\nConstrainRAMSpace=yes\nConstrainSwapSpace=no\n",
        )
        .unwrap();
        for (path, prog) in [(&nodes.scontrol, "scontrol"), (&nodes.scancel, "scancel")] {
            script(
                path,
                &format!(
                    "#!/bin/sh\nSLURM_CONF={} exec /usr/bin/{prog} \"$@\"\n",
                    nodes.conf.display()
                ),
            );
        }
        nodes
    }

    /// memwatch's `[slurm]` section for this cluster.
    pub fn memwatch_config(&self) -> String {
        format!(
            "[slurm]\nscontrol = {:?}\nscancel = {:?}\n",
            self.scontrol, self.scancel
        )
    }

    /// A memwatch daemon in node `i`'s namespaces, listening on its address; `o` says the rest
    /// (its `through` and `listen` are this node's).
    pub fn daemon(&self, i: usize, o: Opts) -> Daemon {
        let enter = self.machines[i].enter();
        let through: Vec<&str> = enter.iter().map(String::as_str).collect();
        let listen = format!("{}:0", self.machines[i].addr);
        Daemon::start(Opts {
            through: &through,
            listen: &listen,
            ..o
        })
    }

    /// Starts munged, slurmctld and both slurmd, with the repository's prolog and epilog run with
    /// `env` on every node and, on node `i`, `MEMWATCH_SOCKET` set to `daemons[i]`'s socket;
    /// returns once both nodes are idle.
    pub fn start(&mut self, daemons: [&Daemon; 2], env: &[(&str, &str)]) {
        let d = self.dir.path().to_owned();
        let exports: String = env
            .iter()
            .map(|(k, v)| format!("export {k}='{v}'\n"))
            .collect();
        let sockets: String = (0..2)
            .map(|i| {
                format!(
                    "{}) export MEMWATCH_SOCKET='{}' ;;\n",
                    self.names[i],
                    daemons[i].socket.display()
                )
            })
            .collect();
        // What the scripts log goes to log/memwatch-slurm.log (a `logger` of the test's own).
        std::fs::create_dir_all(d.join("bin")).unwrap();
        script(
            &d.join("bin/logger"),
            &format!(
                "#!/bin/sh\n[ \"$1\" = -t ] && shift 2\n[ \"$1\" = -- ] && shift\n\
                 echo \"$(date +%T.%N) $(hostname): $*\" >> {}/log/memwatch-slurm.log\n",
                d.display()
            ),
        );
        for which in ["prolog", "epilog"] {
            script(
                &d.join(format!("{which}.sh")),
                &format!(
                    "#!/bin/sh\nexport PATH={bin}:$PATH\n{exports}case \"${{SLURMD_NODENAME:-$(hostname)}}\" in\n{sockets}esac\n\
                     export SCONTROL={}\nexec {}/deploy/slurm/{which}.sh\n",
                    self.scontrol.display(),
                    super::repo().display(),
                    bin = d.join("bin").display(),
                ),
            );
        }
        let (munged, ctld) = munged_and_slurmctld(&d, &self.conf);
        self.children.push(munged);
        self.children.push(ctld);
        self.started = true;
        for (m, name) in self.machines.iter().zip(&self.names) {
            let enter = m.enter();
            let slurmd = Command::new(&enter[0])
                .args(&enter[1..])
                .args(["slurmd", "-D", "-N", name, "-f"])
                .arg(&self.conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start slurmd through nsenter");
            self.children.push(slurmd);
        }
        let idle = || {
            self.run("sinfo", &["-h", "-N", "-o", "%T"])
                .is_ok_and(|s| s.lines().filter(|l| l.trim() == "idle").count() == 2)
        };
        assert!(
            eventually(30.0, idle),
            "the nodes never became idle ({:?}); slurmctld.log:\n{}\nslurmd logs:\n{}\n{}",
            self.run("sinfo", &["-h", "-N", "-o", "%N %T"]),
            self.log("slurmctld"),
            self.log(&format!("slurmd-{}", self.names[0])),
            self.log(&format!("slurmd-{}", self.names[1]))
        );
    }

    /// Runs a Slurm client command against this cluster (from the root namespace); its stdout, or
    /// its stderr as the error.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, CommandError> {
        super::command::output(program, args, |c| {
            c.env("SLURM_CONF", &self.conf);
        })
    }

    /// Submits a batch script to both nodes (`-N2 -w node1,node2`; the script runs on node 0);
    /// returns the job id.
    pub fn sbatch(&self, args: &[&str], script_text: &str) -> String {
        let path = self.dir.path().join(format!("job-{}.sh", free_port()));
        script(&path, script_text);
        let out = format!("{}/job-%j.out", self.dir.path().display());
        let nodes = format!("{},{}", self.names[0], self.names[1]);
        let mut all: Vec<&str> = vec!["--parsable", "-o", &out, "-N2", "-w", &nodes];
        all.extend_from_slice(args);
        let path_s = path.to_string_lossy().into_owned();
        all.push(&path_s);
        let id = self
            .run("sbatch", &all)
            .unwrap_or_else(|e| panic!("sbatch: {e}"));
        id.trim().split(';').next().unwrap_or_default().to_owned()
    }

    /// The job's state as squeue prints it (R, S, PD, CG …); empty once it left the queue.
    pub fn state(&self, id: &str) -> String {
        self.run("squeue", &["-h", "-j", id, "-o", "%t"])
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }

    /// The job's memory cgroup on node `i` (v1).
    pub fn job_cgroup(&self, i: usize, id: &str) -> PathBuf {
        PathBuf::from(format!(
            "/sys/fs/cgroup/memory/slurm_{}/uid_0/job_{id}",
            self.names[i]
        ))
    }

    /// Room for node `i`'s rank: the memory limit of the job's cgroup and of every cgroup below it
    /// (its steps' and tasks') raised to `bytes`, parents first, as an admin giving a job more
    /// memory would. Returns how many limits it wrote.
    pub fn raise_limit(&self, i: usize, id: &str, bytes: u64) -> usize {
        let mut written = 0;
        let mut queue = std::collections::VecDeque::from([self.job_cgroup(i, id)]);
        while let Some(dir) = queue.pop_front() {
            if std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string()).is_ok() {
                written += 1;
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                queue.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
        written
    }

    /// Whether job `id` leaves the queue within 60 s having completed (`JobState=COMPLETED`); a job
    /// that did not is cancelled, and its state printed.
    pub fn completed(&self, id: &str) -> bool {
        let ended = eventually(60.0, || self.state(id).is_empty());
        let state = self
            .run("scontrol", &["show", "job", "-o", id])
            .unwrap_or_default();
        let done = ended && state.contains("JobState=COMPLETED");
        if !done {
            eprintln!("job {id} did not complete: {}", state.trim());
            let _ = self.run("scancel", &[id]);
        }
        done
    }

    /// Every process of step `step`'s tasks on node `i`.
    pub fn step_tasks(&self, i: usize, id: &str, step: &str) -> Vec<u32> {
        let dir = self.job_cgroup(i, id).join(format!("step_{step}"));
        let mut out = Vec::new();
        for task in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if task.file_name().to_string_lossy().starts_with("task_") {
                let procs =
                    std::fs::read_to_string(task.path().join("cgroup.procs")).unwrap_or_default();
                out.extend(
                    procs
                        .split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
        out
    }

    /// OOM kills in the job's memory cgroups on node `i`: the job's, its steps' and tasks' (on v1
    /// a cgroup's `oom_kill` counts only its own), summed.
    pub fn oom_kills(&self, i: usize, id: &str) -> u64 {
        let mut total = 0;
        let mut stack = vec![self.job_cgroup(i, id)];
        while let Some(dir) = stack.pop() {
            let text = std::fs::read_to_string(dir.join("memory.oom_control")).unwrap_or_default();
            total += text
                .lines()
                .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
        total
    }

    /// A daemon's log (`slurmctld`, `slurmd-NODE`, `munged`), for failure messages.
    pub fn log(&self, which: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("log/{which}.log")))
            .unwrap_or_default()
    }

    /// Every Slurm log and the jobs' output, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!(
            "slurmctld.log:\n{}\nmemwatch-slurm.log (the prolog's and epilog's):\n{}",
            self.log("slurmctld"),
            self.log("memwatch-slurm")
        );
        for n in &self.names {
            out.push_str(&format!(
                "\nslurmd-{n}.log:\n{}",
                self.log(&format!("slurmd-{n}"))
            ));
        }
        for entry in std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let file = entry.file_name().to_string_lossy().into_owned();
            if file.starts_with("job-") && file.ends_with(".out") {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                out.push_str(&format!("\n{file}:\n{text}"));
            }
        }
        out
    }

    /// The `slurm_NODE` cgroup directories of both nodes, in every controller Slurm uses.
    fn tops(&self) -> Vec<PathBuf> {
        CONTROLLERS
            .iter()
            .flat_map(|c| {
                self.names
                    .iter()
                    .map(move |n| PathBuf::from(format!("/sys/fs/cgroup/{c}/slurm_{n}")))
            })
            .collect()
    }

    /// Every process left in the nodes' Slurm cgroups.
    fn leftovers(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut stack = self.tops();
        while let Some(dir) = stack.pop() {
            if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(t.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        // Jobs first, so that no task outlives the cluster; what Slurm leaves is thawed and killed,
        // the nodes' cgroups are removed, then the machines and the bridge.
        if self.started {
            let _ = self.run("scancel", &["--full", "-u", "root"]);
            eventually(15.0, || self.leftovers().is_empty());
        }
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let tops = self.tops();
        for top in &tops {
            let _ = Command::new("find")
                .arg(top)
                .args([
                    "-name",
                    "freezer.state",
                    "-exec",
                    "sh",
                    "-c",
                    "echo THAWED > \"$1\"",
                    "_",
                    "{}",
                    ";",
                ])
                .stderr(Stdio::null())
                .status();
        }
        for pid in self.leftovers() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        eventually(5.0, || self.leftovers().is_empty());
        self.machines.clear();
        for top in &tops {
            let _ = Command::new("find")
                .arg(top)
                .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", ";"])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The cluster and a daemon on each node (`configs[i]`: more of node `i`'s config; `roots[i]`: its
/// `[host] root`, "/" when `None`). Returns with both nodes idle.
pub fn cluster(configs: [&str; 2], roots: [Option<&Path>; 2]) -> (Nodes, Daemon, Daemon) {
    cluster_with(true, None, configs, roots)
}

/// [`cluster`], with `PrologFlags=Contain` or without it (`contain`), and with each node's memwatch
/// reading a fake NVML of its own that starts from `gpu_state` (none when `None`).
pub fn cluster_with(
    contain: bool,
    gpu_state: Option<&str>,
    configs: [&str; 2],
    roots: [Option<&Path>; 2],
) -> (Nodes, Daemon, Daemon) {
    let start = Instant::now();
    let mut nodes = Nodes::prepare(contain);
    let daemon = |i: usize| {
        let config = format!("{}{}", nodes.memwatch_config(), configs[i]);
        nodes.daemon(
            i,
            Opts {
                root: roots[i].map_or_else(|| "/".into(), Path::to_owned),
                gpu_state,
                interval_ms: 100,
                extra_config: &config,
                ..Opts::default()
            },
        )
    };
    let (d1, d2) = (daemon(0), daemon(1));
    let memwatch = super::bin();
    nodes.start([&d1, &d2], &[("MEMWATCH", memwatch.to_str().unwrap())]);
    eprintln!("two-node cluster up in {:?}", start.elapsed());
    (nodes, d1, d2)
}

/// Waits until daemon `d` follows Slurm job `id` with at least one process (its prolog attached
/// it, and memwatch adopted it once a task ran).
pub fn wait_adopted(d: &Daemon, id: &str, node: &str) {
    let name = format!("slurm-{id}");
    super::wait::until(
        &format!("{node}'s memwatch follows {name} with its processes"),
        || d.jobs(),
        |jobs| {
            jobs.iter().any(|j| {
                j["name"] == name.as_str()
                    && j["origin"]["id"] == id
                    && j["sample"]["process_count"].as_u64().unwrap_or(0) >= 1
            })
        },
    );
}

/// Node 2's host memory, as its memwatch reads it (`[host] root`): a copy of the fixture tree whose
/// meminfo the test writes, `used` of 32 GiB in use.
pub fn host_memory(root: &Path, used: f64) {
    let total: u64 = 32 << 20;
    let available = (total as f64 * (1.0 - used)) as u64;
    let text = std::fs::read_to_string(super::fixture_root().join("proc/meminfo")).unwrap();
    let text: String = text
        .lines()
        .map(|l| match l.split(':').next() {
            Some("MemTotal") => format!("MemTotal:       {total} kB\n"),
            Some("MemAvailable") => format!("MemAvailable:   {available} kB\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    let tmp = root.join("proc/meminfo.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, root.join("proc/meminfo")).unwrap();
}

/// A batch script of one rank per node for a rank that grows fast: node 1's rank touches 400 MiB
/// at `rate` MiB/s (past the job's 300 MiB: without a stop in time, the OOM killer ends it), holds
/// it 1 s and exits, leaving `done`; node 2's rank waits for `done`. memhog's progress goes to
/// `stamps` (one line per MiB: CLOCK_BOOTTIME µs and the MiB touched so far).
pub fn fast_ranks(nodes: &Nodes, rate: u32, stamps: &Path, done: &Path) -> String {
    format!(
        "#!/bin/bash\nsrun -N2 --ntasks-per-node=1 bash -c 'if [ \"$SLURMD_NODENAME\" = {n1} ]; then\n\
           {hog} --rate-mib {rate} --chunk-mib 1 --total-mib 400 --hold-ms 1000 --stamps {stamps}; touch {done}\n\
         else while [ ! -e {done} ]; do sleep 0.1; done; fi'\n",
        n1 = nodes.names[0],
        hog = super::memhog().display(),
        stamps = stamps.display(),
        done = done.display(),
    )
}

/// The MiB memhog had touched by its last line in `stamps` (0 before its first).
pub fn touched_mib(stamps: &Path) -> u64 {
    std::fs::read_to_string(stamps)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .next_back()
        .unwrap_or(0)
}

/// A rank script for `srun -N2 --ntasks-per-node=1`: node 0's rank fills `fill` (a tmpfs file,
/// charged to its job cgroup) 1 MiB every 40 ms toward the job's 300 MiB, and stops filling once
/// the file is gone; node 1's rank holds 16 MiB.
pub fn ranks(nodes: &Nodes, fill: &Path) -> String {
    format!(
        "srun -N2 --ntasks-per-node=1 bash -c 'if [ \"$SLURMD_NODENAME\" = {n1} ]; then\n\
           for i in $(seq 1 299); do\n\
             if [ $i -gt 1 ] && [ ! -e {fill} ]; then break; fi\n\
             dd if=/dev/zero bs=1M count=1 status=none >> {fill}; sleep 0.04\n\
           done; exec sleep 600\n\
         else exec {hog} --rate-mib 64 --total-mib 16 --hold-ms 600000; fi'\n",
        n1 = nodes.names[0],
        fill = fill.display(),
        hog = super::memhog().display(),
    )
}
